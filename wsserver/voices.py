"""Voices: what a context or a speech request is conditioned on, and the store that keeps them.

A voice is prompt latents (continuation: the model goes on from audio that says `text`), reference latents (VoxCPM2:
an isolated timbre reference), both (what the VoxCPM2 web UI calls ultimate cloning), one of the model's preset
speakers (Qwen3-TTS CustomVoice), or none of these (`default`, zero-shot: the model picks a voice; fix `seed` to keep
it). Where they come from:
- `default`, built in;
- the model's speakers (ModelInfo.speakers), built in: id = the speaker's name;
- `--voices-dir`: `NAME.wav` + `NAME.txt` pairs, encoded at start as continuation prompts (id = NAME);
- `POST /v1/voices`: uploads, encoded once on the engine and persisted in the store directory as one safetensors file
  per voice (the latents, and the metadata in its header). An upload's id is a digest of what determines its latents
  (the decoded audio, the role, the transcript, and the audio encoder), so uploading the same voice twice gives the
  same id, and a voice encoded for another model's encoder is never offered to this one.

Several processes (front-end workers, replicas on shared storage) may share one store directory: the index is
re-read whenever the directory changes (one stat per lookup), so a voice added or deleted by any of them is seen by
all. Files are named by id only; ids are checked against a strict pattern, so no request turns into a path. A
context keeps the Voice it was created with, so deleting a voice never breaks a context already using it.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import re
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from safetensors import SafetensorError, safe_open
from safetensors.numpy import save_file

from engine import EngineError, ModelInfo, Prompt
from engine.streams import EngineHandle
from wsserver.decoding import AudioError, decode

if TYPE_CHECKING:
    from wsserver.config import ServerConfig

logger = logging.getLogger(__name__)

DEFAULT_VOICE = "default"
ROLES = ("prompt", "reference", "both")  # what an upload is used as (docs/http.md)
UPLOAD_PREFIX = "vc_"
_UPLOAD_ID = re.compile(r"vc_[0-9a-f]{24}")
_DIR_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_FORMAT = "voxstream.voice/1"
_RACY_NS = 1_000_000_000
# OpenAI's built-in voice names: some clients refuse any other name before sending (Pipecat), so each is an alias.
OPENAI_VOICES = (
    "alloy", "ash", "ballad", "cedar", "coral", "echo", "fable", "marin", "nova", "onyx", "sage", "shimmer", "verse",
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class Voice:
    id: str
    name: str = ""
    role: str = "zero_shot"  # "zero_shot" | "speaker" | "prompt" | "reference" | "both"
    text: str = ""  # what the prompt audio says
    latents: np.ndarray | None = None  # continuation prompt [patches, patch_size, feat_dim]
    reference_latents: np.ndarray | None = None  # VoxCPM2 reference [patches, patch_size, feat_dim]
    speaker: str = ""  # a preset speaker of the model (role "speaker")
    source: str = "builtin"  # "builtin" | "dir" | "upload"
    duration_s: float = 0.0
    created_at: float = 0.0
    lora: str | None = None  # the LoRA adapter this voice speaks with, unless a request names another

    def prompt(self) -> Prompt:
        """The conditioning of a context's first segment."""
        return Prompt(
            text=self.text, latents=self.latents, reference_latents=self.reference_latents, speaker=self.speaker
        )

    def describe(self) -> dict[str, object]:
        """The voice as the HTTP API lists it."""
        return {
            "id": self.id,
            "object": "voice",
            "name": self.name or self.id,
            "role": self.role,
            "transcript": self.text,
            "source": self.source,
            "duration_s": round(self.duration_s, 3),
            "created_at": int(self.created_at),
            "lora": self.lora,
        }


def upload_id(audio: np.ndarray, role: str, transcript: str, audio_encoder_id: str, lora: str | None = None) -> str:
    """The content address of an upload: everything its latents depend on, and the LoRA adapter it speaks with (a
    voice without one keeps the id it always had), nothing else (not its name)."""
    digest = hashlib.sha256()
    for part in (audio_encoder_id, role, transcript, *((lora,) if lora else ())):
        digest.update(part.encode())
        digest.update(b"\0")
    digest.update(np.ascontiguousarray(audio, np.float32).tobytes())
    return UPLOAD_PREFIX + digest.hexdigest()[:24]


@dataclass(slots=True)
class _Entry:
    path: Path
    mtime_ns: int
    voice: Voice | None = None  # loaded on first use


@dataclass(slots=True)
class VoiceStore:
    """Every voice this server offers: fixed ones (built-in and `--voices-dir`) and uploads persisted under `root`.

    `aliases` maps extra names (OpenAI's voice names by default) to voice ids; a lookup follows them.
    """

    audio_encoder_id: str
    root: Path | None = None
    fixed: dict[str, Voice] = field(default_factory=dict)
    aliases: dict[str, str] = field(default_factory=dict)
    max_uploads: int = 1000
    _uploads: dict[str, _Entry] = field(default_factory=dict)
    _scanned: int | None = None  # mtime_ns of `root` at the last scan

    def __post_init__(self) -> None:
        self.fixed = {DEFAULT_VOICE: Voice(DEFAULT_VOICE, name="default (zero-shot)"), **self.fixed}
        if self.root is not None:
            self.root.mkdir(parents=True, exist_ok=True)
        for alias, target in self.aliases.items():
            if alias in self.fixed:
                raise ValueError(f"alias {alias!r} would hide the voice of that id")
            if not (target in self.fixed or _UPLOAD_ID.fullmatch(target)):
                raise ValueError(f"alias {alias!r} names no voice ({target!r})")

    # -- lookups (the protocol core's VoiceCatalog) --------------------------------------------------------------

    def ids(self) -> list[str]:
        """Every voice id, fixed voices first, uploads oldest first; aliases are not ids."""
        self._refresh()
        uploads = sorted(self._uploads.items(), key=lambda item: (item[1].mtime_ns, item[0]))
        return [*self.fixed, *(voice_id for voice_id, _ in uploads)]

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and self.get(key) is not None

    def get(self, key: str) -> Voice | None:
        """The voice `key` names (an id or an alias), or None."""
        key = self.aliases.get(key, key)
        if key in self.fixed:
            return self.fixed[key]
        if not _UPLOAD_ID.fullmatch(key):
            return None
        self._refresh()
        entry = self._uploads.get(key)
        if entry is None:
            return None
        if entry.voice is None:
            try:
                entry.voice = _read(entry.path)
            except (OSError, ValueError, SafetensorError) as exc:  # deleted meanwhile by another process, or damaged
                logger.warning("voice %s unreadable: %s", key, exc)
                return None
        return entry.voice

    def voices(self) -> list[Voice]:
        return [voice for voice_id in self.ids() if (voice := self.get(voice_id)) is not None]

    # -- changes -------------------------------------------------------------------------------------------------

    def add(self, voice: Voice) -> tuple[Voice, bool]:
        """Persist an upload; returns the stored voice and whether it is new (the same content is stored once).

        OSError (the disk is full, say) leaves nothing behind; VoiceLimitError when the store is full.
        """
        assert self.root is not None and _UPLOAD_ID.fullmatch(voice.id)
        existing = self.get(voice.id)
        if existing is not None:
            return existing, False
        if len(self._uploads) >= self.max_uploads:
            raise VoiceLimitError(f"the store holds max_voices={self.max_uploads} voices; delete some first")
        voice = replace(voice, source="upload", created_at=voice.created_at or time.time())
        path = self.root / f"{voice.id}.safetensors"
        fd, tmp = tempfile.mkstemp(dir=self.root, prefix=".upload-", suffix=".tmp")
        os.close(fd)
        try:
            save_file(_tensors(voice), tmp, metadata=_metadata(voice, self.audio_encoder_id))
            os.replace(tmp, path)  # atomic: a reader sees the whole file or none
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        self._scanned = None
        return voice, True

    def delete(self, voice_id: str) -> bool:
        """Remove an upload (fixed voices cannot be deleted: KeyError). False if there was none."""
        if voice_id in self.fixed:
            raise KeyError(voice_id)
        if self.root is None or not _UPLOAD_ID.fullmatch(voice_id):
            return False
        try:
            (self.root / f"{voice_id}.safetensors").unlink()
        except FileNotFoundError:
            return False
        self._scanned = None
        return True

    # -- the index -----------------------------------------------------------------------------------------------

    def _refresh(self) -> None:
        """Re-read the index if the directory changed since the last scan (files are added and removed by rename and
        unlink, which change the directory's mtime)."""
        if self.root is None:
            return
        try:
            mtime = self.root.stat().st_mtime_ns
        except FileNotFoundError:
            mtime = -1
        # A change within the directory's timestamp granularity of the last scan would leave its mtime unchanged, so
        # a recent mtime is no proof of an unchanged directory (git's "racily clean" rule): rescan until it ages.
        if mtime == self._scanned and time.time_ns() - mtime > _RACY_NS:
            return
        uploads: dict[str, _Entry] = {}
        for path in self.root.glob(f"{UPLOAD_PREFIX}*.safetensors") if mtime != -1 else ():
            voice_id = path.name.removesuffix(".safetensors")
            if not _UPLOAD_ID.fullmatch(voice_id):
                continue
            entry = self._uploads.get(voice_id)
            try:
                stat_mtime = path.stat().st_mtime_ns
                if entry is None or entry.mtime_ns != stat_mtime:
                    if _encoder_of(path) != self.audio_encoder_id:
                        continue  # encoded for another model: not a voice of this one
                    entry = _Entry(path, stat_mtime)
            except (OSError, ValueError, SafetensorError) as exc:
                logger.warning("skipping %s: %s", path.name, exc)
                continue
            uploads[voice_id] = entry
        self._uploads, self._scanned = uploads, mtime


class VoiceLimitError(Exception):
    """The store is full."""


async def open_voices(engine: EngineHandle, config: ServerConfig) -> VoiceStore:
    """The server's voices: the model's speakers, `--voices-dir` pairs encoded now (a bad pair is skipped, loudly),
    and the store."""
    fixed = speaker_voices(engine.info)
    rate = engine.info.encoder_sample_rate
    voices_dir = config.voices_dir
    if voices_dir is not None and "prompt" not in engine.info.voice_roles:
        logger.warning("ignoring --voices-dir %s: this model makes no prompt voices", voices_dir)
        voices_dir = None
    for voice_id, wav_path, transcript in dir_voices(voices_dir) if voices_dir is not None else ():
        if voice_id in fixed:
            logger.warning("skipping voice %s: the model has a speaker of that name", wav_path)
            continue
        try:
            wav = await asyncio.to_thread(decode, wav_path.read_bytes(), rate, config.uploads)
            latents = await engine.encode_audio(wav, padding="left")
        except (AudioError, EngineError, OSError) as exc:
            logger.warning("skipping voice %s: %s", wav_path, exc)
            continue
        duration = wav.size / rate
        fixed[voice_id] = Voice(voice_id, voice_id, "prompt", transcript, latents, source="dir", duration_s=duration)
        logger.info("voice %r: %.1f s of prompt audio", voice_id, duration)
    store = VoiceStore(
        engine.info.audio_encoder_id, config.voices_store, fixed, config.voice_aliases, config.max_voices
    )
    logger.info("voices: %d fixed, %d stored in %s", len(fixed) + 1, len(store.ids()) - len(fixed) - 1, store.root)
    return store


def speaker_voices(info: ModelInfo) -> dict[str, Voice]:
    """The model's preset speakers as voices, each named by the speaker."""
    return {name: Voice(name, name, "speaker", speaker=name) for name in info.speakers}


def dir_voices(voices_dir: Path) -> Iterable[tuple[str, Path, str]]:
    """(id, wav path, transcript) of the `NAME.wav` + `NAME.txt` pairs of a `--voices-dir`; others are skipped."""
    for wav_path in sorted(voices_dir.glob("*.wav")):
        text_path = wav_path.with_suffix(".txt")
        if wav_path.stem == DEFAULT_VOICE or not text_path.exists() or not _DIR_ID.fullmatch(wav_path.stem):
            logger.warning(
                "skipping voice %s: needs a transcript %s and a plain name other than 'default'",
                wav_path,
                text_path.name,
            )
            continue
        yield wav_path.stem, wav_path, text_path.read_text(encoding="utf-8").strip()


def _tensors(voice: Voice) -> dict[str, np.ndarray]:
    tensors = {}
    if voice.latents is not None:
        tensors["latents"] = np.ascontiguousarray(voice.latents, np.float32)
    if voice.reference_latents is not None:
        tensors["reference_latents"] = np.ascontiguousarray(voice.reference_latents, np.float32)
    return tensors


def _metadata(voice: Voice, audio_encoder_id: str) -> dict[str, str]:
    return {
        "format": _FORMAT,
        "id": voice.id,
        "name": voice.name,
        "role": voice.role,
        "transcript": voice.text,
        "audio_encoder_id": audio_encoder_id,
        "duration_s": repr(voice.duration_s),
        "created_at": repr(voice.created_at),
        "lora": voice.lora or "",
    }


def _encoder_of(path: Path) -> str:
    with safe_open(path, "numpy") as f:
        metadata = f.metadata() or {}
    if metadata.get("format") != _FORMAT:
        raise ValueError(f"not a {_FORMAT} file")
    return metadata.get("audio_encoder_id", "")


def _read(path: Path) -> Voice:
    with safe_open(path, "numpy") as f:
        metadata = f.metadata() or {}
        tensors = {name: f.get_tensor(name) for name in f.keys()}  # noqa: SIM118 (safe_open is not a mapping)
    return Voice(
        id=metadata["id"],
        name=metadata["name"],
        role=metadata["role"],
        text=metadata["transcript"],
        latents=tensors.get("latents"),
        reference_latents=tensors.get("reference_latents"),
        source="upload",
        duration_s=float(metadata["duration_s"]),
        created_at=float(metadata["created_at"]),
        lora=metadata.get("lora") or None,
    )
