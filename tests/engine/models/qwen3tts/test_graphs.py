"""The Qwen3 runner's CUDA graphs (engine/models/qwen3tts/runner.py): the frame body replayed per batch bucket.

CPU, with the stand-in capture of tests/engine/test_cuda_graphs.py (a replay re-runs the body on the static
buffers): the graph path's plumbing (staged inputs, scratch padding, bucket choice, the packed result cut to the
batch) gives the eager engine's chunks. GPU (marker `gpu`), on a tiny and a full-size random 0.6B checkpoint:
graphed == eager bit for bit when every step's row count is a bucket size (the graphs then run the eager step's
kernels on the same shapes), and, for row counts between buckets, every replay equals the eager body run on the
same padded rows (result and every slot's state but the scratch slot's), as the engine runs them.

The schedules mix speakers, languages, greedy and sampled requests (other temperatures, seeds), requests of other
lengths joining and leaving between steps (a newcomer takes a freed slot) and every request's last frame (no
look-ahead). min_patches = max_patches masks EOS, so the schedule does not depend on the draws.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from engine import cuda_graphs
from engine.engine_core import EngineCore
from engine.models.qwen3tts.make_checkpoint import make_checkpoint
from engine.models.qwen3tts.runner import Qwen3Runner
from engine.params import GenerationParams, GenerationRequest, Prompt
from tests.engine.helpers import engine_config
from tests.engine.test_cuda_graphs import _bits, _stand_in_capture

VARIANT = "customvoice-0.6b"
Chunks = dict[str, list[tuple[np.ndarray, np.ndarray]]]  # request id -> (codes, samples) per chunk
# (request id, joins at step, frames, speaker, language, temperature, seed)
Schedule = list[tuple[str, int, int, str, str, float, int]]

# Steps of 2, 2, 4, 4, 8, 8, 8, 8 rows (max_num_seqs 8: buckets 1, 2, 4, 8); r1 leaves after step 3, r4 takes its
# slot.
BUCKETED: Schedule = [
    ("r0", 0, 8, "vivian", "english", 0.0, 1),
    ("r1", 0, 4, "aiden", "auto", 1.0, 2),
    ("r2", 2, 6, "ryan", "chinese", 0.7, 3),
    ("r3", 2, 6, "serena", "english", 0.0, 4),
    *((f"r{i}", 4, 4, "eric", "auto", 1.0, i + 1) for i in range(4, 9)),
]
BUCKETED_ROWS = [2, 2, 4, 4, 8, 8, 8, 8]

# Steps of 3, 3, 5, 5, 7, 6, 6 rows: every step padded (to 4 or 8).
BETWEEN: Schedule = [
    ("r0", 0, 7, "vivian", "english", 0.0, 1),
    ("r1", 0, 3, "aiden", "auto", 1.0, 2),
    ("r2", 0, 5, "ryan", "chinese", 0.7, 3),
    ("r3", 2, 5, "serena", "english", 1.0, 4),
    ("r4", 2, 2, "eric", "auto", 0.0, 5),
    ("r5", 3, 4, "vivian", "auto", 1.0, 6),
    *((f"r{i}", 4, 3, "aiden", "english", 0.9, i + 1) for i in range(6, 9)),
]
BETWEEN_ROWS = [3, 3, 5, 5, 7, 6, 6]


def _run(core: EngineCore, schedule: Schedule) -> tuple[Chunks, list[int]]:
    """Drive the schedule; returns the chunks and the rows of every step."""
    rows: list[int] = []
    step_fn = core.runner._step

    def counted(inputs: np.ndarray) -> torch.Tensor:
        rows.append(len(inputs))
        return step_fn(inputs)

    core.runner._step = counted
    chunks: Chunks = {}
    step = 0
    while step == 0 or core.has_work():
        for rid, joins, frames, speaker, language, temperature, seed in schedule:
            if joins == step:
                params = GenerationParams(seed=seed, temperature=temperature, min_patches=frames, max_patches=frames)
                prompt = Prompt(speaker=speaker, language=language)
                core.add_request(GenerationRequest(f"Hello from {rid}.", prompt, params, rid))
        for chunk in core.step():
            chunks.setdefault(chunk.request_id, []).append((chunk.latents.copy(), chunk.samples.copy()))
        step += 1
    expected = {rid: frames for rid, _, frames, *_ in schedule}
    assert {rid: len(c) for rid, c in chunks.items()} == expected
    return chunks, rows


def _joined(chunks: Chunks, rid: str, part: int) -> np.ndarray:
    return np.concatenate([chunk[part].ravel() for chunk in chunks[rid]])


def _assert_same(a: Chunks, b: Chunks, audio_atol: float = 0.0) -> None:
    """Equal codes; equal audio (bit for bit unless audio_atol)."""
    assert a.keys() == b.keys()
    for rid in a:
        np.testing.assert_array_equal(_joined(a, rid, 0), _joined(b, rid, 0), err_msg=rid)
        audio = [_joined(run, rid, 1) for run in (a, b)]
        assert np.isfinite(audio[1]).all() and np.abs(audio[1]).max() > 0
        np.testing.assert_allclose(*audio, rtol=0, atol=audio_atol, err_msg=rid)


def _graphed_on_cpu(core: EngineCore, monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, object]]:
    """Give a CPU runner its graphs, captured with the stand-in; returns the replay log."""
    replays: list[tuple[str, object]] = []
    names: dict[object, str] = {}
    monkeypatch.setattr(cuda_graphs, "capture", _stand_in_capture(replays, names))
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: None)
    runner = core.runner
    runner.graphs = runner._capture_graphs(core.config.max_num_seqs)
    names[runner.graphs.frame.body] = "frame"
    replays.clear()  # the captures' own calls
    return replays


@pytest.mark.parametrize(
    ("schedule", "rows"), [(BUCKETED, BUCKETED_ROWS), (BETWEEN, BETWEEN_ROWS)], ids=["bucketed", "between"]
)
def test_graph_plumbing_on_cpu(qwen_checkpoint, monkeypatch: pytest.MonkeyPatch, schedule, rows) -> None:
    """Graph path vs eager engine on the CPU: the same codes and audio (fp32: padding rows leave the real rows'
    numbers alone up to GEMM blocking), each step replaying the smallest bucket that holds its rows."""
    results = []
    for graphed in (False, True):
        core = EngineCore(engine_config(qwen_checkpoint(VARIANT), max_num_seqs=8, max_patches=8))
        replays = _graphed_on_cpu(core, monkeypatch) if graphed else []
        chunks, seen = _run(core, schedule)
        assert seen == rows
        results.append(chunks)
    assert replays == [("frame", cuda_graphs.smallest_fit([1, 2, 4, 8], n)) for n in rows]
    _assert_same(*results, audio_atol=0.0 if schedule is BUCKETED else 1e-5)


def test_scratch_rows_touch_no_request_state(qwen_checkpoint, monkeypatch: pytest.MonkeyPatch) -> None:
    """A step padded with scratch rows leaves every other slot's state as the unpadded step does."""
    core = EngineCore(engine_config(qwen_checkpoint(VARIANT), max_num_seqs=8, max_patches=8))
    runner: Qwen3Runner = core.runner
    for i in range(3):
        core.add_request(
            GenerationRequest(f"Hi {i}.", params=GenerationParams(seed=i, min_patches=8), request_id=f"r{i}")
        )
    core.step()  # admits the three
    inputs = np.array([(seq.slot, 1, 1) for seq in core.scheduler.running], dtype=np.int64)
    before = _state(runner)
    with torch.inference_mode():
        unpadded = runner._frame(torch.from_numpy(inputs))
        after_unpadded = _state(runner)
        _restore(runner, before)
        _graphed_on_cpu(core, monkeypatch)
        padded = runner._step(inputs)[:3].clone()
    np.testing.assert_allclose(padded.numpy(), unpadded.numpy(), rtol=0, atol=1e-5)
    assert torch.equal(padded[:, :16], unpadded[:, :16])
    _assert_same_state(runner, after_unpadded, _state(runner), atol=1e-5)


def _written(runner: Qwen3Runner) -> list[torch.Tensor]:
    """Every tensor a step writes: slot state, decoder contexts, the talker's KV pool."""
    caches = [
        t for layer in runner.model.talker.model.layers for t in (layer.self_attn.k_cache, layer.self_attn.v_cache)
    ]
    return [runner.slot_hidden, runner.slot_c0, runner.slot_history, *runner.decoder_state.tensors.values(), *caches]


def _state(runner: Qwen3Runner) -> list[torch.Tensor]:
    return [t.clone() for t in _written(runner)]


def _restore(runner: Qwen3Runner, saved: list[torch.Tensor]) -> None:
    for t, s in zip(_written(runner), saved, strict=True):
        t.copy_(s)


def _assert_same_state(runner: Qwen3Runner, a: list[torch.Tensor], b: list[torch.Tensor], atol: float = 0.0) -> None:
    """Equal (bit for bit unless atol) in every slot but the scratch one and every KV block but the scratch block."""
    slots = runner.scratch_slot + 1
    for x, y in zip(a, b, strict=True):
        cut = runner.scratch_slot if x.shape[0] == slots else runner.scratch_block
        if atol and x.is_floating_point():
            torch.testing.assert_close(x[:cut], y[:cut], rtol=0, atol=atol)
        else:
            assert torch.equal(_bits(x[:cut]), _bits(y[:cut]))


# -- GPU ----------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def checkpoints(qwen_checkpoint, tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """tiny: the session's tiny checkpoint; full: a random full-size 0.6B CustomVoice (made once)."""
    made: dict[str, Path] = {}

    def get(size: str) -> Path:
        if size == "tiny":
            return qwen_checkpoint(VARIANT)
        if size not in made:
            made[size] = make_checkpoint(VARIANT, size, tmp_path_factory.mktemp("qwen3tts-full") / VARIANT)
        return made[size]

    return get


def _cuda_core(checkpoint: Path, eager: bool) -> EngineCore:
    # bf16 as served; flash-attn's paged kernels (the full checkpoint's head_dim 128) need blocks of 256 positions
    config: dict[str, Any] = dict(device="cuda", dtype="bfloat16", max_num_seqs=8, max_patches=8)
    core = EngineCore(engine_config(checkpoint, **config, max_model_len=512, kv_block_size=256, enforce_eager=eager))
    assert (core.runner.graphs is None) == eager
    assert eager or core.runner.graphs.buckets == [1, 2, 4, 8]
    return core


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("size", ["tiny", "full"])
def test_graphed_equals_eager(checkpoints, size: str) -> None:
    """Bucket-sized steps, eager vs graphed engine: every code and every sample bit for bit."""
    results = []
    for eager in (True, False):
        chunks, rows = _run(_cuda_core(checkpoints(size), eager), BUCKETED)
        assert rows == BUCKETED_ROWS
        results.append(chunks)
    _assert_same(*results)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("size", ["tiny", "full"])
def test_padded_replays_equal_the_eager_body(checkpoints, size: str) -> None:
    """Steps between buckets: every replay (rows padded with the scratch slot) equals the eager body on the same
    padded rows, its packed result and the state it leaves in every slot and KV block but the scratch ones."""
    core = _cuda_core(checkpoints(size), eager=False)
    runner: Qwen3Runner = core.runner
    assert runner.graphs is not None
    replay = runner._step
    checked: list[int] = []

    def step(inputs: np.ndarray) -> torch.Tensor:
        rows, bucket = len(inputs), runner.graphs.bucket(len(inputs))
        before = _state(runner)
        graphed = replay(inputs)[:rows].clone()
        after_graph = _state(runner)
        _restore(runner, before)
        padded = np.concatenate([inputs, np.tile([runner.scratch_slot, 0, 0], (bucket - rows, 1))])
        eager = runner._frame(torch.from_numpy(padded).to(runner.device))[:rows]
        assert torch.isfinite(graphed).all() and bool((graphed[:, 16:-1] != 0).any())
        assert torch.equal(_bits(graphed), _bits(eager)), f"{rows} rows"
        _assert_same_state(runner, after_graph, _state(runner))
        checked.append(rows)
        return graphed

    runner._step = step
    _run(core, BETWEEN)
    assert checked == BETWEEN_ROWS
