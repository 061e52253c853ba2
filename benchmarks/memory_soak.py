"""Memory soak: is GPU memory held flat across many requests, finished and cancelled alike?

Runs --requests requests through `engine.AsyncEngine` in waves of --concurrency: texts of one to four sentences
(so prompt lengths and patch caps vary), and about one request in ten cancelled after its first few chunks, half of
those by leaving the stream early and half with `engine.cancel()` (the two ways a client's abort reaches the
engine). After every wave, once the engine is idle, it samples torch.cuda.memory_allocated and memory_reserved, the
process RSS (/proc/self/statm) and the engine's free KV blocks, and prints them as one JSON line. A summary line
follows: first/last/max of each figure and `flat`, true when every KV block is free at the end and (on a GPU) the
memory allocated after the last wave is within 1 MiB of that after the first (which holds what warms up once).
On CPU the GPU figures are absent.

    python3 benchmarks/memory_soak.py --device cuda --model CKPT               # 1000 requests, waves of 64
    PYTHONPATH=. python benchmarks/memory_soak.py --requests 100                # CPU, tiny random checkpoint

`max_patches` null in the output: the reference's text-length cap (up to the engine's absolute cap).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from engine import AsyncEngine, EngineConfig, EngineStats, GenerationParams, GenerationRequest

SENTENCES = (
    "The quick brown fox jumps over the lazy dog.",
    "Your order has shipped and should arrive on Thursday.",
    "Could you tell me a little more about what happened?",
    "It is sunny today, with a light breeze from the west and a high of twenty two degrees.",
    "Sure.",
    "I have moved your meeting with the design team to three in the afternoon, in the large room on the fourth "
    "floor, and sent everyone an updated invitation.",
)
MIB = 2**20
FLAT_TOLERANCE_BYTES = MIB
SETTLE_TIMEOUT_S = 10.0


@dataclass(frozen=True, slots=True)
class Plan:
    request: GenerationRequest
    cancel_after: int | None  # chunks to read before cancelling; None: read to the end
    by_api: bool  # cancel with engine.cancel() rather than by leaving the stream


def make_plan(rng: random.Random, max_patches: int | None, cancel_fraction: float) -> Plan:
    text = " ".join(rng.choices(SENTENCES, k=rng.randint(1, 4)))
    params = GenerationParams(seed=rng.randrange(2**31), max_patches=max_patches)
    cancel = rng.random() < cancel_fraction
    return Plan(GenerationRequest(text=text, params=params), rng.randint(1, 3) if cancel else None, rng.random() < 0.5)


async def run(engine: AsyncEngine, plan: Plan) -> bool:
    """Consume one request as planned. True if it was cancelled before its last chunk."""
    received = 0
    # aclosing(): leaving the loop closes the generator now (which cancels the request), not whenever it is collected.
    async with contextlib.aclosing(engine.generate(plan.request)) as stream:
        async for chunk in stream:
            if chunk.finish_reason is not None:
                return False  # finished before (or while) it was cancelled
            received += 1
            if received == plan.cancel_after:
                if not plan.by_api:
                    return True
                engine.cancel(plan.request.request_id)  # the stream then ends without a last chunk
    assert plan.cancel_after is not None, "a stream ended without its last chunk"
    return True


async def settled(engine: AsyncEngine) -> EngineStats:
    """The engine's stats once it is idle: cancels take effect at its next step boundary, after our streams ended.
    Gives up after SETTLE_TIMEOUT_S so that a leak shows as blocks still taken instead of a hang."""
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    while True:
        stats = engine.stats()
        idle = stats.running == stats.waiting == stats.paused == 0 and stats.kv_blocks_free == stats.kv_blocks_total
        if idle or time.monotonic() > deadline:
            return stats
        await asyncio.sleep(0.01)


def rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def spread(values: list[float]) -> dict[str, float]:
    return {"first": values[0], "last": values[-1], "max": max(values)}


async def soak(args: argparse.Namespace, model: str) -> None:
    cuda = torch.cuda.is_available() and args.device != "cpu"
    gpu = None if args.device == "auto" else args.device  # None: the current CUDA device
    # The reference's text-length cap on the GPU; a few patches per request keep the CPU run short.
    max_patches = 8 if args.max_patches is None and not cuda else args.max_patches
    engine = AsyncEngine(EngineConfig(model=model, device=args.device, max_num_seqs=args.concurrency))
    await engine.start()
    rng = random.Random(args.seed)
    samples: list[dict[str, float]] = []
    allocated: list[int] = []  # bytes after each wave, for the flatness test
    done = cancelled = 0
    for wave, first in enumerate(range(0, args.requests, args.concurrency), start=1):
        plans = [
            make_plan(rng, max_patches, args.cancel_fraction)
            for _ in range(min(args.concurrency, args.requests - first))
        ]
        started = time.perf_counter()
        outcomes = await asyncio.gather(*(run(engine, plan) for plan in plans))
        wall = time.perf_counter() - started
        stats = await settled(engine)
        done += len(plans)
        cancelled += sum(outcomes)
        sample: dict[str, float] = {"rss_mib": round(rss_bytes() / MIB, 2)}
        if cuda:
            allocated.append(torch.cuda.memory_allocated(gpu))
            sample["gpu_allocated_mib"] = round(allocated[-1] / MIB, 2)
            sample["gpu_reserved_mib"] = round(torch.cuda.memory_reserved(gpu) / MIB, 2)
        samples.append(sample)
        line = {
            "wave": wave,
            "requests": done,
            "cancelled": sum(outcomes),
            "wall_s": round(wall, 2),
            **sample,
            "kv_blocks_free": stats.kv_blocks_free,
            "kv_blocks_total": stats.kv_blocks_total,
        }
        print(json.dumps(line), flush=True)
    await engine.close()
    flat = stats.kv_blocks_free == stats.kv_blocks_total
    if cuda:
        flat = flat and abs(allocated[-1] - allocated[0]) <= FLAT_TOLERANCE_BYTES
    summary = {
        "summary": True,
        "device": args.device if args.device != "auto" else "cuda" if cuda else "cpu",
        "model": engine.info.name,
        "max_patches": max_patches,
        "concurrency": args.concurrency,
        "waves": len(samples),
        "requests": done,
        "cancelled": cancelled,
        **{key: spread([s[key] for s in samples]) for key in samples[0]},
        "kv_blocks_free_end": stats.kv_blocks_free,
        "kv_blocks_total": stats.kv_blocks_total,
        "flat": flat,
    }
    print(json.dumps(summary), flush=True)


def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        model = args.model
        if model is None:
            from engine.models.voxcpm.make_checkpoint import make_checkpoint

            model = str(make_checkpoint("voxcpm2", "tiny", Path(scratch) / "tiny"))
        asyncio.run(soak(args, model))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="checkpoint; default: a freshly generated tiny random one")
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N")
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=64, help="requests per wave (and engine slots)")
    parser.add_argument("--max-patches", type=int, help="cap per request; default the reference's on cuda, else 8")
    parser.add_argument("--cancel-fraction", type=float, default=0.1, help="share of requests cancelled mid-stream")
    parser.add_argument("--seed", type=int, default=0, help="texts, cancels and noise")
    main(parser.parse_args())
