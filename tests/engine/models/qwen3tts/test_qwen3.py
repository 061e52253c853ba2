"""Fused projections (what CUDA runs) against the released separate ones, with the twins on the CPU."""

from __future__ import annotations

import copy

import torch

from engine.models.qwen3tts import VoiceRequest, build_prompt
from engine.models.qwen3tts.generate import OfflineGenerator
from tests.engine.models.qwen3tts.conftest import GREEDY


def test_fused_projections_give_the_same_codes_and_keep_the_state_dict(loaded) -> None:
    base = loaded("customvoice-1.7b")  # has small_to_mtp_projection: predictor and talker widths differ
    fused = copy.deepcopy(base.model)
    before = {k: v.clone() for k, v in fused.state_dict().items()}
    fused.fuse_projections()
    after = fused.state_dict()
    assert after.keys() == before.keys() and all(torch.equal(after[k], v) for k, v in before.items())
    attn = fused.talker.code_predictor.model.layers[0].self_attn
    assert attn.qkv_weight is not None and attn.q_proj.weight.data_ptr() == attn.qkv_weight.data_ptr()  # views

    request = VoiceRequest("Hello world, this is a test.", "english", speaker="ryan", instruction="Calm.")
    prompt = build_prompt(request, base.tokenizer, base.config)
    with torch.inference_mode():
        want = OfflineGenerator(base.model).generate([prompt], [GREEDY])[0]
        got = OfflineGenerator(fused).generate([prompt], [GREEDY])[0]
    assert torch.equal(got, want)

    # the predictor's hidden states, teacher-forced: one GEMM of stacked weights sums as the three did, to rounding
    pred, ref = fused.talker.code_predictor.model, base.model.talker.code_predictor.model
    x = torch.randn(3, 2, pred.config.hidden_size, generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        outs = [m.forward_cached(x, 0, m.new_caches(3, 16, torch.device("cpu"), torch.float32)) for m in (pred, ref)]
    assert torch.allclose(outs[0], outs[1], rtol=1e-5, atol=1e-5)
