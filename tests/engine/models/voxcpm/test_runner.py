import numpy as np
import pytest
import torch

from engine.cuda_graphs import eager_token_ladder, eager_tokens
from engine.engine_core import EngineCore
from engine.models.voxcpm.batch import BackboneInputs, ModelInputs
from engine.models.voxcpm.runner import VoxCPMRunner
from engine.params import GenerationParams, GenerationRequest, Prompt
from tests.engine.helpers import engine_config
from tests.engine.models.voxcpm.single_forward import single_forward


@pytest.fixture(scope="module")
def checkpoint(tiny_checkpoint):
    return tiny_checkpoint("voxcpm2", stop=False)


def generate(core: EngineCore, request: GenerationRequest) -> list:
    core.add_request(request)
    chunks = []
    while core.has_work():
        chunks += core.step()
    return chunks


def test_kv_pool_is_sized_from_the_configuration(checkpoint):
    runner = VoxCPMRunner(engine_config(checkpoint, max_num_seqs=3, max_model_len=100, kv_block_size=16))
    assert runner.num_kv_blocks == 3 * 7  # ceil(100 / 16) blocks per slot
    assert runner.max_blocks_per_seq == 7
    attention = runner.model.base_lm.layers[0].self_attn
    assert attention.k_cache.shape[:2] == (21 + 1, 16)  # + the scratch block of padded graph rows
    assert VoxCPMRunner(engine_config(checkpoint, num_kv_blocks=5)).num_kv_blocks == 5


def test_generated_patch_is_fed_back_on_the_device(checkpoint):
    core = EngineCore(engine_config(checkpoint))
    runner = core.runner
    core.add_request(GenerationRequest(text="hello", params=GenerationParams(seed=3, max_patches=3), request_id="a"))
    seq = core.scheduler.requests["a"]
    for step in range(3):
        (chunk,) = core.step()
        torch.testing.assert_close(runner.slot_patch[0], torch.from_numpy(chunk.latents), rtol=0, atol=0)
        assert int(runner.slot_step[0]) == step + 1
    assert seq.num_generated == 3 and seq.slot == -1


@pytest.mark.parametrize("mode", ["zero_shot", "continuation"])
def test_streaming_audio_equals_the_references_offline_decode(checkpoint, mode):
    """Continuation output is decoded after the prompt's last <= 3 patches (the reference's context)."""
    core = EngineCore(engine_config(checkpoint, dtype="float64"))  # the tiny VAE needs fp64 to be comparable
    info = core.info
    prompt_latents = np.random.default_rng(0).standard_normal((5, info.patch_size, info.feat_dim))
    prompt = Prompt(text="hello", latents=prompt_latents.astype(np.float32)) if mode == "continuation" else Prompt()
    request = GenerationRequest(text="world", prompt=prompt, params=GenerationParams(seed=1, max_patches=4))
    chunks = generate(core, request)
    context = prompt.latents[-3:] if mode == "continuation" else np.zeros((0, info.patch_size, info.feat_dim))
    latents = np.concatenate([context, *[chunk.latents[None] for chunk in chunks]])  # [n, P, D]
    frames = torch.from_numpy(latents).double().flatten(0, 1).T[None]  # [1, D, n * P]
    offline = core.runner.vae.decode(frames)[0, 0].numpy()[len(context) * info.samples_per_patch :]
    np.testing.assert_allclose(np.concatenate([chunk.samples for chunk in chunks]), offline, atol=1e-6)


@pytest.mark.parametrize("padding", ["left", "right"])
def test_encode_audio_pads_to_whole_patches(checkpoint, padding):
    runner = VoxCPMRunner(engine_config(checkpoint))
    patch_samples = runner.patch_size * runner.vae.chunk_size
    wav = np.random.default_rng(0).uniform(-0.5, 0.5, 2 * patch_samples + 100).astype(np.float32)
    latents = runner.encode_audio(wav, padding)
    assert latents.shape == (3, runner.patch_size, runner.feat_dim) and latents.dtype == np.float32
    pad = 3 * patch_samples - wav.size
    padded = np.pad(wav, (pad, 0) if padding == "left" else (0, pad))
    expected = runner.vae.encode(torch.from_numpy(padded)[None, None])[0]  # [D, frames]
    np.testing.assert_allclose(latents, expected.view(runner.feat_dim, 3, runner.patch_size).permute(1, 2, 0))
    with pytest.raises(ValueError):
        runner.encode_audio(wav, "middle")
    with pytest.raises(ValueError):
        runner.encode_audio(np.zeros(0, dtype=np.float32), padding)


def _single_forward_runner(runner: VoxCPMRunner, monkeypatch: pytest.MonkeyPatch) -> None:
    """Make `runner` step as before the backbone/start/Euler split: one single-function forward over ModelInputs
    per step part, every row through every iteration of a larger CFM loop bound than the rows need, leaving its
    patches and stop flags where the solver leaves its own, so that `_finish` packs them as usual."""

    def head(slots: torch.Tensor, inputs: BackboneInputs) -> None:
        fields = {name: getattr(inputs, name) for name in BackboneInputs.__slots__}
        full = ModelInputs(**fields, **runner._slot_settings(slots))
        outputs = single_forward(runner.model, full, int(full.timesteps.max()) + 3)
        rows = slots.shape[0]
        runner.flow.x[:rows] = outputs.patches.to(runner.flow.x.dtype)  # exact: float() of the model dtype
        runner.flow_slots[:rows] = slots
        runner.flow_stop[:rows] = outputs.stop

    def decode(seqs: list) -> None:
        slots = torch.tensor([seq.slot for seq in seqs], dtype=torch.int64)
        head(slots, runner._decode_inputs(slots))

    def prefill(seqs: list) -> None:
        inputs, slots = runner._prefill_inputs(seqs)
        head(slots, inputs)

    monkeypatch.setattr(runner, "_decode", decode)
    monkeypatch.setattr(runner, "_prefill", prefill)
    monkeypatch.setattr(runner, "_euler", lambda rows: None)


@pytest.mark.parametrize("dtype", ["float64", "bfloat16"])
def test_runner_steps_equal_the_single_forward(checkpoint, monkeypatch, dtype):
    """The runner's eager path (CPU): decode and admission steps through head, Euler iterations on the rows that
    still have steps, and finish give the same bits as the pre-split single forward, over mixed steps whose rows
    differ in Euler steps and settings. Not float32: there the CPU's GEMMs round a row differently for different
    row counts (the late iterations of the rows with more steps run on fewer rows), by ~1e-7, which the tiny
    random VAE amplifies into audio that cannot be compared."""
    results = []
    for single in (False, True):
        core = EngineCore(engine_config(checkpoint, dtype=dtype, max_num_seqs=4, max_patches=6))
        if single:
            _single_forward_runner(core.runner, monkeypatch)
        shape = (4, core.info.patch_size, core.info.feat_dim)
        latents = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
        late = [
            GenerationRequest(
                text="late", prompt=Prompt(text="pp", latents=latents), params=GenerationParams(seed=5), request_id="c"
            ),
            GenerationRequest(text="late two", params=GenerationParams(seed=6, inference_timesteps=3), request_id="d"),
        ]
        core.add_request(GenerationRequest(text="hello", params=GenerationParams(seed=1), request_id="a"))
        core.add_request(
            GenerationRequest(text="world", params=GenerationParams(seed=2, inference_timesteps=5), request_id="b")
        )
        chunks: dict[str, list] = {}
        step = 0
        while core.has_work():
            if step == 2:
                for request in late:
                    core.add_request(request)
            for chunk in core.step():
                chunks.setdefault(chunk.request_id, []).append(np.concatenate([chunk.latents.ravel(), chunk.samples]))
            step += 1
        results.append({key: np.stack(value) for key, value in chunks.items()})
    split, single = results
    assert split.keys() == single.keys() and len(split) == 4
    for key in split:
        np.testing.assert_array_equal(split[key], single[key])


def _record_prefill_positions(runner: VoxCPMRunner) -> list[int]:
    """The position count of every prefill that `runner`'s backbone runs from now on, in order."""
    positions: list[int] = []
    backbone = runner.model.backbone

    def record(inputs: BackboneInputs):
        if not inputs.attn.decode_only:
            positions.append(len(inputs.token_ids))
        return backbone(inputs)

    runner.model.backbone = record
    return positions


def _mixed_admissions(core: EngineCore) -> dict[str, np.ndarray]:
    """Three text prompts admitted in one step, then a continuation prompt with audio: every patch and its audio."""
    shape = (3, core.info.patch_size, core.info.feat_dim)
    latents = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    for i, text in enumerate(["hello", "a longer line of text", "world"]):
        core.add_request(GenerationRequest(text=text, params=GenerationParams(seed=i, max_patches=3), request_id=text))
    chunks: dict[str, list] = {}
    for step in range(6):
        if step == 1:
            params = GenerationParams(seed=9, max_patches=3)
            prompt = Prompt(text="pp", latents=latents)
            core.add_request(GenerationRequest(text="late", prompt=prompt, params=params, request_id="audio"))
        for chunk in core.step():
            chunks.setdefault(chunk.request_id, []).append(np.concatenate([chunk.latents.ravel(), chunk.samples]))
    assert not core.has_work()
    return {key: np.stack(value) for key, value in chunks.items()}


def test_padded_eager_prefills_change_no_output(checkpoint):
    """Eager admissions padded to the ladder (as on CUDA; forced here on the CPU, where every admission is eager)
    give what the unpadded ones give: text-only ones, whose latents are zeros made on the device, and one with prompt
    audio, whose latents are padded on the host."""
    results = []
    for pad in (False, True):
        core = EngineCore(engine_config(checkpoint, dtype="float64", max_num_seqs=4))
        core.runner.pad_eager_prefill = pad
        positions = _record_prefill_positions(core.runner)
        results.append(_mixed_admissions(core))
        assert len(positions) == 2  # the two admissions
        if pad:
            assert all(eager_tokens(n) == n for n in positions)
        else:
            assert any(eager_tokens(n) != n for n in positions)  # so that padding them changes their shapes
    unpadded, padded = results
    assert unpadded.keys() == padded.keys() and len(padded) == 4
    for key in unpadded:
        np.testing.assert_allclose(padded[key], unpadded[key], rtol=1e-10, atol=1e-10)


def test_warm_up_runs_the_ladder_over_scratch_state_only(checkpoint):
    """Where eager prefills are padded, the warm-up runs the backbone once at every size of the ladder up to the
    longest admission (a step's budget, an idle step's, or one whole prompt), and what the engine generates
    afterwards is what a fresh engine generates."""
    results = []
    for warm in (False, True):
        config = engine_config(
            checkpoint, dtype="float64", max_num_seqs=4, max_model_len=100, max_prefill_tokens=64, idle_prefill_tokens=0
        )
        core = EngineCore(config)
        core.runner.pad_eager_prefill = True
        if warm:
            positions = _record_prefill_positions(core.runner)
            core.runner.warm_up()
            assert positions == eager_token_ladder(100) == [16, 32, 48, 64, 80, 96, 112]
        results.append(_mixed_admissions(core))
    cold, warmed = results
    for key in cold:
        np.testing.assert_array_equal(warmed[key], cold[key])
    for idle, longest in ((0, 100), (200, 200)):
        config = engine_config(checkpoint, max_model_len=100, max_prefill_tokens=64, idle_prefill_tokens=idle)
        assert VoxCPMRunner(config).eager_max_tokens == longest


def test_warm_up_does_nothing_where_prefills_are_not_padded(checkpoint, monkeypatch):
    runner = VoxCPMRunner(engine_config(checkpoint))
    assert not runner.pad_eager_prefill  # the CPU: no cuBLAS to warm
    monkeypatch.setattr(runner.model, "backbone", lambda inputs: pytest.fail("the warm-up ran the backbone"))
    runner.warm_up()


@pytest.mark.parametrize("after", [0, 2])
def test_requests_prefilled_ahead_of_their_step_give_the_same_bits(checkpoint, after):
    """EngineCore.prefill_ahead (a burst's first arrivals through the backbone while the rest arrive) changes no bit:
    three requests prefilled ahead, then `after` more admitted with them in one step (a continuation prompt with
    audio among them), against all of them admitted in that step; the first step starts every solver, and the
    ahead ones take no positions of its prefill. Every prompt has 11 positions: the torch attention pads a prefill's
    prompts to the longest, which changes its float32 sums' rounding with the batch (flash-attn's do not pad)."""
    results = []
    for ahead in (True, False):
        # A pass ahead of 33 positions: the first three requests' prompts fill it.
        core = EngineCore(engine_config(checkpoint, dtype="float64", max_num_seqs=6, prefill_ahead_tokens=33))
        latents = np.random.default_rng(1).standard_normal((3, core.info.patch_size, core.info.feat_dim))
        texts = ["quick fox", "small boat", "open door", "cold water"]
        requests = [
            GenerationRequest(text=text, params=GenerationParams(seed=i, max_patches=4), request_id=text)
            for i, text in enumerate(texts)
        ]
        continuation = GenerationRequest(
            text="late",
            prompt=Prompt(text="pp", latents=latents.astype(np.float32)),
            params=GenerationParams(seed=7, max_patches=4, inference_timesteps=5),
            request_id="audio",
        )
        requests = requests[:3] + [continuation, requests[3]][:after]
        assert {core.make_sequence(request).num_prompt for request in requests} == {11}
        for request in requests[:3]:
            core.add_request(request)
        if ahead:
            core.prefill_ahead()
            assert all(seq.prefilled_ahead and seq.slot >= 0 for seq in core.scheduler.running)
            assert len(core.scheduler.running) == 3 and not core.scheduler.waiting
        for request in requests[3:]:
            core.add_request(request)
        positions = _record_prefill_positions(core.runner)
        chunks: dict[str, list] = {}
        while core.has_work():
            for chunk in core.step():
                chunks.setdefault(chunk.request_id, []).append(np.concatenate([chunk.latents.ravel(), chunk.samples]))
        assert positions == ([11 * after] if after else []) if ahead else [11 * (3 + after)]
        assert sorted(len(value) for value in chunks.values()) == [4] * (3 + after)
        assert len(core.scheduler.free_slots) == 6 and not core.scheduler.requests
        results.append(chunks)
    for key in results[1]:
        np.testing.assert_array_equal(np.stack(results[0][key]), np.stack(results[1][key]))
