"""bench_engine with engine.cuda_graphs.PINNED_RESULTS_ALIVE set to argv[1], printing the pinned allocator's blocks
created (host_memory_stats) at exit: how many result buffers a c=1,024 burst has alive at once.

    python3 benchmarks/results/h200-2026-12-03b/pinned_probe.py 4 --model CKPT ... (bench_engine's arguments)
"""

import atexit
import json
import runpy
import sys

import torch

import engine.cuda_graphs

engine.cuda_graphs.PINNED_RESULTS_ALIVE = int(sys.argv[1])
sys.argv = ["bench_engine.py", *sys.argv[2:]]
stats = torch.cuda.host_memory_stats
atexit.register(
    lambda: print(
        json.dumps(
            {"pinned_alive": engine.cuda_graphs.PINNED_RESULTS_ALIVE}
            | {k: v for k, v in stats().items() if k.startswith(("allocations.", "num_host", "host_alloc_time.count"))}
        )
    )
)
runpy.run_path("benchmarks/bench_engine.py", run_name="__main__")
