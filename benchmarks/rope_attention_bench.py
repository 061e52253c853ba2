"""The LocDiT's attention at batch on the GPU: RoPE, the tiny-row attention and the quantising of o_proj's input as
three passes (the engine before kernels.rope_attention; two without FP8) against the fused kernel (the engine's
launch; with `--sweep` each launch of `_launches`: warps, a kv head's 8 queries over 1, 2 or 4 programs, a register
cap), on the full-size VoxCPM2 LocDiT's shapes (16 query heads, 2 kv heads of 128; rows of 11 positions), 2B guidance
rows for B streams. One JSON line per (batch, path, launch): the median time of one call (a CUDA graph of `--repeat`
calls, replayed), the bytes it must move at the least (qkv read once, the output written once) over that time, and
for the fused kernel its relative difference from the twin (dequantised for FP8).

    python3 benchmarks/rope_attention_bench.py --batch 512 1024 [--sweep]

With `--registers` it needs no GPU: it compiles the kernel for sm_90a at each launch of the sweep and prints what
ptxas reports (registers a thread, bytes spilled), which bounds the programs an SM holds.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.profile_step import graph_ms
from engine import kernels
from engine.kernels import triton_ops
from engine.models.voxcpm.config import MiniCPM4Config, parse_config
from engine.models.voxcpm.make_checkpoint import make_config
from engine.models.voxcpm.minicpm4 import LongRoPE


def _timed(fn: Callable[[], object], repeat: int) -> float:
    def body() -> None:
        for _ in range(repeat):
            fn()

    return graph_ms(body, iters=20) / repeat


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return round(float((a.float() - b.float()).norm() / b.float().norm()), 5)


def _measure(batch: int, keep: int, stack: MiniCPM4Config, sweep: bool, repeat: int) -> None:
    heads, kv_heads, dim, seq = stack.num_attention_heads, stack.num_key_value_heads, stack.head_dim, 11
    with torch.device("cuda"):
        table = LongRoPE(stack, seq).to(torch.bfloat16)
    cos, sin = table.cos[:seq].unsqueeze(-2), table.sin[:seq].unsqueeze(-2)
    scale, rows = dim**-0.5, 2 * batch
    qkv = torch.randn(rows, seq, (heads + 2 * kv_heads) * dim, device="cuda", dtype=torch.bfloat16)
    q, k, v = qkv.split((heads * dim, kv_heads * dim, kv_heads * dim), dim=-1)
    q = q.view(rows, seq, heads, dim)
    k, v = k.view(rows, seq, kv_heads, dim), v.view(rows, seq, kv_heads, dim)
    least = qkv.numel() * 2 + rows * keep * heads * dim  # qkv read once, the e4m3 rows written once
    base = {"batch": batch, "rows": rows, "keep": keep}

    def report(line: dict, ms: float) -> None:
        print(json.dumps(base | line | {"ms": round(ms, 4), "tb_s": round(least / ms / 1e9, 2)}), flush=True)

    def three() -> object:
        q2, k2 = kernels.rope_qk(q, k, cos, sin)  # in place: the tables rotate by an amplitude of 1
        out = triton_ops.dense_attention(q2, k2, v, scale)[:, -keep:]
        return triton_ops.quantize_rows(out.reshape(rows * keep, -1))

    def two() -> object:  # the bf16 path: o_proj reads the attention's output as it is
        q2, k2 = kernels.rope_qk(q, k, cos, sin)
        return triton_ops.dense_attention(q2, k2, v, scale)[:, -keep:].reshape(rows, keep, -1)

    report({"path": "three_passes"}, _timed(three, repeat))
    report({"path": "two_passes_bf16"}, _timed(two, repeat))
    twin = kernels.rope_attention_torch(q, k, v, cos, sin, scale, keep, False)
    for (warps, block, registers), fp8 in itertools.product(_launches(heads // kv_heads, sweep), (True, False)):

        def fused(fp8: bool = fp8, launch: Launch = (warps, block, registers)) -> object:
            return triton_ops.rope_attention(q, k, v, cos, sin, scale, keep, fp8, *launch)

        got = fused()
        diff = _rel(got[0].float() * got[1], twin) if fp8 else _rel(got, twin)
        line = {"path": "fused_fp8" if fp8 else "fused_bf16", "warps": warps, "heads_per_program": block}
        report(line | {"max_registers": registers, "rel_to_twin": diff}, _timed(fused, repeat))


# (warps, heads per program, max registers); None: the engine's choice
Launch = tuple[int | None, int | None, int | None]


def _launches(group: int, sweep: bool) -> list[Launch]:
    """The engine's launch, or the sweep's: 4 or 8 warps (2 took 16x longer at B=1,024, h200-2026-12-01 call 2), a kv
    head's queries in 1, 2 or 4 programs, ptxas's register cap its own, 128 or 96."""
    if not sweep:
        return [(None, None, None)]
    return list(itertools.product((4, 8), (group, group // 2, group // 4), (None, 128, 96)))


def _registers(stack: MiniCPM4Config, keep: int) -> None:
    """ptxas -v's registers and spills of the kernel for every launch of the sweep, compiled for sm_90a offline."""
    from benchmarks import ptxas

    heads, kv_heads, dim, seq = stack.num_attention_heads, stack.num_key_value_heads, stack.head_dim, 11
    group = heads // kv_heads
    pointers = ("q_ptr", "k_ptr", "v_ptr", "cos_ptr", "sin_ptr")
    strides = ("q_sb", "q_ss", "k_sb", "k_ss", "v_sb", "v_ss")
    for fp8, (warps, block, registers) in itertools.product((True, False), _launches(group, True)):
        signature = {name: "*bf16" for name in pointers} | {"o_ptr": "*fp8e4nv" if fp8 else "*bf16"}
        signature |= {"s_ptr": "*fp32" if fp8 else "*bf16", "scale": "fp32"} | {name: "i32" for name in strides}
        constants = {"S": seq, "S_P": 16, "KEEP": keep, "H": heads, "HKV": kv_heads, "HKV_P": kv_heads, "G": group}
        constants |= {"GB": block, "D": dim, "FP8": fp8, "ALIGN": 8}  # the engine's strides: multiples of 8
        signature |= {name: "constexpr" for name in constants}
        # The pointers aligned (q, k and v are views of one qkv row at multiples of 8 elements); the strides are not
        # specialised on (ALIGN stands for them).
        options = {"num_warps": warps} | ({"maxnreg": registers} if registers else {})
        found = ptxas.report(triton_ops._rope_attention_kernel, signature, constants, len(pointers) + 2, **options)
        line = {"fp8": fp8, "keep": keep, "warps": warps, "heads_per_program": block, "max_registers": registers}
        print(json.dumps(line | found))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, nargs="+", default=[512, 1024], help="streams (2B guidance rows)")
    parser.add_argument("--keep", type=int, nargs="+", default=[11, 4], help="kept positions (4: the last layer)")
    parser.add_argument("--sweep", action="store_true", help="every launch width of the fused kernel, not the engine's")
    parser.add_argument("--repeat", type=int, default=20, help="calls per graph")
    parser.add_argument("--registers", action="store_true", help="ptxas's registers and spills (no GPU needed)")
    args = parser.parse_args()
    config = parse_config(make_config("voxcpm2", "full"))
    stack = config.local_stack(config.dit_config)
    if args.registers:
        for keep in args.keep:
            _registers(stack, keep)
        return
    print(json.dumps({"gpu": torch.cuda.get_device_name(), "triton": triton_ops.triton.__version__}))
    for batch, keep in itertools.product(args.batch, args.keep):
        _measure(batch, keep, stack, args.sweep, args.repeat)


if __name__ == "__main__":
    main()
