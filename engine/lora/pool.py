"""The resident adapters: a fixed number of slots (max adapters x max rank, allocated once on the model's
device), their names, and the model's LoRALinear layers that read them.

Owned by whoever owns the model (the runner, on the engine loop's thread): adding writes an adapter's tensors
into a free slot between steps, removing zeroes the slot. Neither changes a shape, so captured CUDA graphs stay
valid and running requests never wait. Whether an adapter is still in use is the caller's business (the pool
only knows names and slots).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from torch import nn

from engine.lora.format import Adapter, AdapterError, Target
from engine.lora.linear import AdapterRows, LoRALinear, Site


@dataclass(frozen=True, slots=True)
class LoRALimits:
    max_loras: int  # resident adapters at once
    max_rank: int
    modules: tuple[str, ...]  # released linear names adapters may target (q_proj, ..., enc_to_lm_proj, ...)


class LoRAPool:
    def __init__(self, model: nn.Module, sites: Iterable[Site], limits: LoRALimits) -> None:
        if limits.max_loras < 1 or limits.max_rank < 1:
            raise ValueError("a LoRA pool needs max_loras >= 1 and max_rank >= 1")
        self.limits = limits
        self.rows = AdapterRows(limits.max_loras + 1)
        self.layers: list[LoRALinear] = []
        self.targets: dict[str, Target] = {}  # what adapters may target here, by released path
        served = set(limits.modules)
        for site in sites:
            parts = tuple(p for p in site.parts if p.path.rsplit(".", 1)[-1] in served)
            if not parts:
                continue
            site = Site(site.module, parts, site.in_features, site.group, site.rows)
            owner, _, name = site.module.rpartition(".")
            parent = model.get_submodule(owner) if owner else model
            layer = LoRALinear(getattr(parent, name), site, limits.max_rank, self.rows)
            setattr(parent, name, layer)
            self.layers.append(layer)
            for part in parts:
                self.targets[part.path] = Target(site.in_features, part.size, site.group)
        if not self.layers:
            raise ValueError(f"the model has none of the LoRA modules {', '.join(limits.modules)}")
        self._slots: dict[str, int] = {}  # adapter name -> slot (1..max_loras)

    def slot(self, name: str) -> int:
        if name not in self._slots:
            raise KeyError(f"unknown LoRA adapter {name!r} (loaded: {', '.join(sorted(self._slots)) or 'none'})")
        return self._slots[name]

    def names(self) -> list[str]:
        return sorted(self._slots)

    def add(self, name: str, adapter: Adapter) -> int:
        """Make `adapter` resident under `name`; returns its slot. Checked against this pool before any write."""
        if name in self._slots:
            raise AdapterError(f"a LoRA adapter named {name!r} is already loaded")
        if adapter.rank > self.limits.max_rank:
            raise AdapterError(f"LoRA {name!r}: rank {adapter.rank} exceeds the max LoRA rank {self.limits.max_rank}")
        unserved = sorted(path for path in adapter.weights if path not in self.targets)
        if unserved:
            raise AdapterError(
                f"LoRA {name!r} targets modules this engine does not serve: {', '.join(unserved[:6])}"
                f"{' ...' if len(unserved) > 6 else ''} (served: {', '.join(self.limits.modules)})"
            )
        free = sorted(set(range(1, self.limits.max_loras + 1)) - set(self._slots.values()))
        if not free:
            raise AdapterError(f"too many LoRA adapters: {self.limits.max_loras} are loaded (the maximum)")
        slot = free[0]
        for layer in self.layers:
            layer.load(slot, adapter.weights, adapter.config.scaling)
        self._slots[name] = slot
        return slot

    def remove(self, name: str) -> None:
        slot = self.slot(name)
        for layer in self.layers:
            layer.clear(slot)
        del self._slots[name]
