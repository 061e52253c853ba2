"""Config parsing and strict checkpoint loading: the released variants parse, bad files fail naming what is wrong."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from engine.models.checkpoints import CheckpointError
from engine.models.qwen3tts import ConfigError, is_qwen3tts, load_config, load_qwen3tts
from engine.models.qwen3tts.config import parse_config
from engine.models.qwen3tts.make_checkpoint import VARIANTS, codec_config, model_config, tokenizer_files


def _configs(tmp_path: Path, variant: str, size: str = "full"):
    return model_config(variant, size, tokenizer_files(tmp_path)), codec_config(size)


@pytest.mark.parametrize("variant", VARIANTS)
def test_released_shapes_parse(tmp_path: Path, variant: str) -> None:
    config = parse_config(*_configs(tmp_path, variant))
    kind, size = variant.split("-")
    assert config.variant == {"customvoice": "custom_voice", "base": "base", "voicedesign": "voice_design"}[kind]
    assert config.talker.stack.hidden_size == (1024 if size == "0.6b" else 2048)
    assert config.talker.stack.num_hidden_layers == 28 and config.talker.predictor.num_hidden_layers == 5
    assert (config.talker.codec_eos_id, config.codec_decoder.samples_per_frame) == (2150, 1920)
    assert "english" in config.languages and "auto" in config.languages
    assert not any("dialect" in name for name in config.languages)
    assert (config.speaker_encoder is not None) == (kind == "base")
    assert config.speakers == (sorted(["serena", "vivian", "uncle_fu", "ryan", "aiden", "ono_anna", "sohee",
                                       "eric", "dylan"]) if kind == "customvoice" else [])  # fmt: skip
    assert config.accepts_instruction == (variant in ("customvoice-1.7b", "voicedesign-1.7b"))
    assert config.talker.speaker_dialect.get("eric") == ("sichuan_dialect" if kind == "customvoice" else None)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda m, c: m.update(model_type="qwen2"), "model_type 'qwen2'"),
        (lambda m, c: m.update(tokenizer_type="qwen3_tts_tokenizer_25hz"), "only the 12 Hz"),
        (lambda m, c: m.update(tts_model_type="other"), "tts_model_type 'other'"),
        (lambda m, c: m["talker_config"].pop("text_vocab_size"), "missing talker_config.text_vocab_size"),
        (lambda m, c: m["talker_config"].update(hidden_size="1024"), "talker_config.hidden_size must be int"),
        (lambda m, c: m["talker_config"]["spk_id"].update(bob=99999), "spk_id.bob must be a codec id"),
        (lambda m, c: m["talker_config"]["spk_is_dialect"].update(eric="x"), "spk_is_dialect.eric"),
        (lambda m, c: m["talker_config"]["code_predictor_config"].update(num_code_groups=8), "num_code_groups"),
        (lambda m, c: c.update(model_type="x"), "speech_tokenizer model_type"),
        (lambda m, c: c.update(decode_upsample_rate=960), "speech_tokenizer.decode_upsample_rate must be 1920"),
        (lambda m, c: c["decoder_config"].update(upsample_rates=[8, 5, 4]), "1920 samples"),
    ],
)
def test_bad_configs_name_the_key(tmp_path: Path, edit, message: str) -> None:
    model, codec = _configs(tmp_path, "customvoice-1.7b")
    edit(model, codec)
    with pytest.raises(ConfigError, match=message):
        parse_config(model, codec)


def test_base_speaker_encoder_must_match_the_talker(tmp_path: Path) -> None:
    model, codec = _configs(tmp_path, "base-0.6b")
    model["speaker_encoder_config"]["enc_dim"] = 2048
    with pytest.raises(ConfigError, match="enc_dim must equal"):
        parse_config(model, codec)


def _copy(qwen_checkpoint, tmp_path: Path) -> Path:
    return Path(shutil.copytree(qwen_checkpoint("customvoice-0.6b"), tmp_path / "ck"))


def test_missing_files_are_named(qwen_checkpoint, tmp_path: Path) -> None:
    ck = _copy(qwen_checkpoint, tmp_path)
    (ck / "speech_tokenizer" / "config.json").unlink()
    with pytest.raises(ConfigError, match=r"missing .*speech_tokenizer/config\.json"):
        load_config(ck)
    ck = _copy(qwen_checkpoint, tmp_path / "b")
    (ck / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match=r"missing .*model\.safetensors"):
        load_qwen3tts(ck)
    assert is_qwen3tts(qwen_checkpoint("base-0.6b")) and not is_qwen3tts(tmp_path)


@pytest.mark.parametrize(
    ("file", "edit", "message"),
    [
        ("model.safetensors", lambda t: t.update(extra=torch.zeros(1)), "unknown tensors: extra"),
        ("model.safetensors", lambda t: t.pop("talker.codec_head.weight"), "missing tensors: talker.codec_head"),
        (
            "model.safetensors",
            lambda t: t.update({"talker.model.norm.weight": torch.ones(3)}),
            r"wrong shapes: talker.model.norm.weight \(3,\) \(expected \(64,\)\)",
        ),
        (
            "speech_tokenizer/model.safetensors",
            lambda t: t.pop("decoder.pre_conv.conv.weight"),
            "missing tensors: decoder.pre_conv.conv.weight",
        ),
    ],
)
def test_strict_loading_names_the_tensor(qwen_checkpoint, tmp_path: Path, file: str, edit, message: str) -> None:
    ck = _copy(qwen_checkpoint, tmp_path)
    tensors = load_file(ck / file)
    edit(tensors)
    save_file(tensors, ck / file)
    with pytest.raises(CheckpointError, match=message):
        load_qwen3tts(ck)


def test_generator_cli_writes_a_loadable_checkpoint(tmp_path: Path) -> None:
    from engine.models.qwen3tts.make_checkpoint import main

    main(["--variant", "voicedesign-1.7b", "--size", "tiny", "--out", str(tmp_path / "vd"), "--seed", "3"])
    loaded = load_qwen3tts(tmp_path / "vd")
    assert loaded.config.variant == "voice_design" and loaded.config.size == "1b7"
    assert json.loads((tmp_path / "vd" / "generation_config.json").read_text())["max_new_tokens"] == 8192
