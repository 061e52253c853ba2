"""Text -> token ids exactly as the reference VoxCPM tokenizer wrapper, on the `tokenizers` library alone.

The reference (voxcpm `model/utils.py: mask_multichar_chinese_tokens`) wraps LlamaTokenizerFast: it tokenizes
without BOS/EOS, then replaces every token that (without the "▁" word marker) is a multi-character vocab entry
made only of CJK ideographs (U+4E00..U+9FFF) by its single characters, and maps tokens to ids (unknown ->
<unk>). Text preprocessing follows the reference `core.py`: newlines become spaces, whitespace runs collapse.

The word-marker handling is that of the class the reference loads (transformers' LlamaTokenizer, 5.x): it
ignores tokenizer.json's normalizer and uses a Metaspace pre-tokenizer whose prepend scheme comes from
tokenizer_config.json ("first" unless `legacy` is true; "never" with `add_prefix_space: false`). This only
matters for text that starts with whitespace.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from tokenizers import Tokenizer, pre_tokenizers

_WHITESPACE = re.compile(r"\s+")


def preprocess_text(text: str) -> str:
    """The reference's only text clean-up before tokenizing (`VoxCPM._generate`)."""
    return _WHITESPACE.sub(" ", text.replace("\n", " "))


def _is_cjk_word(token: str) -> bool:
    return len(token) >= 2 and all("\u4e00" <= c <= "\u9fff" for c in token)


class VoxCPMTokenizer:
    def __init__(self, tokenizer: Tokenizer, unk_token: str = "<unk>", prepend_scheme: str = "first") -> None:
        tokenizer.normalizer = None
        tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme=prepend_scheme, split=False)
        self._tok = tokenizer
        vocab = tokenizer.get_vocab(with_added_tokens=True)
        self._multichar = frozenset(t for t in vocab if _is_cjk_word(t))
        # Ids of the tokens `tokenize` splits: text without any of them (all English, say) maps to the library's
        # ids as they are, with no per-token Python (a burst of requests is tokenized on the event loop).
        self._split_ids = frozenset(i for t, i in vocab.items() if t.replace("▁", "") in self._multichar)
        unk_id = tokenizer.token_to_id(unk_token)
        if unk_id is None:
            raise ValueError(f"tokenizer has no unknown token {unk_token!r}")
        self.unk_id = unk_id
        self.vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)

    @classmethod
    def from_dir(cls, path: str | Path) -> VoxCPMTokenizer:
        """Load tokenizer.json (and the unk token named by tokenizer_config.json / special_tokens_map.json)."""
        path = Path(path)
        file = path / "tokenizer.json"
        if not file.is_file():
            raise FileNotFoundError(f"no tokenizer.json in {path}")
        settings: dict = {}
        for name in ("tokenizer_config.json", "special_tokens_map.json"):  # the first file wins, as in transformers
            meta = path / name
            if meta.is_file():
                settings = json.loads(meta.read_text(encoding="utf-8")) | settings
        unk = settings.get("unk_token", "<unk>")
        if isinstance(unk, dict):
            unk = unk.get("content", "<unk>")
        if not settings.get("add_prefix_space", True):
            scheme = "never"
        else:
            scheme = "always" if settings.get("legacy", False) else "first"
        return cls(Tokenizer.from_file(str(file)), unk, scheme)

    def tokenize(self, text: str) -> list[str]:
        tokens: list[str] = []
        for token in self._tok.encode(text, add_special_tokens=False).tokens:
            clean = token.replace("▁", "")
            if clean in self._multichar:
                tokens.extend(clean)
            else:
                tokens.append(token)
        return tokens

    def encode(self, text: str) -> list[int]:
        """Token ids of `text` (no BOS/EOS), as the reference wrapper's `__call__`."""
        ids = self._tok.encode(text, add_special_tokens=False).ids
        if self._split_ids.isdisjoint(ids):
            return ids
        looked_up = (self._tok.token_to_id(t) for t in self.tokenize(text))
        return [self.unk_id if i is None else i for i in looked_up]

    __call__ = encode
