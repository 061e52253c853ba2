"""Uploaded audio -> float32 mono at the encoder's rate, with the checks a voice upload needs.

Decoding is PyAV's (FFmpeg): WAV, FLAC, MP3, Ogg (Vorbis, Opus, FLAC) and WebM (what browsers record) are accepted;
anything else is refused by name before its codec runs. Channels are averaged and the rate converted with soxr's HQ
filter, as the reference package's `librosa.load(path, sr=encoder_rate, mono=True)` does, so an upload gives the
reference's latents. The decoded duration is checked while decoding, frame by frame, and decoding has a time budget:
a small file that expands to hours of audio (a decompression bomb) stops at the limit instead of filling memory.
"""

from __future__ import annotations

import io
import time
from dataclasses import dataclass

import av
import numpy as np
import soxr

# FFmpeg's demuxer names -> what the API calls them.
CONTAINERS = {"wav": "wav", "flac": "flac", "mp3": "mp3", "ogg": "ogg", "matroska,webm": "webm"}
CODECS = ("pcm_", "flac", "mp3", "vorbis", "opus")  # prefixes of the decoders allowed to run
SILENCE_PEAK = 10 ** (-50 / 20)  # a clip whose loudest sample is below -50 dBFS holds no voice


@dataclass(frozen=True, slots=True)
class UploadLimits:
    max_bytes: int = 10 * 1024 * 1024
    min_duration_s: float = 1.0
    max_duration_s: float = 30.0
    max_decode_s: float = 10.0  # wall time for decoding one upload
    max_transcript_chars: int = 1000
    max_name_chars: int = 64
    max_concurrent: int = 4  # uploads in progress at once (each decodes on a thread and encodes on the engine)

    def advertised(self) -> dict[str, object]:
        return {
            "formats": sorted(set(CONTAINERS.values())),
            "max_bytes": self.max_bytes,
            "min_duration_s": self.min_duration_s,
            "max_duration_s": self.max_duration_s,
            "max_transcript_chars": self.max_transcript_chars,
            "max_name_chars": self.max_name_chars,
            "max_concurrent": self.max_concurrent,
        }


class AudioError(ValueError):
    """An upload that cannot become a voice; `code` says why (docs/http.md lists them)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def decode(data: bytes, rate: int, limits: UploadLimits) -> np.ndarray:
    """The audio in `data` as float32 mono at `rate`. Raises AudioError. Blocking: run it on a worker thread."""
    if not data:
        raise AudioError("audio_empty", "the audio file is empty")
    if len(data) > limits.max_bytes:
        raise AudioError("audio_too_big", f"the audio file exceeds max_bytes={limits.max_bytes}")
    deadline = time.monotonic() + limits.max_decode_s
    try:
        with av.open(io.BytesIO(data), mode="r") as container:
            kind = CONTAINERS.get(container.format.name)
            if kind is None:
                raise AudioError("audio_format", f"unsupported audio format {container.format.name!r}")
            if not container.streams.audio:
                raise AudioError("audio_format", "the file has no audio stream")
            stream = container.streams.audio[0]
            if not stream.codec_context.name.startswith(CODECS):
                raise AudioError("audio_format", f"unsupported codec {stream.codec_context.name!r} in {kind}")
            source_rate = stream.codec_context.sample_rate
            if not source_rate:
                raise AudioError("audio_corrupt", "the audio stream has no sample rate")
            samples = _decode_mono(container, stream, int(limits.max_duration_s * source_rate), deadline)
    except av.FFmpegError as exc:
        raise AudioError("audio_corrupt", f"cannot decode the audio: {exc}") from None
    if samples.size == 0:
        raise AudioError("audio_empty", "the audio file holds no samples")
    duration = samples.size / source_rate
    if duration < limits.min_duration_s:
        raise AudioError("audio_too_short", f"{duration:.2f} s of audio; at least {limits.min_duration_s} s")
    if not np.isfinite(samples).all():
        raise AudioError("audio_corrupt", "the audio holds non-finite samples")
    if np.abs(samples).max() < SILENCE_PEAK:
        raise AudioError("audio_silent", "the audio is silent (peak below -50 dBFS)")
    if source_rate != rate:
        samples = soxr.resample(samples, source_rate, rate, quality="HQ")
    return np.ascontiguousarray(samples, np.float32)


def _decode_mono(
    container: av.container.InputContainer, stream: av.AudioStream, cap: int, deadline: float
) -> np.ndarray:
    """Every frame of `stream` as planar float, channels averaged; AudioError past `cap` samples or the deadline."""
    # To planar float without touching the layout or the rate (FFmpeg's downmix would weigh channels its own way).
    to_float = av.AudioResampler(format="fltp")
    chunks, total = [], 0
    for frame in container.decode(stream):
        for converted in to_float.resample(frame):
            planes = converted.to_ndarray()  # [channels, samples]
            chunks.append(planes.mean(axis=0, dtype=np.float32) if planes.shape[0] > 1 else planes[0])
            total += chunks[-1].size
        if total > cap:
            raise AudioError("audio_too_long", f"the audio is longer than max_duration_s={cap / stream.rate:g}")
        if time.monotonic() > deadline:
            raise AudioError("audio_decode_timeout", "decoding the audio took too long")
    return np.concatenate(chunks) if chunks else np.zeros(0, np.float32)
