"""Uploaded audio: every accepted format decodes as librosa.load does; every bad upload gets its own error."""

from __future__ import annotations

import io

import av
import numpy as np
import pytest
import soundfile as sf

from wsserver.decoding import AudioError, UploadLimits, decode

RATE = 44100
LIMITS = UploadLimits()


def tone(seconds: float = 2.0, rate: int = RATE, channels: int = 2) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    return np.stack([0.3 * np.sin(2 * np.pi * (220 + 110 * c) * t) for c in range(channels)], 1)


def encoded(x: np.ndarray, fmt: str, subtype: str, rate: int = RATE) -> bytes:
    buffer = io.BytesIO()
    sf.write(buffer, x, rate, format=fmt, subtype=subtype)
    return buffer.getvalue()


@pytest.mark.parametrize(
    ("fmt", "subtype", "tolerance"),
    [("WAV", "PCM_16", 0), ("WAV", "PCM_24", 0), ("WAV", "FLOAT", 0), ("FLAC", "PCM_16", 0), ("OGG", "VORBIS", 1e-6),
     ("OGG", "OPUS", 1e-6), ("MP3", "MPEG_LAYER_III", 1e-5)],
)  # fmt: skip
def test_decodes_as_the_reference_reads_files(fmt: str, subtype: str, tolerance: float, tmp_path: object) -> None:
    librosa = pytest.importorskip("librosa")
    data = encoded(tone(), fmt, subtype, 48000 if subtype == "OPUS" else RATE)
    ours = decode(data, 16000, LIMITS)
    path = f"{tmp_path}/clip.{fmt.lower()}"
    with open(path, "wb") as f:
        f.write(data)
    theirs, _ = librosa.load(path, sr=16000, mono=True)
    assert ours.dtype == np.float32 and ours.size == theirs.size
    assert float(np.abs(ours - theirs).max()) <= tolerance


def test_webm_from_a_browser_recording() -> None:
    buffer = io.BytesIO()
    with av.open(buffer, mode="w", format="webm") as container:
        stream = container.add_stream("libopus", rate=48000, layout="mono")
        samples = tone(1.5, 48000, 1)[:, 0].astype(np.float32)
        for i in range(0, samples.size, 960):
            frame = av.AudioFrame.from_ndarray(samples[None, i : i + 960], format="flt", layout="mono")
            frame.sample_rate = 48000
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode(None):
            container.mux(packet)
    out = decode(buffer.getvalue(), 16000, LIMITS)
    assert abs(out.size - 24000) < 400 and 0.2 < np.abs(out).max() < 0.4


@pytest.mark.parametrize(
    ("data", "code"),
    [
        (b"", "audio_empty"),
        (b"RIFF\x24\x00\x00\x00WAVEfmt garbage", "audio_corrupt"),
        (np.random.default_rng(0).bytes(5000), "audio_corrupt"),
        (b"\x89PNG\r\n\x1a\n" + bytes(2000), "audio_format"),
        (encoded(tone(0.3), "WAV", "PCM_16"), "audio_too_short"),
        (encoded(np.zeros((RATE * 2, 1)), "WAV", "PCM_16"), "audio_silent"),
        (encoded(tone(2) * 1e-4, "WAV", "PCM_16"), "audio_silent"),
        (encoded(tone(31, 8000, 1), "WAV", "PCM_16", 8000), "audio_too_long"),
    ],
)
def test_bad_uploads_are_refused_with_their_reason(data: bytes, code: str) -> None:
    with pytest.raises(AudioError) as error:
        decode(data, 16000, LIMITS)
    assert error.value.code == code


def test_unsupported_formats_are_refused_by_name() -> None:
    buffer = io.BytesIO()
    with av.open(buffer, mode="w", format="adts") as container:  # AAC is not an upload format
        stream = container.add_stream("aac", rate=24000, layout="mono")
        frame = av.AudioFrame.from_ndarray(
            tone(1, 24000, 1)[:, 0].astype(np.float32)[None], format="flt", layout="mono"
        )
        frame.sample_rate = 24000
        for packet in [*stream.encode(frame), *stream.encode(None)]:
            container.mux(packet)
    with pytest.raises(AudioError) as error:
        decode(buffer.getvalue(), 16000, LIMITS)
    assert error.value.code == "audio_format" and "aac" in str(error.value)


def test_a_decompression_bomb_stops_at_the_duration_limit() -> None:
    """A FLAC of ten minutes of a constant is a few kilobytes: decoding stops at max_duration_s, not at the end."""
    data = encoded(np.full((RATE * 600, 1), 0.5), "FLAC", "PCM_16")
    assert len(data) < 200_000
    with pytest.raises(AudioError) as error:
        decode(data, 16000, LIMITS)
    assert error.value.code == "audio_too_long"


def test_the_size_and_time_limits_hold() -> None:
    data = encoded(tone(5), "WAV", "PCM_16")
    with pytest.raises(AudioError) as error:
        decode(data, 16000, UploadLimits(max_bytes=len(data) - 1))
    assert error.value.code == "audio_too_big"
    with pytest.raises(AudioError) as error:
        decode(data, 16000, UploadLimits(max_decode_s=0))
    assert error.value.code == "audio_decode_timeout"
