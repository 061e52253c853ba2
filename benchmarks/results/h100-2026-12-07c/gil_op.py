"""What a torch call costs a thread beside one running Python, by GIL switch interval (any machine, CPU): torch's
dispatch releases the GIL, and taking it back from a thread that holds it waits out the interval.
    python benchmarks/results/h100-2026-12-07c/gil_op.py"""

import sys
import threading
import time

import numpy as np
import torch

x, a = torch.zeros(4), np.zeros(4)


def spin(stop: threading.Event) -> None:
    while not stop.is_set():
        sum(range(100))


def per_call_us(call, n: int = 200) -> float:
    start = time.perf_counter()
    for _ in range(n):
        call()
    return (time.perf_counter() - start) / n * 1e6


for interval in (0.005, 0.0005, 0.0001):
    sys.setswitchinterval(interval)
    alone = per_call_us(lambda: torch.add(x, 1))
    stop = threading.Event()
    busy = threading.Thread(target=spin, args=(stop,))
    busy.start()
    time.sleep(0.01)
    beside, numpy_beside = per_call_us(lambda: torch.add(x, 1)), per_call_us(lambda: np.add(a, 1))
    stop.set()
    busy.join()
    print(
        f"switch {interval * 1e3} ms: a torch op {alone:.1f} us alone, {beside:.1f} us beside a busy thread; "
        f"a numpy op beside it {numpy_beside:.1f} us"
    )
