"""StreamingVAEDecoder (engine/models/voxcpm/vae_stream.py): slot-indexed streaming equals offline decode, on CPU.

fp64 runs the spec init of ``random_state_dict`` and must match offline decode to 1e-7, i.e. one float32 ulp of the
returned audio (both sides are computed in fp64, then rounded to fp32): that proves the streaming algebra (context
sizes, transposed-conv crops, reset = zero padding) is exact. fp32 runs the tamed weights of
test_audio_vae (unsaturated tanh) with atol 1e-4: conv blocking differs between a 4-frame call and a whole-sequence
call, and the relative rounding of ~1e-7 is amplified by the decoder's gain.
"""

from __future__ import annotations

import itertools
import re

import pytest
import torch

from engine.models.voxcpm.audio_vae import AudioVAE, AudioVAEConfig, CausalConv1d, WeightNormConv, random_state_dict
from engine.models.voxcpm.vae_stream import StreamingVAEDecoder

# Tiny widths, real rates and patch sizes: v1 16 kHz (P=2), v1 44.1 kHz (odd strides, P=4), v2 (P=4).
TINY = {
    "v1-16k": (1, {"encoder_dim": 4, "latent_dim": 8, "decoder_dim": 32}, 2),
    "v1-44k": (
        1,
        {
            "encoder_dim": 4,
            "encoder_rates": [2, 3, 6, 7, 7],
            "latent_dim": 8,
            "decoder_dim": 64,
            "decoder_rates": [7, 7, 6, 3, 2],
            "sample_rate": 44100,
        },
        4,
    ),
    "v2": (2, {"encoder_dim": 4, "latent_dim": 8, "decoder_dim": 128}, 4),
}
TOL = {torch.float64: 1e-7, torch.float32: 1e-4}


def make_vae(name: str, dtype: torch.dtype) -> tuple[AudioVAE, int]:
    version, d, patch = TINY[name]
    cfg = AudioVAEConfig.from_dict(d, version)
    sd = random_state_dict(cfg, 0)
    if dtype == torch.float32:  # shrink the decoder's residual branches: keeps tanh unsaturated (module docstring)
        residual_out = re.compile(r"decoder\.model\.\d+\.block\.\d+\.block\.3\.weight_g")
        sd = {k: v * 0.1 if residual_out.fullmatch(k) else v for k, v in sd.items()}
    vae = AudioVAE(cfg)
    vae.load_state_dict(sd, strict=True)
    return vae.fold_weight_norm().to(dtype).eval(), patch


def randn(*shape: int, seed: int, dtype: torch.dtype) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("name", list(TINY))
def test_streaming_equals_offline_per_slot(name: str, dtype: torch.dtype) -> None:
    vae, patch = make_vae(name, dtype)
    d, hop = vae.latent_dim, vae.decode_chunk_size
    dec = StreamingVAEDecoder(vae, max_slots=8, device="cpu", dtype=dtype)
    slots = torch.tensor([5, 0, 3])
    # Different histories: slot 5 is fresh; slot 0 continues 3 frames of prompt context; slot 3 ran another stream,
    # was reset, then got 2*patch+1 frames of context (a length that is not a whole patch).
    dec.decode(torch.tensor([3]), randn(1, d, 5, seed=9, dtype=dtype))
    dec.reset(torch.tensor([3, 5]))
    ctx = {5: randn(d, 0, seed=0, dtype=dtype), 0: randn(d, 3, seed=1, dtype=dtype)}
    ctx[3] = randn(d, 2 * patch + 1, seed=2, dtype=dtype)
    for slot in (0, 3):
        dec.prime(torch.tensor([slot]), ctx[slot][None])
    n_patches = 8
    new = randn(3, d, n_patches * patch, seed=3, dtype=dtype)
    chunks = [dec.decode(slots, new[:, :, i * patch : (i + 1) * patch]) for i in range(n_patches)]
    assert all(c.dtype == torch.float32 and c.shape == (3, patch * hop) for c in chunks)
    streamed = torch.cat(chunks, dim=-1)
    with torch.no_grad():
        for row, slot in enumerate(slots.tolist()):
            full = vae.decode(torch.cat([ctx[slot], new[row]], dim=-1)[None])[0, 0]
            expected = full[ctx[slot].shape[-1] * hop :].float()
            torch.testing.assert_close(streamed[row], expected, rtol=0, atol=TOL[dtype])


def test_uneven_calls_and_reset_restore_fresh_stream() -> None:
    vae, _ = make_vae("v2", torch.float64)
    dec = StreamingVAEDecoder(vae, max_slots=4, device="cpu", dtype=torch.float64)
    z = randn(1, vae.latent_dim, 10, seed=4, dtype=torch.float64)
    with torch.no_grad():
        expected = vae.decode(z)[0].float()
    slot = torch.tensor([2])
    for _ in range(2):  # the second pass runs after reset and must repeat the first exactly
        pieces = [dec.decode(slot, z[:, :, a:b]) for a, b in ((0, 1), (1, 4), (4, 9), (9, 10))]
        torch.testing.assert_close(torch.cat(pieces, -1), expected, rtol=0, atol=TOL[torch.float64])
        assert dec.state[2].abs().sum() > 0
        dec.reset(slot)
        assert torch.all(dec.state[2] == 0)


def test_slots_are_isolated() -> None:
    vae, patch = make_vae("v1-44k", torch.float32)
    dec = StreamingVAEDecoder(vae, max_slots=6, device="cpu", dtype=torch.float32)
    z5 = randn(8, 1, vae.latent_dim, patch, seed=5, dtype=torch.float32)
    z3 = randn(8, 1, vae.latent_dim, patch, seed=6, dtype=torch.float32)
    alone = [dec.decode(torch.tensor([5]), z) for z in z5]
    dec.reset(torch.tensor([5]))
    interleaved = []
    for a, b in zip(z5, z3, strict=True):
        row5 = dec.state[5].clone()
        dec.decode(torch.tensor([3]), b)
        assert torch.equal(dec.state[5], row5)  # decoding slot 3 leaves slot 5's context untouched
        interleaved.append(dec.decode(torch.tensor([5]), a))
    for x, y in zip(alone, interleaved, strict=True):
        assert torch.equal(x, y)


def test_voxcpm2_state_layout() -> None:
    cfg = AudioVAEConfig.from_dict(None, 2)
    with torch.device("meta"):
        vae = AudioVAE(cfg).to(torch.bfloat16)
    stateful = [m for m in vae.decoder.modules() if isinstance(m, WeightNormConv) and m.ctx > 0]
    assert len(stateful) == 26  # input depthwise conv + 6 x (transposed conv + 3 dilated convs) + output conv
    # Σ C·ctx: 64·6 + (2048+…+64)·1 + (1024+…+32)·(6+18+54) + 32·6; slices tile the state with no gap or overlap.
    assert vae.decoder.state_size == 161_856
    spans = sorted((m.state_offset, m.state_offset + m.cin * m.ctx) for m in stateful)
    assert spans[0][0] == 0 and spans[-1][1] == 161_856
    assert all(a[1] == b[0] for a, b in itertools.pairwise(spans))
    assert all(m.ctx == 6 * m.dilation for m in stateful if isinstance(m, CausalConv1d))
    dec = StreamingVAEDecoder(vae, max_slots=4, device="meta", dtype=torch.bfloat16)
    assert dec.state.shape == (4, 161_856) and dec.state_bytes_per_slot == 323_712


def test_rejects_mismatched_dtype() -> None:
    vae, _ = make_vae("v1-16k", torch.float32)
    with pytest.raises(ValueError, match="float32"):
        StreamingVAEDecoder(vae, max_slots=2, device="cpu", dtype=torch.bfloat16)


def test_rejects_slots_not_matching_latents() -> None:
    vae, patch = make_vae("v2", torch.float32)
    dec = StreamingVAEDecoder(vae, max_slots=4, device="cpu", dtype=torch.float32)
    with pytest.raises(ValueError, match="2 slots for 3 rows"):
        dec.decode(torch.tensor([0, 1]), randn(3, vae.latent_dim, patch, seed=7, dtype=torch.float32))
    assert torch.all(dec.state == 0)  # nothing ran
