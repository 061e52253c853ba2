"""End to end over the WebSocket: first text to first audio frame, gaps between frames, starvation, per session count.

Starts the real server (`python -m wsserver`) in a child process, sized for the largest session count, on the given
checkpoint or a freshly generated tiny random one. For each session count it opens that many sessions, then starts
them together: each streams a few sentences word by word (one word every --word-gap-ms, like an LLM), ends its
context and reads `pcm_s16le` frames at the model's rate until `context.done`. Prints one JSON line per session count:

- `first_text_to_first_frame_ms`: from sending the first word to receiving the first audio frame (p50/p95/max);
- `worst_gap_ms` (all sessions) and `worst_gap_p95_ms` (of each session's worst) between consecutive audio frames;
- `starved_sessions`: sessions whose player ran dry, i.e. some frame arrived later after the first frame than the
  audio delivered ahead of it lasts; `starved_ms_total`: how long their players waited in all (a player that
  starts at the first frame and, when it runs dry, waits for the next frame and plays on);
- `server_ttfa_ms_p50`, `server_queue_ms_p50`, `server_rtf_p50`: the server's own figures from `context.done`;
- `audio_s`, `wall_s`, `xrt`: audio delivered by all sessions, from the start to the last `context.done`, and
  their ratio; `client_cpu_s`: the clients' CPU time meanwhile (close to `wall_s`, they would be the bottleneck);
- `server_cpu_s`: the server process's CPU time meanwhile per thread (Linux), its busiest threads first: a thread
  near `wall_s` is the bottleneck (`main` runs the event loop; the engine's step loop is another);
- `engine`: the engine's step time and batch size (means of /status samples taken every 0.25 s).

`--profile-sessions N --profile-out FILE` also records the server with py-spy (collapsed stacks of every thread,
`py-spy record --format raw`) while the level of N sessions runs.

    PYTHONPATH=. python benchmarks/ws_latency.py --sessions 1 8                 # CPU, tiny random checkpoint
    python3 benchmarks/ws_latency.py --device cuda --model CKPT                 # sessions 1 32 128 256
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import uvloop

from wsserver.client import Audio, Cancelled, Client, Done, Refused
from wsserver.config import ServerConfig

TEXT = (
    "Thanks for calling, I can help you with that right away. Your appointment is now booked for Tuesday "
    "afternoon, and you will get a reminder the day before. Is there anything else I can do for you today?"
)
FRAME_MS = 20
START_TIMEOUT_S = 900  # loading a full-size model and capturing its CUDA graphs takes minutes
# The server listens with asyncio's default backlog (100): more simultaneous handshakes get their SYNs dropped and
# retried a second later, so open the sessions a bounded number at a time.
CONCURRENT_HANDSHAKES = 64


@dataclass(frozen=True, slots=True)
class SessionResult:
    first_frame_s: float  # first word sent -> first audio frame received
    worst_gap_s: float  # longest wait between two consecutive audio frames
    starved_s: float  # time the player's buffer was empty, 0 if it never ran dry
    audio_s: float
    metrics: dict[str, Any]  # context.done's ttfa_ms, queue_ms, rtf


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def server_p50(results: list[SessionResult], key: str) -> float | None:
    """Median of a `context.done` metric over the sessions that have it (ttfa_ms is null without audio)."""
    values = [r.metrics[key] for r in results if r.metrics[key] is not None]
    return round(statistics.median(values), 3) if values else None


def playback(arrivals: list[tuple[float, int]], sample_rate: int) -> tuple[float, float]:
    """(worst gap, starved time) in seconds, for audio frames given as (arrival time, samples).

    The player starts with the first frame. Frame k is due when the audio before it has played, i.e. `delivered /
    sample_rate` after the start plus the time the player already spent waiting; arriving later than that, the
    player waits for it (rebuffers) and plays on from there."""
    start = previous = arrivals[0][0]
    worst = starved = 0.0
    delivered = 0
    for arrival, samples in arrivals:
        worst = max(worst, arrival - previous)
        starved += max(0.0, arrival - (start + starved + delivered / sample_rate))
        delivered += samples
        previous = arrival
    return worst, starved


async def open_session(url: str, handshakes: asyncio.Semaphore) -> Client:
    client = Client(url, open_timeout_s=60)
    async with handshakes:
        await client.connect()
    return client


async def speak(client: Client, seed: int, text: str, word_gap_s: float, rate: int | None) -> SessionResult:
    """One context on an open session: stream `text` word by word, end it, and time every audio frame."""
    sample_rate = rate or client.hello["model"]["sample_rate"]
    # PCM (at the model's own rate unless --sample-rate says otherwise): a frame's payload length is its duration.
    output = {"format": "pcm_s16le", "sample_rate": sample_rate, "frame_ms": FRAME_MS}
    ctx = await client.context("b", output=output, generation={"seed": seed})
    first, *rest = (word + " " for word in text.split())

    async def feed() -> None:
        for word in rest:
            await asyncio.sleep(word_gap_s)
            await ctx.append(word)
        await ctx.end()

    started = time.perf_counter()
    await ctx.append(first)
    feeder = asyncio.create_task(feed())
    arrivals: list[tuple[float, int]] = []  # audio frames with samples
    try:
        async for event in ctx:
            if isinstance(event, Audio):
                arrivals.append((time.perf_counter(), event.samples))
            elif isinstance(event, Done):
                await feeder
                worst_gap, starved = playback(arrivals, sample_rate)
                audio_s = sum(samples for _, samples in arrivals) / sample_rate
                return SessionResult(arrivals[0][0] - started, worst_gap, starved, audio_s, event.metrics)
            elif isinstance(event, Refused | Cancelled):
                raise RuntimeError(event)
    finally:
        feeder.cancel()
    raise RuntimeError("connection closed before context.done")


@dataclass(frozen=True, slots=True)
class Level:
    results: list[SessionResult]
    wall_s: float  # from the start of the speaking to the last context.done
    client_cpu_s: float  # this process's CPU time meanwhile: near wall_s, the clients would be the bottleneck
    model: str


async def run_level(url: str, sessions: int, text: str, word_gap_s: float, rate: int | None) -> Level:
    """All sessions connect first, then speak at once."""
    handshakes = asyncio.Semaphore(CONCURRENT_HANDSHAKES)
    opened = await asyncio.gather(*(open_session(url, handshakes) for _ in range(sessions)), return_exceptions=True)
    try:
        for item in opened:
            if isinstance(item, BaseException):
                raise item
        started, cpu = time.perf_counter(), time.process_time()
        speaking = (speak(client, i, text, word_gap_s, rate) for i, client in enumerate(opened))
        results = await asyncio.gather(*speaking)
        return Level(
            results, time.perf_counter() - started, time.process_time() - cpu, opened[0].hello["model"]["name"]
        )
    finally:
        await asyncio.gather(*(item.close() for item in opened if not isinstance(item, BaseException)))


def get_json(url: str) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(url, timeout=5) as reply:
            return reply.status, orjson.loads(reply.read())
    except urllib.error.HTTPError as error:  # /ready answers 503 while the model loads
        return error.code, None


def wait_ready(base: str, server: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"the server exited with {server.returncode} before it was ready")
        with contextlib.suppress(OSError):  # not listening yet
            if get_json(base + "/ready")[0] == 200:
                return
        time.sleep(0.5)
    raise RuntimeError(f"the server was not ready after {START_TIMEOUT_S} s")


async def wait_disconnected(base: str) -> None:
    """Sessions of the previous level must be gone from the server before the next level counts against
    max_connections."""
    while (await asyncio.to_thread(get_json, base + "/status"))[1]["connections"]["active"]:
        await asyncio.sleep(0.05)


def thread_cpu(pid: int) -> dict[str, float]:
    """CPU seconds per thread of process `pid`: "main" (the event loop's) and "tid N" for the others."""
    ticks = os.sysconf("SC_CLK_TCK")
    cpu: dict[str, float] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):  # a thread that ended meanwhile
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
            name = "main" if task.name == str(pid) else f"tid {task.name}"
            cpu[name] = (int(fields[11]) + int(fields[12])) / ticks  # utime + stime
    return cpu


async def sample_engine(base: str, samples: list[dict[str, Any]]) -> None:
    """/status's engine figures every 0.25 s, while the sessions speak (cancel to stop)."""
    while True:
        status = (await asyncio.to_thread(get_json, base + "/status"))[1]
        if status and status.get("engine"):
            samples.append(status["engine"])
        await asyncio.sleep(0.25)


def engine_means(samples: list[dict[str, Any]]) -> dict[str, float] | None:
    busy = [s for s in samples if s["running"]]
    if not busy:
        return None
    return {key: round(statistics.mean(s[key] for s in busy), 2) for key in ("step_ms", "batch_size", "running")}


async def measure(args: argparse.Namespace, base: str, max_patches: int, server_pid: int) -> None:
    url = base.replace("http://", "ws://") + "/v1/tts/ws"
    word_gap_s = args.word_gap_ms / 1000
    # The first context takes paths the engine's own warm-up does not.
    await run_level(url, 1, args.text, word_gap_s, args.sample_rate)
    for sessions in args.sessions:
        await wait_disconnected(base)
        samples: list[dict[str, Any]] = []
        sampler = asyncio.create_task(sample_engine(base, samples))
        profiler = None
        if sessions == args.profile_sessions:
            profiler = subprocess.Popen(
                [
                    *("py-spy", "record", "--pid", str(server_pid), "--format", "raw", "--threads", "--rate", "50"),
                    *("--output", args.profile_out, "--nonblocking"),
                ],
                stdout=subprocess.DEVNULL,
            )
        cpu_before = thread_cpu(server_pid)
        level = await run_level(url, sessions, args.text, word_gap_s, args.sample_rate)
        cpu_after = thread_cpu(server_pid)
        sampler.cancel()
        if profiler is not None:
            profiler.send_signal(signal.SIGINT)  # py-spy writes its output on SIGINT
            profiler.wait()
        server_cpu = {name: cpu_after[name] - cpu_before.get(name, 0.0) for name in cpu_after}
        results = level.results
        first = [1000 * r.first_frame_s for r in results]
        worst = [1000 * r.worst_gap_s for r in results]
        audio = sum(r.audio_s for r in results)
        line = {
            "sessions": sessions,
            "device": args.device,
            "model": level.model,
            "max_patches": max_patches,
            "word_gap_ms": args.word_gap_ms,
            "sample_rate": args.sample_rate or "model",
            "first_text_to_first_frame_ms": {
                "p50": round(statistics.median(first), 1),
                "p95": round(percentile(first, 0.95), 1),
                "max": round(max(first), 1),
            },
            "worst_gap_ms": round(max(worst), 1),
            "worst_gap_p95_ms": round(percentile(worst, 0.95), 1),
            "starved_sessions": sum(r.starved_s > 0 for r in results),
            "starved_ms_total": round(1000 * sum(r.starved_s for r in results), 1),
            "server_ttfa_ms_p50": server_p50(results, "ttfa_ms"),
            "server_queue_ms_p50": server_p50(results, "queue_ms"),
            "server_rtf_p50": server_p50(results, "rtf"),
            "audio_s": round(audio, 2),
            "audio_s_per_session": round(audio / sessions, 2),
            "wall_s": round(level.wall_s, 2),
            "xrt": round(audio / level.wall_s, 2),
            "client_cpu_s": round(level.client_cpu_s, 2),
            "server_cpu_s": {
                name: round(seconds, 2) for name, seconds in sorted(server_cpu.items(), key=lambda kv: -kv[1])[:4]
            },
            "engine": engine_means(samples),
        }
        print(orjson.dumps(line).decode(), flush=True)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def main(args: argparse.Namespace) -> None:
    cuda = args.device.startswith("cuda")
    args.sessions = args.sessions or ([1, 32, 128, 256] if cuda else [1, 8])
    # The reference's text-length cap on the GPU; a few patches per segment keep the CPU run short.
    max_patches = args.max_patches
    if max_patches is None:
        max_patches = ServerConfig().max_patches if cuda else 8
    with tempfile.TemporaryDirectory() as scratch:
        model = args.model
        if model is None:
            from engine.models.voxcpm.make_checkpoint import make_checkpoint

            model = str(make_checkpoint("voxcpm2", "tiny", Path(scratch) / "tiny"))
        port = free_port()
        most = str(max(args.sessions))
        command = [sys.executable, "-m", "wsserver", "--model", model, "--device", args.device, "--port", str(port)]
        # Every session gets an engine slot and a connection: the benchmark measures the engine under that load, not
        # the server's FIFO in front of a smaller engine.
        command += ["--max-num-seqs", most, "--max-connections", most, "--max-patches", str(max_patches)]
        # A separate process, as in production: the clients' own work must not share the server's GIL and event loop.
        server = subprocess.Popen(command, stdout=sys.stderr)
        try:
            base = f"http://127.0.0.1:{port}"
            wait_ready(base, server)
            uvloop.run(measure(args, base, max_patches, server.pid))
        finally:
            server.send_signal(signal.SIGTERM)  # drains: no session is open by now
            try:
                server.wait(timeout=60)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", type=int, nargs="+", help="default 1 32 128 256 on cuda, else 1 8")
    parser.add_argument("--model", default=None, help="checkpoint; default: a freshly generated tiny random one")
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N")
    parser.add_argument("--max-patches", type=int, help="cap per segment; default the server's on cuda, else 8")
    parser.add_argument("--word-gap-ms", type=float, default=20.0, help="pause between streamed words (LLM pace)")
    parser.add_argument("--text", default=TEXT, help="what each session says (default: three sentences)")
    parser.add_argument("--sample-rate", type=int, help="PCM rate asked for (default: the model's, no resampling)")
    parser.add_argument("--profile-sessions", type=int, help="record the server with py-spy during this level")
    parser.add_argument("--profile-out", default="artifacts/ws-profile.txt", help="py-spy's collapsed stacks")
    main(parser.parse_args())
