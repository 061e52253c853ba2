"""`lora_serve`: a real server around an engine of its own that serves LoRA adapters, with one random adapter
("calm", rank 4) loaded, for the adapters' `lora=` option (the session's engine serves none)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from engine import AsyncEngine, EngineConfig
from engine.lora.make_adapter import make_adapter
from tests.conftest import _run_to_completion
from tests.servers import RunningServer, ServeFactory, running_server


@pytest.fixture(scope="package")
def lora_engine(
    tiny_checkpoint: Callable[..., Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[AsyncEngine]:
    checkpoint = tiny_checkpoint("voxcpm2", stop=False)
    adapter = make_adapter(checkpoint, tmp_path_factory.mktemp("adapters") / "calm", rank=4, scale=0.2)
    config = EngineConfig(
        model=str(checkpoint), device="cpu", max_num_seqs=4, max_patches=64, max_loras=1, max_lora_rank=4
    )
    engine = AsyncEngine(config)
    _run_to_completion(engine.start())
    _run_to_completion(engine.load_lora("calm", adapter))
    yield engine
    _run_to_completion(engine.close())


@pytest.fixture
def lora_serve(lora_engine: AsyncEngine, tmp_path_factory: pytest.TempPathFactory) -> ServeFactory:
    def start(**overrides: Any) -> contextlib.AbstractAsyncContextManager[RunningServer]:
        overrides.setdefault("voices_store", tmp_path_factory.mktemp("voices"))
        return running_server(lora_engine, **overrides)

    return start
