"""Write a random LoRA adapter in the released layout for a checkpoint (tests and benchmarks).

    python -m engine.lora.make_adapter --checkpoint DIR --out DIR [--rank 8] [--alpha 16] [--groups lm,dit,proj]
        [--seed 0] [--scale 0.05]

A ~ N(0, 1/in) and B ~ N(0, scale^2): unlike a freshly initialised adapter (B = 0) it changes the output, by an
amount `scale` sets. It makes noise of another colour, not a voice.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from pathlib import Path

import torch

from engine.lora.format import GROUPS, PROJECTIONS, Adapter, LoRAConfig, Target, selected_targets, write_adapter


def random_adapter(targets: Mapping[str, Target], config: LoRAConfig, seed: int = 0, scale: float = 0.05) -> Adapter:
    """Random A/B for every linear `config` selects among `targets`."""
    gen = torch.Generator().manual_seed(seed)
    weights = {}
    for path, target in sorted(selected_targets(config, targets, "random adapter").items()):
        a = torch.randn(config.r, target.in_features, generator=gen) / target.in_features**0.5
        b = torch.randn(target.out_features, config.r, generator=gen) * scale
        weights[path] = (a, b)
    return Adapter(config, weights)


def checkpoint_targets(checkpoint: str | Path) -> dict[str, Target]:
    """The targetable linears of a checkpoint's model (built on the meta device: no weights are read)."""
    from engine.models.voxcpm.config import load_config
    from engine.models.voxcpm.lora import lora_targets
    from engine.models.voxcpm.model import VoxCPMModel

    config = load_config(Path(checkpoint))
    with torch.device("meta"):
        return lora_targets(VoxCPMModel(config))


def make_adapter(
    checkpoint: str | Path,
    out: str | Path,
    rank: int = 8,
    alpha: float = 16,
    groups: tuple[str, ...] = ("lm", "dit"),
    seed: int = 0,
    scale: float = 0.05,
) -> Path:
    targets = checkpoint_targets(checkpoint)
    has_fusion = any(path == "fusion_concat_proj" for path in targets)
    config = LoRAConfig(
        enable_lm="lm" in groups,
        enable_dit="dit" in groups,
        enable_proj="proj" in groups,
        r=rank,
        alpha=alpha,
        target_proj_modules=PROJECTIONS if has_fusion else PROJECTIONS[:3],
    )
    adapter = random_adapter(targets, config, seed, scale)
    adapter.base_model = str(checkpoint)
    return write_adapter(out, adapter)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--alpha", type=float, default=16)
    parser.add_argument("--groups", default="lm,dit", help=f"comma list of {', '.join(GROUPS)}")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--scale", type=float, default=0.05, help="standard deviation of B")
    args = parser.parse_args(argv)
    groups = tuple(g for g in args.groups.split(",") if g)
    if not groups or set(groups) - set(GROUPS):
        parser.error(f"--groups must name some of {', '.join(GROUPS)}")
    path = make_adapter(args.checkpoint, args.out, args.rank, args.alpha, groups, args.seed, args.scale)
    print(f"wrote a rank-{args.rank} adapter ({', '.join(groups)}) to {path}")


if __name__ == "__main__":
    main()
