"""Our tokenizer equals the reference wrapper (LlamaTokenizerFast + mask_multichar_chinese_tokens)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from engine.models.voxcpm.tokenizer import VoxCPMTokenizer, preprocess_text
from tests.engine.models.voxcpm.reference import reference_models

TEXTS = [
    "Hello world, this is a speech test.",
    "你好世界今天天气",  # multi-character CJK vocab entries, split into characters by the wrapper
    "hello 你好 world 谢谢! 123 中国朋友",
    "Ünïcödé ✓ bytes — 🙂 and ｆｕｌｌ-width",  # byte fallback
    " leading and trailing spaces ",
    "tab\tand\nnewline",
    "ALLCAPS words: THE MODEL",
]


def test_token_ids_equal_the_reference(tiny_checkpoint: Callable[..., Path]) -> None:
    reference_models()  # skips when the reference package is absent
    from transformers import LlamaTokenizerFast
    from voxcpm.model.utils import mask_multichar_chinese_tokens

    path = tiny_checkpoint("voxcpm2")
    ref = mask_multichar_chinese_tokens(LlamaTokenizerFast.from_pretrained(str(path)))
    ours = VoxCPMTokenizer.from_dir(path)
    for text in TEXTS + [preprocess_text(t) for t in TEXTS]:
        assert ours.encode(text) == ref(text), text
    assert "你好" in ours._multichar and ours.tokenize("你好")[-2:] == ["你", "好"]
    assert 1 not in ours.encode("hello") and 2 not in ours.encode("hello")  # no BOS / EOS


def test_preprocess_matches_reference_core() -> None:
    assert preprocess_text("a\nb  c\t\td\n") == "a b c d "


def test_missing_tokenizer_file(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"tokenizer\.json"):
        VoxCPMTokenizer.from_dir(tmp_path)
