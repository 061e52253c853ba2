"""CUDA graphs of the step's pieces: bucket choice and the graph plumbing (CPU, with a stand-in capture), and
graphed == eager on the GPU (marker `gpu`).

Graphed == eager bit for bit wherever the graphs run the eager step's kernels on the same shapes, i.e. when every
piece's row count is a bucket size (a padded piece may pick other GEMM tiles). Under enforce_eager the steps keep
cuDNN for their VAE decode, as the graphs do, so the audio is compared bit for bit too."""

from __future__ import annotations

import collections
import functools
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from engine import cuda_graphs
from engine.cuda_graphs import (
    PINNED_RESULTS_ALIVE,
    PrefillBuckets,
    bucket_sizes,
    cache_pinned_rows,
    eager_token_ladder,
    eager_tokens,
    smallest_fit,
)
from engine.device import native_convs
from engine.engine_core import EngineCore
from engine.models.voxcpm.runner import VoxCPMRunner
from engine.params import GenerationParams, GenerationRequest, Prompt
from tests.engine.helpers import engine_config


def test_bucket_sizes_cover_every_batch_up_to_the_maximum() -> None:
    assert bucket_sizes(1) == [1]
    assert bucket_sizes(20) == [1, 2, 4, 8, 16, 20]
    assert bucket_sizes(512)[-1] == 512 and bucket_sizes(600)[-2:] == [512, 600]
    assert smallest_fit([1, 2, 4], 3) == 4 and smallest_fit([1, 2, 4], 4) == 4 and smallest_fit([1, 2, 4], 5) is None


def test_prefill_graph_keys() -> None:
    buckets = PrefillBuckets.up_to(max_tokens=1024, max_seqs=4)
    assert buckets.tokens == [64, 128, 256, 512, 1024] and buckets.seqs == [1, 2, 4] and buckets.ahead is None
    assert buckets.keys()[:4] == [(64, 1), (64, 2), (64, 4), (128, 1)] and len(buckets.keys()) == 15
    assert buckets.key_for(1, 1) == (64, 1) and buckets.key_for(65, 3) == (128, 4) and buckets.key_for(1024, 4)
    assert buckets.key_for(1025, 1) is None and buckets.key_for(10, 5) is None
    # Passes ahead get a key of their own where no other holds them, replayed for them only.
    assert PrefillBuckets.up_to(1024, 8, ahead=(512, 8)).ahead is None  # (512, 8) holds such a pass
    buckets = PrefillBuckets.up_to(1024, 1024, ahead=(8192, 256))
    assert buckets.ahead == (8192, 256) and buckets.keys()[-1] == (8192, 256) and len(buckets.keys()) == 21
    assert buckets.key_for(9000, 200) is None and buckets.key_for(8192, 256) is None
    assert buckets.key_for(8192, 256, ahead=True) == (8192, 256) and buckets.key_for(100, 2, ahead=True) == (128, 2)
    assert buckets.key_for(8193, 10, ahead=True) is None and buckets.key_for(100, 257, ahead=True) is None


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The bit pattern of a tensor (equal bits, NaNs included)."""
    if not t.is_floating_point():
        return t
    return t.view({2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


Chunks = dict[str, list[tuple[np.ndarray, np.ndarray]]]  # request id -> (latents, samples) per chunk

# (request, Euler steps, patches, joins at step): everyone's last chunk comes at step 7. Chosen so that with
# max_num_seqs=8 every piece's row count is a bucket size: parts of 2, 4 and 8 rows whose Euler-step counts leave
# 1, 2, 4 or 8 rows in the late iterations (a part's rows run most steps first).
MIXED = [("r0", 10, 8, 0), ("r1", 9, 8, 0), ("r2", 8, 6, 2), ("r3", 8, 6, 2)] + [
    (f"r{i}", 7, 4, 4) for i in range(4, 8)
]


def _run_mixed_steps(core: EngineCore, loras: dict[str, str] | None = None) -> Chunks:
    """Four requests join a running pair over two admissions; rows differ in Euler steps within a batch, and one
    newcomer (r2) continues prompt audio (primed VAE context). Decodes of 2, 2, 4, 4, 8, 8, 8 rows; admissions of
    2, 2, 4. `loras`: the LoRA adapter of some requests (by request id)."""
    shape = (3, core.info.patch_size, core.info.feat_dim)
    latents = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    chunks: Chunks = {}
    step = 0
    while step == 0 or core.has_work():
        for request_id, timesteps, patches, joins in MIXED:
            if joins != step:
                continue
            params = GenerationParams(
                seed=int(request_id[1:]) + 1,
                inference_timesteps=timesteps,
                max_patches=patches,
                lora=(loras or {}).get(request_id),
            )
            prompt = Prompt(text="the voice", latents=latents) if request_id == "r2" else Prompt()
            core.add_request(
                GenerationRequest(text=f"hello {request_id}", prompt=prompt, params=params, request_id=request_id)
            )
        for chunk in core.step():
            # Copies: on the CPU a chunk is a view of the step's result.
            chunks.setdefault(chunk.request_id, []).append((chunk.latents.copy(), chunk.samples.copy()))
        step += 1
    return chunks


def _assert_same_chunks(a: Chunks, b: Chunks) -> None:
    """Equal latents and audio, bit for bit."""
    assert a.keys() == b.keys() and len(a) == 8
    for request_id in a:
        for part in (0, 1):
            got = [np.concatenate([chunk[part].ravel() for chunk in run[request_id]]) for run in (a, b)]
            assert got[0].shape == got[1].shape and np.isfinite(got[1]).all()
            np.testing.assert_array_equal(*got, err_msg=request_id)


def _stand_in_capture(replays: list[tuple[str, object]], names: dict[object, str]):
    """A capture for the CPU whose replay re-runs the body on the static buffers into the captured outputs (the
    graphs' bodies write everything else into static buffers themselves), logging (piece, key) per replay."""

    def capture(fn: functools.partial, device: torch.device, pool: object) -> tuple[object, object]:
        out = fn()  # the warm-up
        key = fn.args[0]

        def replay() -> None:
            replays.append((names.get(fn.func, "?"), key))
            fresh = fn()
            for static, value in zip(*((out, fresh) if isinstance(out, tuple) else ((out,), (fresh,))), strict=True):
                if static is not None:
                    static.copy_(value)

        return SimpleNamespace(replay=replay), out

    return capture


def _graphed_on_cpu(core: EngineCore, monkeypatch: pytest.MonkeyPatch, prefill_graph_tokens: int) -> list:
    """Give a CPU runner its graphs, captured with the stand-in; returns the replay log."""
    replays: list[tuple[str, object]] = []
    names: dict[object, str] = {}
    monkeypatch.setattr(cuda_graphs, "capture", _stand_in_capture(replays, names))
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: None)
    runner = core.runner
    with torch.inference_mode():
        runner.graphs = graphs = runner._capture_graphs(core.config.max_num_seqs, prefill_graph_tokens)
    for name in ("decode_head", "prefill_head", "euler", "finish", "backbone"):
        if getattr(graphs, name) is not None:
            names[getattr(graphs, name).body] = name
    replays.clear()  # the captures' own calls
    return replays


def test_eager_prefills_pad_to_a_ladder_of_eight_sizes_an_octave() -> None:
    assert [eager_tokens(n) for n in (1, 16, 17, 128, 129, 1024, 1025, 8190, 8192)] == [
        16, 16, 32, 128, 144, 1024, 1152, 8192, 8192,
    ]  # fmt: skip
    for n in range(1, 20_000):
        size = eager_tokens(n)
        assert n <= size and eager_tokens(size) == size  # a size pads to itself
        assert size - n < max(16, n / 8)  # at most an eighth past 128 positions
    ladder = eager_token_ladder(8192)
    assert len(ladder) == 56 and ladder[-1] == 8192 and ladder == sorted(set(ladder))
    assert {eager_tokens(n) for n in range(1, 8193)} == set(ladder)
    assert eager_token_ladder(8193)[-1] == 9216 and eager_token_ladder(1) == [16]


def test_graph_plumbing_on_cpu(tiny_checkpoint, monkeypatch: pytest.MonkeyPatch) -> None:
    """The runner's graph paths (static inputs, padding, bucket choice, Euler iterations over the rows that still
    have steps, finish copied out per part) on the CPU with a stand-in capture: the same bits as the eager runner,
    and the pieces replayed in the expected order and buckets."""
    checkpoint = tiny_checkpoint("voxcpm2", stop=False)
    results, replays = [], []
    for graphed in (False, True):
        core = EngineCore(engine_config(checkpoint, dtype="bfloat16", max_num_seqs=8, max_patches=8))
        if graphed:
            replays = _graphed_on_cpu(core, monkeypatch, prefill_graph_tokens=0)
        results.append(_run_mixed_steps(core))
    _assert_same_chunks(*results)

    def part(head: str, rows: int, iterations: list[tuple[int, int]]) -> list[tuple[str, int]]:
        """A head over `rows` rows, then (bucket, times) Euler iterations, then finish."""
        euler = [("euler", bucket) for bucket, times in iterations for _ in range(times)]
        return [(head, rows), *euler, ("finish", rows)]

    steps_10_9 = [(2, 8), (1, 1)]  # rows with 10 and 9 steps: iterations 2-9 on both, 10 on one
    steps_10_9_8_8 = [(4, 7), (2, 1), (1, 1)]
    steps_10_9_8_8_7x4 = [(8, 6), (4, 1), (2, 1), (1, 1)]
    assert replays == [
        *part("prefill_head", 2, steps_10_9),  # step 0: r0, r1 admitted
        *part("decode_head", 2, steps_10_9),  # step 1
        *part("decode_head", 2, steps_10_9),  # step 2: r0, r1 decode, r2, r3 (8 steps each) admitted
        *part("prefill_head", 2, [(2, 7)]),
        *part("decode_head", 4, steps_10_9_8_8),  # step 3
        *part("decode_head", 4, steps_10_9_8_8),  # step 4: r4-r7 (7 steps each) admitted
        *part("prefill_head", 4, [(4, 6)]),
        *part("decode_head", 8, steps_10_9_8_8_7x4) * 3,  # steps 5-7
    ]


def test_backbone_graph_plumbing_on_cpu(tiny_checkpoint, monkeypatch: pytest.MonkeyPatch) -> None:
    """Admissions through the prefill backbone graphs (packed static inputs padded to the key, outputs cut to the
    batch; prompt audio runs eagerly) with the stand-in capture: the same chunks as the eager engine up to fp32
    rounding (a padded backbone's GEMMs may block differently), and the keys chosen."""
    checkpoint = tiny_checkpoint("voxcpm2", stop=False)
    results, replays = [], []
    for graphed in (False, True):
        core = EngineCore(engine_config(checkpoint, max_num_seqs=8, max_patches=8))
        if graphed:
            # Buckets past max_model_len (128): a padded admission may hold more positions than a sequence.
            replays = _graphed_on_cpu(core, monkeypatch, prefill_graph_tokens=256)
        results.append(_run_mixed_steps(core))
    # r2 continues prompt audio, so the admission of r2 and r3 runs eagerly.
    assert [key for name, key in replays if name == "backbone"] == [(64, 2), (64, 4)]
    for request_id, chunks in results[0].items():
        for (a, _), (b, _) in zip(chunks, results[1][request_id], strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5, err_msg=request_id)


@pytest.mark.parametrize("prefill_graph_tokens", [8, 256])
def test_prefill_ahead_through_the_backbone_graphs_on_cpu(
    tiny_checkpoint, monkeypatch: pytest.MonkeyPatch, prefill_graph_tokens: int
) -> None:
    """Requests prefilled ahead through a backbone graph keep its outputs (static buffers the next replay overwrites)
    until their first step, with the stand-in capture: a full pass of two prefilled ahead, two more admitted with
    them, against all four admitted in one step: the same chunks up to a padded backbone's fp32 rounding. The pass
    replays a step's key where one holds it (256), else the key of passes ahead (8: 2 x 5 positions over at most 8
    rows), which a step's admission never replays (eager)."""
    checkpoint = tiny_checkpoint("voxcpm2", stop=False)
    requests = [
        GenerationRequest(text=f"hello r{i}", params=GenerationParams(seed=i + 1, max_patches=4), request_id=f"r{i}")
        for i in range(4)
    ]
    positions = EngineCore(engine_config(checkpoint)).make_sequence(requests[0]).num_prompt
    results, keys = [], []
    for ahead in (True, False):
        config = engine_config(checkpoint, max_num_seqs=8, max_patches=4, prefill_ahead_tokens=2 * positions)
        core = EngineCore(config)
        replays = _graphed_on_cpu(core, monkeypatch, prefill_graph_tokens)
        for i, request in enumerate(requests):
            core.add_request(request)
            if ahead and i == 1:
                core.prefill_ahead()
                assert len(core.scheduler.running) == 2
        chunks: Chunks = {}
        while core.has_work():
            for chunk in core.step():
                chunks.setdefault(chunk.request_id, []).append((chunk.latents.copy(), chunk.samples.copy()))
        results.append(chunks)
        keys.append([key for name, key in replays if name == "backbone"])
    assert positions == 5
    if prefill_graph_tokens == 8:
        assert keys == [[(10, 8)], []]
    else:
        assert keys == [[(64, 2), (64, 2)], [(64, 4)]]
    assert results[0].keys() == results[1].keys() and len(results[0]) == 4
    for request_id, chunks in results[0].items():
        for (a, _), (b, _) in zip(chunks, results[1][request_id], strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5, err_msg=request_id)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("ahead", [False, True])
def test_graphed_prefill_backbone_matches_eager(tmp_path, ahead: bool) -> None:
    """The backbone of text-only admissions replayed from its graph (flash-attn varlen over padded positions and
    empty padded sequences) against the eager backbone: same hiddens up to bf16 rounding, same K/V written, and
    nothing written outside the requests' blocks but the scratch block. `ahead`: through the key of passes prefilled
    ahead (2,048 positions over 8 rows, most of them padding, the queries' bound the model's 128 rounded to a
    block)."""
    from tests.engine.models.voxcpm.test_model_gpu import _head_dim_64_checkpoint

    checkpoint = _head_dim_64_checkpoint(tmp_path / "hd64")
    config = engine_config(
        checkpoint, device="cuda", dtype="bfloat16", max_num_seqs=8, kv_block_size=256, prefill_ahead_tokens=2048
    )
    core = EngineCore(config)
    runner = core.runner
    graphs = runner.graphs
    assert graphs is not None and graphs.backbone is not None and graphs.backbone_buckets is not None
    for i, text in enumerate(["hello world", "a longer sentence to say out loud", "three"]):
        core.add_request(GenerationRequest(text=text, params=GenerationParams(seed=i), request_id=f"r{i}"))
    seqs = core.scheduler.schedule()
    caches = [c for attn in runner.model._causal_attention() for c in (attn.k_cache, attn.v_cache)]
    with torch.inference_mode():
        for cache in caches:
            cache.zero_()
        eager = [t.clone() for t in runner.model.backbone(runner._prefill_inputs(seqs)[0])]
        eager_kv = [cache.clone() for cache in caches]
        for cache in caches:
            cache.zero_()
        key = graphs.backbone_buckets.key_for(sum(seq.num_prompt for seq in seqs), len(seqs))
        assert key == (64, 4) and graphs.backbone_buckets.ahead == (2048, 8)
        if ahead:
            key = graphs.backbone_buckets.ahead
        packed = torch.from_numpy(runner._pack_prefill(seqs, *key)).to(runner.device)
        fill = lambda: runner._prefill_static[: packed.numel()].copy_(packed)  # noqa: E731
        slots, *graphed = graphs.backbone.run(key, fill)
    assert slots.tolist() == [seq.slot for seq in seqs] + [runner.scratch_slot] * (key[1] - len(seqs))
    for a, b in zip(eager, graphed, strict=True):
        assert torch.isfinite(b[:3]).all()
        torch.testing.assert_close(b[:3].float(), a.float(), rtol=2e-2, atol=2e-2)
    real = slice(0, runner.scratch_block)  # the scratch block holds the padded positions' K/V
    for a, b in zip(eager_kv, caches, strict=True):
        torch.testing.assert_close(b[real].float(), a[real].float(), rtol=2e-2, atol=2e-2)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("timesteps", [10, 4, 37])
def test_graphed_decode_equals_eager(tiny_checkpoint, timesteps: int) -> None:
    """Same requests, same admission pattern (two join mid-stream, so steps mix a graphed decode with a graphed
    prefill head after an eager backbone), eager vs graphed, for the default Euler-step count and others: every
    graph serves every count. Every part is a bucket size (2, then 4, then 2 rows), so the graphs run the eager
    step's kernels on the same shapes: equal bits."""
    checkpoint = tiny_checkpoint("voxcpm2", stop=False)
    results = []
    for eager in (True, False):
        core = EngineCore(
            engine_config(
                checkpoint,
                device="cuda",
                dtype="bfloat16",
                max_num_seqs=6,
                max_patches=8,
                enforce_eager=eager,
                prefill_graph_tokens=0,  # a padded backbone may pick other GEMM tiles: see the test above
            )
        )
        assert (core.runner.graphs is None) == eager
        params = GenerationParams(seed=7, inference_timesteps=timesteps, max_patches=8)
        chunks: Chunks = {}
        for i in range(2):
            core.add_request(GenerationRequest(text=f"hello {i}", params=params, request_id=f"r{i}"))
        step = 0
        while core.has_work():
            if step == 2:
                for i in (2, 3):
                    core.add_request(GenerationRequest(text=f"late {i}", params=params, request_id=f"r{i}"))
            for chunk in core.step():
                chunks.setdefault(chunk.request_id, []).append((chunk.latents, chunk.samples))
            step += 1
        results.append(chunks)
    eager_chunks, graphed_chunks = results
    assert eager_chunks.keys() == graphed_chunks.keys() == {"r0", "r1", "r2", "r3"}
    for request_id in eager_chunks:
        for part in (0, 1):
            got = [np.concatenate([c[part].ravel() for c in run[request_id]]) for run in results]
            assert np.isfinite(got[1]).all()
            np.testing.assert_array_equal(*got, err_msg=request_id)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_graphed_pieces_equal_eager_on_padded_rows(tiny_checkpoint) -> None:
    """Prefill head, Euler iterations and finish replayed from their graphs (rows padded to the bucket with the
    scratch slot and zero hiddens) equal the same bodies run eagerly on the padded rows: the packed result and the
    per-slot state they leave (fed-back patch, step counter, VAE context), for batches that are not bucket sizes
    and rows whose Euler-step counts differ (the late iterations replay smaller buckets)."""
    runner = VoxCPMRunner(
        engine_config(tiny_checkpoint("voxcpm2", stop=False), device="cuda", dtype="bfloat16", max_num_seqs=8)
    )
    graphs = runner.graphs
    assert graphs is not None and graphs.buckets == [1, 2, 4, 8]
    device, scratch = runner.device, runner.scratch_slot
    torch.manual_seed(0)
    # Slot state as admissions and a few steps leave it: per-row settings, step counters (noise keys), a VAE
    # context primed with latents.
    rows = torch.arange(scratch, device=device)
    counts = [12, 10, 10, 9, 7, 7, 3, 1]  # per slot: Euler steps
    runner.slot_seed[:scratch] = rows * 7919 + 1
    runner.slot_timesteps[:scratch] = torch.tensor(counts, device=device)
    runner.slot_cfg[:scratch] = 1.0 + 0.25 * rows
    runner.slot_temperature[:scratch] = 0.5 + 0.1 * rows
    runner.slot_step[:scratch] = rows % 3
    with torch.inference_mode(), native_convs():
        runner.vae_decoder.prime(rows, torch.randn(scratch, runner.feat_dim, 3 * runner.patch_size, device=device))
    tracked = (runner.slot_patch, runner.slot_step, runner.vae_decoder.state)
    head_inputs = runner._head_inputs[1:]  # the hiddens

    def state() -> list[torch.Tensor]:
        return [t.clone() for t in tracked]

    def restore(saved: list[torch.Tensor]) -> None:
        for t, s in zip(tracked, saved, strict=True):
            t.copy_(s)

    with torch.inference_mode():
        for batch in (8, 5, 3, 2, 1):  # 3 after 5: its padded rows held real slots last replay
            bucket = graphs.bucket(batch)
            slots = torch.randperm(scratch)[:batch].sort().values.to(device)  # slot order = most steps first
            seqs = [SimpleNamespace(params=SimpleNamespace(inference_timesteps=counts[s])) for s in slots.tolist()]
            hiddens = [torch.randn(batch, *buf.shape[1:], device=device).to(buf.dtype) for buf, _ in head_inputs]
            before = state()
            graphed = torch.empty(batch, runner.packed_width, device=device)
            runner._prefill_head(batch, (slots, *hiddens))
            runner._solve(seqs, graphed)
            after_graph = state()
            restore(before)
            pad = bucket - batch
            padded_slots = torch.cat((slots, torch.full((pad,), scratch, dtype=torch.int64, device=device)))
            runner._start(padded_slots, *[torch.cat((h, h.new_zeros(pad, *h.shape[1:]))) for h in hiddens])
            for k in range(2, max(counts[s] for s in slots.tolist()) + 1):  # the buckets _solve replays
                runner._euler(graphs.bucket(sum(counts[s] >= k for s in slots.tolist())))
            eager = runner._finish(bucket)[:batch]
            after_eager = state()
            latents = graphed[:, : runner.patch_size * runner.feat_dim]
            assert torch.isfinite(latents).all() and latents.abs().sum() > 0
            assert torch.equal(_bits(graphed), _bits(eager)), f"batch {batch}"
            for a, b in zip(after_graph, after_eager, strict=True):  # every slot but the scratch one
                assert torch.equal(_bits(a[:scratch]), _bits(b[:scratch])), f"batch {batch}"
            assert int(runner.slot_step[scratch]) == 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_mixed_steps_graphed_equal_eager(tiny_checkpoint) -> None:
    """Steps mixing graphed decodes with admissions (eager backbone, graphed pieces) and rows of different Euler-step
    counts, eager vs graphed (`_run_mixed_steps`: every piece's rows are a bucket size, so the same kernels on the
    same shapes): equal bits, audio included."""
    checkpoint = tiny_checkpoint("voxcpm2", stop=False)
    results = []
    for eager in (True, False):
        config = engine_config(
            checkpoint,
            device="cuda",
            dtype="bfloat16",
            max_num_seqs=8,
            max_patches=8,
            enforce_eager=eager,
            prefill_graph_tokens=0,
        )
        core = EngineCore(config)
        assert (core.runner.graphs is None) == eager
        results.append(_run_mixed_steps(core))
    _assert_same_chunks(*results)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cached_pinned_rows_serve_every_step_without_pinning_more() -> None:
    """After cache_pinned_rows, a step's result buffer of any row count, with the two steps' before it still alive
    (the last one's chunks in the loop's outbox, a consumer's latest chunk of the one before), is served from the host
    allocator's cache."""
    width = 7937  # VoxCPM2's packed row: a patch of latents, its audio, the stop flag
    cache_pinned_rows(512, width)
    torch.cuda.init()  # host_memory_stats() is empty until torch.cuda is initialised (pinning alone does not)
    grown = "num_host_alloc"  # pinned blocks the allocator created
    before = torch.cuda.host_memory_stats()[grown]
    # Each new buffer is made while the deque still holds the two before it: PINNED_RESULTS_ALIVE at once.
    alive: collections.deque[torch.Tensor] = collections.deque(maxlen=PINNED_RESULTS_ALIVE - 1)
    for rows in [*range(1, 513), 512, 512, 512]:
        alive.append(torch.empty((rows, width), pin_memory=True))
    alive.clear()
    assert torch.cuda.host_memory_stats()[grown] == before
