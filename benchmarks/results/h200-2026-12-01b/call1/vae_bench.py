"""The streaming VAE decode of one patch at batch on the GPU (fp16, as the engine runs it; random full-size weights of
`--variant`), with each residual unit as one kernel (kernels.residual_unit) or as its three passes. JSON lines:

- "unit": one residual unit of each decoder block's width C (its frames L a patch, dilation 9, its last pass writing
  the next Snake as the engine's do) at each batch: the three passes (`triton_ops.RESIDUAL_UNIT_MAX_CHANNELS` = 0)
  against the kernel at each launch (with `--sweep`, at the largest batch and widths up to the kernel's default: its
  accumulator tile, input-channel chunk and warps), ms a call (a CUDA graph of `--repeat` calls) and the bytes it
  must move at the least (its input, the residual, the output and the Snake) over that time.
- "vae": the whole decode as one CUDA graph, for each width up to which the kernel runs (0: never).
- with `--profile`: the GPU kernels of one eager decode at the largest batch, three passes and the default, by kind and
  the heaviest by name (profile_step.kernel_breakdown).

    python3 benchmarks/vae_bench.py --batch 512 1024 [--sweep] [--profile]
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import itertools
import json
import sys
from collections.abc import Callable, Iterator
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


@contextlib.contextmanager
def launch(**constants: int) -> Iterator[None]:
    """triton_ops.RESIDUAL_UNIT_<NAME> set to these values for the duration (read at every launch)."""
    names = {f"RESIDUAL_UNIT_{name.upper()}": value for name, value in constants.items()}
    previous = {name: getattr(triton_ops, name) for name in names}
    for name, value in names.items():
        setattr(triton_ops, name, value)
    try:
        yield
    finally:
        for name, value in previous.items():
            setattr(triton_ops, name, value)


def _timed(fn: Callable[[], object], repeat: int) -> float:
    def body() -> None:
        for _ in range(repeat):
            fn()

    return graph_ms(body, iters=10) / repeat


def _unit(batch: int, channels: int, length: int, sweep: bool, repeat: int) -> None:
    dilation = 9
    x = torch.randn(batch, channels, length, **HALF)
    activated = torch.randn(batch, channels, length, **HALF)
    context = torch.randn(batch, channels, 6 * dilation, **HALF)
    dw = torch.randn(channels, 1, 7, **HALF) / 3
    pw = torch.randn(channels, channels, 1, **HALF) / channels**0.5
    alpha, bias = torch.rand(1, channels, 1, **HALF) + 0.3, torch.randn(channels, **HALF)
    then = (torch.rand(1, channels, 1, **HALF) + 0.3, None)

    def unit() -> object:
        return kernels.residual_unit(x, activated, context, dw, bias, dilation, alpha, pw, bias, then, True)

    least = 4 * x.numel() * x.element_size()
    base = {"unit": True, "batch": batch, "channels": channels, "length": length}

    def report(line: dict[str, object], ms: float) -> None:
        print(json.dumps(base | line | {"ms": round(ms, 4), "tb_s": round(least / ms / 1e9, 2)}), flush=True)

    with launch(max_channels=0):
        report({"path": "three_passes"}, _timed(unit, repeat))
    configs = [(tile, 32, warps) for tile, warps in itertools.product((4096, 8192, 16384), (4, 8))]
    configs += [(8192, 16, 4), (8192, 64, 4)]
    for tile, ci, warps in configs if sweep and channels <= triton_ops.RESIDUAL_UNIT_MAX_CHANNELS else [(0, 0, 0)]:
        chosen = {"tile": tile, "ci": ci, "warps": warps} if tile else {}
        with launch(max_channels=channels, **chosen):
            report({"path": "kernel", **chosen}, _timed(unit, repeat))


def _decoder(variant: str, batch: int) -> tuple[StreamingVAEDecoder, int]:
    raw = make_config(variant, "full")
    config = AudioVAEConfig.from_dict(raw["audio_vae_config"], 2 if raw["architecture"] == "voxcpm2" else 1)
    vae = AudioVAE(config)
    vae.load_state_dict(random_state_dict(config, seed=0))
    vae = vae.fold_weight_norm().eval().requires_grad_(False).to(**HALF)
    return StreamingVAEDecoder(vae, batch + 1, "cuda", torch.float16), raw["patch_size"]


def _decode(decoder: StreamingVAEDecoder, frames: int, batch: int, widths: list[int], profile: bool) -> None:
    slots = torch.arange(batch, device="cuda")
    z = torch.randn(batch, decoder.vae.config.latent_dim, frames, device="cuda")
    decode = functools.partial(decoder.decode, slots, z)
    for width in widths:
        with launch(max_channels=width):
            ms = graph_ms(decode)
        print(json.dumps({"vae": True, "batch": batch, "max_channels": width, "ms": round(ms, 3)}), flush=True)
    if profile:
        for width in (0, triton_ops.RESIDUAL_UNIT_MAX_CHANNELS):
            with launch(max_channels=width):
                breakdown = kernel_breakdown(decode, top=25)
            print(json.dumps({"profile": True, "batch": batch, "max_channels": width} | breakdown), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variant", default="voxcpm2", choices=["voxcpm-0.5b", "voxcpm1.5", "voxcpm2"])
    parser.add_argument("--batch", type=int, nargs="+", default=[512, 1024], help="streams")
    parser.add_argument("--widths", type=int, nargs="+", default=[0, 128, 256, 512], help="kernel up to C (vae lines)")
    parser.add_argument("--repeat", type=int, default=5, help="calls per graph (unit lines)")
    parser.add_argument("--sweep", action="store_true", help="every launch of the unit kernel")
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    print(json.dumps({"gpu": torch.cuda.get_device_name(), "variant": args.variant}))
    with torch.no_grad():
        for batch in args.batch:
            decoder, frames = _decoder(args.variant, batch)
            cfg = decoder.vae.config
            length = frames
            for block, stride in enumerate(cfg.decoder_rates):
                length *= stride
                channels = cfg.decoder_dim >> (block + 1)
                if channels <= max(args.widths):
                    _unit(batch, channels, length, args.sweep and batch == max(args.batch), args.repeat)
            _decode(decoder, frames, batch, args.widths, args.profile and batch == max(args.batch))


if __name__ == "__main__":
    main()
