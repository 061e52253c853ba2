"""The seam between the engine core and a model family: what the core drives, and what a family hands back.

The core (engine_core, scheduler, block_manager, sequence, engine_loop, async_engine) knows requests, slots, KV
blocks and steps, never a model. Everything a family owns (weights and checkpoint loading, prompt building and
tokenisation, its KV layout, per-slot device state, the step's pieces and their CUDA graphs, the streaming decoder,
audio encoding for voices) sits behind one `ModelRunner` under engine/models/<family>/, picked from the checkpoint by
engine/models/registry.py.

Terms, the same for every family: a *step* advances every running request by one *patch*, the unit of output (a
VoxCPM latent patch, a Qwen3-TTS codec frame), which is `info.samples_per_patch` samples of audio and one LM position
of KV. A request's prompt takes `num_positions` positions at its first step (prefill), and every later step one more.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import numpy as np

from engine.outputs import ModelInfo
from engine.params import GenerationRequest
from engine.sequence import FamilyPrompt, Sequence

if TYPE_CHECKING:  # torch: only where a family runs
    from engine.lora.pool import LoRAPool


@dataclass(slots=True)
class StepResult:
    """Host copies of one step's results, row i for seqs[i] (the step's sequences in the order they ran)."""

    seqs: list[Sequence]
    latents: np.ndarray  # float32 [B, patch_size, feat_dim]: what made each row's audio (AudioChunk.latents)
    samples: np.ndarray  # float32 [B, samples_per_patch]
    stops: list[bool]  # the family's stop verdict per row (the scheduler applies min_patches)


class ModelRunner(Protocol):
    """One model on one device, driven by the engine core from the engine thread (`make_prompt`: any thread)."""

    info: ModelInfo
    num_kv_blocks: int  # KV blocks of EngineConfig.kv_block_size positions that the scheduler may hand out
    # The resident LoRA adapters (engine.lora): the core adds and removes them between steps, and gives each request
    # its slot (Sequence.lora_slot) for `run` to apply per row. None where the family or the config serves none.
    lora: LoRAPool | None

    def make_prompt(self, request: GenerationRequest) -> FamilyPrompt:
        """Validate and tokenise a request into what `run` reads at its prefill; ValueError names what is wrong.
        Host work only, touching no runner state: callers run it on their own threads."""
        ...

    def warm_up(self) -> None:
        """Before the first step, on the thread that runs the steps: whatever a step would otherwise pay for at the
        first use of a shape or size (library choices, allocations), over scratch state only."""
        ...

    def run(self, batch: list[Sequence], while_running: Callable[[], None]) -> StepResult:
        """One step over the scheduler's batch: prefill the sequences with `is_prefill` (newly admitted, each with a
        fresh `slot` and `block_table`: reset that slot's state), one patch for every other one. Waits for the
        device once, calling `while_running` just before (every piece of device work queued). A slot that is not
        in the batch is not touched; finished and aborted requests simply stop appearing (their slot and blocks go
        to a later admission, which resets them)."""
        ...

    def encode_audio(self, wav: np.ndarray, padding: str) -> np.ndarray:
        """float32 mono wav at `info.encoder_sample_rate` -> the float32 array a voice stores, which `make_prompt`
        takes back: padding "left" gives Prompt.latents (a continuation prompt, ending where generation starts;
        VoxCPM: latent patches [n, patch_size, feat_dim]), "right" Prompt.reference_latents (a reference).
        ValueError for audio it cannot encode."""
        ...


@runtime_checkable
class PrefillsAhead(Protocol):
    """A runner that can prefill prompts ahead of the step that starts them (VoxCPM's; Qwen3-TTS's cannot): while a
    burst still arrives at an idle engine, its first arrivals' prompts go through the backbone, so that the burst's
    first step is left with the last arrivals' and the solvers' start (engine.engine_loop)."""

    def prefill_ahead(self, seqs: list[Sequence]) -> None:
        """Newly admitted `seqs` (fresh slots and block tables, as at `run`): reset their slots, write their prompts'
        KV and keep what their first step's solver starts from. Queues device work and returns: no wait. `run` then
        takes them as `is_prefill` with `prefilled_ahead` set."""
        ...
