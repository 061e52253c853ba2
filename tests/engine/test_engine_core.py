import bisect
import dataclasses
import json
import time
from collections import defaultdict

import numpy as np
import pytest
import torch

from engine.engine_core import EngineCore
from engine.models.family import StepResult
from engine.models.voxcpm.vae_stream import StreamingVAEDecoder
from engine.outputs import STEP_BUCKETS_S, AudioChunk, EngineError, FinishReason
from engine.params import GenerationParams, GenerationRequest, Prompt
from tests.engine.helpers import FakeClock, engine_config


@pytest.fixture(scope="module")
def checkpoint(tiny_checkpoint):
    return tiny_checkpoint("voxcpm2", stop=False)  # every request runs to its cap: lengths are predictable


def make_request(request_id: str, text: str = "hello world", seed: int = 1, **params) -> GenerationRequest:
    return GenerationRequest(text=text, params=GenerationParams(seed=seed, **params), request_id=request_id)


def run_until_idle(core: EngineCore) -> dict[str, list[AudioChunk]]:
    chunks = defaultdict(list)
    while core.has_work():
        for chunk in core.step():
            chunks[chunk.request_id].append(chunk)
    return chunks


def assert_same_audio(a: list[AudioChunk], b: list[AudioChunk]) -> None:
    assert [chunk.index for chunk in a] == [chunk.index for chunk in b]
    np.testing.assert_array_equal(np.stack([c.latents for c in a]), np.stack([c.latents for c in b]))
    np.testing.assert_array_equal(np.concatenate([c.samples for c in a]), np.concatenate([c.samples for c in b]))


def test_streams_chunks_to_the_length_cap(checkpoint):
    core = EngineCore(engine_config(checkpoint))
    core.add_request(make_request("a", max_patches=5))
    chunks = run_until_idle(core)["a"]
    assert [chunk.index for chunk in chunks] == list(range(5))
    assert [chunk.finish_reason for chunk in chunks] == [None] * 4 + [FinishReason.LENGTH]
    info = core.info
    for chunk in chunks:
        assert chunk.samples.shape == (info.samples_per_patch,) and chunk.samples.dtype == np.float32
        assert chunk.latents.shape == (info.patch_size, info.feat_dim)
        assert np.isfinite(chunk.samples).all()
    assert core.stats().kv_blocks_free == core.stats().kv_blocks_total


def test_step_trace_has_a_line_per_step_with_its_admissions(checkpoint, tmp_path):
    trace = tmp_path / "trace" / "engine-0.jsonl"
    core = EngineCore(engine_config(checkpoint, step_trace=str(trace)))
    made = time.monotonic()
    requests = [
        dataclasses.replace(make_request(request_id, max_patches=3), arrival_time=made - 1.0 + k)
        for k, request_id in enumerate("ab")
    ]
    for request in requests:
        core.add_request(request)
    prompts = sum(seq.num_prompt for seq in core.scheduler.waiting)
    run_until_idle(core)
    lines = [json.loads(line) for line in trace.read_text().splitlines()]
    assert [line["batch"] for line in lines] == [2, 2, 2]
    assert [(line["admitted"], line["positions"]) for line in lines] == [(2, prompts), (0, 0), (0, 0)]
    # An admission says when its requests were made (the caller's stamp) and taken in (first, last); others do not.
    assert lines[0]["arrival"] == [round(made - 1.0, 4), round(made, 4)]
    received_first, received_last = lines[0]["received"]
    assert made <= received_first + 1e-4 and received_first <= received_last <= lines[0]["t"] + 1e-4
    assert not {"arrival", "received"} & (lines[1].keys() | lines[2].keys())
    assert all(line["waiting"] == 0 and line["ms"] > 0 for line in lines)
    assert lines[0]["t"] + lines[0]["ms"] / 1e3 <= lines[1]["t"] + 1e-4  # the host's monotonic clock, step by step
    # The step-duration histogram counts the same steps: each in the bucket of its traced duration.
    stats = core.stats()
    expected = [0] * (len(STEP_BUCKETS_S) + 1)
    for line in lines:
        expected[bisect.bisect_left(STEP_BUCKETS_S, line["ms"] / 1e3)] += 1
    assert list(stats.step_counts) == expected and sum(stats.step_counts) == stats.steps == 3
    assert stats.step_s_total == pytest.approx(sum(line["ms"] for line in lines) / 1e3, abs=1e-4)
    trace_file = core.trace
    core.fail()  # the engine's end (a stop or a failed step) closes its trace
    assert trace_file is not None and trace_file.closed and core.trace is None


def test_prefill_ahead_runs_every_full_pass_that_waits_and_traces_each(checkpoint, tmp_path):
    """Five equal prompts queued, passes of two (prefill_ahead_tokens): two passes go ahead, each through the
    runner and traced as a batch-0 line with its admissions; the fifth request waits for more of its burst or its
    step, which then starts all five, prefilling only its prompt."""
    trace = tmp_path / "trace.jsonl"
    positions = EngineCore(engine_config(checkpoint)).make_sequence(make_request("x")).num_prompt
    core = EngineCore(
        engine_config(checkpoint, max_num_seqs=6, prefill_ahead_tokens=2 * positions, step_trace=str(trace))
    )
    assert core.config.prefill_ahead_chunk == (2 * positions, 6)  # at least 8 rows, at most max_num_seqs
    passes: list[list[str]] = []
    prefill_ahead = core.runner.prefill_ahead
    core.runner.prefill_ahead = lambda seqs: (passes.append([seq.request_id for seq in seqs]), prefill_ahead(seqs))
    for request_id in "abcde":
        core.add_request(make_request(request_id, max_patches=2))
    core.prefill_ahead()
    assert passes == [["a", "b"], ["c", "d"]]
    assert [seq.request_id for seq in core.scheduler.waiting] == ["e"]
    run_until_idle(core)
    lines = [json.loads(line) for line in trace.read_text().splitlines()]
    assert [(line["batch"], line["admitted"], line["positions"], line.get("ahead")) for line in lines] == [
        (0, 2, 2 * positions, 2),
        (0, 2, 2 * positions, 2),
        (5, 5, positions, 4),
        (5, 0, 0, None),
    ]
    assert [line["waiting"] for line in lines] == [3, 1, 0, 0]


def test_text_length_cap_and_engine_cap(checkpoint):
    core = EngineCore(engine_config(checkpoint, max_patches=40))
    core.add_request(make_request("a", text="hi"))
    num_tokens = len(core.runner.checkpoint.tokenizer.encode("hi"))
    assert len(run_until_idle(core)["a"]) == min(6 * num_tokens + 10, 40)


def test_stop_is_honoured_only_after_min_patches(checkpoint, monkeypatch):
    core = EngineCore(engine_config(checkpoint))
    run = core.runner.run

    def always_stop(batch, while_running):
        result = run(batch, while_running)
        return StepResult(result.seqs, result.latents, result.samples, [True] * len(batch))

    monkeypatch.setattr(core.runner, "run", always_stop)
    core.add_request(make_request("a", min_patches=2))
    chunks = run_until_idle(core)["a"]
    assert len(chunks) == 4 and chunks[-1].finish_reason is FinishReason.STOP


def test_seeded_stream_is_deterministic(checkpoint):
    runs = []
    for _ in range(2):
        core = EngineCore(engine_config(checkpoint))
        core.add_request(make_request("a", seed=42, max_patches=4))
        runs.append(run_until_idle(core)["a"])
    assert_same_audio(*runs)
    core.add_request(make_request("b", seed=43, max_patches=4))
    assert not np.array_equal(run_until_idle(core)["b"][0].latents, runs[0][0].latents)


@pytest.mark.parametrize("timesteps", [10, 14])
def test_request_alone_equals_request_in_a_batch(checkpoint, timesteps):
    """Also when the request's Euler-step count differs from the others' (14: the runner moves its row ahead of
    the others', and its last iterations run on its row alone)."""
    # float64: CPU GEMMs round differently for different batch sizes, and the tiny random VAE amplifies a
    # 1e-6 change of its input into O(1) audio, so fp32 audio could not be compared at all.
    config = engine_config(checkpoint, dtype="float64")
    alone = EngineCore(config)
    alone.add_request(make_request("x", text="hello world", seed=7, max_patches=6, inference_timesteps=timesteps))
    expected = run_until_idle(alone)["x"]

    core = EngineCore(config)
    core.add_request(make_request("long", text="a much longer sentence, to be said slowly", seed=1, max_patches=9))
    core.step()
    core.add_request(make_request("x", text="hello world", seed=7, max_patches=6, inference_timesteps=timesteps))
    core.add_request(make_request("short", text="hi", seed=3, max_patches=3, inference_timesteps=4))
    chunks = defaultdict(list)
    for step in range(20):
        if step == 2:
            core.add_request(make_request("late", text="hello hello world", seed=5, max_patches=4))
        for chunk in core.step():
            chunks[chunk.request_id].append(chunk)
    assert set(chunks) == {"long", "x", "short", "late"}
    got = chunks["x"]
    assert [chunk.index for chunk in got] == [chunk.index for chunk in expected]
    # The patches pass through float32 (the model contract), where a batch-size-dependent last bit survives.
    np.testing.assert_allclose(np.stack([c.latents for c in got]), np.stack([c.latents for c in expected]), atol=1e-5)
    # The batched audio is exactly the streaming decode of the request's own latents: no state crosses slots.
    decoder = StreamingVAEDecoder(core.runner.vae, 1, "cpu", torch.float64)
    slot = torch.zeros(1, dtype=torch.int64)
    decoder.reset(slot)
    for chunk in got:
        samples = decoder.decode(slot, torch.from_numpy(chunk.latents).double().T[None])[0]
        np.testing.assert_allclose(chunk.samples, samples.numpy(), atol=1e-6)


def test_continuation_and_reference_prompts(checkpoint):
    core = EngineCore(engine_config(checkpoint))
    info = core.info
    latents = np.random.default_rng(0).standard_normal((3, info.patch_size, info.feat_dim)).astype(np.float32)
    core.add_request(
        GenerationRequest(
            text="world",
            prompt=Prompt(text="hello", latents=latents, reference_latents=latents[:2]),
            params=GenerationParams(seed=0, max_patches=3),
            request_id="a",
        )
    )
    assert len(run_until_idle(core)["a"]) == 3


def test_cancel_returns_blocks_and_slots(checkpoint):
    core = EngineCore(engine_config(checkpoint, max_num_seqs=2))
    scheduler = core.scheduler
    free_blocks, free_slots = sorted(scheduler.block_manager.free_block_ids), sorted(scheduler.free_slots)
    for name in "abc":
        core.add_request(make_request(name))
    core.step()  # a and b run, c waits
    assert core.abort("c") and core.abort("a") and core.abort("b")
    assert not core.abort("a")
    assert sorted(scheduler.block_manager.free_block_ids) == free_blocks
    assert sorted(scheduler.free_slots) == free_slots
    assert not core.has_work()


def test_bad_requests_are_rejected_before_queueing(checkpoint, tiny_checkpoint):
    core = EngineCore(engine_config(checkpoint))
    bad = [
        GenerationRequest(text="   "),
        GenerationRequest(text="hello", params=GenerationParams(cfg_value=50.0)),
        GenerationRequest(text="hello " * 200),  # longer than max_model_len
        GenerationRequest(text="hello", prompt=Prompt(latents=np.zeros((2, 3, 3), dtype=np.float32))),
    ]
    for request in bad:
        with pytest.raises(EngineError):
            core.add_request(request)
    v1 = EngineCore(engine_config(tiny_checkpoint("voxcpm-0.5b")))
    reference = np.zeros((2, v1.info.patch_size, v1.info.feat_dim), dtype=np.float32)
    with pytest.raises(EngineError, match="reference"):
        v1.add_request(GenerationRequest(text="hello", prompt=Prompt(reference_latents=reference)))
    assert not core.scheduler.requests and not v1.scheduler.requests


def test_step_failure_fails_every_request(checkpoint, monkeypatch):
    core = EngineCore(engine_config(checkpoint))
    core.add_request(make_request("a"))
    core.step()
    core.add_request(make_request("b"))

    def broken(batch, while_running):
        raise RuntimeError("device lost")

    monkeypatch.setattr(core.runner, "run", broken)
    with pytest.raises(EngineError, match="device lost"):
        core.step()
    stats = core.stats()
    assert not stats.healthy and stats.running == stats.waiting == 0
    assert stats.kv_blocks_free == stats.kv_blocks_total
    assert not core.has_work()
    with pytest.raises(EngineError):
        core.add_request(make_request("c"))


@pytest.mark.parametrize("pace", [True, False])
def test_paced_burst_is_fully_admitted_without_running_streams_dry(checkpoint, monkeypatch, pace):
    """A second wave arrives while the first plays; a step costs 50 ms plus 20 ms a prompt position (a clock the test
    drives). Unpaced, the wave's admission runs the first wave dry; paced, it goes in a few at a time and nobody
    starves. Either way every request finishes at its cap."""
    clock = FakeClock()
    core = EngineCore(engine_config(checkpoint, max_num_seqs=8, pace_admissions=pace), clock=clock)
    run = core.runner.run

    def timed_run(batch, while_running):
        clock.now += 0.05 + 0.02 * sum(seq.num_prompt for seq in batch if seq.is_prefill)
        return run(batch, while_running)

    monkeypatch.setattr(core.runner, "run", timed_run)
    emitted = defaultdict(list)  # request -> emission time of each chunk

    def step() -> None:
        for chunk in core.step():
            emitted[chunk.request_id].append(clock.now)

    for i in range(2):
        core.add_request(make_request(f"first{i}", max_patches=12))
    step()
    step()  # a decode step: the pacer now knows both costs
    for i in range(6):
        core.add_request(make_request(f"second{i}", max_patches=12))
    while core.has_work():
        step()
    assert sorted(emitted) == sorted([f"first{i}" for i in range(2)] + [f"second{i}" for i in range(6)])
    assert all(len(times) == 12 for times in emitted.values())
    patch_s = core.info.samples_per_patch / core.info.sample_rate
    starved = [name for name, times in emitted.items() if any(t > times[0] + k * patch_s for k, t in enumerate(times))]
    assert (starved == []) is pace
