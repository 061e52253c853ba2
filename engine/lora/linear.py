"""The linear layer that applies resident adapters per row, and the per-row adapter index it reads.

A `LoRALinear` replaces an nn.Linear of the model in place (same weight and bias parameters, so the state dict is
unchanged) and owns one stacked A and B per adapter slot: A [slots, R, in], B [slots, R, out] with B transposed
and the adapter's scaling folded in. Slot 0 is "no adapter" and stays zero. R = rank x parts: a fused linear
(q/k/v) stacks each released part's rank block, and part j's B block only writes part j's output columns.

Which slot each input row uses comes from `AdapterRows`, set by the model for the forward in progress, in the
row layout the linear's input has (`Site.rows`). Shapes never depend on the slots, so CUDA graphs capture it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from engine import kernels
from engine.models.layers import Fp8Linear, Fp8Rows, linear


@dataclass(frozen=True, slots=True)
class Part:
    path: str  # released module path, e.g. "base_lm.layers.0.self_attn.k_proj"
    offset: int  # first output feature of this part in our (possibly fused) linear
    size: int  # its output features


@dataclass(frozen=True, slots=True)
class Site:
    """One of the model's linears that adapters may act on."""

    module: str  # our module path, e.g. "base_lm.layers.0.self_attn.qkv_proj"
    parts: tuple[Part, ...]
    in_features: int
    group: str  # "lm" | "dit" | "proj": which lora_config settings select it
    rows: str  # the AdapterRows attribute that indexes this linear's input rows


def _layout(name: str) -> property:
    def get(self: AdapterRows) -> torch.Tensor | None:
        return self._index[name]

    def set(self: AdapterRows, index: torch.Tensor | None) -> None:
        self._index[name] = index
        for key in [key for key in self._prepared if key[0] == name]:
            del self._prepared[key]

    return property(get, set)


class AdapterRows:
    """Adapter slot (int32, 0 = none) per input row of the forward in progress, by row layout. The model sets them;
    None means no adapter for the whole call. A layout with fewer dimensions than the input broadcasts over the
    rest (the LocDiT's [rows] over [rows, tokens]).

    Each layout is expanded to the input's rows and prepared for the kernels (`kernels.lora_rows`) once, by the
    first linear that reads it after the model set it, and shared by the others: in a captured forward that is
    inside the graph, so a replay prepares the index it was given."""

    LAYOUTS = ("tokens", "audio", "seqs", "dit")
    tokens = _layout("tokens")
    audio = _layout("audio")
    seqs = _layout("seqs")
    dit = _layout("dit")

    def __init__(self, slots: int) -> None:
        self.slots = slots  # adapter slots of every LoRALinear, slot 0 (none) included
        self._index: dict[str, torch.Tensor | None] = dict.fromkeys(self.LAYOUTS)
        self._prepared: dict[tuple[str, torch.Size], kernels.LoRARows] = {}

    def prepared(self, layout: str, lead: torch.Size) -> kernels.LoRARows | None:
        """The slots of `layout` for an input whose rows are `lead` (its shape less the features); None: none."""
        index = self._index[layout]
        if index is None:
            return None
        key = (layout, lead)
        if key not in self._prepared:
            flat = index.view(*index.shape, *(1,) * (len(lead) - index.ndim)).expand(lead).reshape(-1)
            self._prepared[key] = kernels.lora_rows(flat, self.slots)
        return self._prepared[key]


class LoRALinear(nn.Linear):
    def __init__(self, base: nn.Linear, site: Site, rank: int, rows: AdapterRows) -> None:
        nn.Module.__init__(self)
        self.in_features, self.out_features = base.in_features, base.out_features
        self.weight, self.bias = base.weight, base.bias
        self.site = site
        self.rank = rank
        self.adapter_rows = rows
        self.fp8 = base.fp8 if isinstance(base, Fp8Linear) else None  # an FP8 base keeps its GEMM
        width = rank * len(site.parts)
        like = {"dtype": base.weight.dtype, "device": base.weight.device}
        self.register_buffer("lora_a", torch.zeros(rows.slots, width, self.in_features, **like), persistent=False)
        self.register_buffer("lora_b", torch.zeros(rows.slots, width, self.out_features, **like), persistent=False)

    def forward(self, x: torch.Tensor | Fp8Rows) -> torch.Tensor:
        if isinstance(x, Fp8Rows):  # quantised by their producer for the FP8 GEMM; the adapter reads their source
            assert self.fp8 is not None and x.source is not None
            y = kernels.fp8_matmul(x.q, x.scale, self.fp8.weight, self.fp8.scale, self.bias, self.weight.dtype)
            x = x.source
        else:
            y = linear(x, self.weight, self.bias, self.fp8)
        rows = self.adapter_rows.prepared(self.site.rows, x.shape[:-1])
        if rows is None:
            return y
        kernels.lora_add_(
            y.view(-1, self.out_features), x.reshape(-1, self.in_features), rows, self.lora_a, self.lora_b
        )
        return y

    @torch.no_grad()
    def load(self, slot: int, weights: dict[str, tuple[torch.Tensor, torch.Tensor]], scaling: float) -> None:
        """Write an adapter's A/B (released shapes, fp32) for this linear's parts into `slot`; parts it does not
        target stay zero."""
        a = torch.zeros(self.lora_a.shape[1:])
        b = torch.zeros(self.lora_b.shape[1:])
        for j, part in enumerate(self.site.parts):
            if part.path not in weights:
                continue
            part_a, part_b = weights[part.path]
            r = part_a.shape[0]
            a[j * self.rank : j * self.rank + r] = part_a
            b[j * self.rank : j * self.rank + r, part.offset : part.offset + part.size] = (part_b * scaling).t()
        self.lora_a[slot].copy_(a)
        self.lora_b[slot].copy_(b)

    @torch.no_grad()
    def clear(self, slot: int) -> None:
        self.lora_a[slot].zero_()
        self.lora_b[slot].zero_()
