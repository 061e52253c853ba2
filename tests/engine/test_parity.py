"""The engine end to end against the reference package (fp32, tiny checkpoints).

The counter-based noise is replaced by the noise that the model parity test injects into the reference
(`tests/engine/models/voxcpm/test_model.py`), so the engine's chunk latents must equal the reference's
patches within the same tolerance. This covers what the model test does not: prompt packing through the
engine, the scheduler's step order, the runner's packing, slots and on-device feedback.
"""

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from engine.engine_core import EngineCore
from engine.models.voxcpm.runner import VoxCPMRunner
from engine.params import GenerationParams, GenerationRequest
from tests.engine.helpers import engine_config
from tests.engine.models.voxcpm.reference import load_reference
from tests.engine.models.voxcpm.test_model import NUM_PATCHES, REL_TOL, TEXT, _noise, _prompt, run_reference


@pytest.mark.parametrize(("variant", "mode"), [("voxcpm2", "continuation"), ("voxcpm-0.5b", "zero_shot")])
def test_engine_matches_reference(
    tiny_checkpoint: Callable[..., Path], tmp_path: Path, variant: str, mode: str
) -> None:
    path = tiny_checkpoint(variant)
    noise = None

    def reference_noise(seeds: torch.Tensor, steps: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
        return noise[steps]  # patch k of every request starts from the reference's k-th draw

    config = engine_config(path, max_patches=NUM_PATCHES, max_model_len=256)
    core = EngineCore(config, VoxCPMRunner(config, noise=reference_noise))
    noise = _noise(core.runner.checkpoint.config)
    prompt, cache = _prompt(mode, core.info.patch_size, core.info.feat_dim)
    expected = run_reference(load_reference(path, tmp_path), TEXT, cache, noise)["patches"]

    # Another request runs alongside, so the checked one is batched, admitted in a mixed step, and not in slot 0.
    core.add_request(GenerationRequest(text="something else entirely", params=GenerationParams(seed=0)))
    core.step()
    params = GenerationParams(min_patches=NUM_PATCHES, max_patches=NUM_PATCHES)  # the stop head never ends it
    core.add_request(GenerationRequest(text=TEXT, prompt=prompt, params=params, request_id="checked"))
    latents = []
    while core.has_work():
        latents += [torch.from_numpy(chunk.latents) for chunk in core.step() if chunk.request_id == "checked"]
    patches = torch.stack(latents)
    assert patches.shape == expected.shape
    error = float((patches - expected).abs().max() / expected.abs().max())
    assert error <= REL_TOL, f"{variant}/{mode}: max relative error {error:.2e}"
