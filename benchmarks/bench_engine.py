"""Engine throughput and latency: a burst of `c` simultaneous requests of a fixed number of patches.

Use a checkpoint whose stop head never fires (`make_checkpoint --no-stop`) so that every request runs
exactly --steps patches, as the anchor runner (../shared/anchor/bench_nanovllm.py) does. Prints one
JSON line per concurrency level with the anchor runner's keys plus the GPU memory held.

    python benchmarks/bench_engine.py --model CKPT --steps 60 --concurrency 1 8 32 64 128 256

With `--outliers K --outlier-timesteps N`, K requests of every burst ask for N Euler steps instead of the
default 10: the line then also gives the others' RTF p90 and TTFB p50 (`others_*`), which shows what such a
request costs the rest of the batch.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import statistics
import time

import torch

from engine import AsyncEngine, EngineConfig, GenerationParams, GenerationRequest

TEXT = "The quick brown fox jumps over the lazy dog while the weather report plays on the radio in the kitchen."


def percentile(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(p / 100 * (len(xs) - 1)))]


async def one(
    engine: AsyncEngine, steps: int, sample_rate: int, timesteps: int | None = None
) -> tuple[float, float, float]:
    params = GenerationParams(seed=1, max_patches=steps, min_patches=steps)
    if timesteps is not None:
        params = dataclasses.replace(params, inference_timesteps=timesteps)
    t0 = time.perf_counter()
    ttfb = None
    samples = 0
    async for chunk in engine.generate(GenerationRequest(text=TEXT, params=params)):
        if ttfb is None:
            ttfb = time.perf_counter() - t0
        samples += len(chunk.samples)
    wall = time.perf_counter() - t0
    assert ttfb is not None
    return ttfb, wall, samples / sample_rate


async def main(args: argparse.Namespace) -> None:
    config = EngineConfig(
        model=args.model,
        device=args.device,
        max_num_seqs=args.max_num_seqs,
        max_model_len=args.max_model_len,
        enforce_eager=args.eager,
    )
    engine = AsyncEngine(config)
    await engine.start()
    sample_rate = engine.info.sample_rate
    print(json.dumps({"engine": "voxstream", "model_info": engine.info.name, "sample_rate": sample_rate}), flush=True)
    for _ in range(args.warmup):
        await asyncio.gather(*[one(engine, args.steps, sample_rate) for _ in range(8)])
    cuda = torch.cuda.is_available() and config.device != "cpu"
    for c in args.concurrency:
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        outliers = min(args.outliers, c)
        timesteps = [args.outlier_timesteps] * outliers + [None] * (c - outliers)
        results = await asyncio.gather(*[one(engine, args.steps, sample_rate, n) for n in timesteps])
        wall = time.perf_counter() - t0
        ttfb = [r[0] for r in results]
        rtf = [r[1] / r[2] for r in results]
        audio = sum(r[2] for r in results)
        line = {
            "engine": "voxstream",
            "concurrency": c,
            "requests": len(results),
            "ttfb_p50_ms": round(1000 * percentile(ttfb, 50), 1),
            "ttfb_p90_ms": round(1000 * percentile(ttfb, 90), 1),
            "rtf_mean": round(statistics.mean(rtf), 4),
            "rtf_p90": round(percentile(rtf, 90), 4),
            "audio_s_per_req": round(results[0][2], 2),
            "xrt_aggregate": round(audio / wall, 2),
        }
        if outliers:
            others = results[outliers:] or results
            line |= {
                "outliers": outliers,
                "outlier_timesteps": args.outlier_timesteps,
                "others_ttfb_p50_ms": round(1000 * percentile([r[0] for r in others], 50), 1),
                "others_rtf_p90": round(percentile([r[1] / r[2] for r in others], 90), 4),
            }
        if cuda:
            line["gpu_mem_reserved_gib"] = round(torch.cuda.memory_reserved() / 2**30, 2)
            line["gpu_mem_peak_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
        print(json.dumps(line), flush=True)
    await engine.close()


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True)
    p.add_argument("--device", default="auto")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32, 64, 128, 256])
    p.add_argument("--max-num-seqs", type=int, default=512)
    p.add_argument("--max-model-len", type=int, default=1024)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--eager", action="store_true")
    p.add_argument("--outliers", type=int, default=0, help="requests per burst with --outlier-timesteps")
    p.add_argument("--outlier-timesteps", type=int, default=30)
    asyncio.run(main(p.parse_args()))
