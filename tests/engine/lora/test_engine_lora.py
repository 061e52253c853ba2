"""LoRA adapters through the engine: the runner's per-slot adapter index in eager and graphed steps, the engine API
(load, generate with, unload) in-process and in an engine process, and every refusal."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

from engine import AsyncEngine, EngineError, GenerationParams, GenerationRequest
from engine.client import EngineClient
from engine.engine_core import EngineCore
from engine.lora.make_adapter import make_adapter
from tests.engine.helpers import engine_config
from tests.engine.test_cuda_graphs import _graphed_on_cpu, _run_mixed_steps
from tests.engine.test_process import engine_process

TIMEOUT = 60
# r1 and r5 run without an adapter; the others spread over three adapters of two ranks.
MIXED_LORAS = {"r0": "a", "r2": "b", "r3": "c", "r4": "a", "r6": "b", "r7": "c"}


@pytest.fixture(scope="module")
def checkpoint(tiny_checkpoint: Callable[..., Path]) -> Path:
    return tiny_checkpoint("voxcpm2", stop=False)


@pytest.fixture(scope="module")
def adapters(checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("adapters")
    specs = {"a": (4, ("lm", "dit")), "b": (8, ("lm", "dit", "proj")), "c": (2, ("dit",)), "big": (16, ("lm",))}
    return {
        name: make_adapter(checkpoint, root / name, rank, 16, groups, seed, scale=0.2)
        for seed, (name, (rank, groups)) in enumerate(specs.items())
    }


def _core(checkpoint: Path, adapters: dict[str, Path], **overrides: object) -> EngineCore:
    core = EngineCore(engine_config(checkpoint, max_loras=3, max_lora_rank=8, **overrides))
    for name in "abc":
        core.load_lora(name, core.read_lora(adapters[name]))
    return core


@pytest.mark.parametrize("prefill_graph_tokens", [0, 64])
def test_mixed_adapters_graphed_equal_eager_on_cpu(
    checkpoint: Path, adapters: dict[str, Path], monkeypatch: pytest.MonkeyPatch, prefill_graph_tokens: int
) -> None:
    """The runner's graphs (stand-in capture) with rows of three adapters and none in every piece, against the
    eager runner; every adapter changes its requests' audio, rows without one are the base model's (checked once).

    Without backbone graphs every piece runs on bucket-sized rows: equal bits (bf16). Through the prefill backbone
    graphs (padded positions, whose adapter index comes from the padded sequence) a padded GEMM may round
    differently, and the tiny random model amplifies that over the patches: the first patch is compared."""
    overrides = dict(max_num_seqs=8, max_patches=8)
    results = []
    for graphed in (False, True):
        core = _core(checkpoint, adapters, **overrides)
        if graphed:
            _graphed_on_cpu(core, monkeypatch, prefill_graph_tokens=prefill_graph_tokens)
        results.append(_run_mixed_steps(core, MIXED_LORAS))
    for request_id in results[0]:
        eager, graphed = (np.stack([c[0] for c in run[request_id]]) for run in results)
        if prefill_graph_tokens:
            np.testing.assert_allclose(graphed[0], eager[0], rtol=1e-4, atol=1e-5, err_msg=request_id)
        else:
            np.testing.assert_array_equal(graphed, eager, err_msg=request_id)
    if prefill_graph_tokens:
        return
    plain = _run_mixed_steps(_core(checkpoint, adapters, **overrides))  # the same requests without adapters
    for request_id, chunks in results[0].items():
        eager, base = np.stack([c[0] for c in chunks]), np.stack([c[0] for c in plain[request_id]])
        if request_id in MIXED_LORAS:
            assert np.abs(eager[0] - base[0]).max() > 1e-2, request_id
        else:
            np.testing.assert_array_equal(eager, base, err_msg=request_id)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_mixed_adapters_graphed_equal_eager_on_gpu(checkpoint: Path, adapters: dict[str, Path]) -> None:
    """CUDA graphs (Triton LoRA kernels inside) against enforce_eager with the same mixed adapters: every piece's
    row count is a bucket size, so the same kernels run on the same shapes: equal bits."""
    results = []
    for eager in (True, False):
        core = _core(
            checkpoint,
            adapters,
            device="cuda",
            dtype="bfloat16",
            max_num_seqs=8,
            max_patches=8,
            enforce_eager=eager,
            prefill_graph_tokens=0,
        )
        assert (core.runner.graphs is None) == eager
        results.append(_run_mixed_steps(core, MIXED_LORAS))
    for request_id in results[0]:
        for part in (0, 1):
            got = [np.concatenate([c[part].ravel() for c in run[request_id]]) for run in results]
            assert np.isfinite(got[1]).all()
            np.testing.assert_array_equal(*got, err_msg=request_id)


def request(request_id: str, lora: str | None = None, seed: int = 1, patches: int = 6) -> GenerationRequest:
    params = GenerationParams(seed=seed, max_patches=patches, lora=lora)
    return GenerationRequest(text="hello world", params=params, request_id=request_id)


async def collect(engine: AsyncEngine | EngineClient, req: GenerationRequest) -> np.ndarray:
    return np.stack([chunk.latents async for chunk in engine.generate(req)])


async def test_engine_api(checkpoint: Path, adapters: dict[str, Path], tmp_path: Path) -> None:
    engine = AsyncEngine(engine_config(checkpoint, max_loras=2, max_lora_rank=8))
    await engine.start()
    try:
        assert (engine.info.max_loras, engine.info.max_lora_rank) == (2, 8)
        base = await asyncio.wait_for(collect(engine, request("base")), TIMEOUT)
        await engine.load_lora("a", adapters["a"])
        await engine.load_lora("b", adapters["b"])
        assert engine.stats().loras == ("a", "b")
        solo = {name: await collect(engine, request(f"solo-{name}", name)) for name in ("a", "b")}
        assert np.abs(solo["a"][0] - base[0]).max() > 1e-2 and np.abs(solo["a"][0] - solo["b"][0]).max() > 1e-2
        together = await asyncio.wait_for(
            asyncio.gather(*(collect(engine, request(f"t-{n}", n)) for n in ("a", None, "b"))), TIMEOUT
        )
        # Batched fp32 GEMMs round differently from solo ones (on an AMD EPYC by up to 0.17 at the sixth patch), and
        # the tiny random model amplifies that over the patches: the first patch is compared, where adapters move
        # the output by > 1e-2 and a batch's rounding by ~1e-6.
        for got, want in zip(together, (solo["a"], base, solo["b"]), strict=True):
            assert got.shape == want.shape and np.isfinite(got).all()
            np.testing.assert_allclose(got[0], want[0], atol=1e-4)

        # Bad input: each refused clearly, the engine and its adapters untouched.
        with pytest.raises(EngineError, match="unknown LoRA adapter 'nope'"):
            await collect(engine, request("x", "nope"))
        with pytest.raises(EngineError, match="too many LoRA adapters: 2 are loaded"):
            await engine.load_lora("c", adapters["c"])
        with pytest.raises(EngineError, match="already loaded"):
            await engine.load_lora("a", adapters["c"])
        with pytest.raises(EngineError, match="rank r = 16 exceeds this engine's max LoRA rank 8"):
            await engine.load_lora("big", adapters["big"])
        with pytest.raises(EngineError, match=r"missing lora_config\.json"):
            await engine.load_lora("empty", tmp_path)
        with pytest.raises(EngineError, match="unknown LoRA adapter 'nope'"):
            await engine.unload_lora("nope")

        # Removing an adapter in use is refused while its request runs, and done once it ended.
        stream = engine.generate(request("long", "a", patches=12))
        await anext(stream)
        with pytest.raises(EngineError, match="'a' is in use by 1 request"):
            await engine.unload_lora("a")
        await stream.aclose()
        async with asyncio.timeout(TIMEOUT):
            while engine.stats().running:
                await asyncio.sleep(0.01)
        await engine.unload_lora("a")
        assert engine.stats().loras == ("b",)
        await engine.load_lora("c", adapters["c"])  # the freed slot takes another adapter
        np.testing.assert_allclose(await collect(engine, request("again-b", "b")), solo["b"], atol=2e-3)
        assert engine.stats().healthy
    finally:
        await engine.close()


async def test_engine_without_lora_refuses_adapters(checkpoint: Path, adapters: dict[str, Path]) -> None:
    engine = AsyncEngine(engine_config(checkpoint))
    await engine.start()
    try:
        assert engine.info.max_loras == 0
        with pytest.raises(EngineError, match="serves none"):
            await collect(engine, request("x", "a"))
        with pytest.raises(EngineError, match="serves no LoRA adapters"):
            await engine.load_lora("a", adapters["a"])
    finally:
        await engine.close()


async def test_engine_process_loads_adapters(checkpoint: Path, adapters: dict[str, Path]) -> None:
    """Run-time loads travel to an engine in its own process; so do refusals."""
    with engine_process(checkpoint, max_loras=1, max_lora_rank=8) as (_, path):
        client = await EngineClient.connect(path)
        try:
            assert client.info.max_loras == 1
            base = await asyncio.wait_for(collect(client, request("base")), TIMEOUT)
            await asyncio.wait_for(client.load_lora("a", adapters["a"]), TIMEOUT)
            async with asyncio.timeout(TIMEOUT):
                while client.stats().loras != ("a",):
                    await asyncio.sleep(0.01)
            with_a = await asyncio.wait_for(collect(client, request("with-a", "a")), TIMEOUT)
            assert np.abs(with_a - base).max() > 1e-2
            with pytest.raises(EngineError, match="too many LoRA adapters"):
                await client.load_lora("b", adapters["b"])
            with pytest.raises(EngineError, match="rank r = 16 exceeds"):
                await client.load_lora("big", adapters["big"])
            await client.unload_lora("a")
            with pytest.raises(EngineError, match="unknown LoRA adapter 'a'"):
                await collect(client, request("gone", "a"))
        finally:
            await client.close()


def test_adapters_loaded_at_start(checkpoint: Path, adapters: dict[str, Path], tmp_path: Path) -> None:
    core = EngineCore(engine_config(checkpoint, max_loras=2, max_lora_rank=8, loras=(("a", str(adapters["a"])),)))
    assert core.stats().loras == ("a",)
    with pytest.raises(EngineError, match=r"missing lora_config\.json"):
        EngineCore(engine_config(checkpoint, max_loras=1, loras=(("x", str(tmp_path)),)))
