"""What a context yields, in arrival order, and the errors the client raises.

Times are seconds on the context's audio timeline: 0 is its first sample, and a frame's `pts` over its clock
(the sample rate for PCM and mu-law, 48 kHz for Opus) is where that frame starts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from wsserver.frames import FLAG_CONTEXT_END, FLAG_SEGMENT_END


@dataclass(frozen=True, slots=True)
class Audio:
    """One frame's audio, decoded: mono little-endian PCM, 16-bit (`pcm_s16le`, `opus`, `mulaw`) or float32
    (`pcm_f32le`). Opus frames are decoded by libopus; the decoder's pre-skip is dropped from the first frame, so the
    decoded stream lines up with the timeline (an Opus chunk starts `start_s` in, the first one is shorter)."""

    pcm: bytes
    sample_rate: int
    sample_format: str  # "s16le" or "f32le"
    start_s: float
    seq: int
    segment: int
    flags: int

    @property
    def samples(self) -> int:
        return len(self.pcm) // (2 if self.sample_format == "s16le" else 4)

    @property
    def duration_s(self) -> float:
        return self.samples / self.sample_rate

    @property
    def last_of_segment(self) -> bool:
        return bool(self.flags & FLAG_SEGMENT_END)

    @property
    def last_of_context(self) -> bool:
        return bool(self.flags & FLAG_CONTEXT_END)

    def array(self) -> np.ndarray:
        return np.frombuffer(self.pcm, "<i2" if self.sample_format == "s16le" else "<f4")


@dataclass(frozen=True, slots=True)
class Packet:
    """One frame as the server sent it, not decoded (contexts created with `decode=False`): an Opus packet, mu-law
    bytes or PCM, for a client that relays the audio on (Opus to a browser or a WebRTC track) or only counts it.
    `samples` at `sample_rate` is counted from the packet (an Opus packet's TOC byte), so the first Opus packet's
    count includes the pre-skip a decoder drops; `start_s` is the frame's `pts` over its clock."""

    payload: bytes
    format: str  # as `context.created` announced it: "opus", "mulaw", "pcm_s16le", "pcm_f32le"
    sample_rate: int
    samples: int
    start_s: float
    seq: int
    segment: int
    flags: int

    @property
    def duration_s(self) -> float:
        return self.samples / self.sample_rate

    @property
    def last_of_segment(self) -> bool:
        return bool(self.flags & FLAG_SEGMENT_END)

    @property
    def last_of_context(self) -> bool:
        return bool(self.flags & FLAG_CONTEXT_END)


@dataclass(frozen=True, slots=True)
class SegmentStart:
    """Yielded just before the first audio of a segment: its text (exactly as sent, trailing whitespace included)
    starts being spoken at `start_s`. Captions: this is all the timing the model gives (no word timing)."""

    segment: int
    text: str
    start_s: float


@dataclass(frozen=True, slots=True)
class SegmentEnd:
    """Yielded just after the last audio of a segment. `end_s` is the end of its last frame, so it includes the
    silence the server pads a segment's tail with (less than one frame)."""

    segment: int
    text: str
    start_s: float
    end_s: float


@dataclass(frozen=True, slots=True)
class Flushed:
    """`context.flushed`: every frame of the text buffered at the flush has been yielded before this."""

    segment: int


@dataclass(frozen=True, slots=True)
class Queued:
    """`queue.status`: a segment waits for an engine slot (1 = next)."""

    position: int


@dataclass(frozen=True, slots=True)
class Notice:
    """A server `warning` about this context or the whole session (`draining`, `nothing_to_say`)."""

    code: str
    message: str


@dataclass(frozen=True, slots=True)
class Refused:
    """An `error` that refused one message for this context and left the context open (e.g. `text_too_long`):
    nothing of that message was accepted."""

    code: str
    message: str


@dataclass(frozen=True, slots=True)
class Done:
    """`context.done`: every accepted character was spoken; the last event of the context."""

    last_seq: int
    audio_ms: float
    metrics: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Cancelled:
    """`context.cancelled`, the cancel fence: `last_seq` is the last frame the server sent (-1: none); nothing of
    the context follows. Also what a context ends with when the server drains it or closes the session."""

    last_seq: int


Event = Audio | Packet | SegmentStart | SegmentEnd | Flushed | Queued | Notice | Refused | Done | Cancelled


class ClientError(Exception):
    """Base of the client's errors."""


class ContextFailed(ClientError):
    """An `error` ended the context (its create was refused, or the engine failed it); `code` is the protocol's."""

    def __init__(self, ctx: str, code: str, message: str) -> None:
        super().__init__(f"context {ctx!r}: {code}: {message}")
        self.ctx, self.code, self.message = ctx, code, message


class ConnectionLost(ClientError):
    """The WebSocket closed before the context ended (close `code`, e.g. 1006 when the network dropped)."""

    def __init__(self, code: int | None, reason: str) -> None:
        super().__init__(f"connection closed ({code}): {reason}")
        self.code, self.reason = code, reason


class Unavailable(ClientError):
    """No session could be opened within the reconnect window: every attempt was refused with 503 (full, starting or
    draining), cut off by the handshake race (4429), or could not connect."""


class Rejected(ClientError):
    """The handshake was refused for good (401 without the right API key, 404 on a wrong path, ...)."""

    def __init__(self, status: int, body: bytes) -> None:
        super().__init__(f"HTTP {status}: {body[:200].decode(errors='replace')}")
        self.status, self.body = status, body
