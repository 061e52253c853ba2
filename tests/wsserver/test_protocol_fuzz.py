"""Property-based fuzzing of the sans-I/O session (issue 17).

Hypothesis drives one `Session` through random interleavings of everything that can happen to it: client frames
(valid messages, messages with random field types and values, random JSON, non-JSON, binary frames, oversize
frames, any Unicode and both JSON string encodings), engine progress for the segments it asked for (admission,
audio chunks of any length, finish, failure, queue moves), a client that reads slowly or not at all, the clock, and
the server's life cycle (drain, drain timeout, lost socket). An adapter model plays the server's part as
`wsserver.server.Connection` does (it runs what `actions()` asks for), and a client model reads the frames that
come out and checks, after every step:

- nothing raises out of the session;
- the wire is well formed: `hello` first, JSON messages of documented types with documented error and warning
  codes, binary frames with a valid header and exactly one frame of audio each;
- ordering (guarantee 1): per context, seq from 0 without gaps, pts advancing by exactly one frame, segments in
  order, nothing after the frame flagged last-of-context;
- the cancel fence (guarantee 2): `context.cancelled.last_seq` is the last frame the client got, and no frame of
  that context follows; `context.done.last_seq` likewise;
- nothing lost (guarantee 3): a context ends once, with `context.done`, `context.cancelled` or an error with
  `ended: true`; `ended: false` errors leave it open; at `context.done` the `segment.started` texts cover all the
  text the session accepted, in order, and what they skip has nothing sayable;
- engine work matches the contexts: one segment per context at a time, numbered from 0, none after a close, all
  aborted when the session closes or the socket goes;
- every run ends in a documented close: with 4503 after a drain if nothing closed it before, with every context
  ended first unless the close is forced (a client that does not read) or the socket is gone.

The budget is fixed (the `ci` profile of tests/wsserver/conftest.py, derandomized); `HYPOTHESIS_PROFILE=fuzz` runs
many more.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import orjson
from hypothesis import event, given, settings
from hypothesis import strategies as st

from tests.wsserver.strategies import CTX_IDS, MODEL, VOICES, frames, texts
from wsserver.audio import HEADER, KIND_AUDIO, KIND_CODEC, OPUS_CLOCK, FrameHeader
from wsserver.errors import CloseCode, ErrorCode
from wsserver.metrics import ServerMetrics
from wsserver.normalize import normalize
from wsserver.protocol import AbortSegment, CloseConnection, Limits, RunSegment, Session, SessionConfig
from wsserver.voices import DEFAULT_VOICE, Voice, VoiceStore

SAMPLE_BYTES = {"pcm_s16le": 2, "pcm_f32le": 4, "mulaw": 1}
SERVER_TYPES = {
    "hello",
    "session.updated",
    "pong",
    "context.created",
    "segment.started",
    "queue.status",
    "context.flushed",
    "context.done",
    "context.cancelled",
    "error",
    "warning",
}
WARNING_CODES = {"draining", "nothing_to_say"}

# -- the client's view: checks every frame it reads ----------------------------------------------------------------


@dataclass
class Stream:
    """One context as its client sees it."""

    ctx: str
    handle: int
    format: str
    frame_samples: int
    pts_step: int
    next_seq: int = 0
    next_pts: int = 0
    segment: int = -1  # segment of the last frame
    segment_ended: bool = True  # the last frame was flagged last-of-segment
    started: list[str] = field(default_factory=list)  # segment.started texts
    context_ended: bool = False  # a frame flagged last-of-context went out
    # A segment started while the previous one's last frames had not come: they were queued when the context was
    # cancelled, and the fence dropped them (messages queued before the cancel still go out). Only the end of the
    # context may follow.
    cut_by_fence: bool = False


class ClientView:
    def __init__(self) -> None:
        self.got_hello = False
        self.streams: dict[str, Stream] = {}  # open contexts
        self.ended: set[str] = set()
        self.done: dict[str, list[str]] = {}  # contexts that ended with context.done -> their segment.started texts
        self.fatal = False
        self.draining = False
        self.frames_read = 0

    def read(self, data: bytes, text: bool) -> None:
        assert not self.fatal, "nothing may follow a fatal error"
        if not text:
            self.frame(data)
            return
        message = orjson.loads(data)
        kind = message["type"]
        assert kind in SERVER_TYPES, message
        assert self.got_hello or kind == "hello", "hello comes first"
        handler = getattr(self, "on_" + kind.replace(".", "_"), None)
        if handler is not None:
            handler(message)

    def on_hello(self, message: dict[str, Any]) -> None:
        assert not self.got_hello
        self.got_hello = True

    def on_context_created(self, message: dict[str, Any]) -> None:
        ctx, output = message["ctx"], message["output"]
        assert ctx not in self.streams and ctx not in self.ended
        assert message["handle"] not in {s.handle for s in self.streams.values()}, "handles of open contexts differ"
        rate, frame_ms = output["sample_rate"], output["frame_ms"]
        frame_samples = rate * frame_ms // 1000
        pts_step = frame_samples * OPUS_CLOCK // rate if output["format"] == "opus" else frame_samples
        self.streams[ctx] = Stream(ctx, message["handle"], output["format"], frame_samples, pts_step)

    def on_segment_started(self, message: dict[str, Any]) -> None:
        stream = self.streams[message["ctx"]]
        assert message["segment"] == len(stream.started), "segments are numbered in order"
        stream.cut_by_fence |= not stream.segment_ended
        assert normalize(message["text"]), "an unsayable segment is skipped"
        stream.started.append(message["text"])

    def on_queue_status(self, message: dict[str, Any]) -> None:
        assert message["ctx"] in self.streams and message["position"] >= 1

    def on_context_flushed(self, message: dict[str, Any]) -> None:
        assert -1 <= message["segment"] < len(self.streams[message["ctx"]].started)

    def on_context_done(self, message: dict[str, Any]) -> None:
        stream = self.end(message["ctx"])
        assert not stream.cut_by_fence, "frames were lost"
        assert message["last_seq"] == stream.next_seq - 1
        assert stream.context_ended or stream.next_seq == 0, "a context with audio ends with a bit1 frame"
        self.done[message["ctx"]] = stream.started

    def on_context_cancelled(self, message: dict[str, Any]) -> None:
        ctx = message["ctx"]
        if ctx in self.streams:
            assert message["last_seq"] == self.end(ctx).next_seq - 1, "the fence is the last frame the client got"
        else:
            assert message["last_seq"] == -1

    def on_error(self, message: dict[str, Any]) -> None:
        assert message["code"] in set(ErrorCode), message
        assert isinstance(message["message"], str) and isinstance(message["fatal"], bool)
        ctx = message.get("ctx")
        if ctx is not None:
            assert isinstance(message["ended"], bool)
            if message["ended"]:
                if ctx in self.streams:
                    self.end(ctx)
            else:
                assert ctx in self.streams, "ended: false names an open context"
        if message["fatal"]:
            assert not self.streams, "a fatal close cancels every context first"
            self.fatal = True

    def on_warning(self, message: dict[str, Any]) -> None:
        assert message["code"] in WARNING_CODES
        if message["code"] == "draining":
            self.draining = True
        else:
            assert message["ctx"] in self.streams

    def end(self, ctx: str) -> Stream:
        self.ended.add(ctx)
        return self.streams.pop(ctx)

    def frame(self, data: bytes) -> None:
        assert len(data) >= HEADER.size
        header, payload = FrameHeader.unpack(data)
        assert header.version == 1 and header.kind in (KIND_AUDIO, KIND_CODEC)
        streams = [s for s in self.streams.values() if s.handle == header.handle]
        assert len(streams) == 1, "a frame belongs to an open context (none follows its end: the fence)"
        stream = streams[0]
        if header.kind == KIND_CODEC:
            assert stream.format == "opus" and stream.next_seq == 0 and payload.startswith(b"OpusHead")
            return
        assert not stream.context_ended, "nothing after the last frame of the context"
        assert not stream.cut_by_fence, "a frame of a segment that started after frames were dropped"
        assert header.seq == stream.next_seq, "seq from 0 without gaps"
        assert header.pts == stream.next_pts, "pts advances by exactly one frame"
        assert header.segment == len(stream.started) - 1, "a frame belongs to the segment that started last"
        assert header.segment >= stream.segment
        if not payload:  # the end marker
            assert header.flags == 3
        elif stream.format == "opus":
            stream.next_pts += stream.pts_step
        else:
            assert len(payload) == stream.frame_samples * SAMPLE_BYTES[stream.format], "one whole frame"
            stream.next_pts += stream.pts_step
        stream.next_seq += 1
        self.frames_read += 1
        stream.segment = header.segment
        stream.segment_ended = bool(header.flags & 1)
        stream.context_ended = bool(header.flags & 2)


# -- the server's part, and the steps of a run ---------------------------------------------------------------------


@dataclass
class Segment:
    ctx: str
    index: int
    admitted: bool = False


# Steps: plain tuples, so that a failing run prints as a readable list.
OUTPUTS = (
    {"format": "pcm_s16le"},
    {"format": "pcm_f32le", "sample_rate": 16000, "frame_ms": 40},
    {"format": "pcm_s16le", "sample_rate": 8000, "frame_ms": 10},
    {"format": "mulaw"},
    {"format": "opus"},
    {"format": "opus", "sample_rate": 12000, "frame_ms": 60, "bitrate": 6000},
    {"format": "pcm_s16le", "sample_rate": 24000, "frame_ms": 1000},
)
buffering = st.fixed_dictionaries(
    {},
    optional={
        "mode": st.sampled_from(("auto", "manual")),
        "first_min_chars": st.integers(1, 40),
        "max_wait_ms": st.sampled_from((0, 300)),
        "max_segment_chars": st.sampled_from((20, 60, 300)),
    },
)
chunk_sizes = st.lists(st.sampled_from((0, 1, 479, 1920, 3840, 7680)) | st.integers(0, 9000), max_size=6)
# Each branch of one_of is drawn equally often: repeated branches are the common steps.
step = st.one_of(
    st.tuples(st.just("send"), frames()),  # anything a client may send
    # what a well-behaved client mostly sends: text for a few contexts, flushes, ends, now and then a cancel
    st.tuples(st.just("speak"), st.sampled_from(CTX_IDS), texts, st.sampled_from(("append", "flush", "end", "cancel"))),
    st.tuples(st.just("speak"), st.sampled_from(CTX_IDS), texts, st.sampled_from(("append", "flush", "end"))),
    st.tuples(st.just("create"), st.sampled_from(CTX_IDS), st.sampled_from(OUTPUTS), buffering, texts),
    st.tuples(st.just("read"), st.integers(1, 50)),
    # the engine moves one of its segments on (picked by index): queue moves, admission, audio, the end
    *[
        st.tuples(
            st.just("engine"),
            st.integers(0, 3),
            st.integers(0, 2),
            chunk_sizes,
            st.sampled_from(("more", "more", "finished", "finished", "failed")),
        )
    ]
    * 3,
    st.tuples(st.just("stale"), st.sampled_from(CTX_IDS), st.sampled_from(("admitted", "audio", "finished", "failed"))),
    st.tuples(st.just("time"), st.sampled_from((0.0, 0.001, 0.05, 0.3, 0.3, 1.0, 5.0, 30.0))),
    # rare: the server's life cycle and the socket's end, one draw in 10 of this branch
    st.tuples(st.just("life"), st.sampled_from(("drain", "drain_expired", "lost", "long_pause")), st.integers(0, 9)),
)
setups = st.tuples(
    st.sampled_from((16000, 24000, 44100, 48000)),  # the model's rate
    # How the client reads: everything after every step, only at "read" steps, or never.
    st.sampled_from(("prompt", "prompt", "slow", "never")),
    # Mostly the defaults, so that most runs live long enough to stream; one run in four with tight limits.
    st.integers(0, 3).flatmap(
        lambda tight: (
            st.just(Limits())
            if tight
            else st.builds(
                Limits,
                max_contexts=st.integers(1, 4),
                max_message_bytes=st.sampled_from((64, 512, 262144)),
                max_text_chars=st.sampled_from((5, 100, 20000)),
                idle_timeout_s=st.sampled_from((1.0, 120.0)),
                stall_timeout_s=st.sampled_from((0.5, 20.0)),
                max_messages_per_s=st.sampled_from((2.0, 200.0)),
                max_bad_messages=st.integers(0, 20),
                send_buffer_bytes=st.sampled_from((100, 5000, 1 << 20)),
            )
        )
    ),
)


class Harness:
    """One session between an adapter model (it runs what `actions()` asks for, as server.Connection does) and the
    client model; every check of the module docstring runs as the steps go."""

    def __init__(self, native_rate: int, reader: str, limits: Limits) -> None:
        self.now = 0.0
        self.reader = reader
        voices = VoiceStore("tiny-vae", fixed={voice: Voice(voice) for voice in VOICES if voice != DEFAULT_VOICE})
        self.session = Session(
            SessionConfig("s", replace(MODEL, sample_rate=native_rate), voices, limits), ServerMetrics(), self.now
        )
        self.client = ClientView()
        self.accepted: dict[str, str] = {}  # ctx -> the text the session accepted for it
        self.segments: dict[str, Segment] = {}  # ctx -> its segment in the engine
        self.run_count: dict[str, int] = {}  # ctx -> segments run so far
        self.close: CloseConnection | None = None  # the close decided, as first asked
        self.forced = False  # the close does not wait for output (a client that does not read)
        self.gone = False  # the transport is closed or aborted: nothing more is read or sent
        self.lost = False  # the client's socket went first

    def run(self, steps: list[tuple[Any, ...]]) -> None:
        for kind, *args in steps:
            if not self.gone:
                getattr(self, kind)(*args)
                self.check()
            elif kind == "time":
                self.late_tick(*args)
        self.finish()

    # -- the adapter: carry out the session's actions, as server.Connection.pump does

    def pump(self) -> None:
        for action in self.session.actions():
            match action:
                case RunSegment(ctx=ctx, segment=index):
                    assert self.close is None and not self.lost, "no engine work after a close"
                    assert ctx not in self.segments, "one segment per context at a time"
                    assert index == self.run_count.get(ctx, 0) and action.continuing == (index > 0)
                    assert action.voice.id in VOICES and action.text
                    self.run_count[ctx] = index + 1
                    self.segments[ctx] = Segment(ctx, index)
                case AbortSegment(ctx=ctx):
                    self.segments.pop(ctx, None)
                case CloseConnection(code=code, after_output=after_output):
                    assert code in set(CloseCode)
                    if self.close is None:
                        assert after_output or code == CloseCode.STALLED, "only a client that does not read is cut"
                        self.close = action
                    else:  # only a close waiting for output that the client never read is forced
                        assert code == self.close.code and self.close.after_output and not after_output
                    if not after_output:
                        self.forced = self.gone = True
        if self.session.closed:
            assert not self.segments, "a closed session has no engine work left"
        if self.reader == "prompt":
            self.read_frames(None)

    def receive(self, data: str | bytes) -> None:
        errors, closed, queued = (
            sum(self.session.metrics.errors.values()),
            self.session.closed,
            self.session.outbox.bytes,
        )
        self.session.receive(data, self.now)
        if closed:
            assert self.session.outbox.bytes == queued, "a closed session ignores its client"
        elif sum(self.session.metrics.errors.values()) == errors and isinstance(data, str):  # accepted
            message = orjson.loads(data)
            if message["type"] in ("context.create", "text.append"):
                self.accepted[message["ctx"]] = self.accepted.get(message["ctx"], "") + message.get("text", "")
        self.pump()

    def read_frames(self, count: int | None) -> None:
        """The client reads `count` frames, or all there are; the adapter closes once a close's output is out."""
        while not self.gone and (count is None or count > 0):
            item = self.session.next_outgoing(self.now)
            if item is None:
                if self.close is not None:
                    self.gone = True  # the close handshake
                return
            self.client.read(item.data, item.text)
            count = None if count is None else count - 1

    # -- steps

    def send(self, data: str | bytes) -> None:
        self.receive(data)

    def speak(self, ctx: str, text: str, how: str) -> None:
        self.receive(orjson.dumps({"type": "text.append", "ctx": ctx, "text": text, "flush": how == "flush"}).decode())
        if how in ("end", "cancel"):
            self.receive(orjson.dumps({"type": f"context.{how}", "ctx": ctx}).decode())

    def create(self, ctx: str, output: dict[str, Any], buffering: dict[str, Any], text: str) -> None:
        message = {"type": "context.create", "ctx": ctx, "output": output, "buffering": buffering, "text": text}
        self.receive(orjson.dumps(message).decode())

    def read(self, count: int) -> None:
        if self.reader != "never":
            self.read_frames(count)

    def engine(self, pick: int, queue_moves: int, chunks: list[int], ending: str) -> None:
        if not self.segments:
            return
        segment = self.segments[sorted(self.segments)[pick % len(self.segments)]]
        if not segment.admitted:
            for position in range(queue_moves, 0, -1):
                self.session.queue_position(segment.ctx, position, self.now)
            segment.admitted = True
            self.session.segment_admitted(segment.ctx, self.now)
        for size in chunks:
            samples = np.random.default_rng(size).uniform(-1.2, 1.2, size).astype(np.float32)
            self.session.segment_audio(segment.ctx, samples, self.now)
        if ending != "more":
            del self.segments[segment.ctx]
            if ending == "finished":
                self.session.segment_finished(segment.ctx, self.now)
            else:
                self.session.segment_failed(segment.ctx, "engine: it broke", self.now)
        self.pump()

    def stale(self, ctx: str, what: str) -> None:
        """Engine news for a segment the adapter no longer runs (aborted meanwhile) is ignored."""
        if ctx in self.segments:
            return
        queued = self.session.outbox.bytes
        match what:
            case "admitted":
                self.session.segment_admitted(ctx, self.now)
            case "audio":
                self.session.segment_audio(ctx, np.zeros(4800, np.float32), self.now)
            case "finished":
                self.session.segment_finished(ctx, self.now)
            case "failed":
                self.session.segment_failed(ctx, "late", self.now)
        assert self.session.outbox.bytes == queued and self.session.actions() == []

    def time(self, seconds: float) -> None:
        """The clock moves and the adapter's timer ticks the session (a tick before a deadline changes nothing)."""
        self.now += seconds
        self.session.tick(self.now)
        self.pump()
        deadline = self.session.next_deadline()
        assert deadline is None or deadline > self.now or self.gone, "a tick handles what is due"

    def late_tick(self, seconds: float) -> None:
        """The transport is gone; a timer that fires late changes nothing."""
        self.now += seconds
        self.session.tick(self.now)
        assert self.session.actions() == [] and self.session.next_outgoing(self.now) is None

    def life(self, what: str, chance: int) -> None:
        if chance:
            return
        match what:
            case "drain":
                self.session.drain(self.now)
            case "drain_expired":
                if not self.session.draining:
                    return
                self.session.drain_expired(self.now)
            case "lost":
                self.session.connection_lost()
                self.lost = self.gone = True
            case "long_pause":
                self.time(200.0)
                return
        self.pump()
        if self.lost:
            assert not self.segments, "a lost socket aborts every segment"
            assert self.session.next_outgoing(self.now) is None

    # -- checks

    def check(self) -> None:
        assert set(self.segments) <= set(self.session.contexts), "engine work only for open contexts"
        for ctx in list(self.client.done):  # nothing lost: the segments spoken cover all accepted text
            check_covered(self.accepted.get(ctx, ""), self.client.done.pop(ctx))

    def finish(self) -> None:
        """Every run ends in a documented close: unless it ended already, the server drains and its drain times out,
        and the client reads what is left."""
        if not self.gone:
            self.session.drain(self.now)
            self.pump()
            self.session.drain_expired(self.now)
            self.pump()
            self.read_frames(None)
            self.check()
            assert self.close is not None and self.close.after_output, "a drained session closes after its output"
            assert self.close.code in (CloseCode.DRAINING, CloseCode.STALLED) or self.client.fatal
        if self.close is not None and not self.forced and not self.lost:
            assert not self.client.streams, "every context ended before the close"
        # What the runs covered (pytest --hypothesis-show-statistics).
        event("close", "lost" if self.lost else str(self.close.code if self.close else None))
        event("contexts ended", min(len(self.client.ended), 3))
        event("audio frames read", min(self.client.frames_read // 20 * 20, 100))
        event("segments run", min(sum(self.run_count.values()), 5))


# The most searching test of the core: four times the profile's budget.
@settings(max_examples=4 * settings().max_examples)
@given(setup=setups, steps=st.lists(step, min_size=40, max_size=150))
def test_any_run_keeps_the_guarantees_and_ends_in_a_documented_close(
    setup: tuple[int, str, Limits], steps: list[tuple[Any, ...]]
) -> None:
    Harness(*setup).run(steps)


def check_covered(accepted: str, started: list[str]) -> None:
    """The segment.started texts are pieces of the accepted text, in order; what lies between and after them has
    nothing sayable."""
    cursor = 0
    for text in started:
        at = accepted.find(text, cursor)
        assert at >= 0, (accepted, started)
        assert not normalize(accepted[cursor:at]), f"skipped sayable text {accepted[cursor:at]!r}"
        cursor = at + len(text)
    assert not normalize(accepted[cursor:]), f"left sayable text {accepted[cursor:]!r}"
