"""Session-wide fixtures shared by every test package.

- `tiny_checkpoint(variant, stop=True)`: tiny random checkpoints in the released layout.
- `engine`: ONE real engine on the tiny VoxCPM2 checkpoint for the whole session (loading and warming up
  costs seconds), shared by the end-to-end and browser tests.
- `serve(...)`: a real server on a loopback port around that engine, with the limits a test needs. On the
  way out it checks that the engine went back to idle, so a test that leaves a request behind (a missed
  abort) fails.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.servers import RunningServer, ServeFactory, running_server


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """`tiny_checkpoint(variant, stop=True) -> Path`: a tiny random checkpoint in the released layout.

    variant: "voxcpm2", "voxcpm1.5" or "voxcpm-0.5b".

    Made once per session and variant by the project's generator (`engine.models.voxcpm.make_checkpoint`);
    `stop=False` disables the stop head, so every request runs to its patch cap.
    """
    # Imported here so that a broken model package fails only the tests that need a checkpoint.
    from engine.models.voxcpm.make_checkpoint import make_checkpoint

    made: dict[tuple[str, bool], Path] = {}
    root = tmp_path_factory.mktemp("checkpoints")

    def make(variant: str, stop: bool = True) -> Path:
        key = (variant, stop)
        if key not in made:
            out = root / f"{variant}-tiny{'' if stop else '-nostop'}"
            made[key] = make_checkpoint(variant, "tiny", out, no_stop=not stop)
        return made[key]

    return make


def _run_to_completion(coro: Coroutine[Any, Any, None]) -> None:
    # On a thread of its own: the browser tests keep Playwright's event loop running on the main thread,
    # and asyncio.run() refuses to start inside a running loop.
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pool.submit(asyncio.run, coro).result()


@pytest.fixture(scope="session")
def engine(tiny_checkpoint: Callable[..., Path]) -> Iterator[Any]:
    from engine import AsyncEngine, EngineConfig

    # No stop head: every segment runs to its patch cap, so durations and frame counts are predictable.
    config = EngineConfig(
        model=str(tiny_checkpoint("voxcpm2", stop=False)),
        device="cpu",
        max_num_seqs=64,
        max_patches=64,
        max_buffered_chunks=4,  # a segment whose client lags pauses after a few chunks
        coalesce_ms=5,
    )
    engine = AsyncEngine(config)
    _run_to_completion(engine.start())
    yield engine
    _run_to_completion(engine.close())


@pytest.fixture(scope="session")
def engine_v1(tiny_checkpoint: Callable[..., Path]) -> Iterator[Any]:
    """A VoxCPM-0.5B engine (no reference audio), for the few tests that need the other architecture."""
    from engine import AsyncEngine, EngineConfig

    engine = AsyncEngine(EngineConfig(model=str(tiny_checkpoint("voxcpm-0.5b")), device="cpu", max_num_seqs=4))
    _run_to_completion(engine.start())
    yield engine
    _run_to_completion(engine.close())


@pytest.fixture
def serve(engine: Any, tmp_path_factory: pytest.TempPathFactory) -> ServeFactory:
    """`async with serve(max_patches=6, limits=dict(max_contexts=2), ...) as running:` a real server around the
    session's engine, with a voice store of its own."""

    def start(**overrides: Any) -> contextlib.AbstractAsyncContextManager[RunningServer]:
        overrides.setdefault("voices_store", tmp_path_factory.mktemp("voices"))
        return running_server(engine, **overrides)

    return start


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Browser tests last: Playwright's sync API keeps an event loop running on the main thread for the rest of
    # the session, and pytest-asyncio cannot run async tests inside it.
    items.sort(key=lambda item: "browser" in item.keywords)
