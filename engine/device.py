"""Which torch device and dtype an engine runs on, from the configuration's names; convolutions off the step."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from engine.config import EngineConfig


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    names = {"float64": torch.float64, "float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    return names[name]


def kv_pool_blocks(config: EngineConfig, device: torch.device, bytes_per_block: int) -> int:
    """How many KV blocks the scheduler may hand out: enough for every slot to hold a request of max_model_len, but
    on CUDA no more than `kv_memory_fraction` of the free memory holds (then requests wait for blocks, in order).

    An explicit `num_kv_blocks` is taken as given. Fewer blocks than one request of max_model_len needs is an error
    naming the memory, instead of an engine that can never admit a long request.
    """
    per_request = -(-config.max_model_len // config.kv_block_size)
    if config.num_kv_blocks is not None:
        return config.num_kv_blocks
    wanted = config.max_num_seqs * per_request
    if device.type != "cuda":
        return wanted
    free, _ = torch.cuda.mem_get_info(device)
    fit = int(free * config.kv_memory_fraction) // bytes_per_block - 1  # one more is the runner's scratch block
    if fit < per_request:
        raise MemoryError(
            f"{free / 2**30:.1f} GiB free on {device}: a KV pool of {config.kv_memory_fraction:.0%} of it holds "
            f"{max(fit, 0) * config.kv_block_size} positions, fewer than one request of max_model_len="
            f"{config.max_model_len} needs"
        )
    return min(wanted, fit)


@contextlib.contextmanager
def native_convs() -> Iterator[None]:
    """Eager decoder and encoder work off the step (priming a streaming decoder with prompt audio, encoding voice
    audio) runs PyTorch's native convolutions, not cuDNN's.

    cuDNN builds an execution plan for every new conv shape, at about 35 ms a conv, and caches it per thread:
    measured on an H200 (VoxCPM), an admission step whose number of newcomers the engine thread had not seen before
    took ~920 ms instead of ~90 ms. These calls come in ever new shapes (batch of newcomers, prompt lengths), so
    they skip cuDNN. A step's own decode keeps cuDNN: graphed, its plans are baked in at capture for the bucket
    shapes; under enforce_eager it runs the graphs' code unchanged (cuDNN included) so that eager and graphed
    steps give the same bits.
    """
    with torch.backends.cudnn.flags(enabled=False):
        yield
