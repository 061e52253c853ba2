"""config.json parsing: architecture defaults, unknown keys tolerated, missing keys named."""

from __future__ import annotations

import copy

import pytest

from engine.models.voxcpm.config import ConfigError, parse_config
from engine.models.voxcpm.make_checkpoint import make_config


def test_release_shapes_parse_with_architecture_defaults() -> None:
    v1 = parse_config(make_config("voxcpm-0.5b", "full"))
    v2 = parse_config(make_config("voxcpm2", "full"))
    assert (v1.architecture, v1.patch_size, v1.lm_config.head_dim, v1.is_v2) == ("voxcpm", 2, 64, False)
    assert (v2.architecture, v2.patch_size, v2.lm_config.head_dim, v2.is_v2) == ("voxcpm2", 4, 128, True)
    assert v2.residual_lm().no_rope and not v1.residual_lm().no_rope
    assert v2.local_stack(v2.encoder_config).head_dim == 128  # heads * head_dim (2048) != hidden (1024)
    assert v2.audio_vae_config.out_sample_rate == 48000 and v1.audio_vae_config.out_sample_rate == 16000


def test_unknown_keys_are_ignored_and_defaults_apply() -> None:
    raw = make_config("voxcpm2", "tiny")
    raw["something_new"] = {"x": 1}
    raw["lm_config"]["extra"] = 3
    for key in ("patch_size", "max_length", "residual_lm_num_layers"):
        del raw[key]
    del raw["lm_config"]["use_mup"]
    config = parse_config(raw)
    assert (config.patch_size, config.max_length, config.residual_lm_num_layers) == (4, 8192, 8)
    assert config.lm_config.use_mup  # the reference's default
    del raw["architecture"]  # the reference's default architecture is voxcpm
    assert parse_config(raw).architecture == "voxcpm"


@pytest.mark.parametrize(
    ("path", "named"),
    [
        (("lm_config",), "'lm_config'"),
        (("lm_config", "rope_scaling", "short_factor"), "'lm_config.rope_scaling.short_factor'"),
        (("dit_config", "cfm_config"), "'dit_config.cfm_config'"),
        (("encoder_config",), "'encoder_config'"),
    ],
)
def test_missing_required_keys_are_named(path: tuple[str, ...], named: str) -> None:
    raw = copy.deepcopy(make_config("voxcpm-0.5b", "tiny"))
    node = raw
    for key in path[:-1]:
        node = node[key]
    del node[path[-1]]
    with pytest.raises(ConfigError, match=f"missing the required key {named}"):
        parse_config(raw)


def test_bad_values_are_rejected() -> None:
    raw = make_config("voxcpm-0.5b", "tiny")
    raw["lm_config"]["num_hidden_layers"] = "two"
    with pytest.raises(ConfigError, match=r"lm_config\.num_hidden_layers"):
        parse_config(raw)
    raw = make_config("voxcpm-0.5b", "tiny")
    raw["architecture"] = "qwen3-tts"
    with pytest.raises(ConfigError, match="unsupported architecture"):
        parse_config(raw)
    raw = make_config("voxcpm-0.5b", "tiny")
    raw["lm_config"]["rope_scaling"]["short_factor"] = [1.0]
    with pytest.raises(ConfigError, match="head_dim/2"):
        parse_config(raw)
