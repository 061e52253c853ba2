"""Session and Context state machines: feed inputs, assert the frames and actions that come out."""

from __future__ import annotations

import numpy as np
import orjson

from engine import ModelInfo
from tests.wsserver.models import QWEN3_CUSTOM, VOXCPM2
from wsserver.errors import CloseCode
from wsserver.frames import FrameHeader
from wsserver.metrics import ServerMetrics
from wsserver.protocol import AbortSegment, CloseConnection, Limits, RunSegment, Session, SessionConfig
from wsserver.voices import VoiceStore, speaker_voices

RATE = VOXCPM2.sample_rate
TEXT = "Hello there, how are you today? "  # long enough to go out at once
PATCH = np.full(7680, 0.1, np.float32)  # 160 ms at 48 kHz: 8 frames of 20 ms


def make_session(model: ModelInfo = VOXCPM2, **limits: float) -> Session:
    voices = VoiceStore("tiny-vae", fixed=speaker_voices(model))
    config = SessionConfig("s1", model, voices, Limits(**limits))
    return Session(config, ServerMetrics(), now=0.0)


def drain(session: Session, now: float = 0.0) -> list[dict | FrameHeader]:
    """Everything queued for the socket: JSON messages as dicts, binary frames as their headers."""
    out = []
    while (item := session.next_outgoing(now)) is not None:
        out.append(orjson.loads(item.data) if item.text else FrameHeader.unpack(item.data)[0])
    return out


def send(session: Session, now: float = 0.0, **message: object) -> None:
    session.receive(orjson.dumps(message).decode(), now)


def messages(out: list, type: str) -> list[dict]:
    return [o for o in out if isinstance(o, dict) and o["type"] == type]


def test_hello_comes_first_and_advertises_the_limits() -> None:
    session = make_session(max_contexts=3)
    [hello] = drain(session)
    assert hello["type"] == "hello" and hello["protocol"] == "ttsws/1"
    assert hello["limits"]["max_contexts"] == 3
    assert hello["model"] == {
        "name": "tiny",
        "sample_rate": RATE,
        "family": "voxcpm",
        "speakers": [],
        "instruction": False,
        "languages": [],
    }


def test_a_context_from_text_to_done() -> None:
    session = make_session()
    drain(session)
    send(session, type="context.create", ctx="a", text="Hello there, how are you today? ")
    [created] = drain(session)
    assert created == {
        "type": "context.created",
        "ctx": "a",
        "handle": 0,
        "output": {"format": "pcm_s16le", "sample_rate": RATE, "channels": 1, "frame_ms": 20},
    }
    [run] = session.actions()
    assert run == RunSegment(
        "a", 0, "Hello there, how are you today?", run.voice, "", "", run.generation, None, continuing=False
    )
    assert run.voice.id == "default" and run.voice.latents is None
    session.segment_admitted("a", 0.1)
    session.segment_audio("a", PATCH, 0.2)
    out = drain(session)
    assert out[0] == {"type": "segment.started", "ctx": "a", "segment": 0, "text": "Hello there, how are you today? "}
    frames = out[1:]
    assert [f.seq for f in frames] == list(range(7))  # the 8th frame waits: its flags are not known yet
    send(session, type="context.end", ctx="a")
    session.segment_finished("a", 0.3)
    out = drain(session)
    [last] = [o for o in out if isinstance(o, FrameHeader)]
    assert (last.seq, last.pts, last.flags) == (7, 7 * 960, 3)  # last of segment and of context
    [done] = messages(out, "context.done")
    assert done["last_seq"] == 7 and done["audio_ms"] == 160.0
    assert done["metrics"]["ttfa_ms"] == 200.0 and done["metrics"]["queue_ms"] == 100.0
    assert "a" not in session.contexts


def test_a_speaker_an_instruction_and_a_language_reach_the_segment() -> None:
    session = make_session(QWEN3_CUSTOM)
    [hello] = drain(session)
    assert hello["voices"] == ["default", "aiden", "vivian"]
    assert hello["model"] == {
        "name": "tiny-qwen",
        "sample_rate": 24000,
        "family": "qwen3tts",
        "speakers": ["aiden", "vivian"],
        "instruction": True,
        "languages": ["auto", "chinese", "english"],
    }
    send(session, type="session.update", defaults={"language": "Chinese"})
    [updated] = drain(session)
    assert updated["effective"]["language"] == "chinese" and updated["effective"]["instruction"] == ""
    send(session, type="context.create", ctx="a", voice="vivian", instruction="Cheerful.", text=TEXT)
    send(session, type="context.create", ctx="b", language="english", text=TEXT)
    run_a, run_b = session.actions()
    assert (run_a.voice.speaker, run_a.instruction, run_a.language) == ("vivian", "Cheerful.", "chinese")
    assert (run_b.voice.id, run_b.voice.speaker, run_b.instruction, run_b.language) == ("default", "", "", "english")
    assert run_a.voice.prompt().speaker == "vivian"


def test_conditioning_the_model_does_not_take_is_refused_and_nothing_is_created() -> None:
    qwen = make_session(QWEN3_CUSTOM)
    voxcpm = make_session(VOXCPM2)
    for session in (qwen, voxcpm):
        drain(session)
    send(qwen, type="context.create", ctx="a", voice="bob", text="Hi. ")
    send(qwen, type="context.create", ctx="b", language="klingon", text="Hi. ")
    send(voxcpm, type="context.create", ctx="c", instruction="Whisper.", text="Hi. ")
    send(voxcpm, type="context.create", ctx="d", voice="vivian", text="Hi. ")  # another model's speaker
    send(voxcpm, type="session.update", defaults={"language": "english"})
    errors = [(e["code"], e.get("ctx"), e.get("ended")) for e in messages(drain(qwen) + drain(voxcpm), "error")]
    assert errors == [
        ("bad_voice", "a", True),
        ("unsupported", "b", True),
        ("unsupported", "c", True),
        ("bad_voice", "d", True),
        ("unsupported", None, None),
    ]
    assert not qwen.contexts and not voxcpm.contexts and not qwen.actions() and not voxcpm.actions()
    assert voxcpm.defaults.language == ""  # the refused update changed nothing


def test_a_writer_keeps_its_turn_until_the_player_holds_the_cushion() -> None:
    """Audio frames end the writer's turn only once the client's player holds TURN_CUSHION_S of what was handed out
    (a player that starts at its first frame and waits when it runs dry); other frames always do."""
    session = make_session()
    send(session, type="context.create", ctx="a", text=TEXT)
    session.actions()
    session.segment_admitted("a", 0.0)
    session.segment_audio("a", np.concatenate([PATCH, PATCH]), 0.0)  # 15 whole frames of 20 ms, the 16th waits
    while (item := session.next_outgoing(0.0)) is not None and item.text:
        assert item.ends_turn  # the server's messages
    assert item is not None
    items = [item.ends_turn] + [session.next_outgoing(0.0).ends_turn for _ in range(3)]
    assert items == [False, False, True, True]  # 60 ms in hand after the third frame, all sent at once
    later = [session.next_outgoing(0.07).ends_turn for _ in range(2)]  # 10 ms held at 70 ms: 30, then 50 ms
    assert later == [False, False] and session.next_outgoing(0.07).ends_turn  # 70 ms
    assert not session.next_outgoing(0.5).ends_turn  # it ran dry meanwhile: the player waited, and holds 20 ms


def test_cancel_fence_drops_frames_not_yet_sent() -> None:
    session = make_session()
    drain(session)
    send(session, type="context.create", ctx="a", text="Some text to say, and some more. ")
    session.actions()
    session.segment_admitted("a", 0.0)
    session.segment_audio("a", PATCH, 0.0)
    out = [session.next_outgoing(0.0) for _ in range(4)]  # context.created, segment.started, seq 0, seq 1
    assert out[-1] is not None and FrameHeader.unpack(out[-1].data)[0].seq == 1
    send(session, type="context.cancel", ctx="a")
    assert session.actions() == [AbortSegment("a")]
    rest = drain(session)
    assert rest == [{"type": "context.cancelled", "ctx": "a", "last_seq": 1}]  # frames 2..6 never go out
    session.segment_audio("a", PATCH, 0.1)  # late engine output is dropped
    session.segment_finished("a", 0.1)
    assert drain(session) == []


def test_a_reused_handle_does_not_inherit_the_fence_of_its_former_context() -> None:
    session = make_session()
    drain(session)
    send(session, type="context.create", ctx="a", text="Hello there. ")
    send(session, type="context.end", ctx="a")
    [run] = session.actions()
    assert isinstance(run, RunSegment)
    session.segment_admitted("a", 0.1)
    session.segment_audio("a", PATCH, 0.2)
    session.segment_finished("a", 0.3)
    [done] = messages(drain(session), "context.done")
    assert done["last_seq"] == 7
    session._counters.next_handle = 0  # as after 65536 handles: the next context gets handle 0 again
    send(session, type="context.create", ctx="b", text="More. ")
    [created] = messages(drain(session), "context.created")
    assert created["handle"] == 0
    send(session, type="context.cancel", ctx="b")
    [cancelled] = messages(drain(session), "context.cancelled")
    assert cancelled["last_seq"] == -1  # no frame of "b" was sent


def test_cancel_unknown_context_is_not_an_error() -> None:
    session = make_session()
    drain(session)
    send(session, type="context.cancel", ctx="ghost")
    assert drain(session) == [{"type": "context.cancelled", "ctx": "ghost", "last_seq": -1}]


def test_flush_waits_for_the_segment_and_segments_run_one_at_a_time() -> None:
    session = make_session()
    drain(session)
    send(session, type="context.create", ctx="a", buffering={"mode": "manual"})
    send(session, type="text.append", ctx="a", text="One.", flush=True)
    send(session, type="text.append", ctx="a", text=" Two.", flush=True)
    [first] = session.actions()  # the second waits: it continues the first one's audio
    assert (first.segment, first.text, first.continuing) == (0, "One.", False)
    session.segment_admitted("a", 0.0)
    session.segment_audio("a", PATCH, 0.0)
    session.segment_finished("a", 0.1)
    [second] = session.actions()
    assert (second.segment, second.text, second.continuing) == (1, "Two.", True)
    out = drain(session)
    [flushed] = messages(out, "context.flushed")
    assert flushed["segment"] == 0 and isinstance(out[out.index(flushed) - 1], FrameHeader)
    assert out[out.index(flushed) - 1].flags == 1


def test_queue_status_only_while_waiting() -> None:
    session = make_session()
    send(session, type="context.create", ctx="a", text="Hi there my friend, how are you? ")
    session.queue_position("a", 2, 0.0)
    session.queue_position("gone", 1, 0.0)
    assert messages(drain(session), "queue.status") == [{"type": "queue.status", "ctx": "a", "position": 2}]


def test_limits_errors_and_the_bad_request_loop() -> None:
    session = make_session(max_contexts=1, max_text_chars=10, max_bad_messages=2)
    drain(session)
    send(session, type="context.create", ctx="a", text="0123456789")
    send(session, type="text.append", ctx="a", text="!")
    send(session, type="context.create", ctx="b")
    errors = messages(drain(session), "error")
    assert [(e["code"], e["ctx"], e["ended"]) for e in errors] == [
        ("text_too_long", "a", False),
        ("too_many_contexts", "b", True),
    ]
    for _ in range(3):
        session.receive("nope", 0.0)
    out = drain(session)
    # three refusals, then the fatal one (after every open context got its context.cancelled)
    assert [(e["code"], e["fatal"]) for e in messages(out, "error")] == [("bad_json", False)] * 3 + [("bad_json", True)]
    assert messages(out, "context.cancelled") == [{"type": "context.cancelled", "ctx": "a", "last_seq": -1}]
    assert [a for a in session.actions() if isinstance(a, CloseConnection)] == [
        CloseConnection(CloseCode.BAD_REQUEST_LOOP, "more than max_bad_messages=2 bad messages", True)
    ]


def test_oversize_message_is_fatal_4413() -> None:
    session = make_session(max_message_bytes=100)
    send(session, type="ping", t="x" * 200)
    assert drain(session)[-1]["fatal"] is True
    [close] = session.actions()
    assert (close.code, close.after_output) == (CloseCode.MESSAGE_TOO_BIG, True)
    assert close.reason == "message of 222 bytes exceeds max_message_bytes=100"


def test_stall_closes_4408_without_output_and_aborts_engine_work() -> None:
    session = make_session(stall_timeout_s=5, send_buffer_bytes=1000)
    send(session, type="context.create", ctx="a", text="Some words to say, and some more. ")
    session.actions()
    session.segment_admitted("a", 0.0)
    session.segment_audio("a", PATCH, 0.0)
    assert not session.writable  # the adapter stops pulling audio: the engine pauses the request
    session.tick(4.9)
    assert session.actions() == []
    session.tick(5.1)
    assert session.actions() == [
        AbortSegment("a"),
        CloseConnection(CloseCode.STALLED, "client read nothing for stall_timeout_s=5", False),
    ]
    assert session.next_outgoing(5.1) is None


def test_a_close_waiting_for_output_the_client_never_reads_is_forced_at_the_stall_timeout() -> None:
    session = make_session(stall_timeout_s=5, max_message_bytes=100)
    send(session, 1.0, type="ping", t="x" * 200)  # fatal: the hello and the error wait for the socket since 0.0
    [close] = session.actions()
    assert close.after_output
    assert session.next_deadline() == 5.0  # closed, but the stall rule still watches the output
    session.tick(4.9)
    assert session.actions() == []
    session.tick(5.0)
    assert session.actions() == [CloseConnection(close.code, close.reason, after_output=False)]
    assert session.next_outgoing(5.0) is None and session.next_deadline() is None
    assert session.metrics.closes == {CloseCode.MESSAGE_TOO_BIG: 1}  # one close, forced, not a second one


def test_a_frame_handed_to_the_socket_waits_until_the_writer_asks_for_the_next() -> None:
    """The last frame handed out may be stuck in a send to a client that stopped reading: the stall rule still
    watches it, also for a close waiting for that output."""
    session = make_session(stall_timeout_s=5, max_message_bytes=100)
    drain(session)
    assert session.next_deadline() == 120.0  # the idle timeout only: nothing waits for the socket
    send(session, 1.0, type="ping", t="x" * 200)  # fatal: the error, then close after the output
    session.actions()
    assert session.next_outgoing(2.0) is not None  # the error, handed out at 2.0; its send never completes
    assert session.next_deadline() == 7.0
    session.tick(7.0)
    assert [a.after_output for a in session.actions()] == [False]


def test_idle_timeout_and_first_segment_timer() -> None:
    session = make_session(idle_timeout_s=10)
    send(session, type="context.create", ctx="a", text="Hello wor", buffering={"max_wait_ms": 500})
    assert session.actions() == []
    assert session.next_deadline() == 0.5
    session.tick(0.5)
    [run] = session.actions()
    assert run.text == "Hello"  # the whole word; "wor" may still grow
    session.segment_admitted("a", 0.5)
    session.segment_finished("a", 0.6)
    drain(session)
    assert session.next_deadline() == 10.6  # idle since its segment ended, not since its last message
    session.tick(10.5)
    assert drain(session) == []
    session.tick(10.6)
    out = drain(session)
    assert messages(out, "context.cancelled") and messages(out, "error")[-1]["code"] == "idle_timeout"
    assert session.actions()[-1].code == CloseCode.STALLED


def test_drain_lets_contexts_finish_then_closes_4503() -> None:
    session = make_session()
    send(session, type="context.create", ctx="a", text="Almost done. ")
    session.actions()
    session.drain(0.0)
    send(session, type="context.create", ctx="b")
    out = drain(session)
    assert messages(out, "warning")[0]["code"] == "draining"
    assert messages(out, "error")[0]["code"] == "over_capacity"
    send(session, type="context.end", ctx="a")
    session.segment_admitted("a", 0.0)
    session.segment_finished("a", 0.1)
    assert messages(drain(session), "context.done")
    assert session.actions()[-1] == CloseConnection(CloseCode.DRAINING, "server shutting down", True)


def test_opus_context_sends_its_codec_header_before_audio() -> None:
    session = make_session()
    drain(session)
    send(session, type="context.create", ctx="a", output={"format": "opus"}, text="Hi. ")
    out = drain(session)
    assert out[0]["type"] == "context.created" and out[0]["output"]["bitrate"] == 32000
    assert out[1].kind == 2 and out[1].seq == 0


def test_no_deadline_stays_due_after_a_tick() -> None:
    """Found by the fuzzer: two deadlines that a tick could not act on stayed in the past, so the adapter's timer
    fired again at once, over and over (the event loop busy for every other session): a first word still growing,
    and the idle timeout of a session whose audio is still in the making."""
    session = make_session(idle_timeout_s=10)
    send(session, type="context.create", ctx="a", text="Hello")
    drain(session)
    session.tick(0.3)  # max_wait_ms passed, but "Hello" may still grow: only text can release it
    assert session.actions() == [] and session.next_deadline() == 10.0  # the idle timeout only
    send(session, 1.0, type="text.append", ctx="b", text="A long text sent at once and then only listened to. ")
    send(session, 1.0, type="context.end", ctx="b")
    [run] = session.actions()
    session.segment_admitted("b", 1.0)
    drain(session, 1.0)
    session.tick(11.0)  # idle_timeout_s since the last message, but audio is in the making
    assert session.actions() == [] and session.next_deadline() is None
    session.segment_audio("b", PATCH, 30.0)
    session.segment_finished("b", 40.0)
    drain(session, 40.0)
    assert session.next_deadline() == 50.0  # idle from the end of its last segment
    assert run.ctx == "b" and not session.closed


def test_a_ping_nested_too_deeply_to_echo_gets_an_error_and_the_session_lives_on() -> None:
    session = make_session()
    drain(session)
    session.receive('{"type": "ping", "t": ' + "[" * 300 + "]" * 300 + "}", 0.0)  # raised TypeError out of receive
    [error] = drain(session)
    assert (error["code"], error["fatal"]) == ("bad_message", False)
    send(session, type="ping", t=1)
    assert drain(session) == [{"type": "pong", "t": 1}]
