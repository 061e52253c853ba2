"""Frame payloads -> PCM, one decoder per context, chosen by the output that `context.created` announced.

Opus is decoded by libopus (opuslib) with one decoder per context, as the server encodes with one encoder per
context; mu-law by the G.711 table; PCM passes through. `packet_samples` counts a payload's samples without decoding
it (contexts created with `decode=False`).
"""

from __future__ import annotations

import ctypes
import functools
import struct
from typing import Any

import numpy as np
import opuslib
import opuslib.api

from wsserver.frames import OPUS_CLOCK

MAX_OPUS_PACKET_MS = 120  # the longest an Opus packet can last (RFC 6716)
SAMPLE_BYTES = {"pcm_s16le": 2, "pcm_f32le": 4, "mulaw": 1}

# libopus reads a packet's duration from its TOC byte (and frame count) without decoding it. opuslib's own wrapper of
# opus_packet_get_samples_per_frame calls the wrong function, so the C function is bound here.
_opus_packet_get_nb_samples = opuslib.api.libopus.opus_packet_get_nb_samples
_opus_packet_get_nb_samples.argtypes = (ctypes.c_char_p, ctypes.c_int32, ctypes.c_int32)
_opus_packet_get_nb_samples.restype = ctypes.c_int


class PcmDecoder:
    """`pcm_s16le` and `pcm_f32le`: the payload is already PCM."""

    def __init__(self, fmt: str, rate: int) -> None:
        self.sample_format = "f32le" if fmt == "pcm_f32le" else "s16le"
        self.rate = rate

    def codec_header(self, payload: bytes) -> None:
        raise ValueError("a PCM context has no codec header")

    def decode(self, payload: bytes, pts: int) -> tuple[bytes, float]:
        return payload, pts / self.rate


class MulawDecoder:
    sample_format = "s16le"

    def __init__(self, rate: int) -> None:
        self.rate = rate

    def codec_header(self, payload: bytes) -> None:
        raise ValueError("a mu-law context has no codec header")

    def decode(self, payload: bytes, pts: int) -> tuple[bytes, float]:
        return _mulaw_table()[np.frombuffer(payload, np.uint8)].tobytes(), pts / self.rate


class OpusDecoder:
    """libopus at the coded rate. The encoder's lookahead delays the decoded audio by the OpusHead's pre-skip; those
    first samples are dropped (RFC 7845 section 4.2), so decoded sample n is timeline sample n."""

    sample_format = "s16le"

    def __init__(self, rate: int) -> None:
        self.rate = rate
        self.decoder = opuslib.Decoder(rate, 1)
        self.pre_skip = 0  # in 48 kHz ticks, from the OpusHead
        self._to_skip = 0  # decoded samples still to drop

    def codec_header(self, payload: bytes) -> None:
        if payload[:8] != b"OpusHead" or len(payload) < 19:
            raise ValueError("the codec header of an Opus context must be an OpusHead")
        (self.pre_skip,) = struct.unpack_from("<H", payload, 10)
        self._to_skip = round(self.pre_skip * self.rate / OPUS_CLOCK)

    def decode(self, payload: bytes, pts: int) -> tuple[bytes, float]:
        pcm = self.decoder.decode(payload, self.rate * MAX_OPUS_PACKET_MS // 1000)
        skip = min(self._to_skip, len(pcm) // 2)
        self._to_skip -= skip
        return pcm[2 * skip :], max(0, pts - self.pre_skip) / OPUS_CLOCK


Decoder = PcmDecoder | MulawDecoder | OpusDecoder


def decoder_for(output: dict[str, Any]) -> Decoder:
    """The decoder for a context's resolved output (`context.created.output`)."""
    fmt, rate = output["format"], output["sample_rate"]
    if fmt == "opus":
        return OpusDecoder(rate)
    if fmt == "mulaw":
        return MulawDecoder(rate)
    if fmt in ("pcm_s16le", "pcm_f32le"):
        return PcmDecoder(fmt, rate)
    raise ValueError(f"unknown audio format {fmt!r}")


def packet_samples(fmt: str, payload: bytes, rate: int) -> int:
    """How many samples at `rate` one frame's payload holds, without decoding it: Opus from the packet's TOC byte
    (libopus), mu-law and PCM from the payload's length."""
    if fmt == "opus":
        samples = _opus_packet_get_nb_samples(payload, len(payload), rate)
        if samples < 0:  # OPUS_BAD_ARG or OPUS_INVALID_PACKET
            raise ValueError(f"not an Opus packet ({len(payload)} bytes, libopus error {samples})")
        return samples
    if fmt not in SAMPLE_BYTES:
        raise ValueError(f"unknown audio format {fmt!r}")
    return len(payload) // SAMPLE_BYTES[fmt]


@functools.cache
def _mulaw_table() -> np.ndarray:
    """G.711 mu-law byte -> 16-bit sample (ITU-T G.711, the inverse of `wsserver.audio.mulaw_encode`)."""
    code = ~np.arange(256) & 0xFF
    exponent, mantissa = (code >> 4) & 0x07, code & 0x0F
    magnitude = (((mantissa << 3) + 0x84) << exponent) - 0x84
    table = np.where(code & 0x80, -magnitude, magnitude).astype("<i2")
    table.flags.writeable = False
    return table
