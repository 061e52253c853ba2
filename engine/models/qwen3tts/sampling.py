"""The reference's sampling and stop policy (qwen-tts 0.1.1 through transformers 4.57's `generate`).

Codebook 0 (the talker's codec head, 3072 ids): repetition penalty over the row's earlier codebook-0 ids
(the prompt is embeddings, so only generated ids count), every id in [vocab-1024, vocab) but the codec EOS
suppressed, EOS masked for the first `min_new_tokens` frames; then, when sampling, temperature, top-k and top-p,
in that order (transformers' processor order), and one draw from the softmax. Codebooks 1..15 (the code
predictor's heads): temperature, top-k, top-p and a draw, no penalty. Greedy takes the argmax of the processed
logits (transformers applies the penalty, suppression and EOS mask then, but not the warpers).

Draws use `torch.multinomial` on one row at a time with that row's own generator: a request's codes then depend
only on its seed, never on what else is in the batch, and a request seeded like the reference's global RNG
draws the reference's codes (same call order: codebook 0, then 1..15, per frame).
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
    seen = torch.zeros_like(logits, dtype=torch.bool)
    valid = history >= 0
    seen.scatter_(1, history.clamp(min=0), valid)
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
    frames_done: torch.Tensor,
    suppress: torch.Tensor,
    eos_id: int,
) -> torch.Tensor:
    """The processors before the warpers: penalty, suppression, EOS mask while frames_done [B] < 2."""
    logits = repetition_penalty(logits.float(), history, penalty)
    logits = logits.masked_fill(suppress, float("-inf"))
    early = frames_done < MIN_NEW_TOKENS
    logits[:, eos_id] = torch.where(early, torch.full_like(logits[:, eos_id], float("-inf")), logits[:, eos_id])
    return logits


def warp(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Temperature, top-k, top-p as transformers' warpers do them (filtered logits become -inf)."""
    if params.temperature != 1.0:
        logits = logits / params.temperature
    if params.top_k:
        k = min(params.top_k, logits.shape[-1])
        kth = torch.topk(logits, k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=False)
        cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        remove = cumulative <= (1 - params.top_p)
        remove[..., -1:] = False
        logits = logits.masked_fill(remove.scatter(1, order, remove), float("-inf"))
    return logits


def choose(
    logits: torch.Tensor, params: Sequence[SamplingParams], generators: Sequence[torch.Generator | None]
) -> torch.Tensor:
    """One id per row of processed logits [B, V]: argmax for greedy rows, else a draw with the row's generator."""
    greedy = logits.argmax(dim=-1)
    out = greedy.clone()
    for row, (p, gen) in enumerate(zip(params, generators, strict=True)):
        if not p.do_sample:
            continue
        probs = warp(logits[row : row + 1], p).softmax(dim=-1)
        out[row] = torch.multinomial(probs, 1, generator=gen)[0, 0]
    return out
