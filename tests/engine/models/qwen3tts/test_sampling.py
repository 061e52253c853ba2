"""The sampling policy pieces against transformers' own logits processors (the reference applies them through
`generate`), and the counter-noise draw: inside the warped support, distributed as its softmax, batch-free."""

from __future__ import annotations

import pytest
import torch
from transformers.generation.logits_process import (
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from engine.models.qwen3tts.sampling import (
    RowSampling,
    SamplingParams,
    choose,
    codebook0_mask,
    process_codebook0,
    repetition_penalty,
    warp,
)
from engine.noise import uniform


def _logits(rows: int, vocab: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed)) * 3


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0.9, top_k=50, top_p=1.0),
        SamplingParams(temperature=1.3, top_k=7, top_p=0.8),
        SamplingParams(temperature=0.5, top_k=0, top_p=0.3),
        SamplingParams(temperature=1.0, top_k=1, top_p=1.0),
    ],
)
def test_warp_matches_transformers_per_row(params: SamplingParams) -> None:
    logits = _logits(3, 300)
    expected = logits.clone()
    if params.temperature != 1.0:
        expected = TemperatureLogitsWarper(params.temperature)(None, expected)
    if params.top_k:
        expected = TopKLogitsWarper(params.top_k)(None, expected)
    if params.top_p < 1.0:
        expected = TopPLogitsWarper(params.top_p)(None, expected)
    # a greedy row beside it keeps its logits untouched
    rows = [params, params, SamplingParams(do_sample=False)]
    got = warp(logits, RowSampling.of(rows, "cpu"))
    assert torch.equal(got[:2], expected[:2])
    assert torch.equal(got[2], logits[2])


def test_repetition_penalty_matches_transformers() -> None:
    logits = _logits(2, 50)
    history = torch.tensor([[3, 3, 7, 49], [0, 1, -1, -1]])
    expected_0 = RepetitionPenaltyLogitsProcessor(1.05)(history[:1], logits[:1].clone())
    expected_1 = RepetitionPenaltyLogitsProcessor(1.3)(history[1:, :2], logits[1:].clone())
    got = repetition_penalty(logits, history, torch.tensor([1.05, 1.3]))
    assert torch.equal(got, torch.cat((expected_0, expected_1)))


def test_codebook0_suppression_and_early_eos() -> None:
    vocab, eos = 3072, 2150
    logits = torch.zeros(2, vocab)
    out = process_codebook0(
        logits,
        torch.zeros(2, 0, dtype=torch.int64),
        torch.ones(2),
        torch.tensor([False, True]),
        codebook0_mask(vocab, eos, "cpu"),
        eos,
    )
    assert torch.isinf(out[:, 2048:2150]).all() and torch.isinf(out[:, 2151:]).all()
    assert torch.isinf(out[0, eos]) and out[1, eos] == 0  # EOS only where allowed
    assert (out[:, :2048] == 0).all()


def test_counter_noise_draws_follow_the_warped_softmax() -> None:
    vocab, draws = 12, 20000
    logits = torch.randn(1, vocab, generator=torch.Generator().manual_seed(1)).repeat(draws, 1)
    params = RowSampling.of([SamplingParams(temperature=0.9, top_k=8, top_p=0.95)] * draws, "cpu")
    seeds = torch.arange(draws, dtype=torch.int64)
    ids = choose(logits, params, uniform(seeds, torch.zeros(draws, dtype=torch.int64), (vocab,)))
    probs = warp(logits[:1], params).softmax(-1)[0].double()
    counts = torch.bincount(ids, minlength=vocab).double()
    assert counts[probs == 0].sum() == 0  # never outside the top-k / top-p support
    expected = probs * draws
    support = probs > 0
    chi2 = ((counts[support] - expected[support]) ** 2 / expected[support]).sum()
    assert chi2 < 30  # support has <= 8 ids: 7 degrees of freedom, p < 1e-4 beyond this


def test_counter_noise_rows_do_not_depend_on_the_batch() -> None:
    logits = _logits(4, 100)
    params = RowSampling.of(
        [
            SamplingParams(),
            SamplingParams(temperature=1.2, top_k=5, top_p=0.9),
            SamplingParams(do_sample=False),
            SamplingParams(),
        ],
        "cpu",
    )
    seeds, steps = torch.tensor([5, 6, 7, 5]), torch.tensor([0, 3, 1, 1])
    batched = choose(logits, params, uniform(seeds, steps, (100,)))
    for row in range(4):
        one = RowSampling(*(getattr(params, f)[row : row + 1] for f in ("do_sample", "temperature", "top_k", "top_p")))
        alone = choose(logits[row : row + 1], one, uniform(seeds[row : row + 1], steps[row : row + 1], (100,)))
        assert alone[0] == batched[row]
    assert batched[2] == logits[2].argmax()
