"""Whether cuDNN's transposed conv runs without its layout conversions (nchwToNhwc / nhwcToNchw, ~4.2 ms of a B=1,024
VoxCPM2 step) when the input and weight are already channels-last (NLC strides): per decoder block of the full-size
VoxCPM2 VAE (fp16, one patch), ms of the engine's upsampling (kernels.causal_conv_transpose_snake), of cuDNN's
conv_transpose1d on NCL tensors, on NLC-strided ones, and of the 2-D call on channels_last 4-D views, with the
kernels each launches; `engine_cl`: the engine's upsampling with the weight channels-last, as folded (call 4 on)."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from benchmarks.vae_upsample_bench import _timed
from engine import kernels
from engine.models.voxcpm.make_checkpoint import make_config


def kernels_of(fn) -> list[str]:
    fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return [e.name[:70] for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]


def nlc(t: torch.Tensor) -> torch.Tensor:
    return t.transpose(1, 2).contiguous().transpose(1, 2)


def block(batch: int, cin: int, length: int, stride: int) -> dict[str, object]:
    half = {"device": "cuda", "dtype": torch.float16}
    cout = cin // 2
    x = torch.randn(batch, cin, length, **half)
    context = torch.randn(batch, cin, 1, **half)
    weight = torch.randn(cin, cout, 2 * stride, **half) / math.sqrt(cin)
    bias, alpha = torch.randn(cout, **half), torch.rand(1, cout, 1, **half) + 0.5
    x_l, w_l = nlc(x), nlc(weight)
    x4 = x.unsqueeze(2).contiguous(memory_format=torch.channels_last)
    w4 = weight.unsqueeze(2).contiguous(memory_format=torch.channels_last)
    calls = {
        "engine": lambda: kernels.causal_conv_transpose_snake(x, context, weight, bias, stride, alpha),
        "engine_cl": lambda: kernels.causal_conv_transpose_snake(x, context, w_l, bias, stride, alpha),
        "ncl": lambda: F.conv_transpose1d(x, weight, None, stride),
        "nlc": lambda: F.conv_transpose1d(x_l, w_l, None, stride),
        "cl2d": lambda: F.conv_transpose2d(x4, w4, None, (1, stride)),
    }
    line: dict[str, object] = {}
    ref = F.conv_transpose1d(x, weight, None, stride).float()
    for name, fn in calls.items():
        line[f"{name}_ms"] = round(_timed(fn, 5), 4)
        line[f"{name}_kernels"] = kernels_of(fn)
        if name in ("nlc", "cl2d"):
            y = fn()
            line[f"{name}_out_strides"] = list(y.stride())
            line[f"{name}_max_err"] = round(float((y.float().reshape(ref.shape) - ref).abs().max()), 5)
    return line


def main() -> None:
    vae = make_config("voxcpm2", "full")["audio_vae_config"]
    print(json.dumps({"gpu": torch.cuda.get_device_name(), "cudnn": torch.backends.cudnn.version()}))
    with torch.no_grad():
        channels, length = vae["decoder_dim"], 4
        for i, stride in enumerate(vae["decoder_rates"]):
            head = {"batch": 1024, "block": i, "cin": channels, "length": length, "stride": stride}
            print(json.dumps(head | block(1024, channels, length, stride)), flush=True)
            channels, length = channels // 2, length * stride


if __name__ == "__main__":
    main()
