"""The reference's sampling and stop policy (qwen-tts 0.1.1 through transformers 4.57's `generate`).

Codebook 0 (the talker's codec head, 3072 ids): repetition penalty over the row's earlier codebook-0 ids
(the prompt is embeddings, so only generated ids count), every id in [vocab-1024, vocab) but the codec EOS
suppressed, EOS masked for the first `min_new_tokens` frames; then, when sampling, temperature, top-k and top-p,
in that order (transformers' processor order), and one draw from the softmax. Codebooks 1..15 (the code
predictor's heads): temperature, top-k, top-p and a draw, no penalty. Greedy takes the argmax of the processed
logits (transformers applies the penalty, suppression and EOS mask then, but not the warpers).

Every step is vectorised over rows with per-row settings (`RowSampling`), and there are two ways to draw:
- counter noise (the engine's): Gumbel-max over uniforms that are a pure function of (seed, draw index)
  (`engine.noise.uniform`), fixed shapes, no host sync, so a request draws the same ids alone or batched and a
  CUDA graph can hold the draw;
- the reference's RNG stream: `torch.multinomial` on one row at a time with that row's generator, so a request
  seeded like the reference's global RNG draws the reference's very ids (same call order: codebook 0, then
  1..15, per frame). The parity tests use it; it loops over rows on the host.
Both draw from the same distribution (the softmax of the warped logits).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

MIN_NEW_TOKENS = 2


@dataclass(frozen=True, slots=True)
class SamplingParams:
    do_sample: bool = True
    temperature: float = 0.9
    top_k: int = 50
    top_p: float = 1.0

    def __post_init__(self) -> None:
        if self.do_sample:
            if not self.temperature > 0:
                raise ValueError(f"temperature must be > 0, got {self.temperature}")
            if self.top_k < 0:
                raise ValueError(f"top_k must be >= 0, got {self.top_k}")
            if not 0 < self.top_p <= 1:
                raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")


def repetition_penalty(logits: torch.Tensor, history: torch.Tensor, penalty: torch.Tensor) -> torch.Tensor:
    """logits [B, V] fp32; history [B, T] earlier ids (-1 = none); penalty [B] (1.0 = off). Each id seen is
    penalised once, as transformers' gather/scatter does: negative logits multiplied, positive divided."""
    if history.shape[1] == 0:
        return logits
    vocab = logits.shape[-1]
    # empty history slots (-1) mark a spare column, so no write can clear a real id's mark
    seen = torch.zeros(logits.shape[0], vocab + 1, dtype=torch.bool, device=logits.device)
    seen.scatter_(1, torch.where(history >= 0, history, vocab), True)
    seen = seen[:, :vocab]
    p = penalty[:, None].to(logits.dtype)
    penalised = torch.where(logits < 0, logits * p, logits / p)
    return torch.where(seen, penalised, logits)


def codebook0_mask(vocab_size: int, eos_id: int, device: torch.device | str) -> torch.Tensor:
    """bool [V]: ids the talker may never emit (the top 1024 special/language/speaker ids, EOS excepted)."""
    mask = torch.zeros(vocab_size, dtype=torch.bool, device=device)
    mask[vocab_size - 1024 :] = True
    mask[eos_id] = False
    return mask


def process_codebook0(
    logits: torch.Tensor,
    history: torch.Tensor,
    penalty: torch.Tensor,
    eos_allowed: torch.Tensor,
    suppress: torch.Tensor,
    eos_id: int,
) -> torch.Tensor:
    """The processors before the warpers: penalty, suppression, EOS masked where not eos_allowed [B] (the
    reference: from frame MIN_NEW_TOKENS on)."""
    logits = repetition_penalty(logits.float(), history, penalty)
    logits = logits.masked_fill(suppress, float("-inf"))
    eos = logits[:, eos_id]
    logits[:, eos_id] = torch.where(eos_allowed, eos, torch.full_like(eos, float("-inf")))
    return logits


@dataclass(frozen=True, slots=True)
class RowSampling:
    """Per-row sampling settings as tensors [B] on the logits' device."""

    do_sample: torch.Tensor  # bool
    temperature: torch.Tensor  # float32
    top_k: torch.Tensor  # int64, 0 = off
    top_p: torch.Tensor  # float32, 1.0 = off

    @classmethod
    def of(cls, params: Sequence[SamplingParams], device: torch.device | str) -> RowSampling:
        ints, floats = cls.columns(params)
        return cls.from_columns(torch.tensor(ints, device=device), torch.tensor(floats, device=device))

    @staticmethod
    def columns(params: Sequence[SamplingParams]) -> tuple[list[tuple[int, int]], list[tuple[float, float]]]:
        """The settings of rows as host columns: (do_sample, top_k) and (temperature, top_p) per row, with the
        warpers off (temperature 1, top-k 0, top-p 1) for greedy rows."""
        ints = [(int(p.do_sample), p.top_k if p.do_sample else 0) for p in params]
        floats = [(p.temperature, p.top_p) if p.do_sample else (1.0, 1.0) for p in params]
        return ints, floats

    @classmethod
    def from_columns(cls, ints: torch.Tensor, floats: torch.Tensor) -> RowSampling:
        """`columns` as tensors: ints int64 [B, 2], floats float32 [B, 2]."""
        return cls(ints[:, 0].bool(), floats[:, 0].float(), ints[:, 1], floats[:, 1].float())

    def select(self, rows: torch.Tensor) -> RowSampling:
        """The settings of rows `rows` (int64 [B]): per-slot settings gathered for a step's rows."""
        return RowSampling(self.do_sample[rows], self.temperature[rows], self.top_k[rows], self.top_p[rows])

    def assign(self, rows: torch.Tensor, other: RowSampling) -> None:
        """Rows `rows` take other's rows 0..len(rows)-1."""
        for mine, theirs in zip(self.tensors(), other.tensors(), strict=True):
            mine[rows] = theirs

    def tensors(self) -> tuple[torch.Tensor, ...]:
        return self.do_sample, self.temperature, self.top_k, self.top_p


def warp(logits: torch.Tensor, s: RowSampling) -> torch.Tensor:
    """Temperature, top-k, top-p per row, as transformers' warpers do them (filtered logits become -inf)."""
    logits = logits / s.temperature[:, None]
    vocab = logits.shape[-1]
    ordered = logits.sort(dim=-1, descending=True).values
    k = s.top_k.clamp(max=vocab)
    kth = ordered.gather(1, (k - 1).clamp(min=0)[:, None])
    kth = torch.where(k[:, None] > 0, kth, torch.full_like(kth, float("-inf")))
    logits = logits.masked_fill(logits < kth, float("-inf"))
    sorted_logits, order = torch.sort(logits, descending=False)
    cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
    remove = (cumulative <= (1 - s.top_p[:, None])) & (s.top_p[:, None] < 1.0)
    remove[..., -1:] = False
    return logits.masked_fill(remove.scatter(1, order, remove), float("-inf"))


def choose(
    logits: torch.Tensor, s: RowSampling, noise: torch.Tensor | Sequence[torch.Generator | None]
) -> torch.Tensor:
    """One id per row of processed logits [B, V]: argmax for greedy rows, else a draw from the warped softmax,
    by Gumbel-max when `noise` is uniforms [B, V] (float64, in (0, 1)), else by `torch.multinomial` with each
    row's generator (None: the global RNG, as the reference)."""
    greedy = logits.argmax(dim=-1)
    warped = warp(logits, s)
    if isinstance(noise, torch.Tensor):
        gumbel = -torch.log(-torch.log(noise))
        drawn = (warped.double() + gumbel).argmax(dim=-1)
        return torch.where(s.do_sample, drawn, greedy)
    out = greedy.clone()
    for row, gen in enumerate(noise):
        if bool(s.do_sample[row]):
            out[row] = torch.multinomial(warped[row : row + 1].softmax(dim=-1), 1, generator=gen)[0, 0]
    return out
