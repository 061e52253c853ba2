"""Paged KV-cache allocator: a free list of fixed-size blocks, handed out per request.

A request reserves KV for its whole life at admission: prompt + patch cap - 1 positions (the last patch
is never fed back). Why not grow one position per step, as LLM engines do?
- The cap is known at admission (the reference's text-length cap), and KV is small for TTS (36 KB per
  position for VoxCPM2, ~2 GB for 256 requests x 256 positions), so reserving costs little.
- Growing means that a full pool must preempt a running stream, and for a real-time stream a preemption
  is an audible stall plus a recompute. Reservation makes admission the only decision point: a request
  that got in never waits for memory again, and no step ever fails for lack of a block.
- With the default pool (max_num_seqs x max_model_len positions) every slot can hold a maximal request,
  so reservation never even delays admission; a smaller pool trades admissions for memory explicitly.

No prefix caching: VoxCPM prompts put the target text before the prompt audio and reference voices
rarely fill one 256-position block, so shared full-block prefixes almost never occur (research brief
section 4.3); the hash machinery would cost host time and memory for no hits.
"""

from __future__ import annotations

from collections import deque

from engine.sequence import Sequence


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int) -> None:
        assert num_blocks >= 1 and block_size >= 1
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.free_block_ids: deque[int] = deque(range(num_blocks))

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_block_ids)

    def blocks_needed(self, num_positions: int) -> int:
        return -(-num_positions // self.block_size)

    def can_allocate(self, seq: Sequence) -> bool:
        return self.blocks_needed(seq.num_reserved_positions) <= len(self.free_block_ids)

    def allocate(self, seq: Sequence) -> None:
        assert not seq.block_table
        num_blocks = self.blocks_needed(seq.num_reserved_positions)
        assert num_blocks <= len(self.free_block_ids)
        seq.block_table = [self.free_block_ids.popleft() for _ in range(num_blocks)]

    def deallocate(self, seq: Sequence) -> None:
        self.free_block_ids.extend(seq.block_table)
        seq.block_table = []
        seq.num_cached = 0
