"""CUDA graphs of the engine step's fixed-shape pieces, and the buckets that pick them, for every model family.

VoxCPM's runner, for one, runs a step as a short pipeline of graph replays over static buffers
(engine/models/voxcpm/runner.py):
- decode head, per batch bucket: the whole one-position backbone of the running streams (slot-state gathers,
  LocEnc, both LMs over the paged KV pool) and the solver's start (mu, noise, stop head). Input: the slot list.
- prefill head, per batch bucket: the solver's start from the hiddens an admission's backbone left.
- Euler iteration, per batch bucket: one CFM iteration, in place on the solver state. The iteration index is a
  device counter that the heads reset and each iteration advances, so one graph serves every iteration of every
  Euler-step count (requests choose 1-100). Rows come ordered by their count, most first: iteration k replays
  the bucket of the rows that still have steps, so a request that asks for many steps costs its own rows only.
- finish, per batch bucket: the on-device feedback of the patch, the streaming VAE decode, the packed result.
- prefill backbone, per (token bucket, sequence bucket): the LMs over the prompts of a small text-only
  admission; replayed, an admission of one request costs one launch instead of ~600, most of the time to first
  audio at low load. Larger admissions are GPU-bound and run eagerly, but for the full passes prefilled ahead of a
  burst's first step, which replay one key of their own (`PrefillBuckets.ahead`): while the burst still arrives,
  its submitter holds the GIL, which each of an eager pass's ~2,100 torch calls waits to take back.
Eager, one step at B=1 is ~2,500 launches (the 9 LocDiT calls dominate), ~70 ms of launch overhead on an H200;
replayed, it is about a dozen. Qwen3-TTS's runner (engine/models/qwen3tts/runner.py) has two: the whole frame
per batch bucket, and an admission's talker prefill with frame 0's codebook 0 per (token bucket, sequence bucket),
any prompt (its embeddings are a static input); both leave their results in slot state but the frame's packed
result, which the runner copies to the host at once.

A piece over B rows replays the smallest bucket >= B: the caller writes rows [:B] of the static inputs and pads
the rest (the scratch slot, whose KV block and state nobody else uses; zero hiddens), so padded rows are inert.

All graphs share one memory pool: only one replays at a time (stream order), and no graph reads pool memory that
another graph wrote. Each piece leaves its results in buffers outside the pool (slot state, the solver state, the
heads' static inputs), except finish, whose output the runner copies to the host before any other replay and
the prefill backbone, whose outputs it copies into the prefill head's inputs at once. (An output kept in the pool
across other graphs' replays would be safe only if every later-captured graph also replayed later in each step.)
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

import torch

K = TypeVar("K", bound=Hashable)
T = TypeVar("T")

# Batch sizes that get a graph (up to max_num_seqs, which is always added). Denser at the low end, where a
# padded row costs most relative to the batch; multiples of 32 above 64 keep GEMM tiles full.
BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 256, 320, 384, 448, 512)

# Admissions that get a backbone graph: up to this many sequences, text only, prompt positions up to the engine's
# prefill_graph_tokens (the largest token bucket; smaller ones from PREFILL_TOKEN_BUCKETS).
PREFILL_SEQ_BUCKETS = (1, 2, 4, 8)
PREFILL_TOKEN_BUCKETS = (64, 128, 256, 512)


# Eager prefills (admissions past the backbone graphs: many sequences, long or audio prompts) run over a position
# count padded up to a size of this ladder. cuBLAS chooses a GEMM's algorithm the first time it sees the GEMM's shape,
# 3.4-4.5 ms for each new shape on an H200 (its first-call heuristics; the step's host thread waits for it), and an
# admission's position count is seldom one seen before: a step admitting 8,190 positions, for one, spent ~20 ms in
# these choices (a profile: 145 ms, the same admission again 101 ms). The ladder has eight sizes an octave (padding
# at most an eighth: padded positions are inert, as in the graphs' token buckets), each run once at start
# (ModelRunner.warm_up), so that no admission meets a new shape.
EAGER_TOKENS_MIN = 16


def eager_tokens(n: int) -> int:
    """The ladder's smallest size >= n positions: multiples of 16 up to 128, then of an eighth of the largest power
    of two below n."""
    step = max(EAGER_TOKENS_MIN, (1 << max(0, (n - 1).bit_length() - 1)) // 8)
    return -(-n // step) * step


def eager_token_ladder(max_tokens: int) -> list[int]:
    """Every size `eager_tokens` gives for 1..max_tokens positions, ascending."""
    sizes = [eager_tokens(1)]
    while sizes[-1] < max_tokens:
        sizes.append(eager_tokens(sizes[-1] + 1))
    return sizes


PINNED_RESULTS_ALIVE = 3  # result buffers alive at once: a step's and the two steps' before it (cache_pinned_rows)


def cache_pinned_rows(max_rows: int, width: int) -> None:
    """Have torch's pinned host allocator cache PINNED_RESULTS_ALIVE float32 [rows, width] buffers for every batch
    bucket up to `max_rows`: a step's result buffer is one (`run` takes a fresh one per step, the chunks handed out
    keep views of it): when a step starts, the last step's chunks wait in the loop's outbox (handed over while this
    step runs) and a consumer that keeps its latest chunk until the next one comes (bench_engine's, any `async for`)
    still holds one of the step before (with two cached, the second decode step after a 1,024-request admission took
    171-175 ms against 153-156 for the rest on an H200: pinning a third 32 MB buffer). The allocator keeps a freed
    pinned buffer for reuse by size class (powers of two); a class first met mid-serve costs the step a pinning
    allocation (~2.6 and 5.4 ms for the first burst's 91-row step on an H200). Consecutive buckets differ by at most
    2x, so every row count's class is one of theirs."""
    for rows in bucket_sizes(max_rows):
        buffers = [torch.empty((rows, width), pin_memory=True) for _ in range(PINNED_RESULTS_ALIVE)]
        del buffers  # all back to the allocator's cache


def bucket_sizes(max_batch: int) -> list[int]:
    return sorted({b for b in BUCKETS if b < max_batch} | {max_batch})


def smallest_fit(sizes: Sequence[int], n: int) -> int | None:
    """The smallest of the ascending `sizes` that holds n; None if none does."""
    return next((size for size in sizes if size >= n), None)


@dataclass(frozen=True, slots=True)
class PrefillBuckets:
    """The (token bucket, sequence bucket) keys of the prefill backbone graphs, and `ahead`: the key of a pass
    prefilled ahead of a burst's first step (EngineConfig.prefill_ahead_chunk) where no other key holds one. Only
    passes ahead replay it: they are full, while a step's admission padded to it could run several times its
    positions."""

    tokens: list[int]
    seqs: list[int]
    ahead: tuple[int, int] | None = None

    @classmethod
    def up_to(cls, max_tokens: int, max_seqs: int, ahead: tuple[int, int] | None = None) -> PrefillBuckets:
        tokens = sorted({t for t in PREFILL_TOKEN_BUCKETS if t < max_tokens} | {max_tokens})
        buckets = cls(tokens, [s for s in PREFILL_SEQ_BUCKETS if s <= max_seqs])
        if ahead is None or buckets.key_for(*ahead) is not None:
            return buckets
        return cls(buckets.tokens, buckets.seqs, ahead)

    def keys(self) -> list[tuple[int, int]]:
        keys = list(itertools.product(self.tokens, self.seqs))
        return keys if self.ahead is None else [*keys, self.ahead]

    def key_for(self, tokens: int, seqs: int, ahead: bool = False) -> tuple[int, int] | None:
        """The smallest key holding an admission of `tokens` prompt positions over `seqs` sequences, if any: the
        `ahead` key only for a pass ahead."""
        token_bucket, seq_bucket = smallest_fit(self.tokens, tokens), smallest_fit(self.seqs, seqs)
        if token_bucket is not None and seq_bucket is not None:
            return token_bucket, seq_bucket
        if ahead and self.ahead is not None and tokens <= self.ahead[0] and seqs <= self.ahead[1]:
            return self.ahead
        return None


class GraphSet(Generic[K, T]):
    """The graphs of one body per key. `body(key)` reads static buffers that the caller's `fill` writes before each
    replay; `prepare(key)` writes inert inputs (the scratch slot, zeros) for the warm-up and the capture, because
    the warm-up really executes the body: it must touch scratch state only."""

    def __init__(
        self,
        body: Callable[[K], T],
        keys: Sequence[K],
        device: torch.device,
        pool: tuple[int, int],
        prepare: Callable[[K], None] | None = None,
    ) -> None:
        self.body = body
        self.keys = list(keys)
        self.prepare = prepare
        self.device = device
        self._pool = pool
        self._graphs: dict[K, tuple[torch.cuda.CUDAGraph, T]] = {}

    def capture_all(self) -> None:
        # Largest first (keys ascend): later, smaller graphs then fit in the pool memory the first one reserved.
        for key in reversed(self.keys):
            if self.prepare is not None:
                self.prepare(key)
            self._graphs[key] = capture(functools.partial(self.body, key), self.device, self._pool)

    def run(self, key: K, fill: Callable[[], None] | None = None) -> T:
        """Replay the graph of `key` after `fill()` wrote its inputs; returns the body's outputs (whole buckets),
        which the next replay of the same graph overwrites."""
        graph, out = self._graphs[key]
        if fill is not None:
            fill()
        graph.replay()
        return out


def capture(fn: Callable[[], T], device: torch.device, pool: tuple[int, int]) -> tuple[torch.cuda.CUDAGraph, T]:
    """Run fn once off the capture (lazy inits, cuBLAS workspaces, cuDNN plans, Triton compiles), on a side stream
    as torch.cuda.graph requires, then capture it into `pool`. Returns the graph and the captured call's result,
    whose tensors every replay rewrites."""
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        out = fn()
    return graph, out
