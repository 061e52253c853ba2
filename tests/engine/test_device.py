"""KV pool sizing (engine/device.py): the configuration's pool, capped by the CUDA memory free."""

from __future__ import annotations

import pytest
import torch

from engine.config import EngineConfig
from engine.device import kv_pool_blocks

GIB = 2**30
BLOCK_BYTES = 256 * 36_864  # a VoxCPM2 block: 256 positions of 36 KiB of K and V


def sized(monkeypatch: pytest.MonkeyPatch, free: int, **config: object) -> int:
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (free, 80 * GIB))
    return kv_pool_blocks(EngineConfig(model="x", **config), torch.device("cuda"), BLOCK_BYTES)  # type: ignore[arg-type]


def test_the_pool_holds_every_slot_at_max_model_len_when_memory_allows(monkeypatch: pytest.MonkeyPatch) -> None:
    assert sized(monkeypatch, 70 * GIB, max_num_seqs=64, max_model_len=4096) == 64 * 16


def test_the_pool_is_capped_by_the_memory_fraction(monkeypatch: pytest.MonkeyPatch) -> None:
    # 512 slots x 4096 positions want 77 GiB: an 80 GB card with 74 GiB free gets 80 % of that instead
    blocks = sized(monkeypatch, 74 * GIB, max_num_seqs=512, max_model_len=4096)
    assert blocks == int(74 * GIB * 0.8) // BLOCK_BYTES - 1
    assert (blocks + 1) * BLOCK_BYTES <= 0.8 * 74 * GIB


def test_an_explicit_pool_is_taken_as_given(monkeypatch: pytest.MonkeyPatch) -> None:
    assert sized(monkeypatch, 1 * GIB, num_kv_blocks=5000) == 5000


def test_too_little_memory_for_one_request_is_an_error_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(MemoryError, match="max_model_len=4096"):
        sized(monkeypatch, 100 * 2**20, max_model_len=4096)


def test_the_cpu_pool_comes_from_the_configuration() -> None:
    config = EngineConfig(model="x", max_num_seqs=3, max_model_len=1000)
    assert kv_pool_blocks(config, torch.device("cpu"), BLOCK_BYTES) == 3 * 4
