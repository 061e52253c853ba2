"""CUDA graphs of the engine step's fixed-shape parts.

ModelRunner keeps three sets in one shared memory pool. Two, `StepGraphs` per (batch bucket, Euler steps) over
the same bucket list:
- decode: the whole decode step of the running streams: the slot-state gathers, LocEnc, both LMs over the
  paged KV pool at one position per stream, then the tail below. Its only input is the slot list.
- prefill tail: the part of an admission step after the eager backbone (whose token count varies): the
  tail below, on the last-position hiddens the backbone wrote into static buffers.
The tail is one function of the runner in both: counter-based noise and settings from slot state,
mu projections, the full CFM loop, stop head, the on-device feedback of the patch, the streaming VAE decode,
ending in the packed [bucket, latents | audio | stop] result. Eager, a tail at B=1 is ~2,500 launches (the
9 LocDiT calls dominate), ~70 ms of launch overhead on an H200; replayed, the launch cost is one call.

A batch of B rows runs in the smallest bucket >= B: the caller writes rows [:B] of the static inputs and
pads the rest (the scratch slot, whose KV block and state nobody else uses; zero hiddens). The graphs share
one memory pool: only one replays at a time (stream order), and the result a replay returns is a view of
its graph's own output, which stays allocated, so a later replay of another graph cannot overwrite it.

The third, `PrefillGraphs`, holds the backbone of small text-only admissions per (token bucket, sequence bucket):
replayed, an admission of one request costs one launch instead of ~600 (the LMs' layers), which is most of the
time to first audio at low load. Larger admissions are GPU-bound and run eagerly.

The Euler-step count is a loop bound inside the graph, hence part of the key. Graphs are captured at start
only, for the default count and every bucket; a step with another count runs the same code eagerly. (Capturing
on first use, mid-serve, beside live requests, broke graphed == eager for decode steps in a test on an H200,
for a reason not found yet; a first-use capture would also stall that step.)
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import TypeVar

import torch

T = TypeVar("T")

# Batch sizes that get a graph (up to max_num_seqs, which is always added). Denser at the low end, where a
# padded row costs most relative to the batch; multiples of 32 above 64 keep GEMM tiles full.
BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 256, 320, 384, 448, 512)

# (the static inputs' first `bucket` rows, max_timesteps) -> packed [bucket, W]
StepBody = Callable[[list[torch.Tensor], int], torch.Tensor]


def bucket_sizes(max_batch: int) -> list[int]:
    return sorted({b for b in BUCKETS if b < max_batch} | {max_batch})


class StepGraphs:
    """The graphs of one step body per (bucket, Euler steps) over static input buffers.

    `inputs`: (buffer [max_batch, ...], pad value) pairs; the body reads each buffer's first `bucket` rows.
    Warm-up and capture run on the pad values only (capture records, but the warm-up really executes the
    body's side effects, which must therefore touch scratch state only).
    """

    def __init__(
        self,
        body: StepBody,
        inputs: Sequence[tuple[torch.Tensor, float]],
        buckets: list[int],
        pool: tuple[int, int],
    ) -> None:
        self.body = body
        self.inputs = list(inputs)
        self.buckets = buckets
        self.device = self.inputs[0][0].device
        assert all(buf.shape[0] >= buckets[-1] for buf, _ in self.inputs)
        self._pool = pool
        self._graphs: dict[tuple[int, int], tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}

    def bucket_for(self, batch: int) -> int | None:
        """The smallest bucket holding `batch` rows; None if the batch is larger than every bucket."""
        for bucket in self.buckets:
            if bucket >= batch:
                return bucket
        return None

    def capture_all(self, max_timesteps: int) -> None:
        # Largest first: later (smaller) graphs then fit in the pool memory the first one reserved.
        for bucket in reversed(self.buckets):
            self._graphs[(bucket, max_timesteps)] = self._capture(bucket, max_timesteps)

    def has_graph(self, batch: int, max_timesteps: int) -> bool:
        bucket = self.bucket_for(batch)
        return bucket is not None and (bucket, max_timesteps) in self._graphs

    def run(self, batch: int, max_timesteps: int, fill: Callable[[int], None]) -> torch.Tensor:
        """Replay the step for `batch` rows (`has_graph` must be true). `fill(bucket)` writes rows [:batch] of
        every input buffer and pads rows [batch:bucket]. Returns the packed result [batch, W], a view of the
        graph's output: read it before the next replay of the same graph."""
        bucket = self.bucket_for(batch)
        assert bucket is not None, f"batch {batch} exceeds the largest graph bucket {self.buckets[-1]}"
        graph, out = self._graphs[(bucket, max_timesteps)]
        fill(bucket)
        graph.replay()
        return out[:batch]

    def _capture(self, bucket: int, max_timesteps: int) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        views = [buf[:bucket] for buf, _ in self.inputs]
        for view, (_, pad) in zip(views, self.inputs, strict=True):
            view.fill_(pad)  # warm-up and capture touch only scratch state
        return capture(lambda: self.body(views, max_timesteps), self.device, self._pool)


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


# Admissions that get a backbone graph: up to this many sequences, text only, prompt positions up to the engine's
# prefill_graph_tokens (the largest bucket; smaller ones from PREFILL_TOKEN_BUCKETS).
PREFILL_SEQ_BUCKETS = (1, 2, 4, 8)
PREFILL_TOKEN_BUCKETS = (64, 128, 256, 512)


class PrefillGraphs:
    """Graphs of one body per (token bucket, sequence bucket). The body reads static inputs that the caller's
    `fill` writes before each replay (padded to the key's sizes); `prepare(key)` writes an admission of no
    sequence at those sizes for warm-up and capture, so that they touch only scratch state."""

    def __init__(
        self,
        body: Callable[[int, int], T],
        prepare: Callable[[int, int], None],
        max_tokens: int,
        max_seqs: int,
        device: torch.device,
        pool: tuple[int, int],
    ) -> None:
        self.body = body
        self.prepare = prepare
        self.token_buckets = sorted({t for t in PREFILL_TOKEN_BUCKETS if t < max_tokens} | {max_tokens})
        self.seq_buckets = [s for s in PREFILL_SEQ_BUCKETS if s <= max_seqs]
        self.device = device
        self._pool = pool
        self._graphs: dict[tuple[int, int], tuple[torch.cuda.CUDAGraph, T]] = {}

    def key_for(self, tokens: int, seqs: int) -> tuple[int, int] | None:
        """The smallest (token bucket, sequence bucket) holding an admission; None if none does."""
        token_bucket = next((t for t in self.token_buckets if t >= tokens), None)
        seq_bucket = next((s for s in self.seq_buckets if s >= seqs), None)
        if token_bucket is None or seq_bucket is None:
            return None
        return token_bucket, seq_bucket

    def capture_all(self) -> None:
        for tokens in reversed(self.token_buckets):  # largest first, as StepGraphs.capture_all
            for seqs in reversed(self.seq_buckets):
                self.prepare(tokens, seqs)
                self._graphs[(tokens, seqs)] = capture(
                    functools.partial(self.body, tokens, seqs), self.device, self._pool
                )

    def run(self, key: tuple[int, int], fill: Callable[[], None]) -> T:
        """Replay the graph of `key` after `fill()` wrote its inputs; returns the body's outputs (full buckets)."""
        graph, out = self._graphs[key]
        fill()
        graph.replay()
        return out
