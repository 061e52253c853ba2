"""How late the engine loop wakes for a burst (development machine, CPU): a tiny checkpoint's engine, settled as the
bench settles it; 1,024 requests submitted at once from the event loop, as bench_engine.py does; the loop's condition
logs the first notify and every return from a wait, with how many requests were queued then.
    python benchmarks/results/h100-2026-12-07b/wake.py CHECKPOINT"""

import asyncio
import sys
import threading
import time

from engine import AsyncEngine, EngineConfig, GenerationParams, GenerationRequest
from engine.process import settle_for_serving

TEXT = "The quick brown fox jumps over the lazy dog while the weather report plays on the radio in the kitchen."


async def main(checkpoint: str) -> None:
    engine = AsyncEngine(
        EngineConfig(
            model=checkpoint, device="cpu", max_num_seqs=1024, max_model_len=256, coalesce_ms=5.0, coalesce_max_ms=150.0
        )
    )
    log: list[tuple[str, float, int]] = []

    class Logged(threading.Condition):
        def wait(self, timeout: float | None = None) -> bool:
            woken = super().wait(timeout)
            log.append(("wait returned", time.perf_counter(), len(engine.loop._commands)))
            return woken

        def notify(self, n: int = 1) -> None:
            log.append(("notify", time.perf_counter(), len(engine.loop._commands)))
            super().notify(n)

    engine.loop._cond = Logged()
    await engine.start()
    settle_for_serving()
    await asyncio.sleep(2)
    submitted: list[float] = []

    async def one() -> None:
        submitted.append(time.perf_counter())
        params = GenerationParams(seed=1, max_patches=1, min_patches=1)
        async for _ in engine.generate(GenerationRequest(text=TEXT, params=params)):
            pass

    log.clear()
    await asyncio.gather(*[one() for _ in range(1024)])
    first_notify = next(entry for entry in log if entry[0] == "notify")
    for name, t, queued in [first_notify, *[entry for entry in log if entry[0] == "wait returned"][:3]]:
        print(f"{name}: {1e3 * (t - submitted[0]):.1f} ms after the first submission, {queued} queued")
    await engine.close()


asyncio.run(main(sys.argv[1]))
