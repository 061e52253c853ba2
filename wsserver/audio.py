"""Audio out: the model's float32 waveform -> resampled, framed, encoded binary frames with the 20-byte header.

One `AudioOut` per context owns the whole chain (resampler, frame buffer, encoder, seq/pts counters), so a
context's audio is one continuous stream: the resampler and the Opus encoder keep their state across chunks.
"""

from __future__ import annotations

import functools
import math
import struct
import time
from dataclasses import dataclass

import numpy as np
import opuslib
from numpy.lib.stride_tricks import sliding_window_view

from wsserver.frames import (
    FLAG_CONTEXT_END,
    FLAG_SEGMENT_END,
    HEADER,
    KIND_AUDIO,
    KIND_CODEC,
    OPUS_CLOCK,
    VERSION,
    FrameHeader,
)
from wsserver.messages import OutputSettings
from wsserver.opus_load import OpusComplexity


@functools.cache
def _polyphase_filter(up: int, down: int, zero_crossings: int, beta: float) -> np.ndarray:
    """The Kaiser-windowed sinc of a up/down resampler in polyphase form, each phase's taps oldest input first:
    [p, taps - 1 - j] = h[p + j * up]. One per rate pair (every context of that pair shares it, read-only)."""
    factor = max(up, down)
    half = zero_crossings * factor
    n = np.arange(-half, half + 1)
    cutoff = 0.5 / factor  # the lower Nyquist, in cycles per upsampled sample
    h = 2 * cutoff * np.sinc(2 * cutoff * n) * np.kaiser(n.size, beta) * up
    taps = -(-h.size // up)
    h = np.pad(h, (0, taps * up - h.size))
    phases = np.ascontiguousarray(h.reshape(taps, up).T[:, ::-1], dtype=np.float32)
    phases.flags.writeable = False
    return phases


class Resampler:
    """Streaming rational-ratio resampler: a Kaiser-windowed sinc in polyphase form.

    Output sample n is the band-limited input at time n * in_rate / out_rate, so chunks fed one by one give the same
    samples as the whole signal at once (no seams). `flush()` ends a stream: it emits the tail the filter was still
    holding, exactly round(len(input) * out_rate / in_rate) samples in total, and starts afresh.
    """

    def __init__(self, in_rate: int, out_rate: int, zero_crossings: int = 16, beta: float = 8.6) -> None:
        g = math.gcd(in_rate, out_rate)
        self.up, self.down = out_rate // g, in_rate // g
        self.half = zero_crossings * max(self.up, self.down)  # filter half-length, in samples of the upsampled signal
        self._reversed = _polyphase_filter(self.up, self.down, zero_crossings, beta)
        self.taps = self._reversed.shape[1]
        self._reset()

    def _reset(self) -> None:
        self._buffer = np.zeros(self.taps, np.float32)  # recent input, zeros before the stream's start
        self._origin = -self.taps  # input index of _buffer[0]
        self._received = 0
        self._next = 0  # next output index

    def process(self, x: np.ndarray) -> np.ndarray:
        if self.up == self.down:
            return x.astype(np.float32, copy=False)
        self._buffer = np.concatenate([self._buffer, x.astype(np.float32, copy=False)])
        self._received += x.size
        # Output n needs input up to index (n * down + half) // up.
        return self._emit((self._received * self.up - 1 - self.half) // self.down + 1)

    def flush(self) -> np.ndarray:
        if self.up == self.down:
            return np.zeros(0, np.float32)
        total = round(self._received * self.up / self.down)
        self._buffer = np.concatenate([self._buffer, np.zeros(self.taps + 1, np.float32)])
        out = self._emit(total)
        self._reset()
        return out

    def _emit(self, stop: int) -> np.ndarray:
        n = np.arange(self._next, max(stop, self._next))
        if not n.size:  # a chunk too small to complete an output: the buffer may be shorter than one window
            return np.zeros(0, np.float32)
        t = n * self.down + self.half
        first = t // self.up - self._origin - (self.taps - 1)  # buffer index of the oldest input each output reads
        windows = sliding_window_view(self._buffer, self.taps)  # windows[i] = _buffer[i : i + taps], no copy
        out = np.empty(n.size, np.float32)
        # Outputs up apart use the same filter phase and read windows exactly `down` inputs apart: one strided
        # product per phase (one in all when decimating), not a gathered [outputs, taps] copy.
        for k in range(min(self.up, n.size)):
            rows = first[k :: self.up]
            # einsum's own loop, not BLAS: a row's sum must not depend on how many rows a chunk has (seamless).
            out[k :: self.up] = np.einsum(
                "nj,j->n", windows[rows[0] : rows[-1] + 1 : self.down], self._reversed[t[k] % self.up]
            )
        self._next += n.size
        # Keep only what the next output can still read.
        oldest = (self._next * self.down + self.half) // self.up - self.taps + 1 - self._origin
        if oldest > 0:
            self._buffer = self._buffer[oldest:]
            self._origin += oldest
        return out


def mulaw_encode(x: np.ndarray) -> bytes:
    """G.711 mu-law bytes of float32 samples in [-1, 1] (ITU-T G.711, the segment/mantissa form)."""
    s = np.clip(np.round(x * 32767), -32767, 32767).astype(np.int32)
    sign = np.where(s < 0, 0x80, 0)
    s = np.minimum(np.abs(s), 32635) + 0x84
    exponent = np.clip(np.floor(np.log2(s)).astype(np.int32) - 7, 0, 7)
    mantissa = (s >> (exponent + 3)) & 0x0F
    return (~(sign | (exponent << 4) | mantissa) & 0xFF).astype(np.uint8).tobytes()


class _OpusCodec:
    def __init__(self, rate: int, frame_samples: int, bitrate: int, complexity: OpusComplexity) -> None:
        self.encoder = opuslib.Encoder(rate, 1, opuslib.APPLICATION_AUDIO)
        self.encoder.bitrate = bitrate
        self.complexity = complexity
        self._level = complexity.level
        self.encoder.complexity = self._level
        self.rate, self.frame_samples = rate, frame_samples
        self._frames = 0  # encoded so far

    def header(self) -> bytes:
        """OpusHead (RFC 7845 section 5.1): version 1, mono, pre-skip in 48 kHz samples, input rate, 0 dB, family 0."""
        pre_skip = self.encoder.lookahead * OPUS_CLOCK // self.rate
        return b"OpusHead" + struct.pack("<BBHIhB", 1, 1, pre_skip, self.rate, 0, 0)

    def encode(self, frame: np.ndarray) -> bytes:
        """One frame's packet, at the front end's complexity now (wsserver.opus_load: a stream's first frames at most
        at its start level), whose cost it is told."""
        level = self.complexity.level_for(self._frames * self.frame_samples / self.rate)
        if level != self._level:
            self.encoder.complexity = self._level = level
        start = time.perf_counter()
        packet = self.encoder.encode_float(frame.tobytes(), self.frame_samples)
        end = time.perf_counter()
        self._frames += 1
        self.complexity.encoded(end - start, end, level)
        return packet


@dataclass(slots=True)
class OpusFrame:
    """An Opus frame whose packet is encoded when the socket is ready for it, not when its audio arrives. A step
    brings each of a worker's streams a chunk of 8 frames; encoded on arrival, every stream's first frame would wait
    for all of them to be encoded (several ms per stream at complexity 10). Its context's frames go out in order, so
    the encoder, which keeps state across frames, still sees them in order; frames that never go out (a cancelled
    context's) are never encoded."""

    header: bytes
    samples: np.ndarray
    codec: _OpusCodec
    size: int  # what the outbox counts until it is encoded: the header and the bitrate's share of a frame

    def __len__(self) -> int:
        return self.size

    def encode(self) -> bytes:
        return self.header + self.codec.encode(self.samples)


Frame = tuple[int, bytes | OpusFrame]  # (seq, the whole binary frame), as a context hands it to its session


def wire(frame: bytes | OpusFrame) -> bytes:
    """A frame as the socket takes it: an Opus frame is encoded here."""
    return frame.encode() if isinstance(frame, OpusFrame) else frame


def has_audio(frame: bytes | OpusFrame) -> bool:
    """Whether a frame carries audio: every frame but the empty end marker (AudioOut.end_marker)."""
    return isinstance(frame, OpusFrame) or len(frame) > HEADER.size


def _encode_pcm(fmt: str, frame: np.ndarray) -> bytes:
    if fmt == "pcm_f32le":
        return frame.astype("<f4").tobytes()
    if fmt == "pcm_s16le":
        return np.clip(np.round(frame * 32767), -32768, 32767).astype("<i2").tobytes()
    return mulaw_encode(frame)


class AudioOut:
    """One context's audio chain: float32 chunks at the model's rate in, binary frames out.

    Every frame carries exactly `frame_ms` of audio: the tail of a segment is padded with silence to a whole frame
    (under one frame of silence at a sentence end), so segments never share a frame. The last full frame of a
    segment is held back until the segment ends or more audio comes, because only then are its flags known.
    """

    def __init__(
        self, output: OutputSettings, native_rate: int, handle: int, opus_complexity: OpusComplexity | None = None
    ) -> None:
        assert output.sample_rate is not None, "resolve the output settings first"
        self.format, self.rate, self.handle = output.format, output.sample_rate, handle
        self.frame_samples = self.rate * output.frame_ms // 1000
        clock = OPUS_CLOCK if self.format == "opus" else self.rate
        self.pts_step = self.frame_samples * clock // self.rate
        self.resampler = Resampler(native_rate, self.rate)
        self.opus: _OpusCodec | None = None
        if self.format == "opus":
            complexity = opus_complexity or OpusComplexity(10, 10)  # no front end's governor: 10, fixed
            self.opus = _OpusCodec(self.rate, self.frame_samples, output.bitrate, complexity)
        self._opus_bytes = output.bitrate * output.frame_ms // 8000  # a frame's packet at the target bitrate
        self._pending = np.zeros(0, np.float32)
        self.next_seq = 0
        self.samples = 0  # samples sent, at the output rate

    def codec_frame(self) -> bytes | None:
        """The kind-2 frame that goes before any audio (OpusHead for Opus, nothing for the other formats)."""
        if self.opus is None:
            return None
        return FrameHeader(KIND_CODEC, self.handle, 0, 0, 0, 0).pack() + self.opus.header()

    def push(self, samples: np.ndarray, segment: int) -> list[Frame]:
        self._pending = np.concatenate([self._pending, self.resampler.process(samples)])
        # Strictly more than whole frames: the last whole frame waits, its flags are not known yet.
        ready = max(0, (self._pending.size - 1) // self.frame_samples) * self.frame_samples
        frames = self._frames(self._pending[:ready], segment, 0)
        self._pending = self._pending[ready:]
        return frames

    def end_segment(self, segment: int, last_of_context: bool) -> list[Frame]:
        tail = np.concatenate([self._pending, self.resampler.flush()])
        self._pending = np.zeros(0, np.float32)
        tail = np.pad(tail, (0, -tail.size % self.frame_samples))  # silence up to a whole frame
        return self._frames(tail, segment, FLAG_SEGMENT_END | (FLAG_CONTEXT_END if last_of_context else 0))

    def end_marker(self, segment: int) -> Frame:
        """An empty frame flagged last-of-context, for a context whose end became known after its last audio."""
        return self._frame(b"", 0, segment, FLAG_SEGMENT_END | FLAG_CONTEXT_END)

    def _frames(self, block: np.ndarray, segment: int, last_flags: int) -> list[Frame]:
        """The frames of `block` (whole frames), the last one flagged `last_flags`. PCM and mu-law are converted in
        one call per block, not per frame: at hundreds of streams this runs for every 20 ms of each."""
        count = block.size // self.frame_samples
        payloads: list[bytes] | list[np.ndarray]
        if self.opus is not None:
            payloads = list(block.reshape(count, self.frame_samples))  # encoded as they are sent (OpusFrame)
        else:
            data = _encode_pcm(self.format, block)
            size = len(data) // count if count else 0
            payloads = [data[i * size : (i + 1) * size] for i in range(count)]
        last = count - 1
        return [
            self._frame(payload, self.frame_samples, segment, last_flags if i == last else 0)
            for i, payload in enumerate(payloads)
        ]

    def _frame(self, payload: bytes | np.ndarray, samples: int, segment: int, flags: int) -> Frame:
        seq, pts = self.next_seq, self.samples // self.frame_samples * self.pts_step
        self.next_seq += 1
        self.samples += samples
        header = HEADER.pack(VERSION, KIND_AUDIO, self.handle, seq, pts, segment, flags)
        if isinstance(payload, np.ndarray):
            assert self.opus is not None
            return seq, OpusFrame(header, payload, self.opus, len(header) + self._opus_bytes)
        return seq, header + payload
