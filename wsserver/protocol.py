"""The `ttsws/1` session and context state machines, sans I/O.

Inputs are method calls: client frames (`receive`), engine progress (`segment_admitted`, `segment_audio`,
`segment_finished`, `segment_failed`), slot-queue moves (`queue_position`), the clock (`tick`) and the server's
life cycle (`drain`, `drain_expired`, `connection_lost`). Every input takes `now` (seconds, any monotonic clock).
Outputs are pulled: `next_outgoing()` hands out wire frames one at a time, in order, and `actions()` the work for
the adapter (run or abort a segment in the engine, close the connection).

The outgoing queue lives here, not in the adapter, because two guarantees depend on knowing what was handed to the
socket: the cancel fence (`context.cancelled.last_seq` is the last frame handed out; frames still queued are
dropped) and isolation (a client that does not read fills the queue, its contexts pause, and after
`stall_timeout_s` without progress the connection is closed with 4408). The stall rule outlives every other close:
a close that waits for its output (a fatal error, drain) is forced once the socket has taken nothing for
`stall_timeout_s`, so a client that does not read never holds its session longer, whatever the close reason.
"""

from __future__ import annotations

import dataclasses
import enum
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import numpy as np

from wsserver import messages as m
from wsserver.audio import AudioOut, Frame, OpusFrame, has_audio, wire
from wsserver.errors import CLIENT_FAULTS, CloseCode, ErrorCode, ProtocolError
from wsserver.metrics import ServerMetrics
from wsserver.normalize import normalize
from wsserver.opus_load import OpusComplexity
from wsserver.segmenter import Segment, Segmenter

if TYPE_CHECKING:
    from engine import ModelInfo
    from wsserver.voices import Voice


@dataclass(frozen=True, slots=True)
class Limits:
    max_contexts: int = 8
    max_message_bytes: int = 262144
    max_text_chars: int = 20000  # per context, over its whole life
    idle_timeout_s: float = 120.0  # no client message and no audio in the making
    stall_timeout_s: float = 20.0  # output queued but the client takes none of it
    max_messages_per_s: float = 200.0  # sustained; bursts of twice that pass
    max_bad_messages: int = 20  # malformed messages tolerated per session before close 4400
    send_buffer_bytes: int = 1 << 20  # queued output above which the session's contexts pause

    def advertised(self) -> dict[str, float]:
        """`hello.limits`: every limit a client can run into (the send buffer is the server's own affair)."""
        return {
            "max_contexts": self.max_contexts,
            "max_message_bytes": self.max_message_bytes,
            "max_text_chars": self.max_text_chars,
            "idle_timeout_s": self.idle_timeout_s,
            "stall_timeout_s": self.stall_timeout_s,
            "max_messages_per_s": self.max_messages_per_s,
            "max_bad_messages": self.max_bad_messages,
        }


class VoiceCatalog(Protocol):
    """The voices a session may use (wsserver.voices.VoiceStore): looked up when a context is created, which then
    keeps the Voice it got, so a voice deleted later does not break it."""

    def ids(self) -> list[str]: ...

    def get(self, key: str) -> Voice | None: ...

    def __contains__(self, key: object) -> bool: ...


class LoRACatalog(Protocol):
    """The LoRA adapters loaded in the engines (wsserver.loras): names checked when settings name one."""

    max_loras: int
    max_lora_rank: int

    def names(self) -> list[str]: ...

    def __contains__(self, key: object) -> bool: ...


class NoLoRAs:
    """The catalog of a server without LoRA adapters."""

    max_loras = 0
    max_lora_rank = 0

    def names(self) -> list[str]:
        return []

    def __contains__(self, key: object) -> bool:
        return False


@dataclass(frozen=True, slots=True)
class SessionConfig:
    session_id: str
    model: ModelInfo  # what `hello` tells of it, and what a context's instruction and language are checked against
    voices: VoiceCatalog
    limits: Limits = field(default_factory=Limits)
    defaults: m.Settings = field(default_factory=m.Settings)
    loras: LoRACatalog = field(default_factory=NoLoRAs)
    # The front end's libopus complexity, which its Opus contexts follow (lowered under load; ServerConfig).
    opus_complexity: OpusComplexity = field(default_factory=lambda: OpusComplexity(10, 10))

    @property
    def native_rate(self) -> int:
        return self.model.sample_rate


# -- actions for the adapter ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RunSegment:
    """Generate one segment: wait for an engine slot, then stream its audio back through `segment_*`."""

    ctx: str
    segment: int
    text: str  # normalised: what the model reads
    voice: Voice  # the context's, pinned when it was created
    instruction: str  # the context's, checked against the model when it was created
    language: str
    generation: m.GenerationSettings
    lora: str | None  # the LoRA adapter the segment generates with (the context's, else its voice's)
    continuing: bool  # not the context's first segment: continue the previous one's voice, and admit it first


@dataclass(frozen=True, slots=True)
class AbortSegment:
    """Stop the context's segment, queued or running; no `segment_*` call for it is expected afterwards."""

    ctx: str


@dataclass(frozen=True, slots=True)
class CloseConnection:
    code: CloseCode
    reason: str
    after_output: bool  # send what is queued first (a fatal error message); False when the client is not reading


Action = RunSegment | AbortSegment | CloseConnection


# -- the outgoing queue --------------------------------------------------------------------------------------------


# A session's writer keeps sending while its client's player holds less audio than this, and only then lets the other
# sessions' writers run. A step's chunks reach many sessions of a worker at once: turns of one frame sent every
# session's first frame soonest, but then each player held a single frame (20 ms) while all the others were handled,
# and ran dry right after its first (on an H200, 512 sessions: hundreds starved at 0.02 s of their audio). With this
# cushion, in an A/B on one H200 (docs/benchmarks.md, "End to end over the WebSocket"), 512 PCM sessions starved 0 and 0
# against 33 and 14, and 512 Opus sessions at complexity 5 starved 2 and 1 against 170 and 132, first frames 17-50 ms
# sooner.
TURN_CUSHION_S = 0.06


@dataclass(frozen=True, slots=True)
class Outgoing:
    """A frame for the socket; `ends_turn`: the writer may let the other sessions' writers run after it."""

    data: bytes
    text: bool
    ends_turn: bool


@dataclass(slots=True)
class _Item:
    data: bytes | OpusFrame  # an Opus frame is encoded as it leaves the outbox
    text: bool
    handle: int | None = None  # set for binary frames: whose they are
    seq: int | None = None  # set for audio frames
    audio_s: float = 0.0  # the audio a frame carries


class Outbox:
    """Frames waiting for the socket, in order, with what the fence and the stall detector need to know."""

    def __init__(self, high_water: int) -> None:
        self.high_water = high_water
        self.bytes = 0
        self._items: deque[_Item] = deque()
        self._last_seq: dict[int, int] = {}  # per handle: the last audio seq handed to the socket
        # Per handle: when the audio handed to the socket so far runs out at the client, whose player starts at the
        # first frame and waits whenever it runs dry.
        self._plays_until: dict[int, float] = {}
        # Since when the socket has taken nothing though output waits for it, queued or handed out (in flight).
        self._waiting_since: float | None = None

    @property
    def writable(self) -> bool:
        return self.bytes < self.high_water

    def put(self, item: _Item, now: float) -> None:
        if self._waiting_since is None:
            self._waiting_since = now
        self._items.append(item)
        self.bytes += len(item.data)

    def pop(self, now: float) -> _Item | None:
        """The next item for the socket. The writer asks only once the socket took the previous one, so asking is
        progress; the item handed out still waits (a send to a client that stopped reading never completes)."""
        if not self._items:
            self._waiting_since = None
            return None
        item = self._items.popleft()
        self.bytes -= len(item.data)
        self._waiting_since = now
        if item.seq is not None:
            assert item.handle is not None
            self._last_seq[item.handle] = item.seq
            if item.audio_s:
                self._plays_until[item.handle] = max(self._plays_until.get(item.handle, now), now) + item.audio_s
        return item

    def ends_turn(self, item: _Item, now: float) -> bool:
        """Whether the writer may let others run after handing out `item` (TURN_CUSHION_S): it carries no audio, or
        its player now holds enough."""
        if item.handle is None or not item.audio_s:
            return True
        return self._plays_until[item.handle] - now >= TURN_CUSHION_S

    def cancel(self, handle: int) -> int:
        """Drop `handle`'s frames that the socket has not taken; returns the last seq it did take (-1: none)."""
        kept = deque(item for item in self._items if item.handle != handle)
        self.bytes = sum(len(item.data) for item in kept)
        self._items = kept
        self._plays_until.pop(handle, None)
        return self._last_seq.pop(handle, -1)

    def forget(self, handle: int) -> None:
        self._last_seq.pop(handle, None)
        self._plays_until.pop(handle, None)

    def clear(self) -> None:
        self._items.clear()
        self.bytes = 0
        self._waiting_since = None

    def stall_deadline(self, timeout: float) -> float | None:
        return None if self._waiting_since is None else self._waiting_since + timeout


# -- contexts ------------------------------------------------------------------------------------------------------


class ContextState(enum.Enum):
    OPEN = "open"
    ENDING = "ending"  # context.end received: no more text, finishing what is buffered
    DONE = "done"
    CANCELLED = "cancelled"
    FAILED = "failed"


@dataclass(slots=True)
class _Running:
    index: int
    segment: Segment
    queued_at: float
    started_at: float | None = None  # when it entered the engine


@dataclass(slots=True)
class _Timing:
    first_text_at: float | None = None
    first_frame_at: float | None = None
    queue_s: float = 0.0
    generation_s: float = 0.0


class Context:
    """One utterance: its text buffer, the segment in the engine, its audio chain, flush and end bookkeeping."""

    def __init__(self, session: Session, ctx: str, handle: int, settings: m.Settings, voice: Voice, now: float) -> None:
        self.session = session
        self.id, self.handle, self.settings, self.voice = ctx, handle, settings, voice
        self.output = settings.output.resolved(session.config.native_rate)
        self.audio = AudioOut(self.output, session.config.native_rate, handle, session.config.opus_complexity)
        self.segmenter = Segmenter(settings.buffering)
        self.state = ContextState.OPEN
        self.running: _Running | None = None
        self.segments = 0  # segments sent to the engine so far
        self.last_done = -1  # the last segment whose audio is all queued for sending
        self.spoken_to = 0  # text offset up to which every segment's audio is queued for sending
        self.flushes: deque[int] = deque()  # text offsets of flushes not yet answered
        self.end_flagged = False  # a frame flagged last-of-context went out
        self.timing = _Timing()
        self.created_at = now

    @property
    def active(self) -> bool:
        return self.state in (ContextState.OPEN, ContextState.ENDING)

    def append(self, text: str, now: float) -> None:
        if text and self.timing.first_text_at is None:
            self.timing.first_text_at = now
        self.segmenter.push(text, now)
        self.advance(now)

    def flush(self, now: float) -> None:
        self.segmenter.flush()
        self.flushes.append(self.segmenter.received)
        self.advance(now)

    def end(self, now: float) -> None:
        self.state = ContextState.ENDING
        self.segmenter.flush()
        self.advance(now)

    def advance(self, now: float) -> None:
        """Send the next segment to the engine if it is free for this context; answer flushes; finish if ended."""
        while self.running is None and self.active:
            segment = self.segmenter.next_segment(now)
            if segment is None:
                break
            speech = normalize(segment.text)
            if not speech:
                if not segment.is_blank:
                    self.session.warn("nothing_to_say", f"nothing sayable in {segment.text!r}", self.id, now)
                self.spoken_to = segment.end
                continue
            self.running = _Running(self.segments, segment, now)
            self.session.outbox_actions.append(
                RunSegment(
                    self.id,
                    self.segments,
                    speech,
                    self.voice,
                    self.settings.instruction,
                    self.settings.language,
                    self.settings.generation,
                    self.settings.lora or self.voice.lora,
                    continuing=self.segments > 0,
                )
            )
            self.segments += 1
        while self.flushes and self.flushes[0] <= self.spoken_to:
            self.flushes.popleft()
            self.session.send(m.ContextFlushed(self.id, self.last_done), now)
        if self.state is ContextState.ENDING and self.running is None and not self.segmenter.pending:
            self._finish(now)

    def admitted(self, now: float) -> None:
        assert self.running is not None
        self.running.started_at = now
        self.timing.queue_s += now - self.running.queued_at
        self.session.metrics.queue_wait.observe(now - self.running.queued_at)
        self.session.send(m.SegmentStarted(self.id, self.running.index, self.running.segment.text), now)

    def audio_chunk(self, samples: np.ndarray, now: float) -> None:
        assert self.running is not None
        self._send_frames(self.audio.push(samples, self.running.index), now)

    def segment_finished(self, now: float) -> None:
        running = self.running
        assert running is not None and running.started_at is not None
        self.timing.generation_s += now - running.started_at
        last = self.state is ContextState.ENDING and not self.segmenter.pending
        frames = self.audio.end_segment(running.index, last_of_context=last)
        self.end_flagged = self.end_flagged or (last and bool(frames))
        self._send_frames(frames, now)
        self.running = None
        self.spoken_to, self.last_done = running.segment.end, running.index
        self.advance(now)

    def fail(self, message: str, now: float) -> None:
        self.running = None
        self.session.send(m.ErrorMessage(ErrorCode.INTERNAL, message, ctx=self.id, ended=True), now)
        self.session.metrics.errors[ErrorCode.INTERNAL] += 1
        self._close(ContextState.FAILED)

    def cancel(self, now: float) -> None:
        if self.running is not None:
            self.session.outbox_actions.append(AbortSegment(self.id))
            self.running = None
        last_seq = self.session.outbox.cancel(self.handle)
        self.session.send(m.ContextCancelled(self.id, last_seq), now)
        self._close(ContextState.CANCELLED)

    def _send_frames(self, frames: list[Frame], now: float) -> None:
        frame_s = self.output.frame_ms / 1000
        for seq, frame in frames:
            audio_s = frame_s if has_audio(frame) else 0.0
            self.session.outbox.put(_Item(frame, text=False, handle=self.handle, seq=seq, audio_s=audio_s), now)
        if frames and self.timing.first_frame_at is None:
            self.timing.first_frame_at = now
            if self.timing.first_text_at is not None:
                self.session.metrics.ttfa.observe(now - self.timing.first_text_at)

    def _finish(self, now: float) -> None:
        if self.audio.next_seq and not self.end_flagged:
            self._send_frames([self.audio.end_marker(max(self.last_done, 0))], now)
        audio_s = self.audio.samples / self.audio.rate
        t = self.timing
        metrics: dict[str, float | None] = {
            "ttfa_ms": None
            if t.first_frame_at is None or t.first_text_at is None
            else round((t.first_frame_at - t.first_text_at) * 1000, 1),
            "queue_ms": round(t.queue_s * 1000, 1),
            "rtf": round(t.generation_s / audio_s, 4) if audio_s else None,
        }
        if metrics["rtf"] is not None:
            self.session.metrics.rtf.observe(metrics["rtf"])
        self.session.send(m.ContextDone(self.id, self.audio.next_seq - 1, round(audio_s * 1000, 1), metrics), now)
        self._close(ContextState.DONE)

    def _close(self, state: ContextState) -> None:
        self.state = state
        self.session.context_closed(self)


# -- the session ---------------------------------------------------------------------------------------------------


@dataclass(slots=True)
class _RateLimit:
    rate: float
    tokens: float
    last: float

    def allow(self, now: float) -> bool:
        self.tokens = min(2 * self.rate, self.tokens + (now - self.last) * self.rate)
        self.last = now
        if self.tokens < 1:
            return False
        self.tokens -= 1
        return True


@dataclass(slots=True)
class _Counters:
    bad_messages: int = 0
    # Since when the session has been idle as far as its client is concerned: its last message, or the end of its
    # last segment (a client that sent a long text at once and listens is not idle while that text is spoken).
    idle_since: float = 0.0
    next_handle: int = 0
    ended: set[str] = field(default_factory=set)  # ctx ids that may not be reused


class Session:
    def __init__(self, config: SessionConfig, metrics: ServerMetrics, now: float) -> None:
        self.config = config
        self.metrics = metrics
        self.defaults = config.defaults
        self.contexts: dict[str, Context] = {}
        self.outbox = Outbox(config.limits.send_buffer_bytes)
        self.outbox_actions: list[Action] = []
        self.closed = False  # a close was requested (or the socket is gone): inputs are ignored from now on
        self._closing: CloseConnection | None = None  # the close asked of the adapter
        self.draining = False
        self._rate = _RateLimit(config.limits.max_messages_per_s, 2 * config.limits.max_messages_per_s, now)
        self._counters = _Counters(idle_since=now)
        self._handles: set[int] = set()
        limits = config.limits.advertised()
        model = config.model
        self.send(
            m.Hello(
                config.session_id,
                {
                    "name": model.name,
                    "sample_rate": model.sample_rate,
                    "family": model.family,
                    "speakers": list(model.speakers),
                    "instruction": model.instruction,
                    "languages": list(model.languages),
                },
                list(m.FORMATS),
                sorted({*m.PCM_RATES, config.native_rate}),
                config.voices.ids(),
                limits,
                {
                    "loaded": config.loras.names(),
                    "max_loras": config.loras.max_loras,
                    "max_lora_rank": config.loras.max_lora_rank,
                },
            ),
            now,
        )

    # -- outputs -------------------------------------------------------------------------------------------------

    @property
    def writable(self) -> bool:
        """False while the client lags: the adapter stops pulling engine audio, so the engine pauses the request."""
        return self.outbox.writable

    @property
    def _busy(self) -> bool:
        """A segment is queued or generating: audio is in the making, so the session is not idle."""
        return any(context.running is not None for context in self.contexts.values())

    def next_outgoing(self, now: float) -> Outgoing | None:
        """The next frame to send; None when nothing is queued. Call it only once the socket has taken the previous
        frame: until then that frame counts as waiting for the stall rule."""
        item = self.outbox.pop(now)
        if item is None:
            return None
        return Outgoing(wire(item.data), item.text, self.outbox.ends_turn(item, now))

    def actions(self) -> list[Action]:
        actions, self.outbox_actions = self.outbox_actions, []
        return actions

    def next_deadline(self) -> float | None:
        """When `tick` should be called next at the latest."""
        limits = self.config.limits
        stall = self.outbox.stall_deadline(limits.stall_timeout_s)
        if self.closed:
            return stall  # a close waiting for its output still obeys the stall rule
        deadlines = [] if self._busy else [self._counters.idle_since + limits.idle_timeout_s]
        if stall is not None:
            deadlines.append(stall)
        for context in self.contexts.values():
            deadline = context.segmenter.deadline() if context.running is None else None
            if deadline is not None:
                deadlines.append(deadline)
        return min(deadlines, default=None)

    def send(self, message: m.ServerMessage, now: float) -> None:
        self.outbox.put(_Item(m.serialize(message), text=True), now)

    def warn(self, code: str, message: str, ctx: str | None, now: float) -> None:
        self.send(m.WarningMessage(code, message, ctx), now)

    # -- inputs from the client ----------------------------------------------------------------------------------

    def receive(self, data: str | bytes, now: float) -> None:
        if self.closed:
            return
        self._counters.idle_since = now
        size = len(data) if isinstance(data, bytes) else len(data.encode())
        if size > self.config.limits.max_message_bytes:
            limit = self.config.limits.max_message_bytes
            self._fatal(
                ErrorCode.BAD_MESSAGE,
                f"message of {size} bytes exceeds max_message_bytes={limit}",
                CloseCode.MESSAGE_TOO_BIG,
                now,
            )
            return
        try:
            if not self._rate.allow(now):
                raise ProtocolError(ErrorCode.RATE_LIMITED, "over max_messages_per_s; message dropped")
            if isinstance(data, bytes):
                raise ProtocolError(ErrorCode.BAD_MESSAGE, "binary frames are not accepted; send JSON text frames")
            self._dispatch(m.parse_client_message(data), now)
        except ProtocolError as exc:
            self._reject(exc, now)

    def _dispatch(self, message: m.ClientMessage, now: float) -> None:
        match message:
            case m.Ping(t=t):
                self.send(m.Pong(t), now)
            case m.SessionUpdate(defaults=patch):
                self.defaults = self.defaults.merged(patch, self.config.voices, self.config.model, self.config.loras)
                self.send(m.SessionUpdated(self.defaults.effective(self.config.native_rate)), now)
            case m.ContextCreate(ctx=ctx, settings=patch, text=text):
                self._append(self._create(ctx, patch, now), text, False, now)
            case m.TextAppend(ctx=ctx, text=text, flush=flush):
                context = self.contexts.get(ctx)
                if context is None and ctx not in self._counters.ended:
                    context = self._create(ctx, m.SettingsPatch(), now)
                self._append(self._writable_context(ctx, context), text, flush, now)
            case m.ContextFlush(ctx=ctx):
                self._context(ctx).flush(now)
            case m.ContextEnd(ctx=ctx):
                context = self._context(ctx)
                if context.state is ContextState.OPEN:  # a repeated end changes nothing
                    context.end(now)
            case m.ContextCancel(ctx=ctx):
                context = self.contexts.get(ctx)
                if context is None:
                    self.send(m.ContextCancelled(ctx, -1), now)
                else:
                    context.cancel(now)

    def _create(self, ctx: str, patch: m.SettingsPatch, now: float) -> Context:
        if ctx in self.contexts or ctx in self._counters.ended:
            raise ProtocolError(ErrorCode.CTX_EXISTS, f"context {ctx!r} exists or has ended; ctx ids are unique", ctx)
        if self.draining:
            raise ProtocolError(ErrorCode.OVER_CAPACITY, "the server is draining; open new contexts elsewhere", ctx)
        if len(self.contexts) >= self.config.limits.max_contexts:
            limit = self.config.limits.max_contexts
            raise ProtocolError(ErrorCode.TOO_MANY_CONTEXTS, f"max_contexts={limit} contexts are open", ctx)
        try:
            settings = self.defaults.merged(patch, self.config.voices, self.config.model, self.config.loras)
        except ProtocolError as exc:
            exc.ctx = ctx
            raise
        voice = self.config.voices.get(settings.voice)
        if voice is None:  # deleted since the session's defaults named it
            raise ProtocolError(ErrorCode.BAD_VOICE, f"unknown voice {settings.voice!r}; hello.voices lists them", ctx)
        if not settings.lora and voice.lora and voice.lora not in self.config.loras:
            message = f"voice {voice.id!r} names LoRA adapter {voice.lora!r}, which is not loaded"
            raise ProtocolError(ErrorCode.BAD_LORA, message, ctx)
        context = Context(self, ctx, self._new_handle(), settings, voice, now)
        self.contexts[ctx] = context
        self._handles.add(context.handle)
        output = {
            "format": context.output.format,
            "sample_rate": context.output.sample_rate,
            "channels": 1,
            "frame_ms": context.output.frame_ms,
        }
        if context.output.format == "opus":
            output["bitrate"] = context.output.bitrate
        self.send(m.ContextCreated(ctx, context.handle, output), now)
        codec = context.audio.codec_frame()
        if codec is not None:
            self.outbox.put(_Item(codec, text=False, handle=context.handle), now)
        return context

    def _new_handle(self) -> int:
        # u16 on the wire; at most max_contexts are live, so skipping the live ones always finds one.
        while True:
            handle = self._counters.next_handle
            self._counters.next_handle = (handle + 1) % 65536
            if handle not in self._handles:
                # A reused handle starts with no frame taken: the fence must not see a former context's seq.
                self.outbox.forget(handle)
                return handle

    def _context(self, ctx: str) -> Context:
        context = self.contexts.get(ctx)
        if context is None:
            state = "has ended" if ctx in self._counters.ended else "does not exist"
            raise ProtocolError(ErrorCode.UNKNOWN_CTX, f"context {ctx!r} {state}", ctx)
        return context

    def _writable_context(self, ctx: str, context: Context | None) -> Context:
        if context is None or context.state is not ContextState.OPEN:
            raise ProtocolError(ErrorCode.UNKNOWN_CTX, f"context {ctx!r} has ended; it takes no more text", ctx)
        return context

    def _append(self, context: Context, text: str, flush: bool, now: float) -> None:
        limit = self.config.limits.max_text_chars
        if context.segmenter.received + len(text) > limit:
            raise ProtocolError(
                ErrorCode.TEXT_TOO_LONG,
                f"context text would exceed max_text_chars={limit}; this text was not accepted",
                context.id,
            )
        context.append(text, now)
        if flush:
            context.flush(now)

    def _reject(self, exc: ProtocolError, now: float) -> None:
        ended = None if exc.ctx is None else exc.ctx not in self.contexts
        self.send(m.ErrorMessage(exc.code, exc.message, ctx=exc.ctx, ended=ended), now)
        self.metrics.errors[exc.code] += 1
        if exc.code in CLIENT_FAULTS:
            self._counters.bad_messages += 1
            if self._counters.bad_messages > self.config.limits.max_bad_messages:
                limit = self.config.limits.max_bad_messages
                self._fatal(
                    exc.code, f"more than max_bad_messages={limit} bad messages", CloseCode.BAD_REQUEST_LOOP, now
                )

    def _fatal(self, code: ErrorCode, message: str, close: CloseCode, now: float) -> None:
        """Cancel every context (each gets its `context.cancelled`), report the error, close after the output."""
        self.closed = True  # before the cancels, so the last one does not look like the end of a drain
        for context in list(self.contexts.values()):
            context.cancel(now)
        self.send(m.ErrorMessage(code, message, fatal=True), now)
        self.metrics.errors[code] += 1
        self._close(close, message, after_output=True)

    def _close(self, code: CloseCode, reason: str, after_output: bool) -> None:
        self.closed = True
        self.metrics.closes[code] += 1
        self._closing = CloseConnection(code, reason, after_output)
        self.outbox_actions.append(self._closing)

    # -- inputs from the engine side -----------------------------------------------------------------------------

    def _running(self, ctx: str) -> Context | None:
        """The context a segment event is for, or None if it went away meanwhile (the event is stale)."""
        context = self.contexts.get(ctx)
        return context if context is not None and context.running is not None and not self.closed else None

    def queue_position(self, ctx: str, position: int, now: float) -> None:
        if self._running(ctx) is not None:
            self.send(m.QueueStatus(ctx, position), now)

    def segment_admitted(self, ctx: str, now: float) -> None:
        if (context := self._running(ctx)) is not None:
            context.admitted(now)

    def segment_audio(self, ctx: str, samples: np.ndarray, now: float) -> None:
        if (context := self._running(ctx)) is not None:
            context.audio_chunk(samples, now)

    def segment_finished(self, ctx: str, now: float) -> None:
        if (context := self._running(ctx)) is not None:
            self._counters.idle_since = now
            context.segment_finished(now)

    def segment_failed(self, ctx: str, message: str, now: float) -> None:
        if (context := self._running(ctx)) is not None:
            self._counters.idle_since = now
            context.fail(message, now)

    def context_closed(self, context: Context) -> None:
        del self.contexts[context.id]
        self._handles.discard(context.handle)
        self._counters.ended.add(context.id)
        self.metrics.contexts[context.state.value] += 1
        if self.draining and not self.contexts and not self.closed:
            self._close(CloseCode.DRAINING, "server shutting down", after_output=True)

    # -- the clock and the server's life cycle -------------------------------------------------------------------

    def tick(self, now: float) -> None:
        limits = self.config.limits
        stall = self.outbox.stall_deadline(limits.stall_timeout_s)
        if stall is not None and now >= stall:
            self._stalled()
            return
        if self.closed:
            return
        if not self._busy and now >= self._counters.idle_since + limits.idle_timeout_s:
            self._fatal(
                ErrorCode.IDLE_TIMEOUT, f"no message for idle_timeout_s={limits.idle_timeout_s}", CloseCode.STALLED, now
            )
            return
        for context in list(self.contexts.values()):
            if context.running is None:
                context.advance(now)

    def _stalled(self) -> None:
        """The client took nothing for `stall_timeout_s`: telling it is pointless, so nothing more is sent."""
        self.outbox.clear()
        if self._closing is not None:
            # A close was waiting for this output: force it, as it was. Every close after output has ended its
            # contexts first, so no engine work is left to stop.
            self.outbox_actions.append(dataclasses.replace(self._closing, after_output=False))
            return
        for context in self.contexts.values():
            if context.running is not None:
                self.outbox_actions.append(AbortSegment(context.id))
        self.metrics.errors[ErrorCode.STALLED] += 1
        timeout = self.config.limits.stall_timeout_s
        self._close(CloseCode.STALLED, f"client read nothing for stall_timeout_s={timeout}", after_output=False)

    def drain(self, now: float) -> None:
        """The server is shutting down: no new contexts; open ones may finish; close once none is left."""
        if self.closed:
            return
        self.draining = True
        self.warn("draining", "the server is shutting down: open contexts may finish, new ones are refused", None, now)
        if not self.contexts:
            self._close(CloseCode.DRAINING, "server shutting down", after_output=True)

    def drain_expired(self, now: float) -> None:
        """The drain timeout passed: cancel what is still open (each gets `context.cancelled`), then close."""
        if self.closed:
            return
        for context in list(self.contexts.values()):
            context.cancel(now)

    def connection_lost(self) -> None:
        """The socket is gone: abort every segment in the engine at once; nothing more will be sent."""
        for context in self.contexts.values():
            if context.running is not None:
                self.outbox_actions.append(AbortSegment(context.id))
        self.outbox.clear()
        self.closed = True
