"""Which torch device and dtype an engine runs on, from the configuration's names."""

from __future__ import annotations

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
