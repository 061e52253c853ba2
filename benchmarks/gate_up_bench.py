"""The MLPs' gate/up GEMM with SiLU*mul and the down projection's e4m3 blocks in its epilogue
(`triton_ops.gate_up_silu_fp8`) at batch on the GPU, at the engine's launch (`GATE_UP_LAUNCH`) or, with `--sweep`,
at each of `LAUNCHES` (BM, BK, warps, stages), against cuBLAS's rowwise FP8 GEMM of the same operands with no epilogue
(what the product alone costs) and with the SiLU*mul pass that quantises its output after it (the path without the
fused kernel). Full-size VoxCPM2 LocDiT shapes (K = 1,024, N = 4,096), 22 rows a stream (2 guidance rows of 11
positions) by default; `--k 2048 --n 6144 --rows-per-stream 90` are VoxCPM2's LMs in a bench burst's admission. One
JSON line per (batch, launch): the median time of one call (a CUDA graph of `--repeat`
calls), TFLOP/s, and for the kernel its dequantised output's relative difference from the engine's launch.

    python3 benchmarks/gate_up_bench.py --batch 512 1024 [--sweep]

With `--registers` it needs no GPU: it compiles the kernel for sm_90a at each launch and prints what ptxas reports
(registers a thread, bytes spilled, shared memory), which bounds the programs an SM holds: the engine's takes one.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.profile_step import graph_ms
from engine import kernels
from engine.kernels import triton_ops

K, N, ROWS_PER_STREAM = 1024, 4096, 22
# The engine's first; then launches that ptxas fits two or three to an SM (BM = BK = 64 at 4 warps), and others.
LAUNCHES = [
    triton_ops.GATE_UP_LAUNCH,
    (128, 128, 8, 4),
    (128, 64, 8, 4),
    (128, 64, 8, 2),
    (64, 128, 4, 3),
    (64, 128, 4, 2),
    (64, 64, 4, 3),
    (64, 64, 4, 4),
    (128, 128, 4, 3),
    (256, 64, 8, 3),
]


def _timed(fn: Callable[[], object], repeat: int) -> float:
    def body() -> None:
        for _ in range(repeat):
            fn()

    return graph_ms(body, iters=10) / repeat


def _dequantised(h: torch.Tensor, h_scale: torch.Tensor) -> torch.Tensor:
    blocks = h.float().view(h.shape[0], -1, kernels.FP8_BLOCK)
    return (blocks * h_scale.unsqueeze(-1)).view(h.shape)


def _measure(
    batch: int, launches: list[tuple[int, int, int, int]], repeat: int, k: int, n: int, rows_per_stream: int
) -> None:
    rows = batch * rows_per_stream
    x, weight = torch.randn(rows, k, device="cuda") * 2, torch.randn(2 * n, k, device="cuda") / k**0.5
    q, scale = kernels.quantize_rows_torch(x)
    w, w_scale = kernels.quantize_rows_torch(weight)
    w_scale = w_scale.t().contiguous()  # [1, 2N], as Fp8Linear holds it
    flop = 2 * rows * k * 2 * n
    base = {"batch": batch, "rows": rows, "k": k, "n": n}

    def report(line: dict, ms: float) -> None:
        print(json.dumps(base | line | {"ms": round(ms, 4), "tflop_s": round(flop / ms / 1e9, 1)}), flush=True)

    gemm = lambda: kernels.fp8_matmul(q, scale, w, w_scale, None, torch.bfloat16)  # noqa: E731
    report({"path": "cublas_gemm_alone"}, _timed(gemm, repeat))
    report({"path": "cublas_gemm_then_silu_mul_fp8"}, _timed(lambda: kernels.silu_mul_fp8(gemm()), repeat))
    want = _dequantised(*triton_ops.gate_up_silu_fp8(q, scale, w, w_scale, torch.bfloat16))
    for launch in launches:
        run = lambda launch=launch: triton_ops.gate_up_silu_fp8(q, scale, w, w_scale, torch.bfloat16, launch)  # noqa: E731
        got = _dequantised(*run())
        rel = float((got - want).norm() / want.norm())
        bm, bk, warps, stages = launch
        line = {"path": "gate_up_silu_fp8", "BM": bm, "BK": bk, "warps": warps, "stages": stages}
        report(line | {"rel_to_engine": round(rel, 5)}, _timed(run, repeat))


def _registers(launches: list[tuple[int, int, int, int]]) -> None:
    from benchmarks import ptxas

    signature = {name: "*fp8e4nv" for name in ("a_ptr", "w_ptr")} | {"sa_ptr": "*fp32", "sw_ptr": "*fp32"}
    signature |= {"q_ptr": "*fp8e4nv", "s_ptr": "*fp32", "M": "i32", "M_OUT": "i32", "N": "i32"}
    for bm, bk, warps, stages in launches:
        constants = {"K": K, "BM": bm, "BN": kernels.FP8_BLOCK, "BK": bk, "GROUP_M": 8}
        constants |= {"ROUND": triton_ops.tl.bfloat16}
        # Pointers and sizes aligned: rows come padded to BLOCK_MLP_ROWS, and the LocDiT's counts are multiples of 16.
        found = ptxas.report(
            triton_ops._gate_up_silu_fp8_kernel,
            signature | {name: "constexpr" for name in constants},
            constants,
            len(signature),
            num_warps=warps,
            num_stages=stages,
        )
        print(json.dumps({"BM": bm, "BK": bk, "warps": warps, "stages": stages} | found))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, nargs="+", default=[512, 1024], help="streams")
    parser.add_argument("--repeat", type=int, default=5, help="calls per graph")
    parser.add_argument("--sweep", action="store_true", help="every launch of LAUNCHES, not the engine's")
    parser.add_argument("--registers", action="store_true", help="ptxas's report per launch (no GPU)")
    parser.add_argument("--k", type=int, default=K, help="hidden size (VoxCPM2's LMs: 2048)")
    parser.add_argument("--n", type=int, default=N, help="intermediate size (VoxCPM2's LMs: 6144)")
    parser.add_argument("--rows-per-stream", type=int, default=ROWS_PER_STREAM, help="an admission: its positions")
    args = parser.parse_args()
    launches = LAUNCHES if args.sweep or args.registers else LAUNCHES[:1]
    if args.registers:
        _registers(launches)
        return
    print(json.dumps({"gpu": torch.cuda.get_device_name()}))
    with torch.no_grad():
        for batch in args.batch:
            _measure(batch, launches, args.repeat, args.k, args.n, args.rows_per_stream)


if __name__ == "__main__":
    main()
