"""VoxCPMModel against the reference package (fp32, tiny checkpoints), and batch invariance.

Parity: the same checkpoint and the same CFM noise in both; the reference's `torch.randn` is replaced inside
its sampler, its stop head is observed through a hook, and its `_inference` is wrapped to record the packed
prompt it built and to run exactly N patches (min_len > N, max_len = N).

Tolerance: max |ours - ref| <= 2e-5 * max |ref| over all 8 patches, stop flags equal. Both sides are fp32 with
the same RoPE tables and the same elementwise operation order; what differs is accumulation order (fused
q/k/v and gate/up GEMMs, explicit-softmax attention over a gathered paged cache instead of SDPA, GEMMs of
other shapes), i.e. a few fp32 ulps per op. Observed: 0.6e-6 .. 1.4e-6 relative (<= 7.4e-6 absolute) for
every variant and mode; 2e-5 leaves ~15x margin for other BLAS builds, while a real change (the perturbation
test: one LocDiT weight moved by 1e-3) is far outside it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from engine.models.voxcpm import build_prompt, load_voxcpm
from engine.models.voxcpm.checkpoint import LoadedVoxCPM
from engine.models.voxcpm.prompt import reference_patch_cap
from engine.params import Prompt
from tests.engine.models.voxcpm.driver import Driver, Seq
from tests.engine.models.voxcpm.reference import load_reference, reference_models
from tests.engine.models.voxcpm.single_forward import single_forward

NUM_PATCHES = 8
REL_TOL = 2e-5
TEXT = "hello world, 你好 speech test"
PROMPT_TEXT = "the voice model"

MODES = [
    ("voxcpm-0.5b", "zero_shot"),
    ("voxcpm-0.5b", "continuation"),
    ("voxcpm1.5", "zero_shot"),
    ("voxcpm1.5", "continuation"),
    ("voxcpm2", "zero_shot"),
    ("voxcpm2", "continuation"),
    ("voxcpm2", "reference"),
    ("voxcpm2", "ref_continuation"),
]


@pytest.fixture(scope="module")
def models(tiny_checkpoint: Callable[..., Path], tmp_path_factory: pytest.TempPathFactory) -> Callable:
    """variant -> (ours, reference), each loaded once per module."""
    cache: dict[str, tuple[LoadedVoxCPM, torch.nn.Module]] = {}
    tmp = tmp_path_factory.mktemp("reference")

    def get(variant: str) -> tuple[LoadedVoxCPM, torch.nn.Module]:
        if variant not in cache:
            path = tiny_checkpoint(variant)
            cache[variant] = (load_voxcpm(path, "cpu", torch.float32), load_reference(path, tmp))
        return cache[variant]

    return get


def _prompt(mode: str, patch_size: int, feat_dim: int, seed: int = 1) -> tuple[Prompt, dict[str, Any] | None]:
    """Our Prompt and the reference's prompt cache for a mode (latents ~ N(0, 1))."""
    gen = torch.Generator().manual_seed(seed)
    audio = torch.randn(5, patch_size, feat_dim, generator=gen)
    ref_audio = torch.randn(3, patch_size, feat_dim, generator=gen)
    if mode == "zero_shot":
        return Prompt(), None
    if mode == "continuation":
        return Prompt(text=PROMPT_TEXT, latents=audio.numpy()), {
            "mode": "continuation",
            "prompt_text": PROMPT_TEXT,
            "audio_feat": audio,
        }
    if mode == "reference":
        return Prompt(reference_latents=ref_audio.numpy()), {"mode": "reference", "ref_audio_feat": ref_audio}
    return Prompt(text=PROMPT_TEXT, latents=audio.numpy(), reference_latents=ref_audio.numpy()), {
        "mode": "ref_continuation",
        "prompt_text": PROMPT_TEXT,
        "audio_feat": audio,
        "ref_audio_feat": ref_audio,
    }


@contextmanager
def _reference_noise(noise: torch.Tensor) -> Iterator[None]:
    """Make the reference sampler draw `noise[k]` ([D, P]) for its k-th patch."""
    queue = list(noise)
    real = torch.randn
    shape = (1, *noise.shape[1:])

    def fake(*size: Any, **kwargs: Any) -> torch.Tensor:
        dims = tuple(size[0]) if len(size) == 1 and isinstance(size[0], tuple | list | torch.Size) else size
        if dims == shape:
            return queue.pop(0)[None].to(kwargs.get("dtype") or torch.float32)
        return real(*size, **kwargs)

    torch.randn = fake
    try:
        yield
    finally:
        torch.randn = real
    assert not queue, "the reference drew fewer noise tensors than patches"


def run_reference(ref: torch.nn.Module, text: str, cache: dict | None, noise: torch.Tensor) -> dict[str, Any]:
    """Generate len(noise) patches with the reference; returns its packed inputs, patches, waveform, stop flags."""
    n = noise.shape[0]
    record: dict[str, Any] = {"stops": []}
    inner = ref._inference

    def inference(text_token, text_mask, feat, feat_mask, **kwargs):  # type: ignore[no-untyped-def]
        record.update(tokens=text_token[0], text_mask=text_mask[0], feats=feat[0], audio_mask=feat_mask[0])
        return inner(text_token, text_mask, feat, feat_mask, **{**kwargs, "min_len": n + 1, "max_len": n})

    hook = ref.stop_head.register_forward_hook(lambda m, i, o: record["stops"].append(bool(o.argmax(-1)[0] == 1)))
    ref._inference = inference
    try:
        with _reference_noise(noise):
            result = ref._generate_with_prompt_cache(target_text=text, prompt_cache=cache, streaming=False)
            audio, _, generated = next(result)
            result.close()
    finally:
        hook.remove()
        del ref._inference
    record["patches"] = generated[-n:].float()  # v1 also returns the prompt's context patches first
    record["audio"] = audio.float().reshape(-1)  # the waveform of the generated patches (prompt context cut)
    return record


def run_ours(loaded: LoadedVoxCPM, text: str, prompt: Prompt, noise: torch.Tensor) -> tuple[Seq, Any]:
    packed = build_prompt(text, prompt, loaded.tokenizer, loaded.config)
    seq = Driver(loaded.model).generate(Seq(packed, noise), noise.shape[0])
    return seq, packed


def _noise(config: Any, seed: int = 7) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(NUM_PATCHES, config.feat_dim, config.patch_size, generator=gen)


def relative_error(ours: torch.Tensor, ref: torch.Tensor) -> float:
    return float((ours - ref).abs().max() / ref.abs().max())


@pytest.mark.parametrize(("variant", "mode"), MODES)
def test_parity_with_reference(models: Callable, variant: str, mode: str) -> None:
    ours, ref = models(variant)
    config = ours.config
    prompt, cache = _prompt(mode, config.patch_size, config.feat_dim)
    noise = _noise(config)
    expected = run_reference(ref, TEXT, cache, noise)
    seq, packed = run_ours(ours, TEXT, prompt, noise)

    # Same packed prompt as the reference built (ids, masks, latents).
    assert packed.token_ids.tolist() == expected["tokens"].tolist()
    assert packed.audio_mask.tolist() == expected["audio_mask"].bool().tolist()
    assert (~packed.audio_mask).tolist() == expected["text_mask"].bool().tolist()
    assert torch.equal(torch.from_numpy(packed.feats), expected["feats"].float())
    assert packed.patch_cap == reference_patch_cap(len(ref.text_tokenizer(TEXT)))

    patches = torch.stack(seq.patches)
    assert patches.shape == expected["patches"].shape == (NUM_PATCHES, config.patch_size, config.feat_dim)
    error = relative_error(patches, expected["patches"])
    assert error <= REL_TOL, f"{variant}/{mode}: max relative error {error:.2e}"
    assert seq.stops == expected["stops"]


@pytest.mark.parametrize("variant", ["voxcpm-0.5b", "voxcpm2"])
def test_bf16_first_patch_matches_reference(variant: str, tiny_checkpoint: Callable[..., Path]) -> None:
    """bf16 as shipped (the reference's from_local casts to config.json's bfloat16, RoPE tables included).

    With the SDPA kernel on both sides the prefill patch comes out bit-identical here, which pins the bf16
    semantics (bf16-rounded RoPE tables, the Euler schedule computed in bf16, the rounding points of RMSNorm,
    RoPE and CFG). Later patches go through differently shaped decode attention (the reference attends over
    its whole static cache) and drift by bf16 rounding, so only the first patch is compared, at 1e-3 (a bf16
    ulp is 4e-3 relative; fp32 RoPE tables alone would move it by more).
    """
    path = tiny_checkpoint(variant)
    v1, v2 = reference_models()
    ref = (v2 if variant == "voxcpm2" else v1).from_local(str(path), optimize=False, device="cpu").eval()
    ours = load_voxcpm(path, "cpu", torch.bfloat16, "sdpa")
    for mode in ("zero_shot", "continuation"):
        prompt, cache = _prompt(mode, ours.config.patch_size, ours.config.feat_dim)
        noise = _noise(ours.config)[:1]
        expected = run_reference(ref, TEXT, cache, noise)
        seq, _ = run_ours(ours, TEXT, prompt, noise)
        assert relative_error(seq.patches[0], expected["patches"][0]) <= 1e-3, mode
        assert seq.stops[0] == expected["stops"][0]


def test_parity_detects_a_perturbed_weight(models: Callable) -> None:
    """The parity check is sensitive: nudging one LocDiT weight by 1e-3 breaks it."""
    loaded = load_voxcpm(models("voxcpm2")[0].path, "cpu", torch.float32)
    _, ref = models("voxcpm2")
    noise = _noise(loaded.config)
    expected = run_reference(ref, TEXT, None, noise)
    with torch.no_grad():
        loaded.model.feat_decoder.estimator.out_proj.weight[0, 0] += 1e-3
    seq, _ = run_ours(loaded, TEXT, Prompt(), noise)
    assert relative_error(torch.stack(seq.patches), expected["patches"]) > REL_TOL


def test_batch_invariance(tiny_checkpoint: Callable[..., Path]) -> None:
    """A request alone == the same request packed with others of different prompt lengths, across steps that
    mix prefill (whole and chunked, so attention reads cached context) with decode."""
    loaded = load_voxcpm(tiny_checkpoint("voxcpm2"), "cpu", torch.float32)
    config = loaded.config
    p, d = config.patch_size, config.feat_dim
    gen = torch.Generator().manual_seed(3)

    def make(text: str, prompt: Prompt, cfg: float = 2.0, temperature: float = 1.0, steps: int = 10) -> Seq:
        noise = torch.randn(NUM_PATCHES, d, p, generator=gen)
        packed = build_prompt(text, prompt, loaded.tokenizer, config)
        return Seq(packed, noise, cfg_value=cfg, temperature=temperature, timesteps=steps)

    latents = torch.randn(6, p, d, generator=gen).numpy()
    alone = make(TEXT, Prompt(text=PROMPT_TEXT, latents=latents))
    Driver(loaded.model).generate(alone, NUM_PATCHES)

    target = make(TEXT, Prompt(text=PROMPT_TEXT, latents=latents))
    target.noise = alone.noise
    other_a = make("hello", Prompt(), cfg=1.5, temperature=0.7, steps=4)
    other_b = make("speech world test " * 3, Prompt(reference_latents=latents[:3]), cfg=3.0, steps=25)
    driver = Driver(loaded.model)
    driver.step([other_a])  # other_a decodes while the target prefills
    driver.step([other_a, target])
    driver.step([target, other_b, other_a], chunk={1: 5})  # decode + chunked prefill + decode
    driver.step([other_b, target], chunk={0: 4})
    while len(target.patches) < NUM_PATCHES:
        driver.step([other_a, other_b, target] if not other_b.prefilled else [other_b, target, other_a])

    assert target.stops == alone.stops
    error = relative_error(torch.stack(target.patches), torch.stack(alone.patches))
    assert error <= 1e-5, f"batched vs alone: max relative error {error:.2e}"


def test_per_row_timesteps_match_single_runs(tiny_checkpoint: Callable[..., Path]) -> None:
    """Rows with different Euler step counts in one batch equal each row run alone."""
    loaded = load_voxcpm(tiny_checkpoint("voxcpm-0.5b"), "cpu", torch.float32)
    config = loaded.config
    gen = torch.Generator().manual_seed(5)
    settings = [(1, 2.0, 1.0), (10, 2.0, 1.0), (3, 0.0, 0.5), (60, 1.2, 1.3)]  # n = 60 has 2 zero-velocity steps
    noise = torch.randn(len(settings), 2, config.feat_dim, config.patch_size, generator=gen)
    seqs = [
        Seq(build_prompt(TEXT, Prompt(), loaded.tokenizer, config), noise[i], cfg_value=c, temperature=t, timesteps=n)
        for i, (n, c, t) in enumerate(settings)
    ]
    driver = Driver(loaded.model)
    driver.step(seqs)
    driver.step(seqs)
    for i, (n, c, t) in enumerate(settings):
        single = Seq(
            build_prompt(TEXT, Prompt(), loaded.tokenizer, config), noise[i], cfg_value=c, temperature=t, timesteps=n
        )
        Driver(loaded.model).generate(single, 2)
        error = relative_error(torch.stack(seqs[i].patches), torch.stack(single.patches))
        assert error <= 1e-5, f"row {i} (n={n}): {error:.2e}"
    assert np.isfinite(torch.stack([s.patches[-1] for s in seqs]).numpy()).all()


@pytest.mark.parametrize(("variant", "dtype"), [("voxcpm2", torch.float32), ("voxcpm-0.5b", torch.bfloat16)])
def test_split_forward_equals_the_single_forward(
    tiny_checkpoint: Callable[..., Path], variant: str, dtype: torch.dtype
) -> None:
    """forward = backbone then generate gives the same bits as the step written as one function, over steps
    that mix whole and chunked prefill with decode and rows with different settings (v2: concatenated mu;
    v1: summed mu)."""
    loaded = load_voxcpm(tiny_checkpoint(variant), "cpu", dtype)
    config = loaded.config
    gen = torch.Generator().manual_seed(11)
    latents = torch.randn(4, config.patch_size, config.feat_dim, generator=gen).numpy()
    noise = torch.randn(3, NUM_PATCHES, config.feat_dim, config.patch_size, generator=gen)
    prompts = [Prompt(), Prompt(text=PROMPT_TEXT, latents=latents), Prompt(text="hi")]
    settings = [(10, 2.0, 1.0), (4, 1.5, 0.7), (25, 3.0, 1.2)]

    def run(forward: Callable | None) -> list[Seq]:
        seqs = [
            Seq(build_prompt(TEXT, prompt, loaded.tokenizer, config), noise[i], cfg_value=c, temperature=t, timesteps=n)
            for i, (prompt, (n, c, t)) in enumerate(zip(prompts, settings, strict=True))
        ]
        driver = Driver(loaded.model, forward=forward)
        driver.step(seqs[:1])
        driver.step(seqs[:2], chunk={1: 5})  # decode + chunked prefill
        driver.step(seqs)
        for _ in range(3):
            driver.step(seqs)
        return seqs

    split, single = run(None), run(lambda inputs: single_forward(loaded.model, inputs))
    for a, b in zip(split, single, strict=True):
        assert len(a.patches) == len(b.patches) > 0
        assert torch.equal(torch.stack(a.patches), torch.stack(b.patches))
        assert a.stops == b.stops
