"""The LoRA low-rank update at VoxCPM2's shapes, kernel by kernel (CUDA only): one JSON line per targeted linear shape,
then one line per step.

    python benchmarks/lora_kernels.py [--baseline OLD_TRITON_OPS.py] [--batch 256] [--max-loras 8]
        [--pool-rank 32] [--adapter-rank 8] [--timesteps 10]

The shapes are those of a decode step at batch B with the engine's default LoRA modules: the LMs' q/k/v (fused) and
o over B positions, the projections over B rows, and the LocDiT's q/k/v and o over its CFG batch (2B rows of
mu_tokens + 1 + 2 x patch tokens), called timesteps - 1 times a step. Every row uses one of max_loras adapters
round-robin (as bench_engine.py --loras spreads them), rank-`adapter-rank` adapters in a pool of width
`pool-rank` per part. Times are CUDA-graph replays (no launch gaps, as in the engine), median per call, microseconds:
- base_us: the linear's own GEMM, for scale;
- new_us: this tree's kernels (lora_add_ with the rows grouped beforehand) at the default tile sizes
  (triton_ops.LORA_BLOCKS), and new_us_by_blocks for each (shrink, expand) BLOCK_M;
- old_us: `--baseline`, a triton_ops.py of an earlier revision (its lora_add_ takes the per-row index), plus the
  index expansion the LoRALinear of that revision did per linear;
- group_us (per layout): expanding the layout's index and grouping the rows, once per forward;
- rel_err: this tree's result against the torch twin.
The step line sums them over a step: lora_ms_new / lora_ms_old, base_ms the GEMMs they ride on.

To compare with the per-slot grid kernels (before rows were grouped by slot), first write them out in the repo:
    git show bda9d50:engine/kernels/triton_ops.py > lora_baseline_ops.py
"""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import json
import statistics
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import torch
import torch.nn.functional as F

from engine import kernels
from engine.kernels import triton_ops
from engine.models.voxcpm.config import parse_config
from engine.models.voxcpm.lora import DEFAULT_MODULES, lora_sites
from engine.models.voxcpm.make_checkpoint import make_config
from engine.models.voxcpm.model import VoxCPMModel

BLOCKS = (16, 32, 64)
DEVICE, DTYPE = "cuda", torch.bfloat16


def graph_us(fn: Callable[[], object], reps: int = 20, iters: int = 10) -> float:
    """Median time of one fn call, from replays of a CUDA graph of `reps` calls (warmed up on a side stream)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(reps):
            fn()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000 / reps)
    return round(statistics.median(times), 2)


def load_baseline(path: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location("lora_baseline_ops", Path(path).resolve())
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def shapes(served: tuple[str, ...]) -> tuple[Counter[tuple[str, int, int, int]], int]:
    """(layout, in, out, parts) -> linears per forward, for VoxCPM2 with `served` modules; and the LocDiT's tokens."""
    with torch.device("meta"):
        model = VoxCPMModel(parse_config(make_config("voxcpm2", "full")))
    counts: Counter[tuple[str, int, int, int]] = Counter()
    for site in lora_sites(model):
        parts = [p for p in site.parts if p.path.rsplit(".", 1)[-1] in served]
        if parts:
            out = model.get_submodule(site.module).out_features
            counts[(site.rows, site.in_features, out, len(parts))] += 1
    estimator = model.feat_decoder.estimator
    return counts, estimator.mu_tokens + 1 + 2 * model.config.patch_size


def pool(slots: int, parts: int, args: argparse.Namespace, k: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A and B of `slots` slots (slot 0 zero), each part's first adapter-rank rows of its pool-rank block used."""
    a = torch.zeros(slots, parts * args.pool_rank, k, device=DEVICE, dtype=DTYPE)
    b = torch.zeros(slots, parts * args.pool_rank, n, device=DEVICE, dtype=DTYPE)
    for j in range(parts):
        used = slice(j * args.pool_rank, j * args.pool_rank + args.adapter_rank)
        a[1:, used] = torch.randn(slots - 1, args.adapter_rank, k, device=DEVICE, dtype=DTYPE) / k**0.5
        b[1:, used] = torch.randn(slots - 1, args.adapter_rank, n, device=DEVICE, dtype=DTYPE) * 0.05
    return a, b


def main(args: argparse.Namespace) -> None:
    old = load_baseline(args.baseline) if args.baseline else None
    counts, dit_tokens = shapes(DEFAULT_MODULES)  # the engine's default lora_modules
    slots = args.max_loras + 1
    batch = args.batch
    per_seq = (torch.arange(batch, device=DEVICE) % args.max_loras + 1).int()  # round-robin, as bench_engine
    layouts = {  # index as the model sets it, the input's rows, forwards per step
        "tokens": (per_seq, (batch,), 1),  # a decode step: one position per sequence
        "audio": (per_seq, (batch,), 1),
        "seqs": (per_seq, (batch,), 1),
        "dit": (torch.cat((per_seq, per_seq)), (2 * batch, dit_tokens), args.timesteps - 1),
    }
    step = {"lora_ms_new": 0.0, "lora_ms_old": 0.0, "base_ms": 0.0}
    for layout, (index, lead, forwards) in layouts.items():

        def expand(index: torch.Tensor = index, lead: tuple[int, ...] = lead) -> torch.Tensor:
            return index.view(*index.shape, *(1,) * (len(lead) - index.ndim)).expand(lead).reshape(-1)

        flat = expand()
        rows = triton_ops.lora_rows(flat, slots)
        group_us = graph_us(lambda expand=expand: triton_ops.lora_rows(expand(), slots))
        if any(key[0] == layout for key in counts):
            step["lora_ms_new"] += forwards * group_us / 1000
        print(json.dumps({"layout": layout, "rows": flat.numel(), "group_us": group_us}), flush=True)
        for (where, k, n, parts), linears in sorted(counts.items()):
            if where != layout:
                continue
            m = flat.numel()
            a, b = pool(slots, parts, args, k, n)
            x = torch.randn(m, k, device=DEVICE, dtype=DTYPE)
            w = torch.randn(n, k, device=DEVICE, dtype=DTYPE) / k**0.5
            y = F.linear(x, w)
            expected = y.clone()
            kernels.lora_add_torch(expected, x, flat, a, b)
            got = y.clone()
            triton_ops.lora_add_(got, x, rows, a, b)
            rel_err = float((got.float() - expected.float()).norm() / (expected.float() - y.float()).norm())
            line = {
                "layout": layout,
                "rows": m,
                "in": k,
                "out": n,
                "width": parts * args.pool_rank,
                "calls_per_step": linears * forwards,
                "rel_err": round(rel_err, 5),
                "base_us": graph_us(lambda x=x, w=w: F.linear(x, w)),
                "new_us": graph_us(lambda x=x, y=y, a=a, b=b, r=rows: triton_ops.lora_add_(y, x, r, a, b)),
                "new_us_by_blocks": {
                    f"{blocks[0]}/{blocks[1]}": graph_us(
                        lambda x=x, y=y, a=a, b=b, r=rows, blocks=blocks: triton_ops.lora_add_(y, x, r, a, b, blocks)
                    )
                    for blocks in itertools.product(BLOCKS, BLOCKS)
                },
            }
            if old is not None:
                line["old_us"] = graph_us(lambda x=x, y=y, a=a, b=b, e=expand: old.lora_add_(y, x, e(), a, b))
                step["lora_ms_old"] += line["calls_per_step"] * line["old_us"] / 1000
            step["lora_ms_new"] += line["calls_per_step"] * line["new_us"] / 1000
            step["base_ms"] += line["calls_per_step"] * line["base_us"] / 1000
            print(json.dumps(line), flush=True)
    if old is None:
        del step["lora_ms_old"]
    gpu = torch.cuda.get_device_name()
    print(json.dumps({"step": f"decode, B={batch}", "gpu": gpu, **{k: round(v, 3) for k, v in step.items()}}))


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--baseline", help="an earlier revision's engine/kernels/triton_ops.py to time against")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--max-loras", type=int, default=8)
    p.add_argument("--pool-rank", type=int, default=32, help="max LoRA rank: the pool's width per part")
    p.add_argument("--adapter-rank", type=int, default=8)
    p.add_argument("--timesteps", type=int, default=10, help="Euler steps: timesteps - 1 LocDiT calls a step")
    main(p.parse_args())
