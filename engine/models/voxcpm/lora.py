"""Where LoRA adapters act in VoxCPMModel: the released linears an adapter may target, and how they map onto our
modules (q/k/v and gate/up are fused here, so one of our linears can carry up to three released targets).

Each site also names the rows its input is laid out by, so that the per-row adapter index can be expanded to it:
- "tokens": the packed LM positions [N] (base LM, residual LM, fusion_concat_proj),
- "audio": the positions LocEnc encodes (enc_to_lm_proj): all N in a decode step, the audio ones in a prefill,
- "seqs": one row per sequence [B] (lm_to_dit_proj, res_to_dit_proj),
- "dit": the LocDiT's CFG rows [2B, S] (conditional half, then unconditional), one adapter per row.
"""

from __future__ import annotations

from torch import nn

from engine.lora.format import Target
from engine.lora.linear import Part, Site
from engine.lora.pool import LoRALimits, LoRAPool
from engine.models.voxcpm.checkpoint import FUSED
from engine.models.voxcpm.minicpm4 import Attention
from engine.models.voxcpm.model import VoxCPMModel

STACKS = {"base_lm": "lm", "residual_lm": "lm", "feat_decoder.estimator.decoder": "dit"}
PROJECTIONS = {
    "enc_to_lm_proj": "audio",
    "fusion_concat_proj": "tokens",
    "lm_to_dit_proj": "seqs",
    "res_to_dit_proj": "seqs",
}
LAYER_LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
ALL_MODULES = (*LAYER_LINEARS, *PROJECTIONS)
# What an engine serves unless told otherwise: voxcpm's default LM and DiT targets, and its projections.
DEFAULT_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", *PROJECTIONS)


def lora_sites(model: nn.Module) -> list[Site]:
    """Every linear of `model` an adapter may target, in module order."""
    sites = []
    for name, module in model.named_modules():
        if not isinstance(module, nn.Linear):
            continue
        owner, _, short = name.rpartition(".")
        if owner == "" and short in PROJECTIONS:
            part = Part(name, 0, module.out_features)
            sites.append(Site(name, (part,), module.in_features, "proj", PROJECTIONS[short]))
            continue
        stack = next((s for s in STACKS if name.startswith(s + ".layers.")), None)
        if stack is None or short not in (*FUSED, *LAYER_LINEARS):
            continue
        if short in FUSED:
            parent = model.get_submodule(owner)
            sizes = parent.split if isinstance(parent, Attention) else (module.out_features // 2,) * 2
            offsets = [sum(sizes[:i]) for i in range(len(sizes))]
            parts = tuple(Part(f"{owner}.{p}", o, s) for p, o, s in zip(FUSED[short], offsets, sizes, strict=True))
        else:
            parts = (Part(name, 0, module.out_features),)
        group = STACKS[stack]
        sites.append(Site(name, parts, module.in_features, group, "dit" if group == "dit" else "tokens"))
    return sites


def lora_targets(model: nn.Module) -> dict[str, Target]:
    """The released linears an adapter may target, by released module path (what adapter files name)."""
    return {
        part.path: Target(site.in_features, part.size, site.group) for site in lora_sites(model) for part in site.parts
    }


def attach_lora(model: VoxCPMModel, limits: LoRALimits) -> LoRAPool:
    """Give `model` a pool of `limits.max_loras` adapter slots on the linears named in `limits.modules`."""
    pool = LoRAPool(model, lora_sites(model), limits)
    model.adapter_rows = pool.rows
    model.feat_decoder.adapter_rows = pool.rows
    return pool
