"""One context of a session, as the client sees it: text goes in, decoded audio and caption timing come out.

The connection's reader hands a context its messages and frames (`on_message`, `on_frame`); the context turns them
into events (`wsserver.client.events`) that its single consumer iterates. Nothing here awaits the network except the
four client messages.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from wsserver.client.decode import Decoder, decoder_for, packet_samples
from wsserver.client.events import (
    Audio,
    Cancelled,
    ConnectionLost,
    ContextFailed,
    Done,
    Event,
    Flushed,
    Notice,
    Packet,
    Queued,
    Refused,
    SegmentEnd,
    SegmentStart,
)
from wsserver.frames import FLAG_SEGMENT_END, KIND_CODEC, OPUS_CLOCK, FrameHeader

if TYPE_CHECKING:
    from wsserver.client.connection import Connection

Ending = Done | Cancelled | ContextFailed | ConnectionLost
_ENDINGS = (Done, Cancelled, ContextFailed, ConnectionLost)


@dataclass
class Synthesis:
    """A whole context collected: its audio, the timing of each segment, and how it ended."""

    pcm: bytes
    sample_rate: int
    sample_format: str
    segments: list[SegmentEnd] = field(default_factory=list)
    result: Done | Cancelled | None = None

    def array(self) -> np.ndarray:
        return np.frombuffer(self.pcm, "<i2" if self.sample_format == "s16le" else "<f4")


class Context:
    """A context on an open session. Iterate it (one consumer) for its events; iteration ends after `Done` or
    `Cancelled` and raises `ContextFailed` or `ConnectionLost` when the context ended that way."""

    def __init__(self, connection: Connection, ctx: str, *, decode: bool = True) -> None:
        self.id = ctx
        self.decode = decode  # False: frames are yielded as `Packet`s, as sent
        self.handle: int | None = None
        self.output: dict[str, Any] = {}  # the resolved output of `context.created`
        self.result: Done | Cancelled | None = None
        self._connection = connection
        loop = asyncio.get_running_loop()
        self._created: asyncio.Future[None] = loop.create_future()
        self._fence: asyncio.Future[Cancelled] = loop.create_future()
        self._events: deque[Event | ContextFailed | ConnectionLost] = deque()
        self._wakeup = asyncio.Event()
        self._decoder: Decoder | None = None
        self._clock = 1  # ticks per second of the frames' pts
        self._texts: dict[int, str] = {}  # segment -> text, from segment.started
        self._starts: dict[int, float] = {}  # segments whose audio has begun -> start_s
        self._ended_segments: set[int] = set()
        self._last_seq = -1  # the last audio frame received
        self._cancelling = False
        self._over = False

    @property
    def ended(self) -> bool:
        return self._over

    @property
    def sample_rate(self) -> int:
        return int(self.output["sample_rate"])

    # -- the client's messages ---------------------------------------------------------------------------------------

    async def append(self, text: str, *, flush: bool = False) -> None:
        """`text.append`: text is concatenated exactly as sent (the server inserts no spaces)."""
        if flush:
            await self._connection.send("text.append", ctx=self.id, text=text, flush=True)
        else:
            await self._connection.send("text.append", ctx=self.id, text=text)

    async def flush(self) -> None:
        """`context.flush`: synthesise what is buffered now; a `Flushed` event follows its last audio."""
        await self._connection.send("context.flush", ctx=self.id)

    async def end(self) -> None:
        """`context.end`: no more text; the context ends with `Done` after its last audio."""
        await self._connection.send("context.end", ctx=self.id)

    async def cancel(self) -> Cancelled:
        """Barge-in: `context.cancel`, and the fence it answers with (`last_seq`: the last frame the server sent).

        Audio not yet consumed from this context is dropped at once, and so is any frame still arriving: after this
        call the iteration yields nothing but the final `Cancelled`. A context that had already ended answers with
        its last frame's seq (-1 if none)."""
        if not self._over:
            self._cancelling = True
            self._purge()
            try:
                await self._connection.send("context.cancel", ctx=self.id)
            except ConnectionLost as lost:
                self.finish(lost)
        return await asyncio.shield(self._fence)

    # -- what the consumer reads -------------------------------------------------------------------------------------

    def __aiter__(self) -> AsyncIterator[Event]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[Event]:
        while True:
            while not self._events:
                self._wakeup.clear()
                await self._wakeup.wait()
            event = self._events.popleft()
            if isinstance(event, ContextFailed | ConnectionLost):
                raise event
            yield event
            if isinstance(event, Done | Cancelled):
                return

    async def audio(self) -> AsyncIterator[Audio]:
        """Only the audio of the context (the other events are skipped)."""
        self._require_decoding("audio()")
        async for event in self:
            if isinstance(event, Audio):
                yield event

    async def collect(self) -> Synthesis:
        """Every event until the end, gathered: the audio joined, the segments with their timing, the result."""
        self._require_decoding("collect()")
        pcm: list[bytes] = []
        segments: list[SegmentEnd] = []
        async for event in self:
            if isinstance(event, Audio):
                pcm.append(event.pcm)
            elif isinstance(event, SegmentEnd):
                segments.append(event)
        assert self._decoder is not None
        return Synthesis(b"".join(pcm), self.sample_rate, self._decoder.sample_format, segments, self.result)

    # -- from the connection's reader ----------------------------------------------------------------------------------

    def on_message(self, message: dict[str, Any]) -> None:
        kind = message["type"]
        if kind == "context.created":
            self.handle, self.output = message["handle"], message["output"]
            if self.decode:
                self._decoder = decoder_for(self.output)
            self._clock = OPUS_CLOCK if self.output["format"] == "opus" else self.sample_rate
            self._created.set_result(None)
        elif kind == "segment.started":
            self._texts[message["segment"]] = message["text"]
        elif kind == "context.flushed":
            self._push(Flushed(message["segment"]))
        elif kind == "queue.status":
            self._push(Queued(message["position"]))
        elif kind == "warning":
            self._push(Notice(message["code"], message["message"]))
        elif kind == "context.done":
            self.finish(Done(message["last_seq"], message["audio_ms"], message["metrics"]))
        elif kind == "context.cancelled":
            self.finish(Cancelled(message["last_seq"]))
        elif kind == "error":
            if message.get("ended"):
                self.finish(ContextFailed(self.id, message["code"], message["message"]))
            else:
                self._push(Refused(message["code"], message["message"]))

    def on_frame(self, header: FrameHeader, payload: bytes) -> None:
        if header.kind == KIND_CODEC:
            if self._decoder is not None:  # a context that does not decode has no use for the OpusHead
                self._decoder.codec_header(payload)
            return
        if self._cancelling:
            return
        segment = header.segment
        if payload:  # an empty frame only marks the end of the context
            self._last_seq = header.seq
            audio = self._audio(header, payload)
            if segment not in self._starts:
                self._starts[segment] = header.pts / self._clock
                self._push(SegmentStart(segment, self._texts.get(segment, ""), self._starts[segment]))
            self._push(audio)
        if header.flags & FLAG_SEGMENT_END and segment in self._starts and segment not in self._ended_segments:
            # A segment's last frame carries the flag; the end marker repeats it for the last segment.
            self._ended_segments.add(segment)
            frame_ticks = self.output["frame_ms"] * self._clock // 1000 if payload else 0
            end_s = (header.pts + frame_ticks) / self._clock
            self._push(SegmentEnd(segment, self._texts.get(segment, ""), self._starts[segment], end_s))

    def _audio(self, header: FrameHeader, payload: bytes) -> Audio | Packet:
        rate = self.sample_rate
        if self._decoder is None:
            fmt, start_s = self.output["format"], header.pts / self._clock
            samples = packet_samples(fmt, payload, rate)
            return Packet(payload, fmt, rate, samples, start_s, header.seq, header.segment, header.flags)
        pcm, start_s = self._decoder.decode(payload, header.pts)
        return Audio(pcm, rate, self._decoder.sample_format, start_s, header.seq, header.segment, header.flags)

    def _require_decoding(self, what: str) -> None:
        if not self.decode:
            raise ValueError(f"{what} needs decoded audio: this context was created with decode=False (iterate it)")

    def finish(self, ending: Ending) -> None:
        """The context is over: its last event is queued, a waiting create or cancel is answered."""
        if self._over:
            return
        self._over = True
        if isinstance(ending, Done | Cancelled):
            self.result = ending
        if not self._created.done():
            if isinstance(ending, ContextFailed | ConnectionLost):
                self._created.set_exception(ending)
            else:
                self._created.set_result(None)
        self._fence.set_result(ending if isinstance(ending, Cancelled) else Cancelled(self._last_seq))
        if self._cancelling:
            self._purge()
        self._push(ending)
        self._connection.forget(self)

    async def created(self) -> None:
        await self._created

    def _push(self, event: Event | ContextFailed | ConnectionLost) -> None:
        self._events.append(event)
        self._wakeup.set()

    def _purge(self) -> None:
        self._events = deque(
            e for e in self._events if isinstance(e, Done | Cancelled | ContextFailed | ConnectionLost)
        )
