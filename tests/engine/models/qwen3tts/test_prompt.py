"""Prompt rows per variant (the reference's layout, its codes checked end to end in test_parity) and the
requests a checkpoint cannot serve, refused with a reason."""

from __future__ import annotations

import pytest
import torch

from engine.models.qwen3tts import ClonePrompt, PromptError, VoiceRequest, build_prompt


def _build(model, **kwargs):
    return build_prompt(VoiceRequest(**kwargs), model.tokenizer, model.config)


def test_custom_voice_rows(loaded) -> None:
    model = loaded("customvoice-1.7b")
    cfg, t = model.config, model.config.talker
    p = _build(model, text="Hi", speaker="Vivian", language="English", instruction="Calm.")
    instruct = model.tokenizer.encode("<|im_start|>user\nCalm.<|im_end|>\n")
    n = len(instruct)
    assert p.text_ids[:n].tolist() == instruct and (p.codec_ids[:n] == -1).all()
    prefix = [t.codec_think_id, t.codec_think_bos_id, t.language_ids["english"], t.codec_think_eos_id,
              t.speaker_ids["vivian"], t.codec_pad_id]  # fmt: skip
    assert p.codec_ids[n + 3 : n + 9].tolist() == prefix
    assert p.text_ids[n + 3 : n + 9].tolist() == [cfg.tts_pad_token_id] * 5 + [cfg.tts_bos_token_id]
    # non-streaming text (the wrapper's default here): every token + codec pad, eos + pad, then pad + codec bos
    text = model.tokenizer.encode("Hi")
    assert p.text_ids[n + 9 :].tolist() == [*text, cfg.tts_eos_token_id, cfg.tts_pad_token_id]
    assert p.codec_ids[n + 9 :].tolist() == [t.codec_pad_id] * (len(text) + 1) + [t.codec_bos_id]
    assert p.trailing_ids.numel() == 0


def test_dialect_speaker_and_auto_language(loaded) -> None:
    model = loaded("customvoice-0.6b")
    t = model.config.talker
    p = _build(model, text="Hi", speaker="dylan", language="chinese", instruction="ignored on 0.6B")
    assert t.language_ids["beijing_dialect"] in p.codec_ids.tolist()
    assert p.text_ids[0] == model.config.im_start_token_id  # no instruct rows: 0.6B drops the instruction
    auto = _build(model, text="Hi", speaker="ryan", language="auto", non_streaming=False)
    assert t.codec_nothink_id in auto.codec_ids.tolist() and t.codec_think_id not in auto.codec_ids.tolist()
    # streaming text: the first token rides on codec bos, the rest and tts_eos are fed per frame
    assert auto.codec_ids[-1] == t.codec_bos_id
    assert auto.trailing_ids[-1] == model.config.tts_eos_token_id


def test_voice_clone_rows(loaded) -> None:
    model = loaded("base-0.6b")
    vector = torch.ones(model.config.talker.stack.hidden_size)
    codes = torch.zeros(3, 16, dtype=torch.int64)
    xvec = _build(model, text="Hi", clone=ClonePrompt(vector))
    assert xvec.speaker_row is not None and xvec.codec_ids[xvec.speaker_row] == -1 and xvec.ref_codes is None
    icl = _build(model, text="Hello there", clone=ClonePrompt(vector, codes, "Yo"))
    assert icl.ref_codes is codes and (icl.codec_ids[icl.ref_start : icl.ref_start + 3] == -1).all()
    assert icl.codec_ids[icl.ref_start - 1] == model.config.talker.codec_bos_id


@pytest.mark.parametrize(
    ("variant", "kwargs", "message"),
    [
        ("customvoice-0.6b", {"text": "Hi"}, "needs a speaker"),
        ("customvoice-0.6b", {"text": "Hi", "speaker": "bob"}, "unknown speaker 'bob'"),
        ("customvoice-0.6b", {"text": "Hi", "speaker": "ryan", "language": "klingon"}, "unsupported language"),
        ("customvoice-0.6b", {"text": "Hi", "speaker": "ryan", "language": "beijing_dialect"}, "unsupported"),
        ("customvoice-0.6b", {"text": "", "speaker": "ryan"}, "empty text"),
        ("voicedesign-1.7b", {"text": "Hi", "instruction": "x", "speaker": "ryan"}, "no preset speakers"),
        ("customvoice-1.7b", {"text": "Hi", "speaker": "ryan", "clone": "x"}, "cannot clone"),
    ],
)
def test_unservable_requests_are_refused(loaded, variant: str, kwargs, message: str) -> None:
    model = loaded(variant)
    if kwargs.get("clone") == "x":
        kwargs = {**kwargs, "clone": ClonePrompt(torch.zeros(4))}
    with pytest.raises(PromptError, match=message):
        _build(model, **kwargs)


def test_text_alone_is_a_valid_request_where_no_voice_is_required(loaded) -> None:
    """VoiceDesign without an instruction and Base without a clone: no instruct rows, no speaker row."""
    # role 3 rows, codec prefix 4 (auto: nothink, think_bos, think_eos, pad); then VoiceDesign (non-streaming
    # text): "Hi" (2 byte tokens) + eos + the bos row; Base (streaming text): the first text token only
    for variant, rows in (("voicedesign-1.7b", 3 + 4 + 3 + 1), ("base-0.6b", 3 + 4 + 1)):
        model = loaded(variant)
        p = _build(model, text="Hi")
        assert p.text_ids[0] == model.config.im_start_token_id and p.speaker_row is None
        assert len(p) == rows


def test_icl_needs_the_transcript(loaded) -> None:
    model = loaded("base-1.7b")
    clone = ClonePrompt(torch.zeros(96), torch.zeros(2, 16, dtype=torch.int64), None)
    with pytest.raises(PromptError, match="transcript"):
        _build(model, text="Hi", clone=clone)


def _masked_rows(model, prompt) -> torch.Tensor:
    """A prompt's rows as the reference builds them: each track embedded where present, the x-vector and the
    reference frames added on their rows."""
    rows = torch.zeros(len(prompt), model.config.talker.stack.hidden_size)
    has_text, has_codec = prompt.text_ids >= 0, prompt.codec_ids >= 0
    rows[has_text] = model.text_embed(prompt.text_ids[has_text])
    rows[has_codec] += model.codec_embed(prompt.codec_ids[has_codec])
    if prompt.speaker_row is not None:
        rows[prompt.speaker_row] += prompt.speaker_vector
    if prompt.ref_codes is not None:
        rows[prompt.ref_start : prompt.ref_start + len(prompt.ref_codes)] += model.frame_embed(prompt.ref_codes)
    return rows


def test_prompts_embed_batched_as_each_alone(loaded) -> None:
    """`embed_prompts` (every track embedded for every row, masked; ids staged by the caller, padded with -1) gives
    each prompt's rows as the reference's masked form, batched or alone, and zero padded rows. Equal up to fp32 GEMM
    blocking: the text projection multiplies every row of the batch at once, and a CPU BLAS may block (and sum) more
    rows differently (two ulps on an AMD EPYC, identical bits on the CI machine); a masking fault is off by whole
    embeddings."""
    model = loaded("base-0.6b")
    gen = torch.Generator().manual_seed(0)
    vector = torch.randn(model.config.talker.stack.hidden_size, generator=gen)
    codes = torch.randint(0, 2048, (5, 16), generator=gen)
    prompts = [
        _build(model, text="Hello there."),
        _build(model, text="Hi", clone=ClonePrompt(vector)),
        _build(model, text="Good morning.", clone=ClonePrompt(vector, codes, "Yo")),
    ]
    with torch.inference_mode():
        expected = torch.cat([_masked_rows(model.model, p) for p in prompts])
        n = expected.shape[0]
        torch.testing.assert_close(model.model.embed_prompts(prompts), expected, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(
            torch.cat([model.model.embed_prompt(p) for p in prompts]), expected, rtol=1e-6, atol=1e-6
        )
        ids = torch.full((2, n + 7), -1, dtype=torch.int64)
        ids[0, :n] = torch.cat([p.text_ids for p in prompts])
        ids[1, :n] = torch.cat([p.codec_ids for p in prompts])
        padded = model.model.embed_prompts(prompts, ids)
    torch.testing.assert_close(padded[:n], expected, rtol=1e-6, atol=1e-6)
    assert not padded[n:].any()
