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

# fp32 on the CPU: padding a step changes its GEMMs' row counts, and a CPU BLAS may block (and sum) them differently:
# a few ulps per GEMM, which the random codec decoder grows to 6e-5 in audio clipped to [-1, 1] on an AMD EPYC (AVX2),
# where the CI machine gave identical bits. A plumbing fault (a wrong row, slot or position) is off by far more.
# The slots' state (KV, codec decoder context) moved there by up to 2.5e-4 of an element's value; per slot or block,
# 4.5e-6 in norm.
BLOCKING_AUDIO_ATOL, BLOCKING_STATE_REL = 5e-4, 1e-4


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


def _graphed_on_cpu(
    core: EngineCore, monkeypatch: pytest.MonkeyPatch, prefill_graph_tokens: int = 0
) -> list[tuple[str, object]]:
    """Give a CPU runner its graphs, captured with the stand-in; returns the replay log."""
    replays: list[tuple[str, object]] = []
    names: dict[object, str] = {}
    monkeypatch.setattr(cuda_graphs, "capture", _stand_in_capture(replays, names))
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: None)
    runner = core.runner
    runner.graphs = graphs = runner._capture_graphs(core.config.max_num_seqs, prefill_graph_tokens)
    names[graphs.frame.body] = "frame"
    if graphs.prefill is not None:
        names[graphs.prefill.body] = "prefill"
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
    _assert_same(*results, audio_atol=0.0 if schedule is BUCKETED else BLOCKING_AUDIO_ATOL)


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
    np.testing.assert_allclose(padded.numpy(), unpadded.numpy(), rtol=0, atol=BLOCKING_AUDIO_ATOL)  # codes, audio
    assert torch.equal(padded[:, :16], unpadded[:, :16])
    _assert_same_state(runner, after_unpadded, _state(runner), blocking=True)


def test_prefill_graph_plumbing_on_cpu(qwen_checkpoint, monkeypatch: pytest.MonkeyPatch) -> None:
    """Admissions through the prefill graphs (packed static inputs and embedded rows padded to the key: padded
    positions and sequences write the scratch block and slot) against the eager engine: the same codes, the same
    audio up to fp32 rounding (a padded prefill's GEMMs may block differently), the smallest key holding each
    admission, and an admission past the buckets eager."""
    results, replays = [], []
    for graphed in (False, True):
        config = engine_config(qwen_checkpoint(VARIANT), max_num_seqs=8, max_patches=8, max_model_len=256)
        core = EngineCore(config)
        if graphed:
            replays = _graphed_on_cpu(core, monkeypatch, prefill_graph_tokens=128)
        chunks, rows = _run(core, BETWEEN)
        assert rows == BETWEEN_ROWS
        # One prompt of more than 128 rows: past the largest token bucket.
        long = GenerationRequest("A much longer sentence. " * 5, params=GenerationParams(seed=9, max_patches=2))
        core.add_request(long)
        assert core.scheduler.waiting[0].num_prompt > 128
        while core.has_work():
            for chunk in core.step():
                chunks.setdefault("long", []).append((chunk.latents.copy(), chunk.samples.copy()))
        results.append(chunks)
    # BETWEEN admits 3, 2, 1 and 3 requests of about 25 prompt rows each; the long one runs eagerly.
    assert [key for name, key in replays if name == "prefill"] == [(128, 4), (64, 2), (64, 1), (128, 4)]
    _assert_same(*results, audio_atol=BLOCKING_AUDIO_ATOL)


def test_packed_prefill_padding_is_inert(qwen_checkpoint) -> None:
    """`_pack_prefill` padded to a key: the real positions as unpadded, padded positions with no ids (zero rows)
    writing K/V into the scratch block, padded sequences empty with the scratch slot."""
    core = EngineCore(engine_config(qwen_checkpoint(VARIANT), max_num_seqs=8))
    runner: Qwen3Runner = core.runner
    for i, text in enumerate(["Hi.", "Hello there, you."]):
        core.add_request(GenerationRequest(text, params=GenerationParams(seed=i), request_id=f"r{i}"))
    seqs = core.scheduler.schedule()
    n, lengths = sum(seq.num_prompt for seq in seqs), [seq.num_prompt for seq in seqs]
    tight = runner._pack_prefill(seqs, n, 2)
    padded = runner._pack_prefill(seqs, 64, 4)
    assert tight.size == runner._packed_size(n, 2) and padded.size == runner._packed_size(64, 4)

    def parts(packed: np.ndarray, tokens: int, rows: int) -> list[np.ndarray]:
        cuts = np.cumsum([tokens] * 4 + [rows + 1] + [rows] * 3)
        return np.split(packed, cuts)

    bs, scratch = runner.block_size, runner.scratch_block
    t_text, t_codec, t_pos, t_map, t_cu, t_len, t_last, t_slots, t_blocks = parts(tight, n, 2)
    p_text, p_codec, p_pos, p_map, p_cu, p_len, p_last, p_slots, p_blocks = parts(padded, 64, 4)
    for a, b in ((t_text, p_text), (t_codec, p_codec), (t_pos, p_pos), (t_map, p_map)):
        np.testing.assert_array_equal(b[:n], a)
    assert (p_text[n:] == -1).all() and (p_codec[n:] == -1).all()
    assert (p_map[n:] // bs == scratch).all() and not (t_map // bs == scratch).any()
    assert t_cu.tolist() == [0, lengths[0], n] and p_cu.tolist() == [0, lengths[0], n, n, n]
    assert t_len.tolist() == lengths and p_len.tolist() == [*lengths, 0, 0]
    assert p_last[:2].tolist() == t_last.tolist() == [lengths[0] - 1, n - 1]
    assert p_slots.tolist() == [*t_slots.tolist(), runner.scratch_slot, runner.scratch_slot]
    blocks = p_blocks.reshape(4, -1)
    np.testing.assert_array_equal(blocks[:2], t_blocks.reshape(2, -1))
    assert (blocks[2:] == scratch).all()


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


def _assert_same_state(
    runner: Qwen3Runner, a: list[torch.Tensor], b: list[torch.Tensor], blocking: bool = False
) -> None:
    """Equal (bit for bit, or up to CPU GEMM blocking) in every slot but the scratch one and every KV block but the
    scratch block."""
    slots = runner.scratch_slot + 1
    for x, y in zip(a, b, strict=True):
        cut = runner.scratch_slot if x.shape[0] == slots else runner.scratch_block
        if blocking and x.is_floating_point():
            moved = (x[:cut] - y[:cut]).flatten(1).norm(dim=1) / y[:cut].flatten(1).norm(dim=1).clamp_min(1e-12)
            assert float(moved.max()) < BLOCKING_STATE_REL, moved
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


def _relative_rms(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


def _cuda_core(checkpoint: Path, eager: bool, prefill_graph_tokens: int = 0) -> EngineCore:
    # bf16 as served; flash-attn's paged kernels (the full checkpoint's head_dim 128) need blocks of 256 positions.
    # No prefill graphs unless asked: a padded prefill may pick other GEMM tiles than the eager one (bits differ).
    config: dict[str, Any] = dict(device="cuda", dtype="bfloat16", max_num_seqs=8, max_patches=8)
    config.update(max_model_len=512, kv_block_size=256, prefill_graph_tokens=prefill_graph_tokens)
    core = EngineCore(engine_config(checkpoint, **config, enforce_eager=eager))
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


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("size", ["tiny", "full"])
def test_prefill_replays_equal_the_eager_body(checkpoints, size: str) -> None:
    """Admissions through the prefill graphs (padded positions and sequences): every replay equals its body run
    eagerly on the same static inputs, bit for bit, in every slot's hidden and codebook 0 and every KV block
    but the scratch ones, and the eager body over the prompts alone (unpadded) up to bf16 rounding in the hiddens
    and K/V (relative RMS); the engine then streams finite audio."""
    core = _cuda_core(checkpoints(size), eager=False, prefill_graph_tokens=256)
    runner: Qwen3Runner = core.runner
    graphs = runner.graphs
    assert graphs is not None and graphs.prefill is not None and graphs.prefill_buckets is not None
    assert graphs.prefill_buckets.tokens == [64, 128, 256] and graphs.prefill_buckets.seqs == [1, 2, 4, 8]
    prefill = runner._prefill
    keys: list[tuple[int, int]] = []

    def checked(seqs: list) -> None:
        key = graphs.prefill_buckets.key_for(sum(seq.num_prompt for seq in seqs), len(seqs))
        assert key is not None
        before = _state(runner)
        prefill(seqs)
        after_graph = _state(runner)
        _restore(runner, before)
        runner._prefill_graph_body(*key)  # eagerly, on the static inputs the replay read
        _assert_same_state(runner, after_graph, _state(runner))
        # and the prompts alone, unpadded: the same hiddens and K/V up to bf16 rounding (GEMM tiles may differ)
        _restore(runner, before)
        tokens, longest = sum(seq.num_prompt for seq in seqs), max(seq.num_prompt for seq in seqs)
        packed = runner._to_device(runner._pack_prefill(seqs, tokens, len(seqs)))
        x = runner.model.embed_prompts([seq.prompt.prompt for seq in seqs], packed[: 2 * tokens].view(2, -1))
        runner._prefill_body(packed, x, tokens, len(seqs), longest, longest)
        slots = [seq.slot for seq in seqs]
        assert _relative_rms(runner.slot_hidden[slots], after_graph[0][slots]) < 2e-2
        blocks = [block for seq in seqs for block in seq.block_table]
        caches = slice(3 + len(runner.decoder_state.tensors), None)  # _written's KV pool tensors
        for cache, graphed in zip(_written(runner)[caches], after_graph[caches], strict=True):
            assert _relative_rms(cache[blocks], graphed[blocks]) < 2e-2
        _restore(runner, after_graph)
        keys.append(key)

    runner._prefill = checked
    chunks, rows = _run(core, BETWEEN)
    assert rows == BETWEEN_ROWS
    assert [seqs for _, seqs in keys] == [4, 2, 1, 4]  # BETWEEN admits 3, 2, 1 and 3 requests
    for rid in chunks:
        audio = _joined(chunks, rid, 1)
        assert np.isfinite(audio).all() and np.abs(audio).max() > 0
