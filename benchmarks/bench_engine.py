"""Engine throughput and latency: a burst of `c` simultaneous requests of a fixed number of patches.

Use a checkpoint whose stop head never fires (`make_checkpoint --no-stop`) so that every request runs
exactly --steps patches, as the anchor runner (../shared/anchor/bench_nanovllm.py) does. Prints one
JSON line per concurrency level with the anchor runner's keys plus the GPU memory held.

    python benchmarks/bench_engine.py --model CKPT --steps 60 --concurrency 1 8 32 64 128 256

Qwen3-TTS checkpoints (a random one: `python -m engine.models.qwen3tts.make_checkpoint --variant customvoice-0.6b
--size full --out DIR`) need no such variant: every request asks for min_patches = --steps, which masks the codec
EOS, so each runs exactly --steps frames of 80 ms (plain text: CustomVoice's default speaker).

With `--outliers K --outlier-timesteps N`, K requests of every burst ask for N Euler steps instead of the
default 10: the line then also gives the others' RTF p90 and TTFB p50 (`others_*`), which shows what such a
request costs the rest of the batch.

With `--loras N` the engine holds N random LoRA adapters (rank --lora-rank, on the LM and LocDiT attention, made by
engine.lora.make_adapter) and the requests of a burst use them round-robin, so every step mixes them; `--loras 0
--max-loras 8` measures the LoRA pool's cost when no request uses it. `--hot-load` loads (then unloads) one more
adapter in the middle of every burst. Every line gives the worst gap between two chunks of a stream
(`gap_max_ms`), which a stall of the engine loop shows in.

    python benchmarks/bench_engine.py --model CKPT --steps 60 --concurrency 256                  # no LoRA
    python benchmarks/bench_engine.py --model CKPT --steps 60 --concurrency 256 --loras 8        # 8 mixed
    python benchmarks/bench_engine.py --model CKPT --steps 60 --concurrency 256 --loras 8 --hot-load

`--fp8-gemms on` runs the LocDiT's GEMMs in FP8 (EngineConfig.fp8_gemms), `--fp8-backbone on` the LocEnc's and
LMs' (EngineConfig.fp8_backbone), from `--fp8-backbone-min-rows` rows per call where given; every line says which
(`fp8_gemms`, `fp8_backbone`, `fp8_backbone_min_rows`).
`--pace-admissions off` turns the engine's admission pacing (engine/pacing.py) off, for an A/B of a burst's gaps and
TTFB; every line says which (`pace_admissions`).
Once the engine has warmed up, the bench settles its process as the server's engine process does before its first
request (engine.process.settle_for_serving: what exists leaves the collector's scans, the GIL's switch interval
shortens); `--settle off` leaves Python's defaults, as the bench had them up to the 2026-12-03 results; every line
says which (`settle`), and at which switch interval (`--switch-interval-us`, `switch_interval_us`).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

from engine import AsyncEngine, EngineConfig, GenerationParams, GenerationRequest
from engine.process import SWITCH_INTERVAL_S, settle_for_serving

TEXT = "The quick brown fox jumps over the lazy dog while the weather report plays on the radio in the kitchen."


def percentile(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(p / 100 * (len(xs) - 1)))]


async def one(
    engine: AsyncEngine,
    text: str,
    steps: int,
    sample_rate: int,
    timesteps: int | None = None,
    lora: str | None = None,
) -> tuple[float, float, float, float]:
    params = GenerationParams(seed=1, max_patches=steps, min_patches=steps, lora=lora)
    if timesteps is not None:
        params = dataclasses.replace(params, inference_timesteps=timesteps)
    t0 = time.perf_counter()
    ttfb = None
    samples = 0
    last, gap = t0, 0.0
    async for chunk in engine.generate(GenerationRequest(text=text, params=params)):
        now = time.perf_counter()
        if ttfb is None:
            ttfb = now - t0
        else:
            gap = max(gap, now - last)
        last = now
        samples += len(chunk.samples)
    wall = time.perf_counter() - t0
    assert ttfb is not None
    return ttfb, wall, samples / sample_rate, gap


async def hot_load(engine: AsyncEngine, directory: Path, delay_s: float) -> None:
    """Load and then unload an adapter that no request uses, while the burst runs."""
    await asyncio.sleep(delay_s)
    await engine.load_lora("hot", directory)
    await asyncio.sleep(delay_s)
    await engine.unload_lora("hot")


async def main(args: argparse.Namespace) -> None:
    config = EngineConfig(
        model=args.model,
        device=args.device,
        max_num_seqs=args.max_num_seqs,
        max_model_len=args.max_model_len,
        enforce_eager=args.eager,
        max_loras=max(args.max_loras, args.loras + args.hot_load),
        max_lora_rank=args.lora_rank,
        **({} if args.prefill_graph_tokens is None else {"prefill_graph_tokens": args.prefill_graph_tokens}),
        pace_admissions=args.pace_admissions == "on",
        fp8_gemms=args.fp8_gemms == "on",
        fp8_backbone=args.fp8_backbone == "on",
        fp8_backbone_min_rows=args.fp8_backbone_min_rows,
        pacing_margin_ms=args.pacing_margin_ms,
        max_prefill_tokens=args.max_prefill_tokens,
        idle_prefill_tokens=args.idle_prefill_tokens,
        prefill_ahead_tokens=args.prefill_ahead_tokens,
        coalesce_ms=args.coalesce_ms,
        coalesce_max_ms=args.coalesce_max_ms,
        pacing_max_hold_ms=args.pacing_max_hold_ms,
        step_trace=args.step_trace,
    )
    engine = AsyncEngine(config)
    await engine.start()
    if args.settle == "on":
        settle_for_serving(args.switch_interval_us / 1e6)
    from engine.lora.make_adapter import make_adapter

    scratch = Path(tempfile.mkdtemp(prefix="bench-loras-"))
    names = [f"lora{i}" for i in range(args.loras)]
    for i, name in enumerate(names):
        await engine.load_lora(name, make_adapter(args.model, scratch / name, rank=args.lora_rank, seed=i))
    hot = make_adapter(args.model, scratch / "hot", rank=args.lora_rank, seed=99) if args.hot_load else None
    sample_rate = engine.info.sample_rate
    info = engine.info
    header = {"engine": "voxstream", "model_info": info.name, "family": info.family, "architecture": info.architecture}
    settings = {
        "enforce_eager": config.enforce_eager,
        "prefill_graph_tokens": config.prefill_graph_tokens,
        "fp8_gemms": config.fp8_gemms,
        "fp8_backbone": config.fp8_backbone,
        "fp8_backbone_min_rows": config.fp8_backbone_min_rows,
        "max_prefill_tokens": config.max_prefill_tokens,
        "idle_prefill_tokens": config.idle_prefill_budget,
        "prefill_ahead_tokens": config.prefill_ahead_tokens,
        "prompt_positions": engine.core.make_sequence(GenerationRequest(text=args.text)).num_prompt,
        "settle": args.settle == "on",
        "switch_interval_us": args.switch_interval_us if args.settle == "on" else None,
    }
    print(json.dumps(header | {"sample_rate": sample_rate} | settings), flush=True)
    for _ in range(args.warmup):
        await asyncio.gather(*[one(engine, args.text, args.steps, sample_rate) for _ in range(8)])
    cuda = torch.cuda.is_available() and config.device != "cpu"
    for c in args.concurrency:
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        outliers = min(args.outliers, c)
        timesteps = [args.outlier_timesteps] * outliers + [None] * (c - outliers)
        loras = [names[i % len(names)] if names else None for i in range(c)]
        hot_task = asyncio.create_task(hot_load(engine, hot, args.hot_load_delay_s)) if hot else None
        results = await asyncio.gather(
            *[
                one(engine, args.text, args.steps, sample_rate, n, lora)
                for n, lora in zip(timesteps, loras, strict=True)
            ]
        )
        wall = time.perf_counter() - t0
        if hot_task is not None:
            await hot_task
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
            "gap_max_ms": round(1000 * max(r[3] for r in results), 1),
            "loras": len(names),
            "max_loras": config.max_loras,
            "hot_load": hot is not None,
            "pace_admissions": config.pace_admissions,
            "pacing_margin_ms": config.pacing_margin_ms,
            "fp8_gemms": config.fp8_gemms,
            "fp8_backbone": config.fp8_backbone,
            "fp8_backbone_min_rows": config.fp8_backbone_min_rows,
            "prefill_ahead_tokens": config.prefill_ahead_tokens,
            "coalesce_ms": config.coalesce_ms,
            "coalesce_max_ms": config.coalesce_max_ms,
            "settle": args.settle == "on",
            "switch_interval_us": args.switch_interval_us if args.settle == "on" else None,
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
    p.add_argument(
        "--prefill-graph-tokens",
        type=int,
        help="admissions replay prefill graphs up to this many prompt positions (default: the engine's; 0: eager)",
    )
    p.add_argument("--outliers", type=int, default=0, help="requests per burst with --outlier-timesteps")
    p.add_argument("--outlier-timesteps", type=int, default=30)
    p.add_argument("--loras", type=int, default=0, help="random LoRA adapters the requests use round-robin")
    p.add_argument("--max-loras", type=int, default=0, help="LoRA pool size (default: what --loras needs)")
    p.add_argument("--lora-rank", type=int, default=32)
    p.add_argument("--hot-load", action="store_true", help="load and unload one more adapter during each burst")
    p.add_argument("--hot-load-delay-s", type=float, default=2.0)
    p.add_argument("--pace-admissions", choices=["on", "off"], default="off", help="engine admission pacing (A/B)")
    p.add_argument("--fp8-gemms", choices=["on", "off"], default="off", help="VoxCPM: the LocDiT's GEMMs in FP8")
    p.add_argument("--fp8-backbone", choices=["on", "off"], default="off", help="VoxCPM: the LocEnc's, LMs' too")
    p.add_argument(
        "--fp8-backbone-min-rows", type=int, default=0, help="the backbone's FP8 from this many rows (0: FP8_MIN_ROWS)"
    )
    engine_defaults = EngineConfig(model="")
    p.add_argument("--pacing-margin-ms", type=float, default=engine_defaults.pacing_margin_ms)
    p.add_argument("--pacing-max-hold-ms", type=float, default=engine_defaults.pacing_max_hold_ms)
    p.add_argument("--step-trace", default="", help="append one JSON line per engine step to this file")
    p.add_argument("--max-prefill-tokens", type=int, default=engine_defaults.max_prefill_tokens)
    p.add_argument("--idle-prefill-tokens", type=int, default=engine_defaults.idle_prefill_tokens)
    # 0: a burst's window waits for all of it before any prefill, as the bench did up to the 2026-12-07 results.
    p.add_argument("--prefill-ahead-tokens", type=int, default=engine_defaults.prefill_ahead_tokens)
    # The server's defaults are 5 and 150 (wsserver.config), the engine's alone 1 and 20.
    p.add_argument("--coalesce-ms", type=float, default=engine_defaults.coalesce_ms)
    p.add_argument("--coalesce-max-ms", type=float, default=engine_defaults.coalesce_max_ms)
    p.add_argument(
        "--settle",
        choices=["on", "off"],
        default="on",
        help="settle the warmed-up process as the server's engine process does (engine.process.settle_for_serving)",
    )
    p.add_argument(
        "--switch-interval-us",
        type=float,
        default=SWITCH_INTERVAL_S * 1e6,
        help="the GIL's switch interval once settled (the engine process's: engine.process.SWITCH_INTERVAL_S)",
    )
    p.add_argument("--text", default=TEXT, help="every request's text (the prompt's length is the admissions' cost)")
    asyncio.run(main(p.parse_args()))
