import asyncio

import numpy as np
import pytest

from engine import AsyncEngine, EngineError, FinishReason, GenerationParams, GenerationRequest, Prompt
from tests.engine.helpers import engine_config

TIMEOUT = 60  # seconds; every wait is bounded so that a hang fails instead of blocking the suite


@pytest.fixture(scope="module")
def checkpoint(tiny_checkpoint):
    return tiny_checkpoint("voxcpm2", stop=False)


@pytest.fixture
async def engine(checkpoint):
    engine = AsyncEngine(engine_config(checkpoint, max_buffered_chunks=4))
    await engine.start()
    yield engine
    await engine.close()


def request(request_id: str, max_patches: int = 6, seed: int = 1, text: str = "hello world") -> GenerationRequest:
    return GenerationRequest(
        text=text, params=GenerationParams(seed=seed, max_patches=max_patches), request_id=request_id
    )


async def collect(engine: AsyncEngine, req: GenerationRequest) -> list:
    return [chunk async for chunk in engine.generate(req)]


async def wait_for(predicate, timeout: float = TIMEOUT) -> None:
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.005)


async def test_generate_streams_to_the_end(engine):
    chunks = await asyncio.wait_for(collect(engine, request("a", max_patches=5)), TIMEOUT)
    assert [chunk.index for chunk in chunks] == list(range(5))
    assert chunks[-1].finish_reason is FinishReason.LENGTH
    assert all(chunk.samples.shape == (engine.info.samples_per_patch,) for chunk in chunks)
    # stats() is a snapshot taken after each step, so it may trail the last chunk briefly
    await wait_for(lambda: engine.stats().kv_blocks_free == engine.stats().kv_blocks_total)
    assert engine.stats().healthy and engine.stats().steps > 0


async def test_concurrent_requests_match_their_solo_runs(engine):
    solo = await asyncio.wait_for(collect(engine, request("solo", seed=9)), TIMEOUT)
    results = await asyncio.wait_for(
        asyncio.gather(*(collect(engine, request(f"r{i}", seed=9 if i == 2 else i)) for i in range(4))), TIMEOUT
    )
    np.testing.assert_allclose(
        np.stack([c.latents for c in results[2]]), np.stack([c.latents for c in solo]), atol=1e-4
    )


async def test_back_pressure_pauses_only_the_lagging_request(engine):
    slow = engine.generate(request("slow", max_patches=12))
    first = await asyncio.wait_for(anext(slow), TIMEOUT)  # then stop reading
    assert first.index == 0
    await wait_for(lambda: engine.stats().paused == 1)
    fast = await asyncio.wait_for(collect(engine, request("fast", max_patches=8)), TIMEOUT)
    assert fast[-1].finish_reason is FinishReason.LENGTH  # the other request is unaffected
    assert engine.stats().paused == 1
    rest = await asyncio.wait_for(collect_rest(slow), TIMEOUT)  # reading again resumes it
    assert [chunk.index for chunk in rest] == list(range(1, 12))
    assert engine.stats().paused == 0


async def collect_rest(stream) -> list:
    return [chunk async for chunk in stream]


async def test_one_hand_off_to_the_loop_per_step(engine, monkeypatch):
    """A step's chunks for every request reach the event loop in one call_soon_threadsafe (one self-pipe wakeup),
    not one per chunk, and each request still gets all of its chunks in order."""
    loop = asyncio.get_running_loop()
    hand_offs: list[int] = []
    steps: list[int] = []
    call_soon_threadsafe, step = loop.call_soon_threadsafe, engine.core.step_lazily

    def counting_call(callback, *args):
        hand_offs.append(1)
        return call_soon_threadsafe(callback, *args)

    def counting_step(**kwargs):
        chunks = step(**kwargs)
        steps.append(len(chunks))
        return chunks

    monkeypatch.setattr(loop, "call_soon_threadsafe", counting_call)
    monkeypatch.setattr(engine.core, "step_lazily", counting_step)
    results = await asyncio.wait_for(
        asyncio.gather(*(collect(engine, request(f"r{i}", max_patches=6, seed=i)) for i in range(4))), TIMEOUT
    )
    assert all([chunk.index for chunk in chunks] == list(range(6)) for chunks in results)
    assert sum(steps) == 24 and max(steps) > 1  # several requests shared steps
    assert len(hand_offs) == len(steps)


async def test_breaking_out_cancels_and_frees(engine):
    total = engine.stats().kv_blocks_total
    async for chunk in engine.generate(request("a", max_patches=12)):
        if chunk.index == 1:
            break
    await wait_for(lambda: engine.stats().running == 0 and engine.stats().kv_blocks_free == total)


async def test_cancelling_the_consumer_task_cancels_the_request(engine):
    started = asyncio.Event()

    async def consume():
        async for _ in engine.generate(request("a", max_patches=12)):
            started.set()
            await asyncio.sleep(10)

    task = asyncio.create_task(consume())
    await asyncio.wait_for(started.wait(), TIMEOUT)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await wait_for(lambda: engine.stats().running == 0)


async def test_cancel_ends_the_stream(engine):
    stream = engine.generate(request("a", max_patches=12))
    await asyncio.wait_for(anext(stream), TIMEOUT)
    engine.cancel("a")
    engine.cancel("a")  # idempotent
    rest = await asyncio.wait_for(collect_rest(stream), TIMEOUT)
    assert len(rest) < 11
    await wait_for(lambda: engine.stats().running == 0)


async def test_bad_input_raises_before_queueing(engine):
    for bad in (
        GenerationRequest(text=""),
        GenerationRequest(text="hi", params=GenerationParams(temperature=-1.0)),
        GenerationRequest(text="hi", prompt=Prompt(latents=np.zeros((1, 1, 1), dtype=np.float32))),
        GenerationRequest(text="hello " * 300),
    ):
        with pytest.raises(EngineError):
            await collect(engine, bad)
    assert engine.stats().waiting == engine.stats().running == 0


async def test_duplicate_request_id_is_an_error(engine):
    first = engine.generate(request("same", max_patches=12))
    await asyncio.wait_for(anext(first), TIMEOUT)
    with pytest.raises(EngineError, match="already in use"):
        await asyncio.wait_for(collect(engine, request("same")), TIMEOUT)
    await first.aclose()


async def test_encode_audio_runs_on_the_engine(engine):
    info = engine.info
    wav = np.zeros(info.patch_size * 640 * 2, dtype=np.float32)
    latents = await asyncio.wait_for(engine.encode_audio(wav, padding="right"), TIMEOUT)
    assert latents.shape[1:] == (info.patch_size, info.feat_dim)
    with pytest.raises(EngineError):
        await asyncio.wait_for(engine.encode_audio(wav, padding="middle"), TIMEOUT)


async def test_a_cancelled_encode_leaves_the_engine_serving(engine, monkeypatch):
    """A caller that stops waiting for encode_audio must not crash the engine thread when its result lands."""
    started, release = asyncio.Event(), asyncio.Event()
    loop = asyncio.get_running_loop()
    encode = engine.core.encode_audio

    def slow_encode(wav, padding):
        loop.call_soon_threadsafe(started.set)
        asyncio.run_coroutine_threadsafe(release.wait(), loop).result(TIMEOUT)
        return encode(wav, padding)

    monkeypatch.setattr(engine.core, "encode_audio", slow_encode)
    task = asyncio.create_task(engine.encode_audio(np.zeros(2560, dtype=np.float32)))
    await asyncio.wait_for(started.wait(), TIMEOUT)
    task.cancel()
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    chunks = await asyncio.wait_for(collect(engine, request("after")), TIMEOUT)
    assert chunks[-1].finish_reason is FinishReason.LENGTH and engine.stats().healthy


async def test_a_paused_reader_gets_its_chunks_and_the_error_after_close(checkpoint):
    """Reading a paused request's buffered chunks after close() resumes nothing and raises the close error,
    not a "not running" error from the resume."""
    engine = AsyncEngine(engine_config(checkpoint, max_buffered_chunks=2))
    await engine.start()
    stream = engine.generate(request("lagging", max_patches=12))
    await asyncio.wait_for(anext(stream), TIMEOUT)
    await wait_for(lambda: engine.stats().paused == 1)
    await asyncio.wait_for(engine.close(), TIMEOUT)
    with pytest.raises(EngineError, match="closed"):
        await asyncio.wait_for(collect_rest(stream), TIMEOUT)


async def test_engine_failure_fails_open_requests(engine, monkeypatch):
    stream = engine.generate(request("a", max_patches=12))
    await asyncio.wait_for(anext(stream), TIMEOUT)

    def broken(batch, while_running):
        raise RuntimeError("device lost")

    monkeypatch.setattr(engine.core.runner, "run", broken)
    with pytest.raises(EngineError, match="device lost"):
        await asyncio.wait_for(collect_rest(stream), TIMEOUT)
    assert not engine.stats().healthy
    with pytest.raises(EngineError):
        await asyncio.wait_for(collect(engine, request("b")), TIMEOUT)


async def test_close_fails_open_requests(checkpoint):
    engine = AsyncEngine(engine_config(checkpoint))
    await engine.start()
    stream = engine.generate(request("a", max_patches=12))
    await asyncio.wait_for(anext(stream), TIMEOUT)
    await asyncio.wait_for(engine.close(), TIMEOUT)
    with pytest.raises(EngineError, match="closed"):
        await asyncio.wait_for(collect_rest(stream), TIMEOUT)


async def _first_prefills(
    engine: AsyncEngine, delays: dict[str, float], max_patches: dict[str, int] | None = None
) -> list[list[str]]:
    """Send one short request per name after its delay (seconds; `max_patches`: by name, else 2); the request ids
    each step admitted."""
    await engine.start()
    schedule = engine.core.scheduler.schedule
    batches: list[list[str]] = []

    def recording_schedule():
        batch = schedule()
        batches.append(sorted(seq.request_id for seq in batch if seq.is_prefill))
        return batch

    engine.core.scheduler.schedule = recording_schedule

    async def late(name: str, delay: float) -> None:
        await asyncio.sleep(delay)
        await collect(engine, request(name, max_patches=(max_patches or {}).get(name, 2)))

    try:
        await asyncio.wait_for(asyncio.gather(*(late(n, d) for n, d in delays.items())), TIMEOUT)
    finally:
        await engine.close()
    return [batch for batch in batches if batch]


async def test_a_lone_request_waits_for_no_burst(checkpoint):
    """The lead of a burst window is admitted at once: with a 3 s window, its first chunk comes in a fraction of it."""
    engine = AsyncEngine(engine_config(checkpoint, coalesce_ms=3000.0, coalesce_max_ms=3000.0))
    await engine.start()
    try:
        loop = asyncio.get_running_loop()
        start = loop.time()
        stream = engine.generate(request("lone", max_patches=2))
        await asyncio.wait_for(anext(stream), TIMEOUT)
        assert loop.time() - start < 1.5
        await asyncio.wait_for(collect_rest(stream), TIMEOUT)
    finally:
        await engine.close()


async def test_a_burst_after_its_lead_is_admitted_in_one_prefill(checkpoint):
    """The lead streams while the rest of its burst gathers (it runs long enough to be stepping meanwhile)."""
    engine = AsyncEngine(engine_config(checkpoint, coalesce_ms=300.0, coalesce_max_ms=3000.0))
    batches = await _first_prefills(engine, {"r0": 0.0, "r1": 0.1, "r2": 0.2, "r3": 0.3}, {"r0": 400})
    assert batches == [["r0"], ["r1", "r2", "r3"]]


async def test_the_window_stays_open_while_a_burst_trickles_in(checkpoint):
    """Arrivals closer together than coalesce_ms keep the window open past coalesce_ms: a burst enters at the pace
    of its senders (tokenizing on the event loop) and still lands in one prefill, after its lead (which has finished
    meanwhile: the rest waits all the same). A request after the window is the next window's lead. (The margins are
    wide: a loaded CI machine wakes sleepers late.)"""
    engine = AsyncEngine(engine_config(checkpoint, coalesce_ms=600.0, coalesce_max_ms=5000.0))
    batches = await _first_prefills(engine, {"r0": 0.0, "r1": 0.15, "r2": 0.3, "r3": 0.45, "r4": 3.0})
    assert batches == [["r0"], ["r1", "r2", "r3"], ["r4"]]


async def test_the_window_closes_at_its_cap(checkpoint):
    """r2 arrives within coalesce_ms of r1 but the window closes coalesce_max_ms after the lead: r1 and r2 do not
    wait for quiet past it, and r3 leads a window of its own."""
    engine = AsyncEngine(engine_config(checkpoint, coalesce_ms=1200.0, coalesce_max_ms=1200.0))
    batches = await _first_prefills(engine, {"r0": 0.0, "r1": 0.3, "r2": 0.6, "r3": 1.9})
    assert batches == [["r0"], ["r1", "r2"], ["r3"]]
