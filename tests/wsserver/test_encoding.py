"""Response formats: one file per response, decodable chunk after chunk, to the samples that went in.

Decoded by libsndfile (soundfile), not by the FFmpeg that encoded them, except AAC, which libsndfile cannot read, and a
streamed FLAC, whose length is unknown (PyAV then). MP3 and AAC hold their encoder's priming and padding: exact
where the file says how much (MP3 blocking, with its gapless header), else within one codec frame.
"""

from __future__ import annotations

import io

import av
import numpy as np
import pytest
import soundfile as sf

from wsserver.encoding import FORMATS, FileEncoder

RATE = 24000
SIGNAL = (0.3 * np.sin(2 * np.pi * 220 * np.arange(int(1.3 * RATE)) / RATE)).astype(np.float32)
CHUNK = 3840  # 160 ms, one VoxCPM2 patch at 24 kHz


def encode(name: str, streaming: bool) -> tuple[bytes, list[bytes]]:
    encoder = FileEncoder(name, RATE, streaming)
    pieces = [encoder.push(SIGNAL[i : i + CHUNK]) for i in range(0, SIGNAL.size, CHUNK)]
    pieces.append(encoder.finish())
    assert encoder.samples == SIGNAL.size
    return b"".join(pieces), pieces


def decoded(name: str, data: bytes, streaming: bool) -> np.ndarray:
    if name == "pcm":
        return np.frombuffer(data, "<i2").astype(np.float32) / 32768
    if name == "aac" or (name == "flac" and streaming):
        with av.open(io.BytesIO(data)) as container:
            planes = np.concatenate([f.to_ndarray()[0] for f in container.decode(audio=0)])
        return planes / 32768 if planes.dtype == np.int16 else planes
    samples, rate = sf.read(io.BytesIO(data), dtype="float32")
    assert rate == RATE
    return samples


@pytest.mark.parametrize("streaming", [True, False])
@pytest.mark.parametrize("name", list(FORMATS))
def test_every_format_decodes_to_the_samples_sent(name: str, streaming: bool) -> None:
    data, pieces = encode(name, streaming)
    samples = decoded(name, data, streaming)
    exact = name in ("pcm", "wav", "flac", "opus") or (name == "mp3" and not streaming)
    if exact:
        assert samples.size == SIGNAL.size
    else:  # the encoder's priming and padding, which this file cannot tell the decoder about
        assert SIGNAL.size <= samples.size <= SIGNAL.size + 2 * 1152
    if name in ("pcm", "wav", "flac"):
        assert np.abs(samples - SIGNAL).max() <= 1 / 32768
    if streaming:
        assert sum(map(len, pieces[:3])) > 0, "a stream must start before its end"
    else:
        assert not any(pieces[:-1]), "a blocking file comes whole at the end"


def test_a_stream_is_one_file_with_one_header() -> None:
    data, _ = encode("wav", streaming=True)
    assert data.count(b"RIFF") == 1 and data[4:8] == b"\xff\xff\xff\xff"  # size unknown while streaming
    data, _ = encode("wav", streaming=False)
    assert int.from_bytes(data[4:8], "little") == len(data) - 8
    data, _ = encode("opus", streaming=True)
    assert data.count(b"OpusHead") == 1 and data.startswith(b"OggS")
