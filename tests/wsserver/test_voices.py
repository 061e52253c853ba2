"""The voice store: content addresses, persistence, encoder binding, several processes on one directory, faults."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import types
import wave
from pathlib import Path

import numpy as np
import pytest

from engine import ModelInfo
from tests.wsserver.models import QWEN3_CUSTOM
from wsserver.config import ServerConfig
from wsserver.voices import DEFAULT_VOICE, Voice, VoiceLimitError, VoiceStore, open_voices, upload_id

ENCODER = "voxcpm2-vae-0123456789abcdef"


def clone(store: VoiceStore, seed: int, role: str = "prompt", name: str = "v") -> Voice:
    audio = np.random.default_rng(seed).standard_normal(1600).astype(np.float32)
    latents = np.full((3, 4, 16), seed, np.float32)
    voice = Voice(
        upload_id(audio, role, f"text {seed}", store.audio_encoder_id),
        name=name,
        role=role,
        text=f"text {seed}",
        latents=None if role == "reference" else latents,
        reference_latents=None if role == "prompt" else latents + 1,
        duration_s=0.1,
    )
    stored, new = store.add(voice)
    assert new
    return stored


def test_upload_ids_address_the_content_and_nothing_else() -> None:
    audio = np.ones(100, np.float32)
    same = upload_id(audio, "prompt", "hi", ENCODER)
    assert same == upload_id(audio.copy(), "prompt", "hi", ENCODER) and same.startswith("vc_") and len(same) == 27
    assert same != upload_id(audio * 0.5, "prompt", "hi", ENCODER)
    assert same != upload_id(audio, "both", "hi", ENCODER)
    assert same != upload_id(audio, "prompt", "hi!", ENCODER)
    assert same != upload_id(audio, "prompt", "hi", "voxcpm-vae-other")


def test_stored_voices_survive_a_restart_and_keep_everything(tmp_path: Path) -> None:
    store = VoiceStore(ENCODER, tmp_path)
    voice = clone(store, 1, role="both", name="Zoë ✓")
    again, new = store.add(voice)
    assert not new and again.id == voice.id
    reopened = VoiceStore(ENCODER, tmp_path)
    assert reopened.ids() == [DEFAULT_VOICE, voice.id]
    loaded = reopened.get(voice.id)
    assert loaded is not None and (loaded.name, loaded.role, loaded.text) == ("Zoë ✓", "both", "text 1")
    assert np.array_equal(loaded.latents, voice.latents)
    assert np.array_equal(loaded.reference_latents, voice.reference_latents)
    assert loaded.created_at == voice.created_at > 0
    assert list(tmp_path.iterdir()) == [tmp_path / f"{voice.id}.safetensors"]  # named by id, nothing left over


def test_voices_of_another_encoder_are_not_offered(tmp_path: Path) -> None:
    other = clone(VoiceStore("voxcpm-vae-ffffffffffffffff", tmp_path), 1)
    store = VoiceStore(ENCODER, tmp_path)
    assert store.ids() == [DEFAULT_VOICE] and store.get(other.id) is None
    mine = clone(store, 2)
    assert store.ids() == [DEFAULT_VOICE, mine.id]


def test_changes_by_another_process_are_seen(tmp_path: Path) -> None:
    """Two stores on one directory (two workers, or two replicas on shared storage)."""
    a, b = VoiceStore(ENCODER, tmp_path), VoiceStore(ENCODER, tmp_path)
    assert b.ids() == [DEFAULT_VOICE]
    voice = clone(a, 1)
    assert b.ids() == [DEFAULT_VOICE, voice.id] and voice.id in b
    assert a.delete(voice.id)
    assert b.get(voice.id) is None and b.ids() == [DEFAULT_VOICE]


def test_a_change_within_the_timestamp_granularity_is_not_missed(tmp_path: Path) -> None:
    store = VoiceStore(ENCODER, tmp_path)
    assert store.ids() == [DEFAULT_VOICE]  # scanned: the directory's mtime is remembered
    mtime = tmp_path.stat().st_mtime_ns
    other = VoiceStore(ENCODER, tmp_path)
    voice = clone(other, 1)
    os.utime(tmp_path, ns=(mtime, mtime))  # as if the change landed in the same clock tick as the scan
    assert store.ids() == [DEFAULT_VOICE, voice.id]


def test_aliases_lead_to_voices_and_ids_never_to_paths(tmp_path: Path) -> None:
    (tmp_path.parent / "secret.safetensors").write_bytes(b"not yours")
    store = VoiceStore(ENCODER, tmp_path, aliases={"alloy": DEFAULT_VOICE})
    assert store.get("alloy") is store.get(DEFAULT_VOICE) is not None
    for key in ("../secret", "vc_../../secret", "vc_" + "0" * 23 + "/", "/etc/passwd", "", "vc_" + "A" * 24):
        assert store.get(key) is None and key not in store
        assert store.delete(key) is False
    with pytest.raises(KeyError):
        store.delete(DEFAULT_VOICE)
    with pytest.raises(ValueError, match="names no voice"):
        VoiceStore(ENCODER, tmp_path, aliases={"echo": "../secret"})


def test_a_full_store_refuses_and_a_failed_write_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = VoiceStore(ENCODER, tmp_path, max_uploads=1)
    kept = clone(store, 1)
    with pytest.raises(VoiceLimitError):
        clone(store, 2)
    assert store.delete(kept.id)

    def disk_full(*args: object, **kwargs: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("wsserver.voices.save_file", disk_full)
    with pytest.raises(OSError, match="No space"):
        clone(store, 3)
    assert list(tmp_path.iterdir()) == [] and store.ids() == [DEFAULT_VOICE]


def test_a_damaged_file_is_skipped(tmp_path: Path) -> None:
    store = VoiceStore(ENCODER, tmp_path)
    good = clone(store, 1)
    (tmp_path / ("vc_" + "1" * 24 + ".safetensors")).write_bytes(b"garbage")
    assert VoiceStore(ENCODER, tmp_path).ids() == [DEFAULT_VOICE, good.id]


def test_a_voices_dir_is_ignored_by_a_model_without_prompt_voices(tmp_path: Path) -> None:
    voices_dir = tmp_path / "dir"
    voices_dir.mkdir()
    with wave.open(str(voices_dir / "alice.wav"), "wb") as wav:  # a valid pair, which only this model ignores
        wav.setnchannels(1)
        wav.setsampwidth(2)
        wav.setframerate(24000)
        wav.writeframes((8000 * np.sin(np.arange(48000) * 0.05)).astype(np.int16).tobytes())
    (voices_dir / "alice.txt").write_text("Alice here.")
    info = ModelInfo("m", "family", "variant", 24000, 24000, 1, 16, 1920, voice_roles=(), continuation=False)

    async def encode_audio(wav: np.ndarray, padding: str = "left") -> np.ndarray:
        raise AssertionError("nothing to encode")

    engine = types.SimpleNamespace(info=info, encode_audio=encode_audio)
    config = ServerConfig(voices_dir=voices_dir, voices_store=tmp_path / "store")
    store = asyncio.run(open_voices(engine, config))  # type: ignore[arg-type]
    assert store.ids() == [DEFAULT_VOICE]


def wav_pair(voices_dir: Path, name: str) -> None:
    voices_dir.mkdir(exist_ok=True)
    with wave.open(str(voices_dir / f"{name}.wav"), "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(2)
        wav.setframerate(24000)
        wav.writeframes((8000 * np.sin(np.arange(24000) * 0.05)).astype(np.int16).tobytes())
    (voices_dir / f"{name}.txt").write_text(f"{name} here.")


def test_the_models_speakers_are_built_in_voices(tmp_path: Path) -> None:
    async def encode_audio(wav: np.ndarray, padding: str = "left") -> np.ndarray:
        raise AssertionError("nothing to encode")

    engine = types.SimpleNamespace(info=QWEN3_CUSTOM, encode_audio=encode_audio)
    store = asyncio.run(open_voices(engine, ServerConfig(voices_store=tmp_path / "store")))  # type: ignore[arg-type]
    assert store.ids() == [DEFAULT_VOICE, "aiden", "vivian"]
    vivian = store.get("vivian")
    assert vivian is not None and vivian.prompt().speaker == "vivian" and vivian.prompt().is_empty
    assert vivian.describe() == {
        "id": "vivian",
        "object": "voice",
        "name": "vivian",
        "role": "speaker",
        "transcript": "",
        "source": "builtin",
        "duration_s": 0.0,
        "created_at": 0,
        "lora": None,
    }
    assert store.get(DEFAULT_VOICE).prompt().speaker == ""  # type: ignore[union-attr]  # the model's own pick
    with pytest.raises(KeyError):
        store.delete("vivian")


def test_a_voices_dir_pair_named_like_a_speaker_is_skipped(tmp_path: Path) -> None:
    wav_pair(tmp_path / "dir", "vivian")
    wav_pair(tmp_path / "dir", "alice")
    info = dataclasses.replace(QWEN3_CUSTOM, voice_roles=("prompt",), encoder_sample_rate=24000)  # none released
    encoded = []

    async def encode_audio(wav: np.ndarray, padding: str = "left") -> np.ndarray:
        encoded.append(wav.size)
        return np.zeros((2, 1, 16), np.float32)

    engine = types.SimpleNamespace(info=info, encode_audio=encode_audio)
    config = ServerConfig(voices_dir=tmp_path / "dir", voices_store=tmp_path / "store")
    store = asyncio.run(open_voices(engine, config))  # type: ignore[arg-type]
    assert store.ids() == [DEFAULT_VOICE, "aiden", "vivian", "alice"] and len(encoded) == 1
    assert store.get("vivian").role == "speaker"  # type: ignore[union-attr]
