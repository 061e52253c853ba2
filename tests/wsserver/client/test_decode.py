"""The client's decoders against the server's own encoders (wsserver.audio), without a network."""

from __future__ import annotations

import numpy as np
import opuslib
import pytest

from wsserver.audio import AudioOut, mulaw_encode, wire
from wsserver.client.decode import (
    MulawDecoder,
    OpusDecoder,
    PcmDecoder,
    _mulaw_table,
    decoder_for,
    packet_samples,
)
from wsserver.frames import FrameHeader
from wsserver.messages import OutputSettings


def test_mulaw_table_inverts_the_encoder_for_every_code() -> None:
    table = _mulaw_table().astype(np.float32) / 32767
    codes = bytearray(range(256))
    codes[0x7F] = 0xFF  # G.711 has two zeros (0x7F and 0xFF); the encoder writes 0xFF
    assert mulaw_encode(table) == bytes(codes)
    x = np.linspace(-1, 1, 4001, dtype=np.float32)
    decoded, _ = MulawDecoder(8000).decode(mulaw_encode(x), 0)
    error = np.abs(np.frombuffer(decoded, "<i2") / 32767 - x)
    assert error.max() < 0.04 and error[np.abs(x) < 0.01].max() < 0.002  # fine steps near zero, coarse at the top


@pytest.mark.parametrize(("rate", "frame_ms"), [(48000, 20), (16000, 60), (24000, 10)])
def test_opus_decoding_drops_the_pre_skip_so_audio_lines_up_with_the_timeline(rate: int, frame_ms: int) -> None:
    t = np.arange(rate) / rate
    tone = (0.5 * np.sin(2 * np.pi * 440 * t) * np.minimum(1, t * 20)).astype(np.float32)  # faded in: a clear onset
    out = AudioOut(OutputSettings("opus", rate, frame_ms, 64000), native_rate=rate, handle=3)
    codec = FrameHeader.unpack(out.codec_frame() or b"")[1]
    frames = [*out.push(tone, 0), *out.end_segment(0, last_of_context=True)]
    decoder = decoder_for({"format": "opus", "sample_rate": rate})
    assert isinstance(decoder, OpusDecoder)
    decoder.codec_header(codec)
    pcm, starts = [], []
    for _, data in frames:
        header, payload = FrameHeader.unpack(wire(data))
        chunk, start_s = decoder.decode(payload, header.pts)
        pcm.append(chunk)
        starts.append(start_s)
    decoded = np.frombuffer(b"".join(pcm), "<i2").astype(np.float32) / 32767
    skip = round(decoder.pre_skip * rate / 48000)
    assert skip > 0 and decoded.size == len(frames) * rate * frame_ms // 1000 - skip
    # each chunk starts where the previous one ended
    sizes = [len(c) // 2 for c in pcm]
    assert starts[0] == 0 and all(
        starts[i + 1] == pytest.approx(starts[i] + sizes[i] / rate) for i in range(len(starts) - 1)
    )
    # and the decoded stream is the tone without delay: the best lag of the cross-correlation is 0
    n = tone.size - 2 * rate // 10
    lags = range(-40, 41)
    scores = [float(np.dot(decoded[100 + lag : n + lag], tone[100:n])) for lag in lags]
    assert lags[int(np.argmax(scores))] == 0
    assert np.abs(decoded[rate // 10 : n] - tone[rate // 10 : n]).mean() < 0.05


def test_pcm_passes_through_with_its_sample_format() -> None:
    decoder = decoder_for({"format": "pcm_f32le", "sample_rate": 16000})
    assert isinstance(decoder, PcmDecoder) and decoder.sample_format == "f32le"
    assert decoder.decode(b"\x00" * 8, 1600) == (b"\x00" * 8, 0.1)
    with pytest.raises(ValueError, match="codec header"):
        decoder.codec_header(b"OpusHead")
    with pytest.raises(ValueError, match="unknown audio format"):
        decoder_for({"format": "mp3", "sample_rate": 16000})


@pytest.mark.parametrize("rate", [8000, 12000, 16000, 24000, 48000])
def test_an_opus_packet_counts_its_samples_without_decoding(rate: int) -> None:
    encoder = opuslib.Encoder(rate, 1, opuslib.APPLICATION_AUDIO)
    for frame_ms in (2.5, 5, 10, 20, 40, 60):
        n = int(rate * frame_ms / 1000)
        packet = encoder.encode(np.zeros(n, "<i2").tobytes(), n)
        assert packet_samples("opus", packet, rate) == n
    # Counted at another rate than it was coded at, a packet lasts as long: 20 ms is 960 samples at 48 kHz.
    assert packet_samples("opus", packet, 48000) == 2880


def test_coded_and_pcm_payloads_count_by_their_sample_width() -> None:
    assert packet_samples("pcm_s16le", b"\x00" * 640, 16000) == 320
    assert packet_samples("pcm_f32le", b"\x00" * 640, 16000) == 160
    assert packet_samples("mulaw", b"\xff" * 160, 8000) == 160


def test_a_payload_that_is_no_packet_is_refused_clearly() -> None:
    with pytest.raises(ValueError, match="not an Opus packet"):
        packet_samples("opus", b"", 48000)
    with pytest.raises(ValueError, match="not an Opus packet"):
        packet_samples("opus", bytes([0x03, 0xFF]), 48000)  # code 3 with an impossible frame count
    with pytest.raises(ValueError, match="unknown audio format"):
        packet_samples("mp3", b"\x00" * 4, 48000)
