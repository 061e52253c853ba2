"""The streaming VAE decode of one patch at batch on the GPU (fp16, as the engine runs it; random full-size weights of
`--variant`) and its row-wise passes alone. JSON lines:

- "pass": each decoder block's row-wise kernels at its shapes (C channels, L frames a patch): the Snake, the
  depthwise conv + Snake at each dilation (with `--dwconv-align`, at each of those alignment hints), the pointwise
  conv's bias + residual writing the next Snake; ms a call (a CUDA graph of `--repeat` calls) and the bytes each must
  move at the least over that time.
- "vae": the whole decode as one CUDA graph.
- with `--profile`: the GPU kernels of one eager decode at the largest batch, by kind and the heaviest by name
  (profile_step.kernel_breakdown).

    python3 benchmarks/vae_bench.py --batch 512 1024 [--profile]
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import sys
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.profile_step import graph_ms, kernel_breakdown
from engine import kernels
from engine.kernels import triton_ops
from engine.models.voxcpm.audio_vae import AudioVAE, AudioVAEConfig, random_state_dict
from engine.models.voxcpm.make_checkpoint import make_config
from engine.models.voxcpm.vae_stream import StreamingVAEDecoder

HALF = {"device": "cuda", "dtype": torch.float16}


def _timed(fn: Callable[[], object], repeat: int) -> float:
    def body() -> None:
        for _ in range(repeat):
            fn()

    return graph_ms(body, iters=10) / repeat


def _conv_snake(align: int | None, *args: object) -> object:
    """kernels.causal_conv_snake with triton_ops.DWCONV_ALIGN set to `align` for the call (None: as it is)."""
    default = triton_ops.DWCONV_ALIGN
    triton_ops.DWCONV_ALIGN = align or default
    try:
        return kernels.causal_conv_snake(*args)
    finally:
        triton_ops.DWCONV_ALIGN = default


def _passes(batch: int, channels: int, length: int, repeat: int, aligns: list[int | None]) -> None:
    x = torch.randn(batch, channels, length, **HALF)
    residual = torch.randn(batch, channels, length, **HALF)
    alpha, bias = torch.rand(1, channels, 1, **HALF) + 0.3, torch.randn(channels, **HALF)
    weight = torch.randn(channels, 1, 7, **HALF) / 3
    tensor = x.numel() * x.element_size()
    runs: list[tuple[str, Callable[[], object], int]] = [("snake", lambda: kernels.snake(x, alpha), 2 * tensor)]
    for dilation, align in itertools.product((1, 3, 9), aligns):
        context = torch.randn(batch, channels, 6 * dilation, **HALF)
        run = functools.partial(_conv_snake, align, x, context, weight, bias, dilation, alpha)
        runs.append((f"conv_snake_d{dilation}" + (f"_align{align}" if align else ""), run, 2 * tensor))
    # A unit's last pass after its pointwise conv (y, here x): bias + residual, the next Snake written, y not kept.
    end = functools.partial(triton_ops._bias_residual_, x, bias, residual, (alpha, None), False)
    runs.append(("bias_residual_snake", end, 3 * tensor))
    base = {"pass": True, "batch": batch, "channels": channels, "length": length}
    for name, run, least in runs:
        ms = _timed(run, repeat)
        print(json.dumps(base | {"kernel": name, "ms": round(ms, 4), "tb_s": round(least / ms / 1e9, 2)}), flush=True)


def _decoder(variant: str, batch: int) -> tuple[StreamingVAEDecoder, int]:
    raw = make_config(variant, "full")
    config = AudioVAEConfig.from_dict(raw["audio_vae_config"], 2 if raw["architecture"] == "voxcpm2" else 1)
    vae = AudioVAE(config)
    vae.load_state_dict(random_state_dict(config, seed=0))
    vae = vae.fold_weight_norm().eval().requires_grad_(False).to(**HALF)
    return StreamingVAEDecoder(vae, batch + 1, "cuda", torch.float16), raw["patch_size"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variant", default="voxcpm2", choices=["voxcpm-0.5b", "voxcpm1.5", "voxcpm2"])
    parser.add_argument("--batch", type=int, nargs="+", default=[512, 1024], help="streams")
    parser.add_argument("--repeat", type=int, default=5, help="calls per graph (pass lines)")
    parser.add_argument("--no-passes", action="store_true", help="the whole decode only")
    parser.add_argument("--dwconv-align", type=int, nargs="+", help="the depthwise conv at each DWCONV_ALIGN")
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    print(json.dumps({"gpu": torch.cuda.get_device_name(), "variant": args.variant}))
    with torch.no_grad():
        for batch in args.batch:
            decoder, frames = _decoder(args.variant, batch)
            config = decoder.vae.config
            length = frames
            for block, stride in enumerate(config.decoder_rates):
                length *= stride
                if not args.no_passes:
                    aligns = args.dwconv_align or [None]
                    _passes(batch, config.decoder_dim >> (block + 1), length, args.repeat, aligns)
            slots = torch.arange(batch, device="cuda")
            z = torch.randn(batch, config.latent_dim, frames, device="cuda")
            decode = functools.partial(decoder.decode, slots, z)
            print(json.dumps({"vae": True, "batch": batch, "ms": round(graph_ms(decode), 3)}), flush=True)
            if args.profile and batch == max(args.batch):
                print(json.dumps({"profile": True, "batch": batch} | kernel_breakdown(decode, top=25)), flush=True)
            del decoder


if __name__ == "__main__":
    main()
