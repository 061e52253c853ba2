"""CUDA backends (flash-attn, SDPA) against the plain torch kernels; run on the GPU machine (marker `gpu`)."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from engine.attention import get_attention_backend
from tests.engine.attention.test_attention import HEADS, KV_HEADS, Pool

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]
BACKENDS = ["sdpa", "flash_attn"]
DIM = 64  # a head size the flash-attn build supports (64 or 128, as the released models)


def _backend(name: str):  # type: ignore[no-untyped-def]
    if name == "flash_attn" and importlib.util.find_spec("flash_attn") is None:
        pytest.skip("flash_attn is not installed")
    return get_attention_backend(name, "cuda")


@pytest.mark.parametrize("name", BACKENDS)
def test_paged_prefill_chunks_and_decode_match_torch(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """flash-attn's paged kernels need block_size % 256 == 0: same plans as the CPU test, bigger blocks."""
    monkeypatch.setattr("tests.engine.attention.test_attention.BLOCK", 256)
    monkeypatch.setattr("tests.engine.attention.test_attention.DIM", DIM)
    backend, reference = _backend(name), get_attention_backend("torch", "cuda")
    gen = torch.Generator().manual_seed(0)
    lengths = {0: 301, 1: 41, 2: 530}
    full = {
        s: [torch.randn(n, h, DIM, generator=gen).cuda().bfloat16() for h in (HEADS, KV_HEADS, KV_HEADS)]
        for s, n in lengths.items()
    }
    pools = [Pool(num_blocks=8), Pool(num_blocks=8)]
    for pool in pools:
        pool.k, pool.v = pool.k.cuda().bfloat16(), pool.v.cuda().bfloat16()
    done = dict.fromkeys(lengths, 0)
    # whole prefills (context-free: the dense varlen kernel), chunked prefill over cached context (varlen +
    # block_table), then a decode step
    for new in ({0: 300, 2: 200}, {1: 40, 2: 329}, {0: 1, 1: 1, 2: 1}):
        outs = []
        for pool, attention in zip(pools, (backend, reference), strict=True):
            meta = pool.step(new)
            meta.slot_mapping = meta.slot_mapping.cuda()
            for field in ("cu_seqlens_q", "seq_lens", "block_tables"):
                setattr(meta, field, getattr(meta, field).cuda())
            q, k, v = (torch.cat([full[s][i][done[s] : done[s] + n] for s, n in new.items()]) for i in range(3))
            outs.append(attention.paged(q, k, v, pool.k, pool.v, meta, DIM**-0.5))
        for s, n in new.items():
            done[s] += n
        torch.testing.assert_close(outs[0].float(), outs[1].float(), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("name", BACKENDS)
def test_dense_matches_torch(name: str) -> None:
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(7, 11, h, DIM, generator=gen).cuda().bfloat16() for h in (HEADS, KV_HEADS, KV_HEADS))
    out = _backend(name).dense(q, k, v, DIM**-0.5)
    expected = get_attention_backend("torch", "cuda").dense(q, k, v, DIM**-0.5)
    torch.testing.assert_close(out.float(), expected.float(), rtol=2e-2, atol=2e-2)
