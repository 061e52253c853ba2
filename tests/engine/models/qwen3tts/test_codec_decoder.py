"""The streaming form of the codec decoder equals offline decoding, per row, whatever the chunking and batching.

Offline is the same code from an empty state, so these pin the state handling: conv and transposed-conv left
contexts, the 72-frame attention window (76 frames exceed it), positions continuing across calls, and rows of
one state that started at different times. In float64 the forms agree to EXACT_TOL (so the state handling is
exact); in float32 (what runs) kernels picked by shape sum in other orders, which the random tiny decoder
amplifies to at most ~8e-5 of full scale (measured), inside STREAM_TOL.
"""

from __future__ import annotations

import copy

import pytest
import torch

STREAM_TOL = 2e-4
EXACT_TOL = 1e-9
SPF = 1920


def _codes(frames: int, seed: int) -> torch.Tensor:
    return torch.randint(0, 2048, (frames, 16), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize(("dtype", "tol"), [(torch.float64, EXACT_TOL), (torch.float32, STREAM_TOL)])
def test_streaming_equals_offline_in_any_chunking(loaded, dtype: torch.dtype, tol: float) -> None:
    decoder = copy.deepcopy(loaded("customvoice-0.6b").codec_decoder).to(dtype)
    codes = _codes(76, 0)
    offline = decoder(codes[None])[0]
    assert offline.shape == (76 * SPF,)
    for chunks in ([1, 1, 1, 2, 71], [3, 72, 1]):
        state = decoder.new_state(1)
        parts, start = [], 0
        for n in chunks:
            parts.append(decoder(codes[None, start : start + n], state)[0])
            start += n
        assert (torch.cat(parts) - offline).abs().max() < tol


def test_rows_of_one_state_are_independent(loaded) -> None:
    """Two rows in one state, the second joining 5 frames late (a slot reused): each equals its own offline
    decode; select/assign move rows between states without changing them."""
    decoder = loaded("customvoice-0.6b").codec_decoder
    a, b = _codes(12, 1), _codes(7, 2)
    alone_a, alone_b = decoder(a[None])[0], decoder(b[None])[0]

    state = decoder.new_state(2)
    first = decoder(torch.stack((a[:5], b[:5])), state)  # row 1 decodes throwaway frames, then restarts
    state.reset(torch.tensor([1]))
    rest = decoder(torch.stack((a[5:12], b)), state)
    assert (torch.cat((first[0], rest[0])) - alone_a).abs().max() < STREAM_TOL
    assert (rest[1] - alone_b).abs().max() < STREAM_TOL

    # a row moved out into a single-row state and back continues exactly
    state = decoder.new_state(2)
    decoder(torch.stack((a[:4], b[:4])), state)
    single = state.select(torch.tensor([0]))
    part = decoder(a[None, 4:8], single)
    state.assign(torch.tensor([0]), single)
    tail = decoder(torch.stack((a[8:11], b[4:7])), state)
    assert (part[0] - alone_a[4 * SPF : 8 * SPF]).abs().max() < STREAM_TOL
    assert (tail[0] - alone_a[8 * SPF : 11 * SPF]).abs().max() < STREAM_TOL
    assert (tail[1] - alone_b[4 * SPF : 7 * SPF]).abs().max() < STREAM_TOL


def test_conv_dtype_runs_the_conv_part_in_16_bits_and_streams(loaded) -> None:
    """set_conv_dtype (CUDA's fp16 decoder) on the CPU: float32 audio out, the conv contexts in the 16-bit dtype,
    the transformer's in fp32, SnakeBeta's parameters fp32; the audio near the fp32 decoder's (the tiny random
    decoder amplifies fp16 rounding to ~1e-2 of full scale here; the GPU test bounds the full-size one)."""
    fp32 = loaded("customvoice-0.6b").codec_decoder
    half = copy.deepcopy(fp32)
    half.set_conv_dtype(torch.float16)
    assert half.decoder[-2].alpha.dtype == torch.float32 and half.decoder[0].conv.weight.dtype == torch.float16
    codes = _codes(6, 3)
    want = fp32(codes[None])[0]
    state = half.new_state(1)
    got = torch.cat([half(codes[None, i : i + 1], state)[0] for i in range(6)])
    assert got.dtype == torch.float32
    assert state.tensors["dec0"].dtype == torch.float16 and state.tensors["attn0.k"].dtype == torch.float32
    assert float((got - want).pow(2).mean().sqrt() / want.pow(2).mean().sqrt()) < 0.05
