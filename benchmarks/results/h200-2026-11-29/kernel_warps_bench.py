"""Launch configurations of the LocDiT's memory-bound Triton kernels at B=512's shapes (VoxCPM2: 1,024 guidance rows
of 11 positions, hidden 1,024, 16 heads of 128, 2 kv heads; bf16), as CUDA graphs: RoPE in place, the tiny-row
attention, quantize_rows of its output, and the residual add + RMSNorm writing e4m3 rows (`norm`: added after call
6, not run yet), each at 1-16 warps, with the bandwidth each reaches (bytes read and written over time). Before
c00df75 the engine launched rope, attention and quantize at 8 warps; it launches the norm at _warps(1024) = 4.
Run from the repository root: python3 benchmarks/results/h200-2026-11-29/kernel_warps_bench.py [kernel ...]"""

import json
import sys

import torch
import triton

sys.path.insert(0, ".")
from benchmarks.profile_step import graph_ms
from engine.kernels import triton_ops

rows, seq, heads, kv_heads, dim = 1024, 11, 16, 2, 128
tokens = rows * seq
qkv = torch.randn(rows, seq, (heads + 2 * kv_heads) * dim, device="cuda", dtype=torch.bfloat16)
q, k, v = qkv.split((heads * dim, kv_heads * dim, kv_heads * dim), dim=-1)
q, k, v = q.view(rows, seq, heads, dim), k.view(rows, seq, kv_heads, dim), v.view(rows, seq, kv_heads, dim)
cos = torch.randn(seq, dim, device="cuda", dtype=torch.bfloat16)
sin = torch.randn(seq, dim, device="cuda", dtype=torch.bfloat16)
out = torch.empty(rows, seq, heads, dim, device="cuda", dtype=torch.bfloat16)
flat = out.view(tokens, heads * dim)
q8 = torch.empty(tokens, heads * dim, device="cuda", dtype=torch.float8_e4m3fn)
scale = torch.empty(tokens, 1, device="cuda", dtype=torch.float32)
seq_p, block = 16, heads * dim
hidden = 1024
residual, update = (torch.randn(tokens, hidden, device="cuda", dtype=torch.bfloat16) for _ in range(2))
norm_weight = torch.randn(hidden, device="cuda", dtype=torch.bfloat16)
summed = torch.empty_like(residual)
normed8 = torch.empty(tokens, hidden, device="cuda", dtype=torch.float8_e4m3fn)
sizes = {  # bytes each kernel must move (reads + writes), for the bandwidth it reaches
    "rope": 2 * 2 * tokens * (heads + kv_heads) * dim,
    "attention": 2 * tokens * ((heads + 2 * kv_heads) * dim + heads * dim),
    "quantize": tokens * heads * dim * (2 + 1) + 4 * tokens,
    "norm": tokens * hidden * (2 + 2 + 2 + 1) + 4 * tokens,
}


def rope(warps: int) -> None:
    triton_ops._rope_kernel[(tokens,)](
        q, k, cos, sin, q.stride(1), k.stride(1), seq,
        HQ=heads, HK=kv_heads, HQ_P=heads, HK_P=kv_heads, D=dim, num_warps=warps,
    )  # fmt: skip


def attention(warps: int) -> None:
    triton_ops._dense_attention_kernel[(rows, kv_heads)](
        q, k, v, out, dim**-0.5, q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        S=seq, S_P=seq_p, H=heads, G=heads // kv_heads, D=dim, num_warps=warps,
    )  # fmt: skip


def quantize(warps: int) -> None:
    triton_ops._quantize_rows_kernel[(tokens,)](flat, q8, scale, block, BLOCK=block, num_warps=warps)


def norm(warps: int) -> None:
    triton_ops._rms_norm_kernel[(tokens,)](
        residual, update, norm_weight, normed8, scale, summed, hidden, 1e-5,
        HAS_UPDATE=True, FP8=True, BLOCK=hidden, num_warps=warps,
    )  # fmt: skip


print(json.dumps({"gpu": torch.cuda.get_device_name(), "triton": triton.__version__}))
kernels = {"rope": rope, "attention": attention, "quantize": quantize, "norm": norm}
for name, fn in kernels.items() if len(sys.argv) < 2 else ((n, kernels[n]) for n in sys.argv[1:]):
    for warps in (1, 2, 4, 8, 16):
        try:
            ms = graph_ms(lambda fn=fn, warps=warps: fn(warps), iters=50)
        except Exception as error:  # a configuration Triton cannot compile (registers, shared memory)
            print(json.dumps({"kernel": name, "warps": warps, "error": str(error)[:200]}))
            continue
        tb_s = sizes[name] / ms / 1e9
        print(json.dumps({"kernel": name, "warps": warps, "ms": round(ms, 4), "tb_s": round(tb_s, 2)}))
