"""Persistent forms of the LocDiT's gate/up GEMM with SiLU*mul and 1x128 e4m3 quantising in its epilogue
(triton_ops._gate_up_silu_fp8_kernel), at B=512's shapes (M = 11,264, K = 1,024, N = 4,096 per half), against the
engine's kernel and cuBLAS's rowwise GEMM alone (which writes the 2N-wide bf16 product and does no epilogue).

Why: K = 1,024 is eight BK = 128 steps, and the engine's kernel (one program per tile, one resident program per SM at
its shared memory) leaves the tensor cores idle while a tile fills its pipeline and while it runs its epilogue. A
persistent kernel whose tile loop is flattened into its K loop (tl.range(flatten=True)) lets Triton's software
pipeliner load the next tile's first K steps while the current tile's epilogue runs. Warp specialisation would also
overlap the epilogue's arithmetic, but Triton 3.6 has it for Blackwell only.

Each variant's output is checked against the engine's kernel (same e4m3 operands): the share of e4m3 values and
scales that differ. Run from the repository root:
    python3 benchmarks/results/h200-2026-11-29b/gate_up_persistent_bench.py
"""

import json
import sys

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

sys.path.insert(0, ".")
from benchmarks.profile_step import graph_ms
from engine import kernels
from engine.kernels import triton_ops

FP8_MAX = tl.constexpr(kernels.FP8_MAX)
FP8_MIN_AMAX = tl.constexpr(kernels.FP8_MIN_AMAX)
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
REPEAT = 10  # launches per captured graph: a 0.2 ms kernel's launch gap would otherwise show


@triton.jit
def _tile(tile_id, grid_m, grid_n, GROUP_M: tl.constexpr):
    band = (tile_id // (GROUP_M * grid_n)) * GROUP_M
    band_m = min(grid_m - band, GROUP_M)
    return band + (tile_id % (GROUP_M * grid_n)) % band_m, (tile_id % (GROUP_M * grid_n)) // band_m


@triton.jit
def _epilogue(acc_g, acc_u, rows, cols, sa_ptr, sw_ptr, q_ptr, q_desc, s_ptr, pid_m, pid_n, M, M_OUT, N,
              BM: tl.constexpr, ROUND: tl.constexpr, TMA_STORE: tl.constexpr):  # fmt: skip
    row_ok = rows < M
    sa = tl.load(sa_ptr + rows, mask=row_ok, other=0.0)[:, None]
    gate = (acc_g * sa * tl.load(sw_ptr + cols)[None, :]).to(ROUND).to(tl.float32)
    up = (acc_u * sa * tl.load(sw_ptr + N + cols)[None, :]).to(ROUND).to(tl.float32)
    act = (gate / (1.0 + tl.exp(-gate))).to(ROUND).to(tl.float32)
    h = (act * up).to(ROUND).to(tl.float32)
    scale = tl.maximum(tl.max(tl.abs(h), axis=1), FP8_MIN_AMAX) / FP8_MAX
    q = (h / scale[:, None]).to(tl.float8e4nv)
    out_ok = rows < M_OUT
    if TMA_STORE:
        q_desc.store([pid_m * BM, pid_n * 128], q)
    else:
        tl.store(q_ptr + rows.to(tl.int64)[:, None] * N + cols[None, :], q, mask=out_ok[:, None])
    tl.store(s_ptr + pid_n * M_OUT + rows, scale, mask=out_ok)


@triton.jit
def _persistent_ptr_kernel(
    a_ptr, w_ptr, sa_ptr, sw_ptr, q_ptr, s_ptr, M, M_OUT, N, K: tl.constexpr,
    BM: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr, ROUND: tl.constexpr,
    NUM_SMS: tl.constexpr, FLATTEN: tl.constexpr,
):  # fmt: skip
    BN: tl.constexpr = 128
    grid_m, grid_n = tl.cdiv(M_OUT, BM), N // BN
    ks = tl.arange(0, BK)
    for tile_id in tl.range(tl.program_id(0), grid_m * grid_n, NUM_SMS, flatten=FLATTEN):
        pid_m, pid_n = _tile(tile_id, grid_m, grid_n, GROUP_M)
        rows = pid_m * BM + tl.arange(0, BM)
        cols = pid_n * BN + tl.arange(0, BN)
        a_at = a_ptr + tl.where(rows < M, rows, 0).to(tl.int64)[:, None] * K + ks[None, :]
        g_at = w_ptr + cols.to(tl.int64)[None, :] * K + ks[:, None]
        acc_g = tl.zeros([BM, BN], dtype=tl.float32)
        acc_u = tl.zeros([BM, BN], dtype=tl.float32)
        for k in range(0, K, BK):
            a = tl.load(a_at + k)  # rows past M read row 0; the epilogue's zero row scale zeroes them
            acc_g = tl.dot(a, tl.load(g_at + k), acc_g)
            acc_u = tl.dot(a, tl.load(g_at + N * K + k), acc_u)
        _epilogue(acc_g, acc_u, rows, cols, sa_ptr, sw_ptr, q_ptr, q_ptr, s_ptr, pid_m, pid_n, M, M_OUT, N,
                  BM, ROUND, False)  # fmt: skip


@triton.jit
def _persistent_tma_kernel(
    a_desc, w_desc, sa_ptr, sw_ptr, q_ptr, q_desc, s_ptr, M, M_OUT, N, K: tl.constexpr,
    BM: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr, ROUND: tl.constexpr,
    NUM_SMS: tl.constexpr, FLATTEN: tl.constexpr, TMA_STORE: tl.constexpr,
):  # fmt: skip
    BN: tl.constexpr = 128
    grid_m, grid_n = tl.cdiv(M_OUT, BM), N // BN
    for tile_id in tl.range(tl.program_id(0), grid_m * grid_n, NUM_SMS, flatten=FLATTEN):
        pid_m, pid_n = _tile(tile_id, grid_m, grid_n, GROUP_M)
        acc_g = tl.zeros([BM, BN], dtype=tl.float32)
        acc_u = tl.zeros([BM, BN], dtype=tl.float32)
        for k in range(0, K, BK):
            a = a_desc.load([pid_m * BM, k])  # rows past M come back zeros (the descriptor's bounds)
            acc_g = tl.dot(a, w_desc.load([pid_n * BN, k]).T, acc_g)
            acc_u = tl.dot(a, w_desc.load([N + pid_n * BN, k]).T, acc_u)
        rows = pid_m * BM + tl.arange(0, BM)
        cols = pid_n * BN + tl.arange(0, BN)
        _epilogue(acc_g, acc_u, rows, cols, sa_ptr, sw_ptr, q_ptr, q_desc, s_ptr, pid_m, pid_n, M, M_OUT, N,
                  BM, ROUND, TMA_STORE)  # fmt: skip


def outputs(m: int, n: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    m_out = -(-m // kernels.BLOCK_MLP_ROWS) * kernels.BLOCK_MLP_ROWS
    h = torch.empty(m_out, n, device=DEVICE, dtype=kernels.FP8)
    return h, torch.empty(n // 128, m_out, device=DEVICE, dtype=torch.float32), m_out


def persistent(
    kind: str, bm: int, stages: int, warps: int, flatten: bool, tma_store: bool, group_m: int = 8, rnd=tl.bfloat16
):
    sms = torch.cuda.get_device_properties(0).multi_processor_count if torch.cuda.is_available() else 4

    def run(q, scale, w, w_scale):
        (m, k), n = q.shape, w.shape[0] // 2
        h, h_scale, m_out = outputs(m, n)
        grid = (min(sms, triton.cdiv(m_out, bm) * (n // 128)),)
        common = dict(BM=bm, BK=128, GROUP_M=group_m, ROUND=rnd, NUM_SMS=sms, FLATTEN=flatten)
        if kind == "ptr":
            _persistent_ptr_kernel[grid](
                q, w, scale, w_scale, h, h_scale, m, m_out, n, k, **common, num_warps=warps, num_stages=stages
            )
        else:
            a_desc = TensorDescriptor(q, [m, k], [k, 1], [bm, 128])
            w_desc = TensorDescriptor(w, [2 * n, k], [k, 1], [128, 128])
            q_desc = TensorDescriptor(h, [m_out, n], [n, 1], [bm, 128])
            _persistent_tma_kernel[grid](
                a_desc, w_desc, scale, w_scale, h, q_desc, h_scale, m, m_out, n, k,
                **common, TMA_STORE=tma_store, num_warps=warps, num_stages=stages,
            )  # fmt: skip
        return h, h_scale.t()

    return run


def main() -> None:
    print(json.dumps({"gpu": torch.cuda.get_device_name(), "triton": triton.__version__}))
    m, k, n = 11264, 1024, 4096
    x, weight = torch.randn(m, k, device="cuda") * 2, torch.randn(2 * n, k, device="cuda") / k**0.5
    q, scale = kernels.quantize_rows_torch(x)
    w, w_scale = kernels.quantize_rows_torch(weight)
    w_scale = w_scale.t().contiguous()
    flop = 2 * m * k * 2 * n
    want_h, want_s = triton_ops.gate_up_silu_fp8(q, scale, w, w_scale, torch.bfloat16)

    def report(name: str, fn) -> None:
        try:
            h, s = fn(q, scale, w, w_scale)
            ms = graph_ms(lambda: [fn(q, scale, w, w_scale) for _ in range(REPEAT)], iters=30) / REPEAT
        except Exception as error:  # a configuration Triton cannot compile (registers, shared memory)
            print(json.dumps({"variant": name, "error": str(error)[:300]}))
            return
        line = {"variant": name, "ms": round(ms, 4), "tflop_s": round(flop / ms / 1e9, 1)}
        if h is not None:
            line["e4m3_differ"] = float((h.float() != want_h.float()).float().mean())
            line["scale_differ"] = float((s != want_s).float().mean())
        print(json.dumps(line), flush=True)

    report("engine", lambda *a: triton_ops.gate_up_silu_fp8(*a, torch.bfloat16))

    def cublas(q, s, w, ws):
        torch._scaled_mm(q, w.t(), scale_a=s, scale_b=ws, out_dtype=torch.bfloat16)
        return None, None

    report("cublas_rowwise_gemm_only", cublas)
    for kind in ("ptr", "tma"):
        for flatten in (True, False):
            for stages in (2, 3, 4):
                for tma_store in (False, True) if kind == "tma" else (False,):
                    name = f"{kind} flatten={flatten} stages={stages} tma_store={tma_store}"
                    report(name, persistent(kind, 128, stages, 8, flatten, tma_store))
    for group_m in (4, 16):
        report(f"tma flatten=True stages=3 group_m={group_m}", persistent("tma", 128, 3, 8, True, False, group_m))


if __name__ == "__main__":
    main()
