"""The web demo's conditioning controls in headless Chromium: a Qwen3-TTS CustomVoice 1.7B server announces
instructions and languages, and the page offers them and sends them in `context.create`; a server with a LoRA
adapter loaded gets an Adapter select; the VoxCPM tiny server announces none of them, and the page hides them.

What was sent is read off the WebSocket as Playwright saw it, not from the page's bookkeeping.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from engine.lora.make_adapter import make_adapter
from engine.models.qwen3tts.make_checkpoint import make_checkpoint
from tests.conftest import _run_to_completion
from tests.servers import running_server

from .conftest import open_demo, running
from .test_web_demo import assert_clean, speak, wait_turn, wire_messages

pytestmark = pytest.mark.browser

TEXT = "Hello there."
CONTROLS = ("#conditioning", "#lora-field", "#language-field", "#instruction-field")


def _started(config: Any) -> Iterator[Any]:
    from engine import AsyncEngine

    engine = AsyncEngine(config)
    _run_to_completion(engine.start())
    yield engine
    _run_to_completion(engine.close())


@pytest.fixture(scope="module")
def instructed_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """Qwen3-TTS CustomVoice 1.7B, tiny: preset speakers, instructions, languages."""
    from engine import EngineConfig

    checkpoint = make_checkpoint("customvoice-1.7b", "tiny", tmp_path_factory.mktemp("qwen3tts") / "customvoice")
    yield from _started(EngineConfig(model=str(checkpoint), device="cpu", max_num_seqs=4, max_patches=8,
                                     kv_block_size=16, max_model_len=256, coalesce_ms=1))  # fmt: skip


@pytest.fixture(scope="module")
def lora_engine(tiny_checkpoint: Callable[..., Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """VoxCPM2, tiny, with the adapter `calm` resident."""
    from engine import EngineConfig

    checkpoint = tiny_checkpoint("voxcpm2", stop=False)
    adapter = make_adapter(checkpoint, tmp_path_factory.mktemp("adapters") / "calm", rank=4, scale=0.2)
    config = EngineConfig(model=str(checkpoint), device="cpu", max_num_seqs=4, max_patches=64, max_loras=2,
                          max_lora_rank=8)  # fmt: skip
    for engine in _started(config):
        _run_to_completion(engine.load_lora("calm", adapter))
        yield engine


def demo(browser_context: Any, server: Any) -> Any:
    tab = open_demo(browser_context, f"{server.base_url}/")
    tab.wait_for_function("window.__ttsDemo?.status === 'ready'", timeout=20_000)
    return tab


def options(page: Any, select: str) -> list[str]:
    return page.eval_on_selector_all(f"{select} option", "options => options.map(o => o.value)")


def created(page: Any, ctx: str) -> dict[str, Any]:
    return next(m for m in page.wire.sent if m["type"] == "context.create" and m["ctx"] == ctx)


def test_instruction_and_language_on_a_model_that_takes_them(
    browser_context: Any, server_loop: Any, instructed_engine: Any, tmp_path: Path, screenshot: Any
) -> None:
    serve = lambda **kw: running_server(instructed_engine, tmp_path, max_patches=2, **kw)  # noqa: E731
    with running(server_loop, serve) as server:
        page = demo(browser_context, server)
        model = page.wire.messages("hello")[0]["model"]
        assert model["instruction"] is True and "english" in model["languages"]
        assert page.is_visible("#instruction-field") and page.is_visible("#language-field")
        assert not page.is_visible("#lora-field"), "the server has no adapters"
        # "auto" is the default (nothing sent), not a second option.
        assert options(page, "#language") == ["", *(lang for lang in model["languages"] if lang != "auto")]
        assert page.input_value("#language") == ""
        assert page.get_attribute("#instruction", "maxlength") == "1000"

        # Defaults send nothing new: a ttsws/1 context.create.
        plain = speak(page, TEXT)
        wait_turn(page, plain, "done")
        assert not {"instruction", "language", "lora"} & created(page, plain).keys()

        page.wait_for_selector("#voice option[value='ryan']", state="attached")  # a preset speaker is a voice
        speaker = page.inner_text("#voice-list li[data-id='ryan']")
        assert "speaker" in speaker and "Delete" not in speaker
        page.select_option("#voice", "ryan")
        page.fill("#instruction", "Speak cheerfully.")
        page.select_option("#language", "english")
        screenshot(page, "filled")
        ctx = speak(page, TEXT)
        wait_turn(page, ctx, "done")
        sent = created(page, ctx)
        assert (sent["voice"], sent["instruction"], sent["language"]) == ("ryan", "Speak cheerfully.", "english")
        wire_messages(page, "context.done", ctx)
        assert [f for f in page.wire.frames(ctx) if f.kind == 1], "no audio frames"
        assert_clean(page)
        page.close()


def test_adapter_select_when_the_server_has_loras(
    browser_context: Any, server_loop: Any, lora_engine: Any, tmp_path: Path
) -> None:
    serve = lambda **kw: running_server(lora_engine, tmp_path, max_patches=2, **kw)  # noqa: E731
    with running(server_loop, serve) as server:
        page = demo(browser_context, server)
        assert page.wire.messages("hello")[0]["loras"]["loaded"] == ["calm"]
        assert page.is_visible("#lora-field")
        assert not page.is_visible("#instruction-field") and not page.is_visible("#language-field")
        assert options(page, "#lora") == ["", "calm"] and page.input_value("#lora") == ""
        page.select_option("#lora", "calm")
        ctx = speak(page, TEXT)
        wait_turn(page, ctx, "done")
        assert created(page, ctx)["lora"] == "calm"
        wire_messages(page, "context.done", ctx)
        assert_clean(page)
        page.close()


def test_controls_hidden_on_a_model_without_them(page: Any) -> None:
    model = page.wire.messages("hello")[0]["model"]
    assert (model["family"], model["instruction"], model["languages"]) == ("voxcpm", False, [])
    for selector in CONTROLS:
        assert not page.is_visible(selector), selector
    ctx = speak(page, TEXT)
    wait_turn(page, ctx, "done")
    assert not {"instruction", "language", "lora"} & created(page, ctx).keys()
    assert_clean(page)
