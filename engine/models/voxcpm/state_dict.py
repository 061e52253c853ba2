"""Strict checks of a checkpoint's tensors against what a module expects, worded once for both loaders (the model
weights in `checkpoint.py`, the AudioVAE in `audio_vae.py`): a wrong file fails naming every tensor at fault."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

Shape = Sequence[int]  # torch.Size or any sequence of ints


def name_list(names: Sequence[str], limit: int = 12) -> str:
    """`names` joined for an error message; past `limit` the rest is counted, not listed."""
    shown = ", ".join(names[:limit])
    return shown + (f", ... ({len(names) - limit} more)" if len(names) > limit else "")


def mismatches(found: Mapping[str, Shape], expected: Mapping[str, Shape]) -> str:
    """Every unknown, missing and mis-shaped tensor of `found` (name -> shape), named; "" when it matches exactly."""
    unknown = sorted(found.keys() - expected.keys())
    missing = sorted(expected.keys() - found.keys())
    mis_shaped = sorted(
        f"{name} {tuple(found[name])} (expected {tuple(shape)})"
        for name, shape in expected.items()
        if name in found and tuple(found[name]) != tuple(shape)
    )
    return "; ".join(
        f"{label}: {name_list(names)}"
        for label, names in (("unknown tensors", unknown), ("missing tensors", missing), ("wrong shapes", mis_shaped))
        if names
    )
