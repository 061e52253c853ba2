"""Packed prompt layouts for every conditioning mode (parity with the reference's own packing is checked in
test_model.py; these pin the layouts and the error cases)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from engine.models.voxcpm import build_prompt, load_config
from engine.models.voxcpm.prompt import reference_patch_cap
from engine.models.voxcpm.tokenizer import VoxCPMTokenizer
from engine.params import Prompt


@pytest.fixture
def v2(tiny_checkpoint: Callable[..., Path]) -> tuple[VoxCPMTokenizer, object]:
    path = tiny_checkpoint("voxcpm2")
    return VoxCPMTokenizer.from_dir(path), load_config(path)


def test_layouts(v2: tuple) -> None:
    tok, config = v2
    p, d = config.patch_size, config.feat_dim
    audio = np.arange(2 * p * d, dtype=np.float32).reshape(2, p, d)
    ref = -np.ones((3, p, d), dtype=np.float32)
    text_ids = tok.encode("hello world")

    zero = build_prompt("hello world", Prompt(), tok, config)
    assert zero.token_ids.tolist() == [*text_ids, 101] and not zero.audio_mask.any()
    assert zero.patch_cap == reference_patch_cap(len(text_ids)) == 6 * len(text_ids) + 10  # the reference's cap
    assert zero.feats.shape == (zero.num_positions, p, d) and not zero.feats.any()
    # Text alone holds no latents of its own: one zero patch, viewed read-only at every position.
    assert zero.feats.strides[0] == 0 and zero.feats.base.nbytes == p * d * 4 and not zero.feats.flags.writeable

    cont = build_prompt("world", Prompt(text="hello ", latents=audio), tok, config)
    assert cont.token_ids.tolist() == [*tok.encode("hello world"), 101, 0, 0]
    assert cont.audio_mask.tolist() == [False] * (cont.num_positions - 2) + [True, True]
    assert np.array_equal(cont.feats[-2:], audio) and not cont.feats[:-2].any()
    assert cont.patch_cap == reference_patch_cap(len(tok.encode("world")))  # the target's tokens alone

    both = build_prompt("hello world", Prompt(text="", latents=audio, reference_latents=ref), tok, config)
    assert both.token_ids.tolist() == [103, 0, 0, 0, 104, *text_ids, 101, 0, 0]
    assert both.audio_mask.tolist() == [False, True, True, True, False] + [False] * (len(text_ids) + 1) + [True] * 2
    assert np.array_equal(both.feats[1:4], ref) and not both.feats[0].any() and not both.feats[4].any()


def test_errors(v2: tuple, tiny_checkpoint: Callable[..., Path]) -> None:
    tok, config = v2
    with pytest.raises(ValueError, match="shaped"):
        build_prompt("hi", Prompt(text="x", latents=np.zeros((2, 3, 5), np.float32)), tok, config)
    with pytest.raises(ValueError, match="something to say"):
        build_prompt(" \n ", Prompt(), tok, config)
    v1_path = tiny_checkpoint("voxcpm-0.5b")
    v1_config = load_config(v1_path)
    ref = np.zeros((1, v1_config.patch_size, v1_config.feat_dim), np.float32)
    with pytest.raises(ValueError, match="VoxCPM2"):
        build_prompt("hi", Prompt(reference_latents=ref), VoxCPMTokenizer.from_dir(v1_path), v1_config)


@pytest.mark.parametrize("field", ["speaker", "instruction", "language"])
def test_conditioning_voxcpm_lacks_is_refused(v2: tuple, field: str) -> None:
    tok, config = v2
    with pytest.raises(ValueError, match=f"VoxCPM models take no {field}"):
        build_prompt("hi", Prompt(**{field: "x"}), tok, config)
