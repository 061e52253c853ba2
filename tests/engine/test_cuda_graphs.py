"""CUDA graphs of decode steps and prefill tails: bucket choice (CPU) and graphed == eager on the GPU (marker `gpu`).

Graphed == eager bit for bit wherever the graph runs the eager step's kernels on the same shapes, i.e. when the
batch is a bucket size (a padded batch may pick other GEMM tiles). Under enforce_eager the steps keep cuDNN for
their VAE decode, as the graphs do, so the audio is compared bit for bit too; a step without a graph in a graphed
engine decodes with native convolutions, so there only latents compare bit for bit."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from engine import cuda_graphs
from engine.cuda_graphs import PrefillGraphs, StepGraphs, bucket_sizes
from engine.engine_core import EngineCore
from engine.model_runner import ModelRunner, native_convs
from engine.params import GenerationParams, GenerationRequest, Prompt
from tests.engine.helpers import engine_config


def test_bucket_sizes_cover_every_batch_up_to_the_maximum() -> None:
    assert bucket_sizes(1) == [1]
    assert bucket_sizes(20) == [1, 2, 4, 8, 16, 20]
    assert bucket_sizes(512)[-1] == 512 and bucket_sizes(600)[-2:] == [512, 600]


def test_prefill_graph_keys() -> None:
    graphs = PrefillGraphs(print, print, max_tokens=1024, max_seqs=4, device=torch.device("cpu"), pool=(0, 0))
    assert graphs.token_buckets == [64, 128, 256, 512, 1024] and graphs.seq_buckets == [1, 2, 4]
    assert graphs.key_for(1, 1) == (64, 1) and graphs.key_for(65, 3) == (128, 4) and graphs.key_for(1024, 4)
    assert graphs.key_for(1025, 1) is None and graphs.key_for(10, 5) is None


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The bit pattern of a tensor (equal bits, NaNs included)."""
    if not t.is_floating_point():
        return t
    return t.view({2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


Chunks = dict[str, list[tuple[np.ndarray, np.ndarray]]]  # request id -> (latents, samples) per chunk


def _run_mixed_steps(core: EngineCore) -> Chunks:
    """Four requests join a running pair over two admissions. Admissions and decodes differ in Euler steps
    (the admission of 2 uses 4, a count without graphs: it runs eagerly; rows of one batch differ too), one newcomer
    continues prompt audio (primed VAE context). Everyone's last chunk comes at step 7, so every batch is a
    bucket size of max_num_seqs=8: decodes 2, 2, 4, 4, 8, 8, 8; admissions 2, 2, 4."""
    shape = (3, core.info.patch_size, core.info.feat_dim)
    latents = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    joins = {
        0: [("r0", 10, 8, None), ("r1", 10, 8, None)],
        2: [("r2", 4, 6, Prompt(text="the voice", latents=latents)), ("r3", 3, 6, None)],
        4: [("r4", 10, 4, None), ("r5", 7, 4, None), ("r6", 10, 4, None), ("r7", 10, 4, None)],
    }
    chunks: Chunks = {}
    step = 0
    while step == 0 or core.has_work():
        for request_id, timesteps, patches, prompt in joins.get(step, []):
            params = GenerationParams(seed=int(request_id[1:]) + 1, inference_timesteps=timesteps, max_patches=patches)
            request = GenerationRequest(
                text=f"hello {request_id}", prompt=prompt or Prompt(), params=params, request_id=request_id
            )
            core.add_request(request)
        for chunk in core.step():
            # Copies: on the CPU a chunk is a view of the step's result (with the stand-in graphs of
            # test_graph_plumbing_on_cpu, of the graph's output, which the next replay overwrites).
            chunks.setdefault(chunk.request_id, []).append((chunk.latents.copy(), chunk.samples.copy()))
        step += 1
    return chunks


def _assert_same_chunks(a: Chunks, b: Chunks, same_audio: set[str] | None = None) -> None:
    """Equal latents bit for bit; equal audio bit for bit for the requests in `same_audio` (default: all)."""
    assert a.keys() == b.keys() and len(a) == 8
    for request_id in a:
        latents = [np.stack([latents for latents, _ in run[request_id]]) for run in (a, b)]
        assert latents[0].shape == latents[1].shape and np.isfinite(latents[1]).all()
        np.testing.assert_array_equal(*latents, err_msg=request_id)
        samples = [np.concatenate([samples for _, samples in run[request_id]]) for run in (a, b)]
        assert np.isfinite(samples[1]).all()
        if same_audio is None or request_id in same_audio:
            np.testing.assert_array_equal(*samples, err_msg=request_id)


def test_graph_plumbing_on_cpu(tiny_checkpoint, monkeypatch: pytest.MonkeyPatch) -> None:
    """The runner's graph paths (static inputs, padding, bucket and key choice, eager fallback) on the CPU,
    with a stand-in capture whose replay re-runs the body on the static buffers into the captured output:
    the same steps as the eager runner, bit for bit. The GPU tests below check the real graphs."""
    replays: list[tuple[str, int, int]] = []

    def capture(graphs: StepGraphs, bucket: int, max_timesteps: int) -> tuple[object, torch.Tensor]:
        views = [buf[:bucket] for buf, _ in graphs.inputs]
        for view, (_, pad) in zip(views, graphs.inputs, strict=True):
            view.fill_(pad)
        out = graphs.body(views, max_timesteps).clone()  # the warm-up
        kind = "decode" if len(graphs.inputs) == 1 else "tail"

        def replay() -> None:
            replays.append((kind, bucket, max_timesteps))
            out.copy_(graphs.body(views, max_timesteps))

        return SimpleNamespace(replay=replay), out

    monkeypatch.setattr(StepGraphs, "_capture", capture)
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: None)
    checkpoint = tiny_checkpoint("voxcpm2", stop=False)
    results = []
    for graphed in (False, True):
        core = EngineCore(engine_config(checkpoint, dtype="bfloat16", max_num_seqs=8, max_patches=8))
        if graphed:
            with torch.inference_mode():
                core.runner._capture_graphs(8, 10)
        results.append(_run_mixed_steps(core))
    _assert_same_chunks(*results)
    assert replays == [
        ("tail", 2, 10),
        ("decode", 2, 10),
        ("decode", 2, 10),
        ("decode", 4, 10),
        ("decode", 4, 10),
        ("tail", 4, 10),
        *[("decode", 8, 10)] * 3,
    ]


def test_backbone_graph_plumbing_on_cpu(tiny_checkpoint, monkeypatch: pytest.MonkeyPatch) -> None:
    """Admissions through the prefill backbone graphs (packed static inputs padded to the key, outputs cut to the
    batch; prompt audio runs eagerly) with a stand-in capture that re-runs the body on replay: the same chunks as
    the eager engine up to fp32 rounding (a padded backbone's GEMMs may block differently), and the keys chosen."""
    replays: list[tuple[int, int]] = []

    def capture(fn, device, pool):
        out = fn()
        key = (fn.args[0], fn.args[1])

        def replay() -> None:
            replays.append(key)
            for static, fresh in zip(out, fn(), strict=True):
                static.copy_(fresh)

        return SimpleNamespace(replay=replay), out

    monkeypatch.setattr(cuda_graphs, "capture", capture)
    checkpoint = tiny_checkpoint("voxcpm2", stop=False)
    results = []
    for graphed in (False, True):
        core = EngineCore(engine_config(checkpoint, max_num_seqs=8, max_patches=8))
        if graphed:
            core.runner._graph_pool = (0, 0)
            with torch.inference_mode():
                # Buckets past max_model_len (128): a padded admission may hold more positions than a sequence.
                core.runner._capture_backbone_graphs(256, 8)
        results.append(_run_mixed_steps(core))
    # r2 continues prompt audio, so the admission of r2 and r3 runs eagerly.
    assert replays == [(64, 2), (64, 4)]
    for request_id, chunks in results[0].items():
        for (a, _), (b, _) in zip(chunks, results[1][request_id], strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5, err_msg=request_id)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_graphed_prefill_backbone_matches_eager(tmp_path) -> None:
    """The backbone of text-only admissions replayed from its graph (flash-attn varlen over padded positions and
    empty padded sequences) against the eager backbone: same hiddens up to bf16 rounding, same K/V written, and
    nothing written outside the requests' blocks but the scratch block."""
    from tests.engine.models.voxcpm.test_model_gpu import _head_dim_64_checkpoint

    checkpoint = _head_dim_64_checkpoint(tmp_path / "hd64")
    core = EngineCore(engine_config(checkpoint, device="cuda", dtype="bfloat16", max_num_seqs=8, kv_block_size=256))
    runner = core.runner
    assert runner.backbone_graphs is not None
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
        key = runner.backbone_graphs.key_for(sum(seq.num_prompt for seq in seqs), len(seqs))
        assert key == (64, 4)
        packed = torch.from_numpy(runner._pack_prefill(seqs, *key)).to(runner.device)
        fill = lambda: runner._prefill_static[: packed.numel()].copy_(packed)  # noqa: E731
        slots, *graphed = runner.backbone_graphs.run(key, fill)
    assert slots.tolist() == [seq.slot for seq in seqs] + [runner.scratch_slot]
    for a, b in zip(eager, graphed, strict=True):
        assert torch.isfinite(b[:3]).all()
        torch.testing.assert_close(b[:3].float(), a.float(), rtol=2e-2, atol=2e-2)
    real = slice(0, runner.scratch_block)  # the scratch block holds the padded positions' K/V
    for a, b in zip(eager_kv, caches, strict=True):
        torch.testing.assert_close(b[real].float(), a[real].float(), rtol=2e-2, atol=2e-2)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("timesteps", [10, 4])
def test_graphed_decode_equals_eager(tiny_checkpoint, timesteps: int) -> None:
    """Same requests, same admission pattern (two join mid-stream, so steps mix a graphed decode with a
    prefill: eager backbone, graphed tail), eager vs graphed. Every decode and admission batch (2, then 4,
    then 2) is a bucket size, so the graphs run the eager step's kernels on the same shapes: equal bits."""
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
                prefill_graph_tokens=0,  # a padded backbone may pick other GEMM tiles: see the test below
            )
        )
        assert (core.runner.graphs is None) == eager
        params = GenerationParams(seed=7, inference_timesteps=timesteps, max_patches=8)
        chunks: dict[str, list] = {}
        for i in range(2):
            core.add_request(GenerationRequest(text=f"hello {i}", params=params, request_id=f"r{i}"))
        step = 0
        while core.has_work():
            if step == 2:
                for i in (2, 3):
                    core.add_request(GenerationRequest(text=f"late {i}", params=params, request_id=f"r{i}"))
            for chunk in core.step():
                chunks.setdefault(chunk.request_id, []).append(chunk)
            step += 1
        results.append(chunks)
    eager_chunks, graphed_chunks = results
    assert eager_chunks.keys() == graphed_chunks.keys()
    # A count without graphs runs eagerly with native convolutions instead of cuDNN: same latents, and audio
    # that the tiny random VAE's amplified rounding makes incomparable bit for bit.
    same_audio = timesteps == GenerationParams().inference_timesteps
    for request_id in eager_chunks:
        a = np.stack([c.latents for c in eager_chunks[request_id]])
        b = np.stack([c.latents for c in graphed_chunks[request_id]])
        assert a.shape == b.shape and np.isfinite(b).all()
        np.testing.assert_array_equal(a, b)
        samples = [np.concatenate([c.samples for c in run[request_id]]) for run in (eager_chunks, graphed_chunks)]
        assert np.isfinite(samples[1]).all()
        if same_audio:
            np.testing.assert_array_equal(*samples)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_graphed_prefill_tail_equals_eager(tiny_checkpoint) -> None:
    """The prefill tail (CFM, stop head, feedback, VAE, packing) replayed from its graph equals `_tail_body`
    run eagerly on the graph's shapes (rows padded to the bucket with the scratch slot and zero hiddens):
    the packed result and the per-slot state it leaves (fed-back patch, step counter, VAE context)."""
    runner = ModelRunner(
        engine_config(tiny_checkpoint("voxcpm2", stop=False), device="cuda", dtype="bfloat16", max_num_seqs=8)
    )
    graphs = runner.prefill_graphs
    assert graphs is not None and graphs.buckets == [1, 2, 4, 8]
    timesteps = GenerationParams().inference_timesteps  # the count the graphs are captured for
    assert not graphs.has_graph(1, timesteps - 1)  # any other count runs eagerly
    device, scratch = runner.device, runner.scratch_slot
    torch.manual_seed(0)
    # Slot state as admissions and a few steps leave it: per-row settings (some rows stop their Euler loop
    # early), step counters (noise keys), a VAE context primed with latents.
    rows = torch.arange(scratch, device=device)
    runner.slot_seed[:scratch] = rows * 7919 + 1
    runner.slot_timesteps[:scratch] = (timesteps - rows % 3).clamp(min=1)
    runner.slot_cfg[:scratch] = 1.0 + 0.25 * rows
    runner.slot_temperature[:scratch] = 0.5 + 0.1 * rows
    runner.slot_step[:scratch] = rows % 3
    with torch.inference_mode(), native_convs():
        runner.vae_decoder.prime(rows, torch.randn(scratch, runner.feat_dim, 3 * runner.patch_size, device=device))

    def state() -> list[torch.Tensor]:
        return [t.clone() for t in (runner.slot_patch, runner.slot_step, runner.vae_decoder.state)]

    def restore(saved: list[torch.Tensor]) -> None:
        for t, s in zip((runner.slot_patch, runner.slot_step, runner.vae_decoder.state), saved, strict=True):
            t.copy_(s)

    with torch.inference_mode():
        for batch in (8, 4, 3, 2, 1):  # 3 after 4: its padded row held a real slot last replay
            bucket = graphs.bucket_for(batch)
            assert bucket is not None
            slots = torch.randperm(scratch)[:batch].to(device)
            hiddens = [torch.randn(batch, *buf.shape[1:], device=device).to(buf.dtype) for buf, _ in graphs.inputs[1:]]
            before = state()
            graphed = runner._tail(slots, *hiddens, timesteps).clone()
            after_graph = state()
            restore(before)
            pad = bucket - batch
            padded_slots = torch.cat((slots, torch.full((pad,), scratch, dtype=torch.int64, device=device)))
            padded = [torch.cat((h, h.new_zeros(pad, *h.shape[1:]))) for h in hiddens]
            eager = runner._tail_body(padded_slots, *padded, timesteps)[:batch]
            after_eager = state()
            assert (bucket, timesteps) in graphs._graphs
            latents = graphed[:, : runner.patch_size * runner.feat_dim]
            assert torch.isfinite(latents).all() and latents.abs().sum() > 0
            assert torch.equal(_bits(graphed), _bits(eager)), f"batch {batch}"
            for a, b in zip(after_graph, after_eager, strict=True):  # every slot but the scratch one
                assert torch.equal(_bits(a[:scratch]), _bits(b[:scratch])), f"batch {batch}"
            assert int(runner.slot_step[scratch]) == 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_mixed_steps_with_graphed_prefill_tails_equal_eager(tiny_checkpoint) -> None:
    """Steps mixing graphed decodes with admissions (eager backbone + graphed tail), eager vs graphed
    (`_run_mixed_steps`: every batch is a bucket size, so the same kernels on the same shapes): equal bits."""
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
        assert (core.runner.prefill_graphs is None) == eager
        results.append(_run_mixed_steps(core))
        if not eager:
            assert not core.runner.prefill_graphs.has_graph(2, 4) and core.runner.prefill_graphs.has_graph(4, 10)
    # r2 and r3 were admitted in the step without graphs: with graphs on, that eager step decodes their first
    # patch with native convolutions (not cuDNN), and the tiny random VAE amplifies the rounding difference.
    _assert_same_chunks(*results, same_audio={"r0", "r1", "r4", "r5", "r6", "r7"})
