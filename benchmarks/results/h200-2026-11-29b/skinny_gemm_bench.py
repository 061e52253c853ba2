"""bf16 GEMMs of few rows (one VoxCPM2 stream's step: the LMs decode 1 row, the LocEnc 5, the LocDiT 22), cuBLAS
(F.linear) against a Triton kernel that streams the weight once, as CUDA graphs of 10 launches.

Why: a B=1 step (9.3 ms on an H200) reads ~7.5 GB of weights (the LMs once, the LocDiT nine times), 1.6 ms at the
memory's 4.8 TB/s, but its GEMM kernels took 4.7 ms (the tenth session's profile): at these shapes cuBLAS reaches
~1.6 TB/s. A GEMM of M <= 64 rows is a weight stream: each program owns BN output features for every row and walks K.

Run from the repository root: python3 benchmarks/results/h200-2026-11-29b/skinny_gemm_bench.py
"""

import itertools
import json
import sys

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

sys.path.insert(0, ".")
from benchmarks.profile_step import graph_ms

REPEAT = 10


@triton.jit
def _skinny_kernel(x_ptr, w_ptr, y_ptr, part_ptr, count_ptr, M, N, K: tl.constexpr, stride_x, stride_y,
                   BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, SPLIT: tl.constexpr,
                   STAGES: tl.constexpr):  # fmt: skip
    """y [M, N] = x [M, K] @ w [N, K].T: y.T = w @ x.T. Program (n, s) owns BN output features of all M (<= BM)
    rows over the s-th of SPLIT slices of K. With SPLIT > 1 each writes its fp32 partial to part [SPLIT, N, BM] and
    counts itself in count[n]; the last of a tile's programs to arrive sums the partials in a fixed order (the same
    result whichever arrives last), writes y and sets the count back to 0 for the next launch (and graph replay)."""
    pid_n, pid_k = tl.program_id(0), tl.program_id(1)
    ns = pid_n * BN + tl.arange(0, BN)
    ms = tl.arange(0, BM)
    ks = tl.arange(0, BK)
    K_PART: tl.constexpr = K // SPLIT
    w_at = w_ptr + ns.to(tl.int64)[:, None] * K + pid_k * K_PART + ks[None, :]
    x_at = x_ptr + ms[None, :] * stride_x + pid_k * K_PART + ks[:, None]
    acc = tl.zeros([BN, BM], dtype=tl.float32)
    for k in tl.range(0, K_PART, BK, num_stages=STAGES):
        acc = tl.dot(tl.load(w_at + k), tl.load(x_at + k, mask=ms[None, :] < M, other=0.0), acc)
    out_at = y_ptr + ms[None, :] * stride_y + ns[:, None]
    if SPLIT == 1:
        tl.store(out_at, acc.to(y_ptr.dtype.element_ty), mask=ms[None, :] < M)
    else:
        tile = ns[:, None] * BM + ms[None, :]
        tl.store(part_ptr + pid_k * N * BM + tile, acc, cache_modifier=".cg")
        tl.debug_barrier()  # every thread's partial is written before the count says so
        if tl.atomic_add(count_ptr + pid_n, 1, sem="acq_rel") == SPLIT - 1:
            acc = tl.zeros([BN, BM], dtype=tl.float32)
            for s in tl.static_range(SPLIT):
                acc += tl.load(part_ptr + s * N * BM + tile, cache_modifier=".cg")
            tl.store(out_at, acc.to(y_ptr.dtype.element_ty), mask=ms[None, :] < M)
            tl.atomic_xchg(count_ptr + pid_n, 0)


_SCRATCH: dict = {}


def skinny(x: torch.Tensor, w: torch.Tensor, bn: int, bk: int, stages: int, warps: int, split: int = 1):
    m, k = x.shape
    n = w.shape[0]
    y = torch.empty(m, n, device=x.device, dtype=x.dtype)
    bm = max(16, triton.next_power_of_2(m))
    key = (n, bm, split, bn)
    if key not in _SCRATCH:
        _SCRATCH[key] = (
            torch.empty(split * n * bm, device=x.device, dtype=torch.float32),
            torch.zeros(n // bn, device=x.device, dtype=torch.int32),
        )
    part, count = _SCRATCH[key]
    _skinny_kernel[(n // bn, split)](x, w, y, part, count, m, n, k, x.stride(0), y.stride(0),
                                     BM=bm, BN=bn, BK=bk, SPLIT=split, STAGES=stages, num_warps=warps)  # fmt: skip
    return y


SHAPES = {  # name: (K, N, rows at one stream, calls in a B=1 step)
    "lm_qkv": (2048, 2560, 1, 36),
    "lm_o": (2048, 2048, 1, 36),
    "lm_gate_up": (2048, 12288, 1, 36),
    "lm_down": (6144, 2048, 1, 36),
    "dit_qkv": (1024, 2560, 22, 108),
    "dit_o": (2048, 1024, 22, 108),
    "dit_gate_up": (1024, 8192, 22, 108),
    "dit_down": (4096, 1024, 22, 108),
}
CONFIGS = [
    (bn, bk, stages, warps, split)
    for bn, bk, stages, warps, split in itertools.product((32, 64, 128), (128,), (2, 4), (4,), (1, 2, 4, 8))
]


def main() -> None:
    print(json.dumps({"gpu": torch.cuda.get_device_name(), "triton": triton.__version__}))
    total = {"cublas": 0.0, "triton": 0.0}
    for name, (k, n, rows, calls) in SHAPES.items():
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k**0.5
        for m in sorted({1, rows, 8, 64}):
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            nbytes = 2 * (n * k + m * k + m * n)
            want = F.linear(x.float(), w.float())
            cublas = graph_ms(lambda x=x, w=w: [F.linear(x, w) for _ in range(REPEAT)], iters=20) / REPEAT
            best = None
            for cfg in CONFIGS:
                if n % cfg[0] or k % (cfg[1] * cfg[4]):
                    continue
                try:
                    got = skinny(x, w, *cfg)
                    ms = graph_ms(lambda x=x, w=w, cfg=cfg: [skinny(x, w, *cfg) for _ in range(REPEAT)], iters=20)
                except Exception as error:  # registers or shared memory out of bounds
                    print(json.dumps({"shape": name, "m": m, "config": cfg, "error": str(error)[:160]}))
                    continue
                err = float((got.float() - want).norm() / want.norm())
                if best is None or ms / REPEAT < best[0]:
                    best = (ms / REPEAT, cfg, err)
            line = {
                "shape": name, "m": m, "k": k, "n": n,
                "cublas_us": round(cublas * 1e3, 2), "cublas_tb_s": round(nbytes / cublas / 1e9, 2),
                "triton_us": round(best[0] * 1e3, 2), "triton_tb_s": round(nbytes / best[0] / 1e9, 2),
                "config_bn_bk_stages_warps_split": best[1], "rel_err": round(best[2], 6),
            }  # fmt: skip
            print(json.dumps(line), flush=True)
            if m == rows:
                total["cublas"] += cublas * calls
                total["triton"] += best[0] * calls
    print(json.dumps({"b1_step_gemm_ms": {key: round(v, 3) for key, v in total.items()}}))


if __name__ == "__main__":
    main()
