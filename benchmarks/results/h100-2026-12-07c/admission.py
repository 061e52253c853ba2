"""Where a c=1,024 burst's first step goes, and what a prefill ahead costs the host beside a busy thread (CUDA).

EngineCore as bench_engine.py configures it for issue 16 (VoxCPM2, FP8 LocDiT, the backbone's FP8 from 8,192 rows).
Each round adds 1,024 one-patch requests and runs their first step twice over: once as the engine runs it (wall ms),
once with the runner's pieces each synchronised (`_admit`, `_backbone`, `_prefill_head`, `_solve`: device ms each).
Then prefill-ahead passes of 100 requests (9,000 positions), alone and beside a thread running plain Python, at the
GIL switch intervals given: host ms of the pass (it queues its device work without waiting) and device ms to done.
    python3 admission.py CKPT [SWITCH_US ...]"""

import json
import statistics
import sys
import threading
import time

import torch

from engine import EngineConfig, GenerationParams, GenerationRequest
from engine.engine_core import EngineCore

TEXT = "The quick brown fox jumps over the lazy dog while the weather report plays on the radio in the kitchen."
PIECES = ("_admit", "_backbone", "_prefill_head", "_solve")


def add(core: EngineCore, n: int, tag: str) -> None:
    params = GenerationParams(seed=1, max_patches=1, min_patches=1)
    for i in range(n):
        core.add_request(GenerationRequest(text=TEXT, params=params, request_id=f"{tag}-{i}"))


def sync() -> None:
    torch.cuda.synchronize()


def first_step(core: EngineCore, tag: str, pieces: bool) -> dict[str, float]:
    runner, timed, originals = core.runner, {}, {}
    if pieces:
        for name in PIECES:
            originals[name] = getattr(runner, name)

            def wrapped(*args, _name=name, _f=originals[name]):
                sync()
                start = time.perf_counter()
                result = _f(*args)
                sync()
                timed[_name] = timed.get(_name, 0.0) + 1e3 * (time.perf_counter() - start)
                return result

            setattr(runner, name, wrapped)
    add(core, 1024, tag)
    sync()
    start = time.perf_counter()
    core.step()
    sync()
    timed["step"] = 1e3 * (time.perf_counter() - start)
    for name in originals:
        delattr(runner, name)  # back to the class's method
    while core.has_work():
        core.step()
    return {k: round(v, 2) for k, v in timed.items()}


def ahead(core: EngineCore, tag: str, busy: bool) -> dict[str, float]:
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            sum(range(200))

    add(core, 100, tag)
    sync()
    thread = threading.Thread(target=spin)
    if busy:
        thread.start()
        time.sleep(0.02)
    start = time.perf_counter()
    core.prefill_ahead()
    host = time.perf_counter() - start
    sync()
    done = time.perf_counter() - start
    stop.set()
    if busy:
        thread.join()
    while core.has_work():
        core.step()
    return {"host_ms": round(1e3 * host, 2), "done_ms": round(1e3 * done, 2)}


def main() -> None:
    config = EngineConfig(
        model=sys.argv[1],
        max_num_seqs=1024,
        fp8_gemms=True,
        fp8_backbone=True,
        fp8_backbone_min_rows=8192,
    )
    core = EngineCore(config)
    core.runner.warm_up()
    for r in range(3):
        print(json.dumps({"first_step": "engine", "r": r, **first_step(core, f"e{r}", pieces=False)}), flush=True)
        print(json.dumps({"first_step": "pieces", "r": r, **first_step(core, f"p{r}", pieces=True)}), flush=True)
    for us in [float(x) for x in sys.argv[2:]] or [500.0]:
        sys.setswitchinterval(us / 1e6)
        for busy in (False, True):
            runs = [ahead(core, f"a{us}{busy}{i}", busy) for i in range(5)]
            print(
                json.dumps(
                    {
                        "ahead": 100,
                        "switch_us": us,
                        "busy_thread": busy,
                        "host_ms": statistics.median(x["host_ms"] for x in runs),
                        "done_ms": statistics.median(x["done_ms"] for x in runs),
                        "runs": runs,
                    }
                ),
                flush=True,
            )


main()
