"""CUDA graphs of the decode step, one per (batch bucket, Euler steps).

A graph replays the whole decode step of ModelRunner: the slot-state gathers, counter-based noise, LocEnc,
both LMs over the paged KV pool, FSQ, projections, stop head, the full CFM loop, the on-device feedback of
the patch, and the streaming VAE decode, ending in the packed [bucket, latents | audio | stop] result. Eager,
that step is ~6,000 launches (~100 ms of pure launch overhead on an H200 even for a tiny model); replayed,
the launch cost is one call.

The only per-step input is the slot list: everything else a decode row needs (position, KV slots, block
table, sampling settings) is derived on the device from per-slot state. A batch of B rows runs in the
smallest bucket >= B; the rows past B point at the scratch slot, whose KV block and state nobody else uses.
Graphs share one memory pool: only one replays at a time and its result is consumed before the next.

The Euler-step count is a loop bound inside the graph, hence part of the key: the default is captured for
every bucket at start, any other value on first use.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

# Batch sizes that get a graph (up to max_num_seqs, which is always added). Denser at the low end, where a
# padded row costs most relative to the batch; multiples of 32 above 64 keep GEMM tiles full.
BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 256, 320, 384, 448, 512)

DecodeBody = Callable[[torch.Tensor, int], torch.Tensor]  # (slots [B] int64, max_timesteps) -> packed [B, W]


def bucket_sizes(max_batch: int) -> list[int]:
    return sorted({b for b in BUCKETS if b < max_batch} | {max_batch})


class DecodeGraphs:
    """Owns the graphs, their shared memory pool and the static slot buffer they read."""

    def __init__(self, body: DecodeBody, max_batch: int, scratch_slot: int, device: torch.device) -> None:
        self.body = body
        self.buckets = bucket_sizes(max_batch)
        self.scratch_slot = scratch_slot
        self.device = device
        self.slots = torch.full((max_batch,), scratch_slot, dtype=torch.int64, device=device)
        self._staging = torch.empty(max_batch, dtype=torch.int64, pin_memory=True)
        self._pool = torch.cuda.graph_pool_handle()
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
            self._graph(bucket, max_timesteps)

    def run(self, slots: np.ndarray, max_timesteps: int) -> torch.Tensor:
        """Replay the step for `slots` (int64 [B], B <= the largest bucket); returns the packed result [B, W]
        (a view of the graph's output: read it before the next replay)."""
        batch = len(slots)
        bucket = self.bucket_for(batch)
        assert bucket is not None, f"batch {batch} exceeds the largest graph bucket {self.buckets[-1]}"
        # Before staging the slots: a first-use capture fills the slot buffer with the scratch slot.
        graph, out = self._graph(bucket, max_timesteps)
        staging = self._staging.numpy()
        staging[:batch] = slots
        staging[batch:bucket] = self.scratch_slot
        # The host waits for every step's result before preparing the next, so staging is free to reuse.
        self.slots[:bucket].copy_(self._staging[:bucket], non_blocking=True)
        graph.replay()
        return out[:batch]

    def _graph(self, bucket: int, max_timesteps: int) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        key = (bucket, max_timesteps)
        if key not in self._graphs:
            self._graphs[key] = self._capture(bucket, max_timesteps)
        return self._graphs[key]

    def _capture(self, bucket: int, max_timesteps: int) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        slots = self.slots[:bucket]
        slots.fill_(self.scratch_slot)  # warm-up and capture touch only the scratch slot's state
        # Warm up off the capture (lazy inits, cuBLAS workspaces, Triton compiles), on a side stream as
        # torch.cuda.graph requires, then capture.
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            self.body(slots, max_timesteps)
        torch.cuda.current_stream(self.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            out = self.body(slots, max_timesteps)
        return graph, out
