"""engine.heap against glibc itself: memory freed in the middle of the heap stays resident until trim_heap returns it.
In a process of its own, so that pytest's heap does not blur the figures."""

from __future__ import annotations

import subprocess
import sys

import pytest

from engine import heap

PROBE = """
from pathlib import Path
from engine.heap import trim_heap

def rss_mib():
    line = next(l for l in Path("/proc/self/status").read_text().splitlines() if l.startswith("VmRSS:"))
    return int(line.split()[1]) / 1024

blobs = [bytes(1000) + bytes([i % 256]) for i in range(200_000)]  # 200 MB of malloc chunks (not pymalloc's)
pin = bytes(1000) + b"x"  # above them: the heap's top cannot shrink past it
loaded = rss_mib()
del blobs
freed = rss_mib()
returned = trim_heap()
print(loaded, freed, rss_mib(), returned)
"""


@pytest.mark.skipif(heap._MALLOC_TRIM is None, reason="the C library has no malloc_trim")
def test_trim_returns_memory_that_free_kept() -> None:
    run = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True)
    loaded, freed, trimmed, returned = run.stdout.split()
    assert float(freed) > float(loaded) - 50  # free() alone kept most of the 200 MB resident
    assert float(trimmed) < float(freed) - 150
    assert returned == "True"
