"""Attention backends: paged causal attention against a dense per-sequence reference."""

from __future__ import annotations

import math

import pytest
import torch

from engine.attention import get_attention_backend
from engine.attention.metadata import AttentionMetadata

HEADS, KV_HEADS, DIM, BLOCK = 8, 2, 16, 4


def dense_causal(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, offset: int) -> torch.Tensor:
    """Naive GQA attention of q [Lq, H, D] over k/v [Lk, Hkv, D]; query i sits at position offset + i."""
    k = k.repeat_interleave(HEADS // KV_HEADS, dim=1)
    v = v.repeat_interleave(HEADS // KV_HEADS, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.double(), k.double()) / math.sqrt(DIM)
    allowed = torch.arange(k.shape[0])[None, :] <= (offset + torch.arange(q.shape[0]))[:, None]
    scores = scores.masked_fill(~allowed, float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v.double()).float()


class Pool:
    """K/V pool with scrambled block assignment; sequences grow by appending positions."""

    def __init__(self, num_blocks: int = 48) -> None:
        self.k = torch.zeros(num_blocks, BLOCK, KV_HEADS, DIM)
        self.v = torch.zeros(num_blocks, BLOCK, KV_HEADS, DIM)
        self.free = torch.randperm(num_blocks, generator=torch.Generator().manual_seed(0)).tolist()
        self.blocks: dict[int, list[int]] = {}
        self.lens: dict[int, int] = {}

    def step(self, new: dict[int, int]) -> AttentionMetadata:
        """Metadata for appending new[s] positions to each sequence s."""
        cu, slots, seq_lens = [0], [], []
        for s, n in new.items():
            start = self.lens.get(s, 0)
            blocks = self.blocks.setdefault(s, [])
            while len(blocks) * BLOCK < start + n:
                blocks.append(self.free.pop())
            slots += [blocks[p // BLOCK] * BLOCK + p % BLOCK for p in range(start, start + n)]
            self.lens[s] = start + n
            cu.append(cu[-1] + n)
            seq_lens.append(start + n)
        width = max(len(self.blocks[s]) for s in new) + 1  # one spare -1 column, as a padded table has
        tables = torch.full((len(new), width), -1, dtype=torch.int32)
        for i, s in enumerate(new):
            tables[i, : len(self.blocks[s])] = torch.tensor(self.blocks[s])
        return AttentionMetadata(
            cu_seqlens_q=torch.tensor(cu, dtype=torch.int32),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
            max_seqlen_q=max(new.values()),
            max_seqlen_k=max(seq_lens),
            slot_mapping=torch.tensor(slots),
            block_tables=tables,
            decode_only=all(n == 1 for n in new.values()),
            context_free=all(self.lens[s] == n for s, n in new.items()),
        )


@pytest.mark.parametrize("backend", ["torch", "sdpa"])
def test_paged_matches_dense_with_cached_context(backend: str) -> None:
    """Whole prefills (the first step: context-free), chunked prefills (reading cached context) and decodes, packed
    together, equal a dense causal attention over each full sequence; so prefill with cached context equals prefill
    without."""
    attention = get_attention_backend(backend, "cpu")
    gen = torch.Generator().manual_seed(1)
    lengths = {0: 11, 1: 3, 2: 17}
    full = {s: [torch.randn(n, h, DIM, generator=gen) for h in (HEADS, KV_HEADS, KV_HEADS)] for s, n in lengths.items()}
    pool = Pool()
    outputs: dict[int, list[torch.Tensor]] = {s: [] for s in lengths}
    done = dict.fromkeys(lengths, 0)
    # step plans: positions each sequence appends (mixed whole prefill, chunked prefill and decode)
    for plan in ({0: 11, 2: 5}, {1: 3, 2: 7, 0: 0}, {2: 4, 0: 0, 1: 0}, {0: 0, 1: 0, 2: 1}):
        new = {s: n for s, n in plan.items() if n} or plan
        meta = pool.step(new)
        q = torch.cat([full[s][0][done[s] : done[s] + n] for s, n in new.items()])
        k = torch.cat([full[s][1][done[s] : done[s] + n] for s, n in new.items()])
        v = torch.cat([full[s][2][done[s] : done[s] + n] for s, n in new.items()])
        out = attention.paged(q, k, v, pool.k, pool.v, meta, DIM**-0.5)
        for (s, n), part in zip(new.items(), out.split(list(new.values())), strict=True):
            outputs[s].append(part)
            done[s] += n
    for s, n in lengths.items():
        assert done[s] == n
        q, k, v = full[s]
        torch.testing.assert_close(torch.cat(outputs[s]), dense_causal(q, k, v, 0), rtol=1e-5, atol=1e-5)


def test_decode_step_over_many_sequences() -> None:
    attention = get_attention_backend("torch", "cpu")
    gen = torch.Generator().manual_seed(2)
    pool = Pool(num_blocks=64)
    lengths = [1, 6, 9, 13]
    ks = [torch.randn(n, KV_HEADS, DIM, generator=gen) for n in lengths]
    vs = [torch.randn(n, KV_HEADS, DIM, generator=gen) for n in lengths]
    qs = [torch.randn(n, HEADS, DIM, generator=gen) for n in lengths]
    prefill = pool.step({i: n - 1 for i, n in enumerate(lengths) if n > 1})
    attention.paged(
        torch.cat([q[:-1] for q in qs]),
        torch.cat([k[:-1] for k in ks]),
        torch.cat([v[:-1] for v in vs]),
        pool.k,
        pool.v,
        prefill,
        1.0,
    )
    meta = pool.step(dict.fromkeys(range(len(lengths)), 1))
    assert meta.decode_only
    out = attention.paged(
        torch.stack([q[-1] for q in qs]),
        torch.stack([k[-1] for k in ks]),
        torch.stack([v[-1] for v in vs]),
        pool.k,
        pool.v,
        meta,
        DIM**-0.5,
    )
    for i in range(len(lengths)):
        expected = dense_causal(qs[i], ks[i], vs[i], 0)[-1]
        torch.testing.assert_close(out[i], expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("context_free", [False, True])
@pytest.mark.parametrize("backend", ["torch", "sdpa"])
def test_padded_prefill_stays_finite(backend: str, context_free: bool) -> None:
    """A prefill padded as a graph pads it: positions past the last sequence and empty sequences, their K/V
    written into a scratch block that the padded block-table columns point at. The real sequences' rows equal
    the dense attention and every row is finite (NaN in the scratch block would reach real rows through the zero
    weights of the masked keys they gather), whether the keys are gathered back from the cache or, these being whole
    prompts (`context_free`), read as they come."""
    attention = get_attention_backend(backend, "cpu")
    gen = torch.Generator().manual_seed(3)
    scratch, lengths, tokens = 9, [5, 3], 12  # blocks 0..8 for the sequences, 9 is scratch
    n = sum(lengths)
    q, k, v = (torch.randn(tokens, h, DIM, generator=gen) for h in (HEADS, KV_HEADS, KV_HEADS))
    k_cache, v_cache = torch.zeros(scratch + 1, BLOCK, KV_HEADS, DIM), torch.zeros(scratch + 1, BLOCK, KV_HEADS, DIM)
    tables = torch.tensor([[0, 1, scratch], [2, scratch, scratch], [scratch] * 3, [scratch] * 3], dtype=torch.int32)
    slots = [0, 1, 2, 3, 4, 8, 9, 10] + [scratch * BLOCK + p % BLOCK for p in range(n, tokens)]
    meta = AttentionMetadata(
        cu_seqlens_q=torch.tensor([0, 5, 8, 8, 8], dtype=torch.int32),
        seq_lens=torch.tensor([*lengths, 0, 0], dtype=torch.int32),
        max_seqlen_q=tokens,
        max_seqlen_k=3 * BLOCK,
        slot_mapping=torch.tensor(slots),
        block_tables=tables,
        decode_only=False,
        context_free=context_free,
    )
    for _ in range(2):  # the second pass gathers what the first wrote into the scratch block
        out = attention.paged(q, k, v, k_cache, v_cache, meta, DIM**-0.5)
        assert torch.isfinite(out).all()
        for start, end in ((0, 5), (5, 8)):
            expected = dense_causal(q[start:end], k[start:end], v[start:end], 0)
            torch.testing.assert_close(out[start:end], expected, rtol=1e-5, atol=1e-5)


def test_dense_bidirectional_kernels_agree() -> None:
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(5, 11, HEADS, DIM, generator=gen)
    k = torch.randn(5, 11, KV_HEADS, DIM, generator=gen)
    v = torch.randn(5, 11, KV_HEADS, DIM, generator=gen)
    math_out = get_attention_backend("torch", "cpu").dense(q, k, v, DIM**-0.5)
    sdpa_out = get_attention_backend("sdpa", "cpu").dense(q, k, v, DIM**-0.5)
    torch.testing.assert_close(math_out, sdpa_out, rtol=1e-5, atol=1e-5)
    expected = torch.stack([dense_causal(q[b], k[b], v[b], offset=10**6) for b in range(5)])  # no causal cut
    torch.testing.assert_close(math_out, expected, rtol=1e-5, atol=1e-5)


def test_backend_selection() -> None:
    assert get_attention_backend("auto", "cpu").name == "torch"
    with pytest.raises(ValueError, match="CUDA"):
        get_attention_backend("flash_attn", "cpu")
    with pytest.raises(ValueError, match="unknown"):
        get_attention_backend("xformers", "cpu")
