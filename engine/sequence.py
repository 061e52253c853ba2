"""Per-request progress: the prompt, where generation stands, and what the request holds (KV blocks, a slot)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Protocol

from engine.outputs import FinishReason
from engine.params import GenerationParams


class FamilyPrompt(Protocol):
    """A request's prompt as its model family built it (engine/models/family.py). The core reads only these two
    numbers; the family's runner reads the rest at the request's prefill."""

    @property
    def num_positions(self) -> int:
        """LM positions (KV) the prompt takes at prefill."""
        ...

    @property
    def patch_cap(self) -> int:
        """The family's cap on generated patches when the request sets none (VoxCPM: the reference's)."""
        ...


class SequenceStatus(enum.Enum):
    WAITING = enum.auto()  # queued, holds nothing
    RUNNING = enum.auto()  # holds KV blocks and a slot, stepped every engine step
    PAUSED = enum.auto()  # holds KV blocks and a slot, skipped until resumed (its consumer lags)
    FINISHED = enum.auto()  # holds nothing


@dataclass(eq=False, slots=True)
class Sequence:
    """One request as the scheduler sees it.

    Positions are LM positions: the prompt's, then one per generated patch (one step's output: a VoxCPM latent
    patch, a Qwen3-TTS codec frame), because each generated patch is fed back as the input of the next step. The
    newest patch is fed back only if another step follows, so a request capped at `max_patches` patches needs KV for
    `num_prompt + max_patches - 1` positions.
    """

    request_id: str
    prompt: FamilyPrompt
    params: GenerationParams
    seed: int  # the noise seed: params.seed, or one drawn at submission
    arrival_time: float = 0.0  # GenerationRequest.arrival_time
    received_time: float = 0.0  # time.monotonic() when the engine made the sequence (validated, tokenized)
    max_patches: int = 0  # set by the scheduler when the request is added (Scheduler.add)
    status: SequenceStatus = SequenceStatus.WAITING
    block_table: list[int] = field(default_factory=list)
    slot: int = -1  # index of the family's per-request device state (fed-back patch, decoder state, noise counter)
    lora_slot: int = 0  # the resident LoRA adapter's slot (0: none), resolved when the engine takes the request
    num_cached: int = 0  # positions whose KV is written
    num_generated: int = 0  # patches generated (and emitted) so far
    finish_reason: FinishReason | None = None
    # Written by engine.pacing only: when the consumer is taken to have started playing (the first chunk's emission,
    # or the latest resume; None before the first chunk), and how many patches before then it is not credited with.
    play_start: float | None = None
    play_skipped: int = 0
    # prompt.num_positions, fixed: a B=1,024 step reads it several times a request (a property chain costs ~1 us)
    num_prompt: int = field(init=False)

    def __post_init__(self) -> None:
        self.num_prompt = self.prompt.num_positions

    @property
    def num_positions(self) -> int:
        """Positions to have KV for after the next step: the prompt plus every patch generated so far."""
        return self.num_prompt + self.num_generated

    @property
    def num_new(self) -> int:
        """Positions the next step computes: the whole prompt at prefill, then one fed-back patch."""
        return self.num_positions - self.num_cached

    @property
    def is_prefill(self) -> bool:
        """The next step is the request's first: its prompt's prefill and first patch (the prompt's KV may have been
        written ahead of it: `prefilled_ahead`)."""
        return self.num_generated == 0

    @property
    def prefilled_ahead(self) -> bool:
        """Admitted while its burst was still arriving, its prompt's KV written then (EngineCore.prefill_ahead): the
        first step only starts its solver."""
        return self.num_generated == 0 and self.num_cached > 0

    @property
    def num_reserved_positions(self) -> int:
        return self.num_prompt + self.max_patches - 1
