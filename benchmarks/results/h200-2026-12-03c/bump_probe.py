"""The third decode step after a B=1,024 admission (+11-15 ms in bench_engine's traces): does EngineCore alone, with no
consumers, show it, and if so which kernels take the time? Burst 1 times every step; burst 2 profiles the admission
and the five decode steps after it (per-step GPU busy time, the kernels that grew against the step before)."""

from __future__ import annotations

import argparse
import collections
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from benchmarks.bench_engine import TEXT
from benchmarks.step_timeline import _timeline
from engine import EngineConfig, GenerationParams, GenerationRequest
from engine.engine_core import EngineCore
from engine.process import settle_for_serving


def add_burst(core: EngineCore, tag: str, batch: int, steps: int) -> None:
    params = GenerationParams(seed=1, max_patches=steps, min_patches=steps)
    for i in range(batch):
        core.add_request(GenerationRequest(text=TEXT, params=params, request_id=f"{tag}-{i}"))


@torch.inference_mode()
def main(args: argparse.Namespace) -> None:
    config = EngineConfig(
        model=args.model,
        max_num_seqs=args.batch,
        max_model_len=1024,
        fp8_gemms=True,
        fp8_backbone=True,
        fp8_backbone_min_rows=8192,
    )
    core = EngineCore(config)
    core.runner.warm_up()
    add_burst(core, "warm", 8, 4)
    while core.has_work():
        core.step()
    settle_for_serving()
    print(json.dumps({"gpu": torch.cuda.get_device_name()}), flush=True)
    for burst in range(2):
        add_burst(core, f"b{burst}", args.batch, args.steps)
        times = []
        while core.has_work():
            t0 = time.perf_counter()
            core.step()
            times.append(round(1e3 * (time.perf_counter() - t0), 2))
        print(json.dumps({"burst": burst, "first_steps_ms": times[:10], "last_steps_ms": times[-3:]}), flush=True)
    add_burst(core, "prof", args.batch, args.steps)
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as prof:
        for i in range(6):
            with torch.profiler.record_function(f"engine_step_{i}"):
                core.step()
    for request_id in list(core.scheduler.requests):
        core.abort(request_id)
    events = prof.events()
    windows = {e.name: (e.time_range.start, e.time_range.end) for e in events if e.name.startswith("engine_step_")}
    device = sorted(
        (e.time_range.start, e.time_range.end, e.name)
        for e in events
        if e.device_type == torch.autograd.DeviceType.CUDA and not e.name.startswith("engine_step_")
    )
    totals = []
    for i in range(6):
        start, end = windows[f"engine_step_{i}"]
        line = _timeline((start, end), device)
        kernels: collections.Counter[str] = collections.Counter()
        for s, e, name in device:
            if start <= s < end:
                kernels[name[:90]] += (e - s) / 1e3
        totals.append(kernels)
        line.pop("largest_gaps")
        print(json.dumps({"step": i, **{k: round(v, 3) for k, v in line.items()}, "kernels": len(kernels)}))
    for i in (3, 4):
        diff = {k: round(totals[i][k] - totals[2][k], 3) for k in set(totals[i]) | set(totals[2])}
        top = sorted(diff.items(), key=lambda kv: -abs(kv[1]))[:12]
        print(json.dumps({"step": i, "against_step": 2, "kernel_ms_diff": top}))


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--model", required=True)
    p.add_argument("--batch", type=int, default=1024)
    p.add_argument("--steps", type=int, default=60)
    main(p.parse_args())
