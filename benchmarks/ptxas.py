"""What ptxas makes of a Triton kernel, offline (no GPU): compile it for sm_90a with Triton's bundled ptxas and read
its `-v` report. The benchmarks' `--registers` modes use it to see a launch's registers, spills and shared memory,
which bound the programs an SM holds."""

from __future__ import annotations

import re
import subprocess
import tempfile
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

SM90 = GPUTarget("cuda", 90, 32)
REGISTERS_PER_SM = 65536
SHARED_KIB_PER_SM = 228  # Hopper; each program's share also holds 1 KiB the system reserves


def report(fn: object, signature: dict[str, str], constants: dict[str, object], aligned: int, **options: int) -> dict:
    """ptxas's report for `fn` compiled with `signature` (every constexpr listed as "constexpr") and `constants`, its
    first `aligned` arguments 16-byte aligned as a launch specialises them (torch's tensors; ints divisible by 16):
    without it Triton must assume every access unaligned and makes it a 16-bit one. `options`: num_warps,
    num_stages, maxnreg. Returns registers a thread, bytes spilled, shared memory (KiB) and the programs an SM holds
    by its registers and its shared memory."""
    attrs = {(i,): [["tt.divisibility", 16]] for i in range(aligned)}
    compiled = triton.compile(ASTSource(fn, signature, constexprs=constants, attrs=attrs), target=SM90, options=options)
    ptxas = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
    with tempfile.NamedTemporaryFile("w", suffix=".ptx") as ptx:
        ptx.write(compiled.asm["ptx"])
        ptx.flush()
        out = subprocess.run(
            [str(ptxas), "-v", "--gpu-name", "sm_90a", ptx.name, "-o", "/dev/null"],
            capture_output=True,
            text=True,
            check=True,
        ).stderr
    used = int(re.search(r"Used (\d+) registers", out).group(1))  # type: ignore[union-attr]
    spilled = int(re.search(r"(\d+) bytes spill stores", out).group(1))  # type: ignore[union-attr]
    # A warp-specialised kernel runs more warps than num_warps asks for (its producer's and consumers' groups).
    warps, shared_kib = compiled.metadata.num_warps, compiled.metadata.shared // 1024
    programs = min(REGISTERS_PER_SM // (used * 32 * warps), SHARED_KIB_PER_SM // (shared_kib + 1))
    return {
        "registers": used,
        "spill_bytes": spilled,
        "shared_kib": shared_kib,
        "programs_per_sm": programs,
        "warps_run": warps,
    }
