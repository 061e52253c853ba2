"""The frame loop: per-row decoding state, the step from a talker hidden to the next frame and input row, and an
offline batched driver over the paged talker (tests, the CLI's reference form).

`frame_step` is the family's per-step piece, independent of who schedules rows: for B rows with their talker
hiddens it samples codebook 0 (EOS ends a row), runs the code predictor for all rows at once, and builds each
row's next talker input (the frame's summed embeddings + the row's next trailing text row, or tts_pad).

Draws use counter noise keyed by (request seed, frame * 16 + codebook), or, with `reference_rng`, the
reference's RNG stream (see sampling.py).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import torch

from engine.attention.metadata import AttentionMetadata
from engine.models.qwen3tts.model import Noise, Qwen3TTSModel
from engine.models.qwen3tts.prompt import Qwen3Prompt
from engine.models.qwen3tts.sampling import (
    MIN_NEW_TOKENS,
    RowSampling,
    SamplingParams,
    choose,
    codebook0_mask,
    process_codebook0,
)
from engine.noise import draw_seed, uniform

CODEBOOKS = 16


@dataclass(frozen=True, slots=True)
class GenerationSettings:
    """The reference's generate kwargs for one request. `max_frames` caps the output (the reference's
    max_new_tokens minus one: its last sampled codebook 0 never gets a predictor pass)."""

    talker: SamplingParams = field(default_factory=SamplingParams)
    predictor: SamplingParams = field(default_factory=SamplingParams)
    repetition_penalty: float = 1.05
    max_frames: int = 2047
    seed: int | None = None  # None: a fresh one (counter noise) or the global RNG (reference stream)

    def __post_init__(self) -> None:
        if not self.repetition_penalty > 0:
            raise ValueError(f"repetition_penalty must be > 0, got {self.repetition_penalty}")
        if self.max_frames < 1:
            raise ValueError(f"max_frames must be >= 1, got {self.max_frames}")


@dataclass
class RowState:
    """One request's decoding state between frames."""

    settings: GenerationSettings
    trailing: torch.Tensor  # [T, H] text rows fed one per frame; the last one (tts_pad) repeats
    seed: int
    generator: torch.Generator | None  # the reference RNG stream's, when that is used
    history: list[int] = field(default_factory=list)  # codebook-0 ids emitted so far
    frames: list[torch.Tensor] = field(default_factory=list)
    finished: bool = False

    @classmethod
    def start(
        cls, model: Qwen3TTSModel, prompt: Qwen3Prompt, settings: GenerationSettings, reference_rng: bool = False
    ) -> RowState:
        seed = draw_seed() if settings.seed is None else settings.seed
        generator = None
        if reference_rng and settings.seed is not None:
            generator = torch.Generator(device=model.device).manual_seed(settings.seed)
        return cls(settings, model.trailing_embed(prompt), seed, generator)


def _noise(rows: list[RowState], device: torch.device, reference_rng: bool) -> Noise:
    if reference_rng:
        generators = [r.generator for r in rows]
        return lambda codebook, vocab: generators
    seeds = torch.tensor([r.seed for r in rows], dtype=torch.int64, device=device)
    frames = torch.tensor([len(r.frames) for r in rows], dtype=torch.int64, device=device)
    return lambda codebook, vocab: uniform(seeds, frames * CODEBOOKS + codebook, (vocab,))


def frame_step(
    model: Qwen3TTSModel, hidden: torch.Tensor, rows: list[RowState], reference_rng: bool = False
) -> torch.Tensor:
    """hidden [B, H]: each row's last talker hidden. Appends a frame to each row that does not end here, marks
    rows that end (EOS or their frame cap), and returns the next talker input [B, H] (rows that ended: ignore)."""
    device = hidden.device
    eos = model.config.talker.codec_eos_id
    vocab = model.config.talker.stack.vocab_size
    width = max(len(r.history) for r in rows)
    history = torch.full((len(rows), width), -1, dtype=torch.int64)
    for i, r in enumerate(rows):
        history[i, : len(r.history)] = torch.tensor(r.history, dtype=torch.int64)
    logits = process_codebook0(
        model.codebook0_logits(hidden),
        history.to(device),
        torch.tensor([r.settings.repetition_penalty for r in rows], device=device),
        torch.tensor([len(r.history) >= MIN_NEW_TOKENS for r in rows], device=device),
        codebook0_mask(vocab, eos, device),
        eos,
    )
    noise = _noise(rows, device, reference_rng)
    c0 = choose(logits, RowSampling.of([r.settings.talker for r in rows], device), noise(0, vocab))
    frames = model.predict_rest(hidden, c0, RowSampling.of([r.settings.predictor for r in rows], device), noise)
    step_rows = []
    for i, r in enumerate(rows):
        code = int(c0[i])
        if code == eos:
            r.finished = True
        else:
            r.history.append(code)
            r.frames.append(frames[i].cpu())
            r.finished = len(r.frames) >= r.settings.max_frames
        step_rows.append(r.trailing[min(len(r.frames) - 1, r.trailing.shape[0] - 1)] if r.frames else r.trailing[-1])
    return model.frame_embed(frames) + torch.stack(step_rows)


class OfflineGenerator:
    """Generates whole requests in one batch over a private paged KV pool (contiguous blocks per row).

    Rows leave the batch when they end, so the remaining rows keep running at smaller batch sizes; each row's
    numbers do not depend on its neighbours (batch == alone, up to float summation order)."""

    def __init__(self, model: Qwen3TTSModel, block_size: int = 16, reference_rng: bool = False) -> None:
        self.model = model
        self.block_size = block_size
        self.reference_rng = reference_rng

    def generate(self, prompts: list[Qwen3Prompt], settings: list[GenerationSettings]) -> list[torch.Tensor]:
        """codes [T_i, 16] per request (int64, CPU)."""
        model, bs = self.model, self.block_size
        rows = [RowState.start(model, p, s, self.reference_rng) for p, s in zip(prompts, settings, strict=True)]
        lengths = [len(p) + s.max_frames for p, s in zip(prompts, settings, strict=True)]
        per_row = [-(-n // bs) for n in lengths]
        model.allocate_kv_cache(sum(per_row) + 1, bs)
        starts = list(itertools.accumulate([0, *per_row]))
        tables = [list(range(starts[i], starts[i + 1])) for i in range(len(rows))]
        kv_len = [0] * len(rows)

        def forward(active: list[int], inputs: list[torch.Tensor]) -> torch.Tensor:
            q_lens = [x.shape[0] for x in inputs]
            positions, slots = [], []
            for i, n in zip(active, q_lens, strict=True):
                for pos in range(kv_len[i], kv_len[i] + n):
                    positions.append(pos)
                    slots.append(tables[i][pos // bs] * bs + pos % bs)
                kv_len[i] += n
            width = max(len(tables[i]) for i in active)
            table = torch.full((len(active), width), sum(per_row), dtype=torch.int32)
            for j, i in enumerate(active):
                table[j, : len(tables[i])] = torch.tensor(tables[i], dtype=torch.int32)
            cu = list(itertools.accumulate([0, *q_lens]))
            device = model.device
            attn = AttentionMetadata(
                cu_seqlens_q=torch.tensor(cu, dtype=torch.int32, device=device),
                seq_lens=torch.tensor([kv_len[i] for i in active], dtype=torch.int32, device=device),
                max_seqlen_q=max(q_lens),
                max_seqlen_k=max(kv_len[i] for i in active),
                slot_mapping=torch.tensor(slots, dtype=torch.int64, device=device),
                block_tables=table.to(device),
                decode_only=all(n == 1 for n in q_lens),
            )
            hidden = model.talker_forward(
                torch.cat(inputs), torch.tensor(positions, dtype=torch.int64, device=device), attn
            )
            return hidden[torch.tensor(cu[1:], device=device) - 1]

        with torch.inference_mode():
            active = list(range(len(rows)))
            hidden = forward(active, [model.embed_prompt(p) for p in prompts])
            while active:
                next_inputs = frame_step(model, hidden, [rows[i] for i in active], self.reference_rng)
                keep = [j for j, i in enumerate(active) if not rows[i].finished]
                if not keep:
                    break
                active = [active[j] for j in keep]
                hidden = forward(active, [next_inputs[j : j + 1] for j in keep])
        return [torch.stack(r.frames) if r.frames else torch.zeros(0, 16, dtype=torch.int64) for r in rows]
