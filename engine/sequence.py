"""Per-request progress: the prompt, where generation stands, and what the request holds (KV blocks, a slot)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

import numpy as np

from engine.outputs import FinishReason
from engine.params import GenerationParams


class SequenceStatus(enum.Enum):
    WAITING = enum.auto()  # queued, holds nothing
    RUNNING = enum.auto()  # holds KV blocks and a slot, stepped every engine step
    PAUSED = enum.auto()  # holds KV blocks and a slot, skipped until resumed (its consumer lags)
    FINISHED = enum.auto()  # holds nothing


@dataclass(eq=False, slots=True)
class Sequence:
    """One request as the scheduler sees it.

    Positions are LM positions: the prompt's, then one per generated patch, because each generated patch
    is fed back as the input of the next step. The newest patch is fed back only if another step follows,
    so a request capped at `max_patches` patches needs KV for `num_prompt + max_patches - 1` positions.
    """

    request_id: str
    token_ids: np.ndarray  # int64 [T] prompt text token ids (0 at audio positions)
    feats: np.ndarray  # float32 [T, P, D] prompt latent patches (zeros at text positions)
    audio_mask: np.ndarray  # bool [T]
    params: GenerationParams
    seed: int  # the noise seed: params.seed, or one drawn at submission
    num_target_tokens: int  # target text tokens, for the reference's length cap
    max_patches: int = 0  # set by the scheduler when the request is added (Scheduler.add)
    status: SequenceStatus = SequenceStatus.WAITING
    block_table: list[int] = field(default_factory=list)
    slot: int = -1  # index of the per-request device state (fed-back patch, VAE state, noise counter)
    num_cached: int = 0  # positions whose KV is written
    num_generated: int = 0  # patches generated (and emitted) so far
    finish_reason: FinishReason | None = None

    @property
    def num_prompt(self) -> int:
        return len(self.token_ids)

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
        return self.num_cached == 0

    @property
    def num_reserved_positions(self) -> int:
        return self.num_prompt + self.max_patches - 1

    def decode_context(self, max_patches: int) -> np.ndarray | None:
        """The last prompt audio patches [n <= max_patches, P, D] when the prompt ends in audio (continuation).

        The reference decodes continuation output together with these patches, so the streaming VAE is
        primed with them; a prompt ending in text (zero-shot, reference-only) starts from silence.
        """
        if not self.audio_mask[-1]:
            return None
        return self.feats[self.audio_mask][-max_patches:]
