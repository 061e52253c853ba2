"""Audio files out: the response formats of `POST /v1/audio/speech`, encoded and muxed by PyAV (FFmpeg).

One encoder per response, fed float32 mono chunks as the engine makes them. Streamed, it hands back the bytes that
each chunk completes (one file, one header: never a container per chunk); FFmpeg's muxers then write what a stream
allows, so WAV says "size unknown" (0xFFFFFFFF) and FLAC "length unknown", as every streaming server does. Blocking,
it writes to a seekable buffer, so the muxers go back and fill in sizes, FLAC's sample count and MP3's gapless header.
"""

from __future__ import annotations

import io
from dataclasses import dataclass, field

import av
import numpy as np

_MP3_RATES = (8000, 11025, 12000, 16000, 22050, 24000, 32000, 44100, 48000)  # MPEG layer III and AAC
_ANY_RATE = (8000, 16000, 22050, 24000, 44100, 48000)


@dataclass(frozen=True, slots=True)
class FileFormat:
    content_type: str
    muxer: str
    codec: str
    rates: tuple[int, ...]  # the output rates offered (the model's own rate too where the format takes any)
    bit_rate: int | None = None
    any_rate: bool = False  # PCM-like: every rate the resampler makes is fine
    options: dict[str, str] = field(default_factory=dict)


# OpenAI's `response_format` values, with the Content-Type OpenAI answers them with.
FORMATS: dict[str, FileFormat] = {
    "mp3": FileFormat("audio/mpeg", "mp3", "libmp3lame", _MP3_RATES, 64000),
    # Ogg pages of 20 ms: the muxer's default (1 s) would hold the first audio back for a second.
    "opus": FileFormat("audio/opus", "ogg", "libopus", (8000, 12000, 16000, 24000, 48000), 32000,
                       options={"page_duration": "20000"}),
    "aac": FileFormat("audio/aac", "adts", "aac", _MP3_RATES, 64000),
    "flac": FileFormat("audio/flac", "flac", "flac", _ANY_RATE, any_rate=True),
    "wav": FileFormat("audio/wav", "wav", "pcm_s16le", _ANY_RATE, any_rate=True,
                      options={"fflags": "+bitexact"}),  # no "encoder: Lavf" LIST chunk in the header
    "pcm": FileFormat("audio/pcm", "s16le", "pcm_s16le", _ANY_RATE, any_rate=True),
}  # fmt: skip


class _Appender:
    """A write-only sink: FFmpeg sees an unseekable stream and writes only what it can write in order."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []

    def write(self, data: bytes) -> int:
        self.parts.append(bytes(data))
        return len(data)

    def take(self) -> bytes:
        data = b"".join(self.parts)
        self.parts.clear()
        return data


class FileEncoder:
    """float32 mono chunks at `rate` in, the bytes of one audio file out."""

    def __init__(self, name: str, rate: int, streaming: bool) -> None:
        self.format = FORMATS[name]
        self.rate = rate
        self.samples = 0
        self._sink: _Appender | io.BytesIO = _Appender() if streaming else io.BytesIO()
        self._container = av.open(self._sink, mode="w", format=self.format.muxer, options=self.format.options)
        self._stream = self._container.add_stream(self.format.codec, rate=rate, layout="mono")
        if self.format.bit_rate is not None:
            self._stream.bit_rate = self.format.bit_rate

    def push(self, samples: np.ndarray) -> bytes:
        """Encode a chunk; the bytes it completes (streaming), or nothing (blocking: all comes at the end)."""
        if samples.size:
            frame = av.AudioFrame.from_ndarray(
                np.ascontiguousarray(samples, np.float32)[None, :], format="flt", layout="mono"
            )
            frame.sample_rate = self.rate
            self._mux(frame)
            self.samples += samples.size
        return self._taken()

    def finish(self) -> bytes:
        """Flush the encoder and close the file: its last bytes (streaming), or the whole file (blocking)."""
        self._mux(None)
        self._container.close()
        if isinstance(self._sink, io.BytesIO):
            return self._sink.getvalue()
        return self._sink.take()

    def _mux(self, frame: av.AudioFrame | None) -> None:
        for packet in self._stream.encode(frame):
            self._container.mux(packet)

    def _taken(self) -> bytes:
        return self._sink.take() if isinstance(self._sink, _Appender) else b""
