"""Decode CUDA graphs: bucket choice (CPU) and graphed == eager on the GPU (marker `gpu`)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engine.cuda_graphs import bucket_sizes
from engine.engine_core import EngineCore
from engine.params import GenerationParams, GenerationRequest
from tests.engine.helpers import engine_config


def test_bucket_sizes_cover_every_batch_up_to_the_maximum() -> None:
    assert bucket_sizes(1) == [1]
    assert bucket_sizes(20) == [1, 2, 4, 8, 16, 20]
    assert bucket_sizes(512)[-1] == 512 and bucket_sizes(600)[-2:] == [512, 600]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("timesteps", [10, 4])
def test_graphed_decode_equals_eager(tiny_checkpoint, timesteps: int) -> None:
    """Same requests, same admission pattern (one joins mid-stream, so steps mix a graphed decode with an
    eager prefill), eager vs graphed. Every decode batch (2, then 4, then 2) is a bucket size, so the graphs
    run the eager step's kernels on the same shapes: equal bits."""
    checkpoint = tiny_checkpoint("voxcpm2", stop=False)
    results = []
    for eager in (True, False):
        core = EngineCore(
            engine_config(
                checkpoint, device="cuda", dtype="bfloat16", max_num_seqs=6, max_patches=8, enforce_eager=eager
            )
        )
        assert (core.runner.graphs is None) == eager
        params = GenerationParams(seed=7, inference_timesteps=timesteps, max_patches=8)
        chunks: dict[str, list] = {}
        for i in range(2):
            core.add_request(GenerationRequest(text=f"hello {i}", params=params, request_id=f"r{i}"))
        step = 0
        while core.has_work():
            if step == 2:
                for i in (2, 3):
                    core.add_request(GenerationRequest(text=f"late {i}", params=params, request_id=f"r{i}"))
            for chunk in core.step():
                chunks.setdefault(chunk.request_id, []).append(chunk)
            step += 1
        results.append(chunks)
    eager_chunks, graphed_chunks = results
    assert eager_chunks.keys() == graphed_chunks.keys()
    for request_id in eager_chunks:
        a = np.stack([c.latents for c in eager_chunks[request_id]])
        b = np.stack([c.latents for c in graphed_chunks[request_id]])
        assert a.shape == b.shape and np.isfinite(b).all()
        np.testing.assert_array_equal(a, b)
        samples = [np.concatenate([c.samples for c in run[request_id]]) for run in (eager_chunks, graphed_chunks)]
        np.testing.assert_array_equal(*samples)
