"""Launch configurations of the few-rows GEMM kernel (engine.kernels.triton_ops._few_rows_kernel) at one stream's
shapes, against cuBLAS and against the configuration the engine launches: for a per-shape table.

The engine launches every few-rows GEMM with 64 output features a program and splits K in four where N <= 2,048 and
K >= 2,048 (`few_rows_linear`). The fourteenth session's sweep (benchmarks/results/h200-2026-11-29b, call 2) found 32
features a program best at four of the eight VoxCPM2 shapes and did not print the other configurations; this prints
all of them (CUDA only). Each figure is a CUDA graph of one launch per copy of the weight, 256 MB of copies, so that
every launch reads its weight from memory as in a step (the fifteenth session's first run, h200-2026-11-29c call 1,
replayed 10 launches of one weight, which then came from L2, and stopped at a configuration needing more shared memory
than the GPU has; such configurations are now left out):

    python3 benchmarks/few_rows_configs.py [--rows 1 8 22 32]

One JSON line per shape and row count: cuBLAS's time, the engine's configuration's, the best and every configuration
(BN, SPLIT -> microseconds); gated shapes (gate/up with SiLU*mul) compare with cuBLAS's product plus silu_mul.
"""

from __future__ import annotations

import argparse
import functools
import json
from collections.abc import Callable

import torch
import torch.nn.functional as F
import triton

from benchmarks.profile_step import graph_ms
from engine import kernels
from engine.kernels import triton_ops

FLUSH_BYTES = 256 << 20  # each timed graph streams this much weight: several copies, more than the H200's 50 MB L2
# name: (K, N, gated). VoxCPM2's LMs (hidden 2,048) and LocDiT (1,024); Qwen3-TTS 0.6B's talker and code predictor
# (hidden 1,024, 16 heads of 128 and 8 kv heads, MLP 3,072), and its code predictor's LM heads (2,048 codes).
SHAPES = {
    "voxcpm2_lm_qkv": (2048, 2560, False),
    "voxcpm2_lm_o": (2048, 2048, False),
    "voxcpm2_lm_gate_up": (2048, 2 * 6144, True),
    "voxcpm2_lm_down": (6144, 2048, False),
    "voxcpm2_dit_qkv": (1024, 2560, False),
    "voxcpm2_dit_o": (2048, 1024, False),
    "voxcpm2_dit_gate_up": (1024, 2 * 4096, True),
    "voxcpm2_dit_down": (4096, 1024, False),
    "qwen3_qkv": (1024, 4096, False),
    "qwen3_o": (2048, 1024, False),
    "qwen3_gate_up": (1024, 2 * 3072, True),
    "qwen3_down": (3072, 1024, False),
    "qwen3_predictor_head": (1024, 2048, False),
}


def scratch(rows: int, n: int, bn: int, split: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A split launch's partials and arrival counts (few_rows_linear keeps one pair per shape)."""
    bm = max(16, triton.next_power_of_2(rows))
    return (
        torch.empty(split * n * bm, device="cuda", dtype=torch.float32),
        torch.zeros(n // bn, device="cuda", dtype=torch.int32),
    )


def launch(
    x: torch.Tensor, gated: bool, bn: int, split: int, part: torch.Tensor, count: torch.Tensor, weight: torch.Tensor
) -> torch.Tensor:
    """One launch of the engine's kernel as few_rows_linear makes it, with BN and SPLIT chosen here."""
    rows, k = x.shape
    n = weight.shape[0] // 2 if gated else weight.shape[0]
    y = torch.empty(rows, n, device=x.device, dtype=x.dtype)
    bm = max(16, triton.next_power_of_2(rows))
    triton_ops._few_rows_kernel[(n // bn, split)](
        x, weight, y, part, count, rows, n, k, k, n,
        BM=bm, BN=bn, BK=triton_ops._FEW_ROWS_BK, SPLIT=split, GATED=gated, num_warps=4,
    )  # fmt: skip
    return y


def us(fn: Callable[[torch.Tensor], object], weights: list[torch.Tensor]) -> float | None:
    """Microseconds a call of fn takes, from CUDA graphs of one call per weight copy: each call reads its weight from
    memory, as in a step, where every layer has its own (one copy, replayed, would be read from L2). None: the
    configuration does not fit the GPU (shared memory)."""
    try:
        return round(graph_ms(lambda: [fn(w) for w in weights], iters=20) * 1e3 / len(weights), 2)
    except triton.runtime.errors.OutOfResources:
        return None


def cublas(x: torch.Tensor, weight: torch.Tensor, gated: bool) -> torch.Tensor:
    y = F.linear(x, weight)
    return kernels.silu_mul(y) if gated else y


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 8, 22, 32])
    args = parser.parse_args()
    print(json.dumps({"gpu": torch.cuda.get_device_name(), "triton": triton.__version__}))
    for name, (k, n, gated) in SHAPES.items():
        weight = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k**0.5
        weights = [weight.clone() for _ in range(max(2, -(-FLUSH_BYTES // (weight.numel() * weight.element_size()))))]
        half = n // 2 if gated else n
        engine = kernels.gate_up_silu if gated else kernels.linear
        for rows in args.rows:
            x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
            want = cublas(x, weight, gated).float()
            line = {"shape": name, "rows": rows, "k": k, "n": n, "gated": gated}
            line["cublas_us"] = us(lambda w: cublas(x, w, gated), weights)  # noqa: B023 (called right here)
            line["engine_us"] = us(lambda w: engine(x, w), weights)  # noqa: B023
            configs = {}
            for bn in (32, 64, 128):
                for split in (1,) if gated else (1, 2, 4, 8):
                    if half % bn or k % (split * triton_ops._FEW_ROWS_BK):
                        continue
                    run = functools.partial(launch, x, gated, bn, split, *scratch(rows, half, bn, split))
                    try:
                        got = run(weight)
                    except triton.runtime.errors.OutOfResources:
                        continue  # more shared memory than the GPU has (BN 128 with the gated form's two tiles)
                    assert float((got.float() - want).norm() / want.norm()) < 1e-2, (name, rows, bn, split)
                    configs[f"{bn},{split}"] = us(run, weights)
            best = min(configs, key=lambda c: configs[c] or float("inf"))
            print(
                json.dumps(line | {"best": best, "best_us": configs[best], "configs_bn_split_us": configs}), flush=True
            )


if __name__ == "__main__":
    main()
