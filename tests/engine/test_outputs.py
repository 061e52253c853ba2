"""engine.outputs: an AudioChunk pickles with its arrays' bytes out of band, and comes back equal however pickled."""

from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest

from engine.outputs import AudioChunk, FinishReason


def chunk(finish_reason: FinishReason | None = None) -> AudioChunk:
    rng = np.random.default_rng(0)
    step = rng.standard_normal((3, 1920)).astype(np.float32)  # a step's host buffer: a chunk's samples are a row
    return AudioChunk("r-1", 7, step[1], rng.standard_normal((4, 64)).astype(np.float32), finish_reason)


def same(got: AudioChunk, want: AudioChunk) -> bool:
    return (
        (got.request_id, got.index, got.finish_reason) == (want.request_id, want.index, want.finish_reason)
        and got.samples.dtype == want.samples.dtype
        and got.latents.shape == want.latents.shape
        and np.array_equal(got.samples, want.samples)
        and np.array_equal(got.latents, want.latents)
    )


def test_a_chunk_goes_out_of_band_as_its_arrays_raw_bytes() -> None:
    want = chunk(FinishReason.LENGTH)
    buffers: list[pickle.PickleBuffer] = []
    data = pickle.dumps(want, protocol=5, buffer_callback=buffers.append)
    assert [bytes(buffer.raw()) for buffer in buffers] == [want.samples.tobytes(), want.latents.tobytes()]
    assert len(data) < 400  # the arrays are not in the pickle itself
    received = [bytearray(buffer.raw()) for buffer in buffers]
    got = pickle.loads(data, buffers=received)
    assert same(got, want)
    received[0][:4] = b"\0\0\0\0"  # the arrays are views of what was received, not copies
    assert got.samples[0] == 0.0


@pytest.mark.parametrize("protocol", [2, 4, 5])
def test_a_chunk_pickles_in_band_and_copies_with_any_protocol(protocol: int) -> None:
    want = chunk()
    assert same(pickle.loads(pickle.dumps(want, protocol=protocol)), want)
    assert same(copy.deepcopy(want), want) and same(copy.copy(want), want)


def test_a_chunk_of_a_strided_view_pickles_its_values() -> None:
    want = chunk()
    want.samples = want.samples[::2]
    assert same(pickle.loads(pickle.dumps(want, protocol=5)), want)
