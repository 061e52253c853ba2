from __future__ import annotations

import itertools
from collections import defaultdict

import numpy as np
import opuslib
import pytest
from hypothesis import given
from hypothesis import strategies as st

from wsserver.audio import AudioOut, OpusFrame, Resampler, _OpusCodec, mulaw_encode, wire
from wsserver.frames import HEADER, FrameHeader
from wsserver.messages import OutputSettings
from wsserver.opus_load import FIRST_S, OpusComplexity


@pytest.mark.parametrize(("src", "dst"), [(48000, 16000), (48000, 8000), (16000, 48000), (44100, 48000)])
def test_resampler_is_seamless_across_chunks_and_keeps_the_tone(src: int, dst: int) -> None:
    x = (0.5 * np.sin(2 * np.pi * 440 * np.arange(src // 2) / src)).astype(np.float32)
    whole = Resampler(src, dst)
    expected = np.concatenate([whole.process(x), whole.flush()])
    chunked, parts, rng, i = Resampler(src, dst), [], np.random.default_rng(0), 0
    while i < x.size:
        n = int(rng.integers(1, 2000))
        parts.append(chunked.process(x[i : i + n]))
        i += n
    got = np.concatenate([*parts, chunked.flush()])
    assert got.size == expected.size == round(x.size * dst / src)
    np.testing.assert_array_equal(got, expected)
    reference = 0.5 * np.sin(2 * np.pi * 440 * np.arange(got.size) / dst)
    middle = slice(got.size // 4, 3 * got.size // 4)
    assert np.abs(got[middle] - reference[middle]).max() < 1e-4


def test_mulaw_matches_g711() -> None:
    # Reference points of the G.711 mu-law table (ITU-T G.711, table 2a).
    x = np.array([0, 1, -1, 32767, -32768, 100, -100], np.float32) / 32767
    assert mulaw_encode(x) == bytes([0xFF, 0xFF, 0x7F, 0x80, 0x00, 0xF2, 0x72])


def frames_of(out: AudioOut, chunks: list[np.ndarray], segment: int, last: bool) -> list[tuple[FrameHeader, bytes]]:
    raw = [f for chunk in chunks for f in out.push(chunk, segment)] + out.end_segment(segment, last_of_context=last)
    return [FrameHeader.unpack(wire(data)) for _, data in raw]  # in order, as the session's outbox hands them out


def test_framing_pads_segments_and_flags_the_last_frames() -> None:
    out = AudioOut(OutputSettings(format="pcm_s16le", sample_rate=48000), 48000, handle=5)
    first = frames_of(out, [np.full(1000, 0.5, np.float32), np.full(1000, 0.5, np.float32)], 0, last=False)
    second = frames_of(out, [np.full(960, 0.25, np.float32)], 1, last=True)
    headers = [h for h, _ in first + second]
    assert [h.seq for h in headers] == [0, 1, 2, 3]
    assert [h.pts for h in headers] == [0, 960, 1920, 2880]
    assert [(h.segment, h.flags) for h in headers] == [(0, 0), (0, 0), (0, 1), (1, 3)]
    payloads = [np.frombuffer(p, "<i2") for _, p in first + second]
    assert all(p.size == 960 for p in payloads)
    assert (payloads[2][:80] == 16384).all() and (payloads[2][80:] == 0).all()  # 2000 = 2 * 960 + 80, then silence
    marker_seq, marker = out.end_marker(1)
    assert marker_seq == 4 and FrameHeader.unpack(marker)[1] == b""


def test_opus_frames_decode_and_the_header_announces_the_stream() -> None:
    out = AudioOut(OutputSettings(format="opus", sample_rate=16000, frame_ms=20, bitrate=24000), 48000, handle=1)
    header, opus_head = FrameHeader.unpack(out.codec_frame())
    assert header.kind == 2 and opus_head[:8] == b"OpusHead" and len(opus_head) == 19
    tone = (0.3 * np.sin(2 * np.pi * 300 * np.arange(7680) / 48000)).astype(np.float32)
    frames = frames_of(out, [tone], 0, last=True)
    decoder = opuslib.Decoder(16000, 1)
    assert len(frames) == 8 and [h.pts for h, _ in frames] == [i * 960 for i in range(8)]  # 48 kHz clock
    assert all(len(decoder.decode(payload, 320)) == 640 for _, payload in frames)


def test_opus_frames_follow_the_front_ends_complexity_and_still_decode() -> None:
    """The governor's level reaches each stream's encoder at its next frame; a stream that changes level mid-way is
    one valid Opus stream, and its frames are counted at the level they were encoded at."""
    output = OutputSettings(format="opus", sample_rate=48000, frame_ms=20, bitrate=32000)
    counts: defaultdict[int, int] = defaultdict(int)
    complexity = OpusComplexity(10, 0, counts=counts)
    out = AudioOut(output, 48000, handle=1, opus_complexity=complexity)
    assert out.opus is not None and out.opus.encoder.complexity == 6  # the governor's start
    tone = (0.3 * np.sin(2 * np.pi * 300 * np.arange(7680) / 48000)).astype(np.float32)
    decoder = opuslib.Decoder(48000, 1)
    payloads = [payload for _, payload in frames_of(out, [tone], 0, last=False)]
    complexity.level = 0  # as the governor sets it when the worker is busy
    payloads += [payload for _, payload in frames_of(out, [tone], 1, last=True)]
    assert out.opus.encoder.complexity == 0 and counts == {6: 8, 0: 8}
    assert all(len(decoder.decode(payload, 960)) == 1920 for payload in payloads)


def test_a_new_streams_first_frames_go_at_the_start_level_on_a_worker_at_10() -> None:
    """A burst meeting a worker at 10: each new stream's first FIRST_S (15 frames of 20 ms) is encoded at 6, its later
    frames at the worker's level; one valid Opus stream throughout."""
    output = OutputSettings(format="opus", sample_rate=48000, frame_ms=20, bitrate=32000)
    counts: defaultdict[int, int] = defaultdict(int)
    complexity = OpusComplexity(10, 0, counts=counts)
    complexity.level = 10  # where a worker's few streams took it
    out = AudioOut(output, 48000, handle=1, opus_complexity=complexity)
    assert FIRST_S == 0.3
    tone = (0.3 * np.sin(2 * np.pi * 300 * np.arange(24000) / 48000)).astype(np.float32)
    payloads = [payload for _, payload in frames_of(out, [tone], 0, last=True)]
    assert out.opus is not None and out.opus.encoder.complexity == 10 and counts == {6: 15, 10: 10}
    decoder = opuslib.Decoder(48000, 1)
    assert all(len(decoder.decode(payload, 960)) == 1920 for payload in payloads)


def test_resampler_takes_a_chunk_too_small_to_complete_an_output() -> None:
    """Found by the fuzzer: decimating, a chunk that completes no output sample (empty, or a few samples) met a buffer
    shorter than one filter window, and numpy's sliding_window_view raised."""
    resampler = Resampler(48000, 8000)
    out = [resampler.process(np.zeros(n, np.float32)) for n in (1920, 3840, 3463, 1191, 233, 0, 1, 2)]
    assert [o.size for o in out[-3:]] == [0, 0, 0]


# -- properties (hypothesis) ---------------------------------------------------------------------------------------

RATE_PAIRS = ((48000, 8000), (48000, 16000), (16000, 48000), (44100, 48000), (24000, 24000), (16000, 12000))


@given(rates=st.sampled_from(RATE_PAIRS), sizes=st.lists(st.integers(0, 3000), max_size=10))
def test_resampling_in_chunks_of_any_size_equals_resampling_the_whole(rates: tuple[int, int], sizes: list[int]) -> None:
    src, dst = rates
    x = np.random.default_rng(len(sizes)).uniform(-1, 1, sum(sizes)).astype(np.float32)
    whole = Resampler(src, dst)
    expected = np.concatenate([whole.process(x), whole.flush()])
    chunked, edges = Resampler(src, dst), np.cumsum([0, *sizes])
    got = np.concatenate([*(chunked.process(x[a:b]) for a, b in itertools.pairwise(edges)), chunked.flush()])
    assert got.size == expected.size == round(x.size * dst / src)
    np.testing.assert_array_equal(got, expected)


OUTPUTS = (
    OutputSettings("pcm_s16le", 48000),
    OutputSettings("pcm_f32le", 16000, frame_ms=40),
    OutputSettings("mulaw", 8000, frame_ms=10),
    OutputSettings("opus", 48000),
    OutputSettings("opus", 12000, frame_ms=60, bitrate=6000),
    OutputSettings("pcm_s16le", 24000, frame_ms=1000),
)


@given(
    output=st.sampled_from(OUTPUTS),
    native=st.sampled_from((16000, 24000, 48000)),
    segments=st.lists(st.lists(st.integers(0, 6000), max_size=5), min_size=1, max_size=4),
)
def test_framing_any_chunks_gives_whole_frames_in_order_with_exact_flags(
    output: OutputSettings, native: int, segments: list[list[int]]
) -> None:
    out = AudioOut(output, native, handle=7)
    frame_samples = output.sample_rate * output.frame_ms // 1000
    frames: list[tuple[FrameHeader, bytes]] = []
    for index, sizes in enumerate(segments):
        chunks = [np.random.default_rng(n).uniform(-1, 1, n).astype(np.float32) for n in sizes]
        got = frames_of(out, chunks, index, last=index == len(segments) - 1)
        produced = round(sum(sizes) * output.sample_rate / native)
        assert len(got) == -(-produced // frame_samples)  # the segment's audio, padded to whole frames
        if got:
            assert [h.flags for h, _ in got] == [0] * (len(got) - 1) + [1 | 2 * (index == len(segments) - 1)]
            assert {h.segment for h, _ in got} == {index}
        frames += got
    headers = [h for h, _ in frames]
    assert [h.seq for h in headers] == list(range(len(frames)))
    step = frame_samples * (48000 // output.sample_rate if output.format == "opus" else 1)
    assert [h.pts for h in headers] == [i * step for i in range(len(frames))]
    width = {"pcm_s16le": 2, "pcm_f32le": 4, "mulaw": 1}.get(output.format)
    assert all(len(p) == frame_samples * width if width else p for _, p in frames)


def test_opus_frames_are_encoded_when_taken_not_when_pushed(monkeypatch: pytest.MonkeyPatch) -> None:
    """A chunk's frames wait unencoded for the socket (the outbox counts each as its header and the bitrate's share)."""
    firsts: list[float] = []  # the first sample of each frame encoded
    encode = _OpusCodec.encode
    monkeypatch.setattr(_OpusCodec, "encode", lambda codec, frame: firsts.append(frame[0]) or encode(codec, frame))
    out = AudioOut(OutputSettings(format="opus", sample_rate=48000, bitrate=32000), 48000, handle=1)
    frames = out.push(np.arange(7680, dtype=np.float32) / 7680, 0)
    assert len(frames) == 7 and not firsts
    pending = frames[1][1]
    assert isinstance(pending, OpusFrame) and len(pending) == HEADER.size + 32000 * 20 // 8000
    header, payload = FrameHeader.unpack(pending.encode())
    assert header.seq == 1 and payload and firsts == [960 / 7680]
