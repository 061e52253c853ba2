"""Prompt building for the three Qwen3-TTS variants (the reference's `Qwen3TTSForConditionalGeneration.generate`
and its wrapper's chat templates), as token ids per row; the model turns rows into embeddings.

Each prefill row is a text track (T(id) = text_projection(text_embedding(id))) plus a codec track (a codec id,
the x-vector, or a reference frame's summed codebook embeddings); -1 marks an absent track. In order:
  instruct      `<|im_start|>user\\n{instruct}<|im_end|>\\n`, text only (CustomVoice 1.7B, VoiceDesign)
  role          `<|im_start|>assistant\\n`, text only
  codec prefix  codec [think, think_bos, lang, think_eos] (`auto`: [nothink, think_bos, think_eos]), then the
                speaker (a preset's codec id, or the x-vector), then pad; text tts_pad on all but the last,
                which carries tts_bos
  body          non-streaming text: every text token + codec pad, tts_eos + codec pad, tts_pad + codec bos;
                streaming text: the first text token + codec bos, the rest is fed one per frame
                voice clone (ICL): text `ref_text + text + tts_eos`, codec `bos + reference frames`; in
                non-streaming mode all text rows (+ codec pad) then all codec rows (+ tts_pad), else zipped
                row by row, surplus text fed per frame, surplus codec rows with tts_pad
After the prompt, `trailing_ids` are fed one per generated frame, then tts_pad forever.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.models.qwen3tts.config import Qwen3TTSConfig
from engine.models.qwen3tts.tokenizer import Qwen3TTSTokenizer


class PromptError(ValueError):
    """A request the checkpoint cannot serve (unknown speaker or language, missing clone data, ...)."""


@dataclass(frozen=True, slots=True)
class ClonePrompt:
    """What a Base checkpoint clones a voice from (the reference's `VoiceClonePromptItem`)."""

    speaker_vector: torch.Tensor  # x-vector [H] from the speaker encoder
    ref_codes: torch.Tensor | None = None  # [F, 16] speech-tokenizer codes of the reference audio (ICL)
    ref_text: str | None = None  # transcript of the reference audio (ICL)

    @property
    def icl(self) -> bool:
        return self.ref_codes is not None


@dataclass(frozen=True, slots=True)
class VoiceRequest:
    text: str
    language: str = "auto"
    speaker: str | None = None  # CustomVoice preset
    instruction: str | None = None  # CustomVoice 1.7B style, VoiceDesign voice description
    clone: ClonePrompt | None = None  # Base
    # None: the reference wrapper's default for the variant (streaming text for voice clone only)
    non_streaming: bool | None = None


@dataclass(frozen=True, slots=True)
class Qwen3Prompt:
    text_ids: torch.Tensor  # int64 [R], -1 = no text track
    codec_ids: torch.Tensor  # int64 [R], -1 = no codec id
    trailing_ids: torch.Tensor  # int64 [T], text fed one per generated frame (tts_pad after)
    speaker_row: int | None = None  # row whose codec track is the x-vector
    speaker_vector: torch.Tensor | None = None
    ref_start: int = 0  # first row of the reference frames (ICL)
    ref_codes: torch.Tensor | None = None  # [F, 16], also the decoder's left context for the output

    def __len__(self) -> int:
        return int(self.text_ids.shape[0])


def _template_ids(tokenizer: Qwen3TTSTokenizer, text: str, config: Qwen3TTSConfig, suffix: int) -> list[int]:
    """Tokenise a chat template; the reference slices it by position ([:3] role, last `suffix` tokens), which
    holds only when role and suffix tokenise on their own."""
    ids = tokenizer.encode(text)
    if len(ids) < 3 + suffix or ids[0] != config.im_start_token_id or config.im_end_token_id not in ids[-suffix:]:
        raise PromptError(f"the tokenizer splits the chat template of {text!r} differently from the reference's")
    return ids


def resolve_language(config: Qwen3TTSConfig, language: str, speaker: str | None) -> int | None:
    """The codec language id (None for auto); a dialect speaker turns chinese/auto into its dialect."""
    lang = language.lower()
    if (lang != "auto" and lang not in config.talker.language_ids) or "dialect" in lang:
        raise PromptError(f"unsupported language {language!r}; supported: {', '.join(config.languages)}")
    dialect = config.talker.speaker_dialect.get(speaker.lower()) if speaker else None
    if lang in ("chinese", "auto") and dialect is not None:
        return config.talker.language_ids[dialect]
    return None if lang == "auto" else config.talker.language_ids[lang]


def build_prompt(request: VoiceRequest, tokenizer: Qwen3TTSTokenizer, config: Qwen3TTSConfig) -> Qwen3Prompt:
    t = config.talker
    variant = config.variant
    if not request.text:
        raise PromptError("empty text")
    speaker = request.speaker or None
    if variant == "custom_voice":
        if speaker is None:
            raise PromptError(f"this CustomVoice checkpoint needs a speaker; one of {', '.join(config.speakers)}")
        if speaker.lower() not in t.speaker_ids:
            raise PromptError(f"unknown speaker {speaker!r}; supported: {', '.join(config.speakers)}")
    elif speaker is not None:
        raise PromptError(f"a {variant} checkpoint has no preset speakers (got {speaker!r})")
    if variant != "base" and request.clone is not None:
        raise PromptError(f"a {variant} checkpoint cannot clone a voice (only Base checkpoints can)")
    # Without an instruction (VoiceDesign) or a clone (Base) the model speaks in its unconditioned voice: the
    # reference's model takes such prompts (no instruct rows, no speaker row), though its wrapper asks for them.
    instruction = request.instruction or None
    if instruction is not None and not config.accepts_instruction:
        instruction = None  # the reference's wrapper drops it for the 0.6B CustomVoice model and Base has none
    clone = request.clone
    if clone is not None and clone.icl and not clone.ref_text:
        raise PromptError("voice cloning from reference codes needs the reference transcript")
    non_streaming = request.non_streaming if request.non_streaming is not None else variant != "base"
    language_id = resolve_language(config, request.language, speaker)

    ids = _template_ids(
        tokenizer, f"<|im_start|>assistant\n{request.text}<|im_end|>\n<|im_start|>assistant\n", config, 5
    )
    text_rows: list[int] = []
    codec_rows: list[int] = []

    def add(text_id: int, codec_id: int) -> None:
        text_rows.append(text_id)
        codec_rows.append(codec_id)

    if instruction is not None:
        for i in _template_ids(tokenizer, f"<|im_start|>user\n{instruction}<|im_end|>\n", config, 2):
            add(i, -1)
    for i in ids[:3]:
        add(i, -1)
    prefix = (
        [t.codec_nothink_id, t.codec_think_bos_id, t.codec_think_eos_id]
        if language_id is None
        else [t.codec_think_id, t.codec_think_bos_id, language_id, t.codec_think_eos_id]
    )
    speaker_row = None
    if speaker is not None:
        prefix.append(t.speaker_ids[speaker.lower()])
    elif clone is not None:
        speaker_row = len(text_rows) + len(prefix)
        prefix.append(-1)  # the x-vector goes here
    prefix.append(t.codec_pad_id)
    for k, codec_id in enumerate(prefix):
        add(config.tts_bos_token_id if k == len(prefix) - 1 else config.tts_pad_token_id, codec_id)

    pad, eos = config.tts_pad_token_id, config.tts_eos_token_id
    body = ids[3:-5]
    trailing: list[int] = []
    ref_start, ref_codes = 0, None
    if clone is not None and clone.icl:
        ref_ids = _template_ids(tokenizer, f"<|im_start|>assistant\n{clone.ref_text}<|im_end|>\n", config, 2)
        text = ref_ids[3:-2] + body + [eos]
        ref_codes = clone.ref_codes
        assert ref_codes is not None
        codec = [t.codec_bos_id] + [-1] * ref_codes.shape[0]  # -1: a reference frame's summed embeddings
        if non_streaming:
            for i in text:
                add(i, t.codec_pad_id)
            ref_start = len(text_rows) + 1
            for c in codec:
                add(pad, c)
        else:
            ref_start = len(text_rows) + 1
            for k, c in enumerate(codec):
                add(text[k] if k < len(text) else pad, c)
            trailing = text[len(codec) :]
    elif non_streaming:
        for i in [*body, eos]:
            add(i, t.codec_pad_id)
        add(pad, t.codec_bos_id)
    else:
        if not body:
            raise PromptError("the text tokenises to nothing")
        add(body[0], t.codec_bos_id)
        trailing = [*body[1:], eos]

    return Qwen3Prompt(
        text_ids=torch.tensor(text_rows, dtype=torch.int64),
        codec_ids=torch.tensor(codec_rows, dtype=torch.int64),
        trailing_ids=torch.tensor(trailing, dtype=torch.int64),
        speaker_row=speaker_row,
        speaker_vector=None if clone is None else clone.speaker_vector,
        ref_start=ref_start,
        ref_codes=ref_codes,
    )
