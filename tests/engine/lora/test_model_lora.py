"""VoxCPMModel with LoRA adapters against the reference package with the same adapter loaded (fp32, tiny
checkpoints of every variant), and rows with different adapters (or none) in one batch against each alone.

Tolerance as in tests/engine/models/voxcpm/test_model.py (2e-5 of max |ref|): the adapter adds two small GEMMs
per targeted linear on both sides; ours folds alpha/r into B and fuses q/k/v, which only reorders fp32 sums.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from engine.lora.format import read_adapter
from engine.lora.make_adapter import make_adapter
from engine.lora.pool import LoRALimits
from engine.models.voxcpm import build_prompt, load_voxcpm
from engine.models.voxcpm.lora import ALL_MODULES, attach_lora
from engine.params import Prompt
from tests.engine.models.voxcpm.driver import Driver, Seq
from tests.engine.models.voxcpm.reference import load_reference
from tests.engine.models.voxcpm.test_model import REL_TOL, TEXT, _noise, relative_error, run_reference

LIMITS = LoRALimits(max_loras=4, max_rank=8, modules=ALL_MODULES)


@pytest.mark.parametrize("variant", ["voxcpm-0.5b", "voxcpm1.5", "voxcpm2"])
def test_adapter_matches_reference(variant: str, tiny_checkpoint: Callable[..., Path], tmp_path: Path) -> None:
    path = tiny_checkpoint(variant)
    adapter_dir = make_adapter(path, tmp_path / "adapter", rank=4, alpha=8, groups=("lm", "dit", "proj"), seed=1)
    ref = load_reference(path, tmp_path, lora=adapter_dir)
    loaded = load_voxcpm(path, "cpu", torch.float32)
    pool = attach_lora(loaded.model, LIMITS)
    pool.add("other", read_adapter(make_adapter(path, tmp_path / "other", rank=8, seed=2), pool.targets, 8))
    slot = pool.add("x", read_adapter(adapter_dir, pool.targets, LIMITS.max_rank))
    noise = _noise(loaded.config)
    prompt = Prompt(text="the voice", latents=torch.randn(3, loaded.config.patch_size, loaded.config.feat_dim).numpy())
    cache = {"mode": "continuation", "prompt_text": "the voice", "audio_feat": torch.from_numpy(prompt.latents)}
    expected = run_reference(ref, TEXT, cache, noise)
    packed = build_prompt(TEXT, prompt, loaded.tokenizer, loaded.config)
    seq = Driver(loaded.model).generate(Seq(packed, noise, adapter=slot), noise.shape[0])
    error = relative_error(torch.stack(seq.patches), expected["patches"])
    assert error <= REL_TOL, f"{variant}: max relative error {error:.2e}"
    assert seq.stops == expected["stops"]
    # The adapter matters: without it the same request is far from the reference with it.
    plain = Driver(loaded.model).generate(Seq(packed, noise), noise.shape[0])
    assert relative_error(torch.stack(plain.patches), expected["patches"]) > 100 * REL_TOL


def test_mixed_batch_equals_each_alone(tiny_checkpoint: Callable[..., Path], tmp_path: Path) -> None:
    """Three adapters (two ranks, one on the LM only) and a row without one share every step, mixing prefill and
    decode; each row equals the same request run alone."""
    path = tiny_checkpoint("voxcpm2")
    loaded = load_voxcpm(path, "cpu", torch.float32)
    pool = attach_lora(loaded.model, LIMITS)
    specs = [("a", 4, ("lm", "dit")), ("b", 8, ("lm", "dit", "proj")), ("c", 2, ("lm",))]
    slots = [
        pool.add(name, read_adapter(make_adapter(path, tmp_path / name, rank, 16, groups, i), pool.targets, 8))
        for i, (name, rank, groups) in enumerate(specs)
    ]
    config = loaded.config
    gen = torch.Generator().manual_seed(4)
    texts = ["hello world", "speech test one two", TEXT, "a row without adapter"]
    noises = [torch.randn(6, config.feat_dim, config.patch_size, generator=gen) for _ in texts]

    def seq(i: int) -> Seq:
        return Seq(build_prompt(texts[i], Prompt(), loaded.tokenizer, config), noises[i], adapter=([*slots, 0])[i])

    batch = [seq(i) for i in range(4)]
    driver = Driver(loaded.model)
    driver.step(batch[:2])
    driver.step(batch, chunk={2: 3})
    while any(len(s.patches) < 6 for s in batch):
        driver.step([s for s in batch if len(s.patches) < 6])
    for i, row in enumerate(batch):
        alone = Driver(loaded.model).generate(seq(i), 6)
        error = relative_error(torch.stack(row.patches[:6]), torch.stack(alone.patches[:6]))
        assert error <= 1e-5, f"row {i}: {error:.2e}"
    # Distinct adapters give distinct outputs for the same request.
    same = [Driver(loaded.model).generate(Seq(batch[0].prompt, noises[0], adapter=s), 2).patches[-1] for s in slots]
    assert all(relative_error(same[0], other) > 1e-3 for other in same[1:])


def test_removed_adapter_slot_is_zero_and_reused(tiny_checkpoint: Callable[..., Path], tmp_path: Path) -> None:
    path = tiny_checkpoint("voxcpm2")
    loaded = load_voxcpm(path, "cpu", torch.float32)
    pool = attach_lora(loaded.model, LoRALimits(2, 8, ALL_MODULES))
    adapter = read_adapter(make_adapter(path, tmp_path / "a", rank=4), pool.targets, 8)
    slot = pool.add("a", adapter)
    packed = build_prompt(TEXT, Prompt(), loaded.tokenizer, loaded.config)
    noise = _noise(loaded.config)[:2]
    base = Driver(loaded.model).generate(Seq(packed, noise), 2)
    pool.remove("a")
    assert all(not layer.lora_a[slot].any() and not layer.lora_b[slot].any() for layer in pool.layers)
    # A removed adapter's slot is the same as no adapter.
    stale = Driver(loaded.model).generate(Seq(packed, noise, adapter=slot), 2)
    assert torch.equal(torch.stack(stale.patches), torch.stack(base.patches))
    assert pool.add("b", adapter) == slot
