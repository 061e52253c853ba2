"""Time from first text to first audio frame over the WebSocket, for N concurrent sessions.

Starts a real server in-process (the real engine on the given checkpoint, or a freshly generated tiny one), then
for each concurrency level opens that many sessions at once; each streams one sentence word by word and ends it.
Prints one JSON line per level: first-text-to-first-frame percentiles (client side), and the server's own
ttfa/queue/rtf from `context.done`.

    PYTHONPATH=. python benchmarks/ws_latency.py --sessions 1 50 [--model CKPT] [--device cpu] [--max-patches 8]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import struct
import tempfile
import time
from pathlib import Path

import orjson
from websockets.asyncio.client import connect

from engine import AsyncEngine, EngineConfig
from wsserver.config import ServerConfig
from wsserver.server import TTSServer
from wsserver.voices import VoiceRegistry

TEXT = "Hello there, this is a latency test of the streaming server. It speaks as the words arrive. "


async def session(url: str, seed: int, word_gap_s: float) -> dict:
    async with connect(url) as ws:
        await ws.recv()  # hello
        await ws.send(orjson.dumps({"type": "context.create", "ctx": "b", "generation": {"seed": seed}}).decode())
        started = time.perf_counter()
        first_frame = None

        async def feed() -> None:
            for word in TEXT.split(" "):
                await ws.send(orjson.dumps({"type": "text.append", "ctx": "b", "text": word + " "}).decode())
                await asyncio.sleep(word_gap_s)
            await ws.send(orjson.dumps({"type": "context.end", "ctx": "b"}).decode())

        feeder = asyncio.create_task(feed())
        async for message in ws:
            if isinstance(message, bytes):
                if first_frame is None and struct.unpack_from("<B", message, 1)[0] == 1:
                    first_frame = time.perf_counter() - started
            elif (event := orjson.loads(message))["type"] == "context.done":
                await feeder
                return {"first_frame_s": first_frame, **event["metrics"]}
            elif event["type"] == "error":
                raise RuntimeError(event)
    raise RuntimeError("connection closed early")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def main(args: argparse.Namespace) -> None:
    model = args.model
    if model is None:
        from engine.models.voxcpm.make_checkpoint import make_checkpoint

        model = str(make_checkpoint("voxcpm2", "tiny", Path(tempfile.mkdtemp()) / "tiny"))
    engine = AsyncEngine(EngineConfig(model=model, device=args.device, max_num_seqs=max(args.sessions)))
    await engine.start()
    server = TTSServer(ServerConfig(model=model, port=0, max_patches=args.max_patches, max_num_seqs=max(args.sessions)))
    server.attach(engine, await VoiceRegistry.load(engine, None))
    listening = await server.listen()
    url = f"ws://127.0.0.1:{listening.sockets[0].getsockname()[1]}/v1/tts/ws"
    await session(url, 0, args.word_gap_ms / 1000)  # warm the path once
    for n in args.sessions:
        results = await asyncio.gather(*(session(url, i, args.word_gap_ms / 1000) for i in range(n)))
        first = [r["first_frame_s"] * 1000 for r in results]
        print(
            orjson.dumps(
                {
                    "sessions": n,
                    "device": args.device,
                    "model": engine.info.name,
                    "max_patches": args.max_patches,
                    "first_text_to_first_frame_ms": {
                        "p50": round(statistics.median(first), 1),
                        "p95": round(percentile(first, 0.95), 1),
                        "max": round(max(first), 1),
                    },
                    "server_ttfa_ms_p50": statistics.median(r["ttfa_ms"] for r in results),
                    "queue_ms_p50": statistics.median(r["queue_ms"] for r in results),
                    "rtf_p50": statistics.median(r["rtf"] for r in results),
                }
            ).decode(),
            flush=True,
        )
    listening.close()
    await listening.wait_closed()
    await engine.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, nargs="+", default=[1, 50])
    parser.add_argument("--model", default=None)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--max-patches", type=int, default=8)
    parser.add_argument("--word-gap-ms", type=float, default=20.0, help="pause between streamed words (LLM pace)")
    asyncio.run(main(parser.parse_args()))
