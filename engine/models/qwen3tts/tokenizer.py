"""The text tokenizer of a Qwen3-TTS checkpoint: Qwen2 byte-level BPE from vocab.json + merges.txt.

The released repos ship no tokenizer.json; the reference (transformers' Qwen2TokenizerFast) converts the slow
files on load with `Qwen2Converter`: NFC normalisation, the Qwen2 pre-tokenisation regex, byte-level BPE, and
the added tokens of tokenizer_config.json matched before BPE. This builds the same pipeline with `tokenizers`.
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers
from tokenizers.models import BPE

from engine.models.qwen3tts.config import ConfigError

PRETOKENIZE_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)


class Qwen3TTSTokenizer:
    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tokenizer = tokenizer

    @classmethod
    def from_dir(cls, directory: Path) -> Qwen3TTSTokenizer:
        try:
            vocab = json.loads((directory / "vocab.json").read_text(encoding="utf-8"))
            merges_text = (directory / "merges.txt").read_text(encoding="utf-8")
            config = json.loads((directory / "tokenizer_config.json").read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ConfigError(f"unreadable tokenizer files in {directory}: {exc}") from exc
        merges = [
            tuple(line.split(" ", 1))
            for line in merges_text.splitlines()
            if line and not line.startswith("#version") and " " in line
        ]
        tok = Tokenizer(BPE(vocab=vocab, merges=merges, unk_token=None, fuse_unk=False, byte_fallback=False))
        tok.normalizer = normalizers.NFC()
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
        tok.decoder = decoders.ByteLevel()
        added = sorted(config.get("added_tokens_decoder", {}).items(), key=lambda item: int(item[0]))
        for token_id, spec in added:
            token = AddedToken(
                spec["content"],
                single_word=spec.get("single_word", False),
                lstrip=spec.get("lstrip", False),
                rstrip=spec.get("rstrip", False),
                normalized=spec.get("normalized", False),
                special=spec.get("special", True),
            )
            tok.add_tokens([token])
            if tok.token_to_id(spec["content"]) != int(token_id):
                raise ConfigError(
                    f"added token {spec['content']!r} has id {token_id} in tokenizer_config.json but "
                    f"{tok.token_to_id(spec['content'])} after the vocabulary"
                )
        return cls(tok)

    def encode(self, text: str) -> list[int]:
        return self._tokenizer.encode(text, add_special_tokens=False).ids

    def token_id(self, token: str) -> int | None:
        return self._tokenizer.token_to_id(token)
