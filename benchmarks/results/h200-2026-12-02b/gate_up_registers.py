"""Offline (no GPU): ptxas's registers, spills and shared memory for `_gate_up_silu_fp8_kernel` at the LocDiT's K =
1,024, for the engine's launch (BM 128, BK 128, 8 warps, 3 stages) and a few others, pointers and ints 16-byte
aligned as a launch specialises them. Run from the repository root with Triton 3.6 installed:

    PYTHONPATH=. python3 benchmarks/results/h200-2026-12-02b/gate_up_registers.py
"""

import json
import re
import subprocess
import tempfile
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from engine.kernels import triton_ops

PTXAS = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
LAUNCHES = [
    (128, 128, 8, 3),
    (128, 128, 8, 4),
    (128, 64, 8, 4),
    (128, 64, 8, 2),
    (64, 128, 4, 3),
    (64, 128, 4, 2),
    (64, 64, 4, 3),
    (64, 64, 4, 4),
    (128, 128, 4, 3),
    (256, 64, 8, 3),
]  # (BM, BK, warps, stages); the first is the engine's

for bm, bk, warps, stages in LAUNCHES:
    signature = {name: "*fp8e4nv" for name in ("a_ptr", "w_ptr", "q_ptr")} | {"sa_ptr": "*fp32", "sw_ptr": "*fp32"}
    signature |= {"s_ptr": "*fp32", "M": "i32", "M_OUT": "i32", "N": "i32"}
    constants = {"K": 1024, "BM": bm, "BN": 128, "BK": bk, "GROUP_M": 8, "ROUND": triton.language.bfloat16}
    signature |= {name: "constexpr" for name in constants}
    aligned = {(i,): [["tt.divisibility", 16]] for i in range(9)}
    source = ASTSource(triton_ops._gate_up_silu_fp8_kernel, signature, constexprs=constants, attrs=aligned)
    options = {"num_warps": warps, "num_stages": stages}
    compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options)
    with tempfile.NamedTemporaryFile("w", suffix=".ptx") as ptx:
        ptx.write(compiled.asm["ptx"])
        ptx.flush()
        report = subprocess.run(
            [str(PTXAS), "-v", "--gpu-name", "sm_90a", ptx.name, "-o", "/dev/null"], capture_output=True, text=True
        ).stderr
    line = {"BM": bm, "BK": bk, "warps": warps, "stages": stages}
    line["registers"] = int(re.search(r"Used (\d+) registers", report).group(1))
    line["spill_bytes"] = int(re.search(r"(\d+) bytes spill stores", report).group(1))
    line["shared_kib"] = compiled.metadata.shared // 1024
    print(json.dumps(line))
