"""A steady decode step on the GPU's timeline: of EngineCore.step()'s wall time, how much the GPU is busy and where it
idles: before its first kernel (scheduling, the first launch), between kernels (launches behind, graph boundaries),
after its last (the host's wait, postprocessing, the chunks); and the VAE graph's time. One JSON line per batch
(CUDA only). `--cudnn-benchmark` lets cuDNN time its algorithms for each convolution shape (the graphs are captured
with what it picks).

    python3 benchmarks/step_timeline.py --model CKPT --batch 1024 --fp8-gemms on [--cudnn-benchmark]

Keys (milliseconds, medians over the profiled steps): wall, busy (the union of the GPU's kernel and copy intervals),
lead, gaps, tail (idle before, between, after them), largest_gaps (the longest idle intervals, with the kernels on
either side), step_ms (EngineCore.step() unprofiled, median), vae (the streaming VAE decode's graph, as profile_step).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.profile_step import TEXT, graph_ms
from engine import EngineConfig, GenerationParams, GenerationRequest
from engine.engine_core import EngineCore


def _admit(core: EngineCore, batch: int) -> None:
    patches = core.config.max_model_len // 2  # no request finishes while measured
    params = GenerationParams(seed=1, max_patches=patches, min_patches=patches)
    for i in range(batch):
        core.add_request(GenerationRequest(text=TEXT, params=params, request_id=f"t{batch}-{i}"))
    while core.scheduler.waiting or any(seq.is_prefill for seq in core.scheduler.running):
        core.step()


def _timeline(window: tuple[float, float], device: list[tuple[float, float, str]]) -> dict[str, object]:
    """Idle and busy time of one step's window (us) given the device's (start, end, name) intervals, sorted."""
    start, end = window
    inside = [(max(s, start), min(e, end), name) for s, e, name in device if e > start and s < end]
    busy, gaps, cursor, previous = 0.0, [], start, "step start"
    for s, e, name in inside:
        if s > cursor:
            gaps.append((s - cursor, previous, name))
        busy += max(0.0, e - max(s, cursor))
        if e > cursor:
            cursor, previous = e, name
    lead = gaps.pop(0)[0] if gaps and gaps[0][1] == "step start" else 0.0
    return {
        "wall": (end - start) / 1e3,
        "busy": busy / 1e3,
        "lead": lead / 1e3,
        "gaps": sum(g[0] for g in gaps) / 1e3,
        "tail": (end - cursor) / 1e3,
        "largest_gaps": [[round(g / 1e3, 3), before[:60], after[:60]] for g, before, after in sorted(gaps)[-5:]],
    }


def profile(core: EngineCore, batch: int, steps: int) -> dict[str, object]:
    _admit(core, batch)
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        core.step()
        times.append(1e3 * (time.perf_counter() - t0))
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as prof:
        for _ in range(3):
            with torch.profiler.record_function("engine_step"):
                core.step()
    events = prof.events()
    windows = [(e.time_range.start, e.time_range.end) for e in events if e.name == "engine_step"]
    device = sorted(
        (e.time_range.start, e.time_range.end, e.name)
        for e in events
        if e.device_type == torch.autograd.DeviceType.CUDA and e.name != "engine_step"
    )
    lines = [_timeline(window, device) for window in windows]
    line: dict[str, object] = {"batch": batch, "step_ms": round(statistics.median(times), 2)}
    for key in ("wall", "busy", "lead", "gaps", "tail"):
        line[key] = round(statistics.median(float(t[key]) for t in lines), 3)  # type: ignore[arg-type]
    line["largest_gaps"] = lines[len(lines) // 2]["largest_gaps"]
    runner = core.runner
    seqs = list(core.scheduler.running)
    slots = torch.tensor([seq.slot for seq in seqs], device=runner.device)
    latents = torch.randn(len(seqs), runner.feat_dim, runner.patch_size, device=runner.device)
    line["vae"] = round(graph_ms(lambda: runner.vae_decoder.decode(slots, latents)), 2)
    for seq in seqs:
        core.abort(seq.request_id)
    return line


@torch.inference_mode()
def main(args: argparse.Namespace) -> None:
    torch.backends.cudnn.benchmark = args.cudnn_benchmark
    config = EngineConfig(
        model=args.model, max_num_seqs=max(args.batch), max_model_len=1024, fp8_gemms=args.fp8_gemms == "on"
    )
    core = EngineCore(config)
    print(json.dumps({"gpu": torch.cuda.get_device_name(), "cudnn_benchmark": args.cudnn_benchmark}))
    for batch in args.batch:
        print(json.dumps(profile(core, batch, args.steps)), flush=True)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--batch", type=int, nargs="+", default=[1024])
    p.add_argument("--steps", type=int, default=6, help="unprofiled steady steps timed first")
    p.add_argument("--fp8-gemms", choices=["on", "off"], default="off", help="the LocDiT's GEMMs in FP8")
    p.add_argument("--cudnn-benchmark", action="store_true", help="cuDNN times its algorithms per shape")
    main(p.parse_args())
