"""How much of the streaming VAE decode's upsampling a GEMM could take back from cuDNN, on the GPU: for each decoder
block of the full-size VoxCPM2 VAE at B streams (fp16, one patch's frames), the engine's upsampling
(`kernels.causal_conv_transpose_snake`: cuDNN's transposed conv with its layout conversions, the carried frame's
part, then the bias + Snake pass) against what a GEMM formulation must do at the least: the two taps of every phase
as one product, W [2 * stride * C_out, C_in] @ x [C_in, B * L] (with the transposed copy of x it needs), and the
pass that would interleave the phases, add the bias and write the Snake (timed as the engine's bias + Snake pass over
twice the output, what that pass would read). One JSON line per block: ms for each (CUDA graphs of `--repeat` calls)
and the difference, the most the GEMM form could save.

    python3 benchmarks/vae_upsample_bench.py --batch 512 1024
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.profile_step import graph_ms
from engine import kernels
from engine.models.voxcpm.make_checkpoint import make_config


def _timed(fn: Callable[[], object], repeat: int) -> float:
    def body() -> None:
        for _ in range(repeat):
            fn()

    return statistics.median(graph_ms(body, iters=10) for _ in range(3)) / repeat


def _block(batch: int, cin: int, length: int, stride: int, repeat: int) -> dict[str, float]:
    half = {"device": "cuda", "dtype": torch.float16}
    cout = cin // 2
    x = torch.randn(batch, cin, length, **half)
    context = torch.randn(batch, cin, 1, **half)
    weight = torch.randn(cin, cout, 2 * stride, **half) / math.sqrt(cin)
    bias, alpha = torch.randn(cout, **half), torch.rand(1, cout, 1, **half) + 0.5
    affine = (torch.ones_like(alpha), bias.view(1, -1, 1))
    taps = weight.permute(1, 2, 0).reshape(cout * 2 * stride, cin).contiguous()  # both taps of every phase
    out = torch.randn(batch, cout, 2 * length * stride, **half)  # what the interleaving pass would read
    engine = _timed(lambda: kernels.causal_conv_transpose_snake(x, context, weight, bias, stride, alpha), repeat)
    gemm = _timed(lambda: taps @ x.transpose(0, 1).reshape(cin, batch * length), repeat)
    combine = _timed(lambda: kernels.snake(out, alpha, affine), repeat)
    line = {"engine_ms": round(engine, 4), "gemm_ms": round(gemm, 4), "combine_ms": round(combine, 4)}
    return line | {"most_saved_ms": round(engine - gemm - combine, 4)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, nargs="+", default=[512, 1024], help="streams")
    parser.add_argument("--frames", type=int, default=4, help="latent frames a patch decodes (VoxCPM2: 4)")
    parser.add_argument("--repeat", type=int, default=5, help="calls per graph")
    args = parser.parse_args()
    vae = make_config("voxcpm2", "full")["audio_vae_config"]
    print(json.dumps({"gpu": torch.cuda.get_device_name()}))
    with torch.no_grad():
        for batch in args.batch:
            channels, length = vae["decoder_dim"], args.frames
            for block, stride in enumerate(vae["decoder_rates"]):
                line = {"batch": batch, "block": block, "cin": channels, "length": length, "stride": stride}
                print(json.dumps(line | _block(batch, channels, length, stride, args.repeat)), flush=True)
                channels, length = channels // 2, length * stride


if __name__ == "__main__":
    main()
