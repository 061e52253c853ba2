"""AudioVAE of the VoxCPM family (v1: VoxCPM-0.5B / VoxCPM1.5, v2: VoxCPM2): config, module, loading, random weights.

This file owns:

* ``AudioVAEConfig`` -- the ``audio_vae_config`` block of config.json for both versions, with the reference defaults.
* ``AudioVAE`` -- one causal-conv codec module for both versions. Its parameter and buffer names are those of the
  released ``audiovae.pth`` (weight-norm ``weight_g``/``weight_v``, ``decoder.sr_bin_boundaries``,
  ``decoder.sr_cond_model.*``), so a release state dict loads strictly. The v2 differences are parameters of the
  same code: sample-rate conditioning (present iff ``sr_bin_boundaries`` is set), decoder rates/width, and the
  encoder's causal padding of odd strides (v2 pads one sample less, see ``_strided_left_pad``).
* ``StreamState`` -- the per-call view of the decoder's causal context that ``vae_stream.StreamingVAEDecoder``
  threads through ``AudioVAE.decoder``; every causal conv of the decoder owns a fixed slice of a flat per-slot state.
* ``load_audio_vae``, ``random_state_dict``, ``AudioVAE.fold_weight_norm``.

Every layer takes ``(x, stream)``; ``stream=None`` is the offline path (zero left padding, as in the reference).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from itertools import pairwise
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from engine import kernels
from engine.kernels import NextSnake
from engine.models.voxcpm.state_dict import mismatches

# Reference defaults (voxcpm 2.0.3: modules/audiovae/audio_vae.py AudioVAEConfig, audio_vae_v2.py AudioVAEConfig).
_DEFAULTS: dict[int, dict[str, Any]] = {
    1: {
        "encoder_dim": 128,
        "encoder_rates": [2, 5, 8, 8],
        "latent_dim": 64,
        "decoder_dim": 1536,
        "decoder_rates": [8, 8, 5, 2],
        "depthwise": True,
        "sample_rate": 16000,
        "use_noise_block": False,
    },
    2: {
        "encoder_dim": 128,
        "encoder_rates": [2, 5, 8, 8],
        "latent_dim": 64,
        "decoder_dim": 2048,
        "decoder_rates": [8, 6, 5, 2, 2, 2],
        "depthwise": True,
        "sample_rate": 16000,
        "out_sample_rate": 48000,
        "use_noise_block": False,
        "sr_bin_boundaries": [20000, 30000, 40000],
        "cond_type": "scale_bias",
        "cond_dim": 128,
        "cond_out_layer": False,
    },
}
_COND_TYPES = ("scale_bias", "scale_bias_init", "add", "concat")


@dataclass(frozen=True, slots=True)
class AudioVAEConfig:
    """``audio_vae_config`` of config.json. v1 has no sample-rate conditioning and decodes at ``sample_rate``."""

    version: int = 2  # 1: VoxCPM-0.5B / VoxCPM1.5 (audio_vae.py), 2: VoxCPM2 (audio_vae_v2.py)
    encoder_dim: int = 128
    encoder_rates: tuple[int, ...] = (2, 5, 8, 8)
    latent_dim: int = 64
    decoder_dim: int = 2048
    decoder_rates: tuple[int, ...] = (8, 6, 5, 2, 2, 2)
    depthwise: bool = True
    sample_rate: int = 16000  # encoder input rate
    out_sample_rate: int = 48000  # decoder output rate (v1: == sample_rate)
    use_noise_block: bool = False
    sr_bin_boundaries: tuple[int, ...] | None = (20000, 30000, 40000)  # None: no SR conditioning layers
    cond_type: str = "scale_bias"
    cond_dim: int = 128
    cond_out_layer: bool = False

    def __post_init__(self) -> None:
        if self.version not in (1, 2):
            raise ValueError(f"AudioVAE version must be 1 or 2, got {self.version}")
        if self.version == 1 and (self.sr_bin_boundaries is not None or self.out_sample_rate != self.sample_rate):
            raise ValueError("AudioVAE v1 has no sample-rate conditioning and decodes at sample_rate")
        if self.cond_type not in _COND_TYPES:
            raise ValueError(f"cond_type must be one of {_COND_TYPES}, got {self.cond_type!r}")
        if self.cond_type == "concat" and not self.cond_out_layer:
            raise ValueError("cond_type 'concat' needs cond_out_layer=True (as in the reference)")
        if self.decoder_dim % 2 ** len(self.decoder_rates):
            raise ValueError("decoder_dim must be divisible by 2**len(decoder_rates)")

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None, version: int) -> AudioVAEConfig:
        """Build from config.json's ``audio_vae_config`` (None = all defaults) with the reference defaults of
        ``version``. Like the reference (pydantic ``extra="ignore"``), unknown keys are ignored; so are the v2-only
        keys for v1, as in the v1 reference class."""
        if version not in _DEFAULTS:
            raise ValueError(f"AudioVAE version must be 1 or 2, got {version}")
        known = _DEFAULTS[version]
        values = {**known, **{k: v for k, v in (d or {}).items() if k in known}}
        if values["latent_dim"] is None:  # reference: latent_dim None -> width of the last encoder stage
            values["latent_dim"] = values["encoder_dim"] * 2 ** len(values["encoder_rates"])
        if version == 1:
            values.update(out_sample_rate=values["sample_rate"], sr_bin_boundaries=None)
        for key in ("encoder_rates", "decoder_rates", "sr_bin_boundaries"):
            if values.get(key) is not None:
                values[key] = tuple(int(v) for v in values[key])
        return cls(version=version, **values)

    def to_dict(self) -> dict[str, Any]:
        """The config.json form (what ``from_dict`` reads), without ``version``."""
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name in _DEFAULTS[self.version]}
        return {k: list(v) if isinstance(v, tuple) else v for k, v in out.items()}

    @property
    def chunk_size(self) -> int:
        """Input samples (at ``sample_rate``) per latent frame."""
        return math.prod(self.encoder_rates)

    @property
    def decode_chunk_size(self) -> int:
        """Output samples (at ``out_sample_rate``) per latent frame."""
        return math.prod(self.decoder_rates)


# ----------------------------------------------------------------------------------------------------------------------
# Streaming context


class StreamState:
    """Causal context of one decoder call for a batch of streams.

    ``prev`` [B, state_size] holds, per stream, the left context every stateful conv needs (gathered from the
    per-slot store); the decoder writes the context for the *next* call into ``next`` (same shape), which the caller
    scatters back. Each conv owns the slice ``[offset, offset + C * ctx)`` viewed as [B, C, ctx]. Reading ``prev`` and
    writing ``next`` (never the store itself) keeps a failed call from corrupting state and keeps shapes fixed.
    """

    __slots__ = ("next", "prev")

    def __init__(self, prev: Tensor, next: Tensor) -> None:
        self.prev = prev
        self.next = next

    def carry(self, x: Tensor, offset: int, ctx: int) -> Tensor:
        """Return the ``ctx`` frames before x ([B, C, ctx], a view of ``prev``) and record the last ``ctx`` frames of
        ``cat(context, x)`` as the next call's context."""
        b, c, length = x.shape
        n = c * ctx
        context = self.prev[:, offset : offset + n].view(b, c, ctx)
        following = self.next[:, offset : offset + n].view(b, c, ctx)
        if length >= ctx:
            following.copy_(x[..., length - ctx :])
        else:
            following.copy_(torch.cat([context[..., length:], x], dim=-1))
        return context

    def extend(self, x: Tensor, offset: int, ctx: int) -> Tensor:
        """Return ``cat(context, x)`` along time (recording the next context, see ``carry``)."""
        return torch.cat([self.carry(x, offset, ctx), x], dim=-1)


# ----------------------------------------------------------------------------------------------------------------------
# Layers. All take (x, stream) so that containers can thread the streaming context uniformly.


class WeightNormConv(nn.Module):
    """Weight-normed conv parameters named like ``torch.nn.utils.weight_norm`` (dim 0): ``weight_g``/``weight_v``,
    or a plain ``weight`` after ``fold()``. ``ctx`` = left-context frames (of ``cin`` channels) carried between
    streaming calls; ``state_offset`` is assigned by the decoder (None in the encoder, which does not stream)."""

    def __init__(self, weight_shape: tuple[int, int, int], cin: int, cout: int, bias: bool, ctx: int) -> None:
        super().__init__()
        self.weight_v = nn.Parameter(torch.empty(weight_shape))
        self.weight_g = nn.Parameter(torch.empty(weight_shape[0], 1, 1))
        self.bias = nn.Parameter(torch.empty(cout)) if bias else None
        self.cin = cin
        self.ctx = ctx
        self.state_offset: int | None = None

    def conv_weight(self) -> Tensor:
        if "weight" in self._parameters:
            return self._parameters["weight"]
        # torch._weight_norm is the op torch.nn.utils.weight_norm uses: identical weights to the reference.
        return torch._weight_norm(self.weight_v, self.weight_g, 0)

    def fold(self) -> None:
        """Replace weight_g/weight_v by the weight they define (no per-call norm; needed before casting to bf16)."""
        if "weight" in self._parameters:
            return
        w = self.conv_weight().detach()
        del self.weight_g, self.weight_v
        self.register_parameter("weight", nn.Parameter(w, requires_grad=False))

    def _context(self, x: Tensor, stream: StreamState | None) -> Tensor:
        """x with its ``ctx`` left-context frames prepended."""
        if self.ctx == 0:
            return x
        if stream is None:
            return F.pad(x, (self.ctx, 0))
        assert self.state_offset is not None, "stream state given to a conv without a state slot"
        return stream.extend(x, self.state_offset, self.ctx)

    def left_context(self, x: Tensor, stream: StreamState | None) -> Tensor:
        """Only the ``ctx`` frames before x ([B, C, ctx]): zeros offline, the carried frames when streaming."""
        if stream is None:
            return x.new_zeros(x.shape[0], x.shape[1], self.ctx)
        assert self.state_offset is not None, "stream state given to a conv without a state slot"
        return stream.carry(x, self.state_offset, self.ctx)


class CausalConv1d(WeightNormConv):
    """Reference ``CausalConv1d``: left-pads ``2*padding - output_padding`` zeros (v1 ignores output_padding)."""

    def __init__(
        self,
        cin: int,
        cout: int,
        kernel_size: int,
        *,
        left_pad: int = 0,
        stride: int = 1,
        dilation: int = 1,
        groups: int = 1,
        bias: bool = True,
    ) -> None:
        super().__init__((cout, cin // groups, kernel_size), cin, cout, bias, left_pad)
        self.stride, self.dilation, self.groups = stride, dilation, groups

    def forward(self, x: Tensor, stream: StreamState | None = None) -> Tensor:
        if stream is not None and self.ctx > 0 and self.stride == 1 and self.groups == 1:
            # Streaming: the conv reads the carried frames where they lie (the output conv, 32 channels to 1, in a
            # fused kernel; the rest as conv1d of the concatenation, which is the twin).
            context = self.left_context(x, stream)
            return kernels.causal_conv(x, context, self.conv_weight(), self.bias, self.dilation)
        x = self._context(x, stream)
        return F.conv1d(x, self.conv_weight(), self.bias, self.stride, 0, self.dilation, self.groups)


class CausalConvTranspose1d(WeightNormConv):
    """Reference ``CausalTransposeConv1d`` with kernel 2*stride: output cropped by ``trim = 2*padding -
    output_padding`` (= stride) on the right, i.e. exactly ``stride`` samples per input frame. Output frame block t
    depends on input frames t-1 and t, so streaming carries ``ctx = (k-1)//stride = 1`` input frame and drops the
    ``ctx*stride`` output samples that belong to the previous call."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        kernel = 2 * stride
        super().__init__((cin, cout, kernel), cin, cout, True, (kernel - 1) // stride)
        self.stride = stride
        self.trim = 2 * math.ceil(stride / 2) - stride % 2

    def forward(self, x: Tensor, stream: StreamState | None = None) -> Tensor:
        if stream is not None:  # the carried frame is not concatenated (trim == stride for kernel 2*stride)
            return kernels.causal_conv_transpose(
                x, self.left_context(x, stream), self.conv_weight(), self.bias, self.stride
            )
        return kernels.conv_transpose_crop(x, self.conv_weight(), self.bias, self.stride, 0, self.trim)

    def forward_snake(self, x: Tensor, stream: StreamState | None, alpha: Tensor) -> tuple[Tensor, Tensor]:
        """(output, its Snake with ``alpha``): the Snake comes from the pass that adds the bias when streaming."""
        if stream is not None:
            return kernels.causal_conv_transpose_snake(
                x, self.left_context(x, stream), self.conv_weight(), self.bias, self.stride, alpha
            )
        y = self(x)
        return y, kernels.snake(y, alpha)


class Snake1d(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.alpha = nn.Parameter(torch.empty(1, channels, 1))

    def forward(self, x: Tensor, stream: StreamState | None = None) -> Tensor:
        # The reference's scripted snake (x + sin²(αx)/α, with its 1e-9 guard); one fused pass on CUDA.
        return kernels.snake(x, self.alpha)


class NoiseBlock(nn.Module):
    """Reference ``NoiseBlock`` (off in every release): adds ``randn * linear(x)``; not reproducible when streaming."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.linear = CausalConv1d(dim, dim, 1, bias=False)

    def forward(self, x: Tensor, stream: StreamState | None = None) -> Tensor:
        noise = torch.randn(x.shape[0], 1, x.shape[-1], device=x.device, dtype=x.dtype)
        return x + noise * self.linear(x)


class _Chain(nn.ModuleList):
    """``nn.Sequential`` that threads the stream state (same child names ``0, 1, ...``)."""

    def forward(self, x: Tensor, stream: StreamState | None = None) -> Tensor:
        for layer in self:
            x = layer(x, stream)
        return x


class _Block(nn.Module):
    """Holds a chain under the name ``block`` (reference encoder/decoder blocks)."""

    def __init__(self, layers: Iterable[nn.Module]) -> None:
        super().__init__()
        self.block = _Chain(layers)

    def forward(self, x: Tensor, stream: StreamState | None = None) -> Tensor:
        return self.block(x, stream)


class ResidualUnit(_Block):
    """Snake, k7 dilated (depthwise) conv, Snake, pointwise conv; plus the input.

    The dilated conv and the Snake after it run as one kernel (``kernels.causal_conv_snake``) that reads the causal
    context where it lies instead of concatenating it; the pointwise conv's bias and the residual add run as one
    pass (``kernels.pointwise_residual``): the same arithmetic as the chain, in fewer passes.
    """

    def __init__(self, dim: int, dilation: int, groups: int) -> None:
        super().__init__(
            [
                Snake1d(dim),
                CausalConv1d(dim, dim, 7, left_pad=6 * dilation, dilation=dilation, groups=groups),
                Snake1d(dim),
                CausalConv1d(dim, dim, 1),
            ]
        )

    def forward(self, x: Tensor, stream: StreamState | None = None) -> Tensor:
        return self.from_activated(x, self.block[0](x), stream)

    def from_activated(self, x: Tensor, activated: Tensor, stream: StreamState | None) -> Tensor:
        """The unit over x, whose first Snake's output ``activated`` is."""
        h = self._branch(activated, stream)
        _, _, _, pointwise = self.block
        return kernels.pointwise_residual(h, pointwise.conv_weight(), pointwise.bias, x)  # k=1: no causal context

    @property
    def alpha(self) -> Tensor:
        """The first Snake's: a decoder block has the layer before the unit apply it (``forward_snake``)."""
        return self.block[0].alpha

    def forward_snake(
        self, x: Tensor, activated: Tensor, stream: StreamState | None, then: NextSnake, keep: bool
    ) -> tuple[Tensor | None, Tensor]:
        """``from_activated``, and ``then`` = (alpha, affine), the next layer's Snake, applied by the unit's last pass:
        (the output, or None unless ``keep``; the next Snake's output)."""
        h = self._branch(activated, stream)
        _, _, _, pointwise = self.block
        alpha, affine = then
        return kernels.pointwise_residual_snake(h, pointwise.conv_weight(), pointwise.bias, x, alpha, affine, keep)

    def _branch(self, activated: Tensor, stream: StreamState | None) -> Tensor:
        _, conv, snake_out, _ = self.block
        context = conv.left_context(activated, stream)
        return kernels.causal_conv_snake(
            activated, context, conv.conv_weight(), conv.bias, conv.dilation, snake_out.alpha
        )


class DecoderBlock(_Block):
    """Snake, upsampling transposed conv, (noise,) residual units. ``affine`` (scale, shift) is a per-channel
    affine map of the input (the sample-rate conditioning before the block) that the first Snake applies as it
    loads x, instead of two extra passes over the block's input.

    Every Snake after the first is applied by the pass that finishes the tensor it reads (the upsampling's bias, a
    unit's bias + residual; ``kernels.pointwise_residual_snake``), not by a pass of its own. With ``then``, the next
    layer's first Snake (a block's, or the decoder's last), the last unit applies that one too and the block returns
    its output rather than its own, which nothing else reads; ``activated``: x is this block's first Snake's output
    already (the block before applied it)."""

    def forward(
        self,
        x: Tensor,
        stream: StreamState | None = None,
        affine: tuple[Tensor, Tensor] | None = None,
        then: NextSnake | None = None,
        activated: bool = False,
    ) -> Tensor:
        snake, upsample, *rest = self.block
        units = [layer for layer in rest if isinstance(layer, ResidualUnit)]
        noise = rest[: len(rest) - len(units)]  # a noise block (off in every release): the first unit's Snake apart
        if not activated:
            x = kernels.snake(x, snake.alpha, affine)
        if noise:
            x = upsample(x, stream)
            for layer in noise:
                x = layer(x, stream)
            act = kernels.snake(x, units[0].alpha)
        else:
            x, act = upsample.forward_snake(x, stream, units[0].alpha)
        for unit, following in pairwise(units):
            y, act = unit.forward_snake(x, act, stream, (following.alpha, None), keep=True)
            assert y is not None
            x = y
        if then is None:
            return units[-1].from_activated(x, act, stream)
        return units[-1].forward_snake(x, act, stream, then, keep=False)[1]


def _residual_units(dim: int, groups: int) -> list[nn.Module]:
    return [ResidualUnit(dim, dilation, groups) for dilation in (1, 3, 9)]


def _strided_left_pad(stride: int, version: int) -> int:
    """Left padding of an encoder downsampling conv (kernel 2*stride, reference ``padding=ceil(stride/2)``).
    v1's CausalConv1d pads ``2*padding``; v2's passes ``output_padding=stride%2`` and pads one sample less for odd
    strides. Output lengths agree, but the alignment (hence the latents) differs, so this must follow the version."""
    pad = 2 * math.ceil(stride / 2)
    return pad - stride % 2 if version >= 2 else pad


class SampleRateCondition(nn.Module):
    """Reference ``SampleRateConditionLayer``: per-SR-bucket channel affine / add / concat (+ optional out layer)."""

    def __init__(self, dim: int, buckets: int, cond_type: str, cond_dim: int, out_layer: bool) -> None:
        super().__init__()
        self.cond_type = cond_type
        if cond_type in ("scale_bias", "scale_bias_init"):
            self.scale_embed = nn.Embedding(buckets, dim)
            self.bias_embed = nn.Embedding(buckets, dim)
        else:
            self.cond_embed = nn.Embedding(buckets, cond_dim if cond_type == "concat" else dim)
        out_in = dim + cond_dim if cond_type == "concat" else dim
        self.out_layer = _Chain([Snake1d(out_in), CausalConv1d(out_in, dim, 1)]) if out_layer else None

    def channel_affine(self, bucket: Tensor) -> tuple[Tensor, Tensor] | None:
        """(scale, shift), each [1, C, 1], when this condition is exactly x * scale + shift (scale_bias types without
        an out layer), so that the block after it can fold it into its first Snake; else None."""
        if self.out_layer is not None or self.cond_type not in ("scale_bias", "scale_bias_init"):
            return None
        return self.scale_embed(bucket)[..., None], self.bias_embed(bucket)[..., None]

    def forward(self, x: Tensor, bucket: Tensor, stream: StreamState | None = None) -> Tensor:
        """``bucket``: long [1] (one output rate for the whole batch). Embedding lookups, not ``weight[bucket]``:
        advanced indexing with a device tensor syncs with the host, which breaks CUDA-graph capture."""
        if self.cond_type == "concat":
            x = torch.cat([x, self.cond_embed(bucket)[..., None].expand(x.shape[0], -1, x.shape[-1])], dim=1)
        elif self.cond_type == "add":
            x = x + self.cond_embed(bucket)[..., None]
        else:
            scale, shift = self.scale_embed(bucket)[..., None], self.bias_embed(bucket)[..., None]
            x = x * scale + shift
        return x if self.out_layer is None else self.out_layer(x, stream)


class CausalEncoder(nn.Module):
    def __init__(self, cfg: AudioVAEConfig) -> None:
        super().__init__()
        dim = cfg.encoder_dim
        layers: list[nn.Module] = [CausalConv1d(1, dim, 7, left_pad=6)]
        for stride in cfg.encoder_rates:
            groups = dim if cfg.depthwise else 1
            pad = _strided_left_pad(stride, cfg.version)
            layers.append(
                _Block(
                    [
                        *_residual_units(dim, groups),
                        Snake1d(dim),
                        CausalConv1d(dim, 2 * dim, 2 * stride, left_pad=pad, stride=stride),
                    ]
                )
            )
            dim *= 2
        self.block = _Chain(layers)
        self.fc_mu = CausalConv1d(dim, cfg.latent_dim, 3, left_pad=2)
        self.fc_logvar = CausalConv1d(dim, cfg.latent_dim, 3, left_pad=2)  # unused at inference; in the checkpoint

    def forward(self, x: Tensor) -> Tensor:
        return self.fc_mu(self.block(x))


class CausalDecoder(nn.Module):
    """``model``: [input conv(s), one upsampling block per rate, Snake, output conv] (+ tanh, parameter-free). With
    SR conditioning, ``sr_cond_model[i]`` (None except at the blocks) is applied before ``model[i]``."""

    def __init__(self, cfg: AudioVAEConfig) -> None:
        super().__init__()
        d, c = cfg.latent_dim, cfg.decoder_dim
        if cfg.depthwise:
            layers: list[nn.Module] = [CausalConv1d(d, d, 7, left_pad=6, groups=d), CausalConv1d(d, c, 1)]
        else:
            layers = [CausalConv1d(d, c, 7, left_pad=6)]
        first_block = len(layers)
        for i, stride in enumerate(cfg.decoder_rates):
            cin, cout = c >> i, c >> (i + 1)
            noise = [NoiseBlock(cout)] if cfg.use_noise_block else []
            groups = cout if cfg.depthwise else 1
            layers.append(
                DecoderBlock(
                    [Snake1d(cin), CausalConvTranspose1d(cin, cout, stride), *noise, *_residual_units(cout, groups)]
                )
            )
        cout = c >> len(cfg.decoder_rates)
        layers += [Snake1d(cout), CausalConv1d(cout, 1, 7, left_pad=6)]
        self.model = _Chain(layers)

        self.sr_cond_model: nn.ModuleList | None = None
        if cfg.sr_bin_boundaries is not None:
            buckets = len(cfg.sr_bin_boundaries) + 1
            cond: list[nn.Module | None] = [None] * len(layers)
            for i in range(len(cfg.decoder_rates)):
                cond[first_block + i] = SampleRateCondition(
                    c >> i, buckets, cfg.cond_type, cfg.cond_dim, cfg.cond_out_layer
                )
            self.sr_cond_model = nn.ModuleList(cond)
            self.register_buffer("sr_bin_boundaries", torch.tensor(cfg.sr_bin_boundaries, dtype=torch.int32))
            self.out_sample_rate = cfg.out_sample_rate

        # Lay out the streaming context: every conv with ctx > 0 owns a slice of one flat per-slot vector.
        offset = 0
        for m in self.modules():
            if isinstance(m, WeightNormConv) and m.ctx > 0:
                m.state_offset = offset
                offset += m.cin * m.ctx
        self.state_size = offset

    def forward(self, z: Tensor, stream: StreamState | None = None) -> Tensor:
        layers = list(self.model)
        conds: list[nn.Module | None] = [None] * len(layers)
        bucket = None
        if self.sr_cond_model is not None:
            # bucketize(out_sample_rate, boundaries) (right=False) without a host round trip, so it can be captured.
            bucket = (self.sr_bin_boundaries < self.out_sample_rate).sum(0, keepdim=True)
            conds = list(self.sr_cond_model)
        # The released conditioning (a channel affine) is applied by the block's first Snake.
        affines = [None if cond is None else cond.channel_affine(bucket) for cond in conds]
        x, activated = z, False  # activated: x went through the next layer's first Snake already
        for i, (layer, cond, affine) in enumerate(zip(layers, conds, affines, strict=True)):
            if cond is not None and affine is None:
                x = cond(x, bucket, stream)
            if isinstance(layer, DecoderBlock):
                then = self._next_snake(layers, conds, affines, i + 1)
                x = layer(x, stream, affine, then, activated)
                activated = then is not None
            elif not activated:
                x = layer(x, stream) if affine is None else layer(x, stream, affine)
            else:  # the last Snake, which the last block applied
                activated = False
        return torch.tanh(x)

    @staticmethod
    def _next_snake(
        layers: list[nn.Module], conds: list[nn.Module | None], affines: list[tuple[Tensor, Tensor] | None], i: int
    ) -> NextSnake | None:
        """The first Snake of layer i (alpha, affine) when the layer before can apply it: a block's, or the last
        Snake; not across a conditioning other than a channel affine."""
        if i >= len(layers) or (conds[i] is not None and affines[i] is None):
            return None
        layer = layers[i]
        if isinstance(layer, DecoderBlock):
            return layer.block[0].alpha, affines[i]
        return (layer.alpha, None) if isinstance(layer, Snake1d) else None


class AudioVAE(nn.Module):
    """VoxCPM AudioVAE (v1 or v2). Parameters are allocated uninitialised: load a state dict (``load_audio_vae``,
    or ``load_state_dict(random_state_dict(cfg, seed))``)."""

    def __init__(self, config: AudioVAEConfig) -> None:
        super().__init__()
        self.config = config
        self.encoder = CausalEncoder(config)
        self.decoder = CausalDecoder(config)

    @property
    def sample_rate(self) -> int:
        return self.config.sample_rate

    @property
    def out_sample_rate(self) -> int:
        return self.config.out_sample_rate

    @property
    def latent_dim(self) -> int:
        return self.config.latent_dim

    @property
    def chunk_size(self) -> int:
        """Input samples per latent frame (640 at 16 kHz for 0.5B/VoxCPM2, 1764 at 44.1 kHz for VoxCPM1.5)."""
        return self.config.chunk_size

    @property
    def decode_chunk_size(self) -> int:
        """Output samples per latent frame (640 / 1764 / 1920 at 48 kHz for VoxCPM2)."""
        return self.config.decode_chunk_size

    def encode(self, wav: Tensor) -> Tensor:
        """wav [B, 1, T] (or [B, T]) at ``sample_rate`` -> mu [B, latent_dim, ceil(T / chunk_size)].
        Right-pads with zeros to a multiple of ``chunk_size``, like the reference ``preprocess``."""
        if wav.ndim == 2:
            wav = wav.unsqueeze(1)
        wav = F.pad(wav, (0, -wav.shape[-1] % self.chunk_size))
        return self.encoder(wav)

    def decode(self, latents: Tensor) -> Tensor:
        """latents [B, latent_dim, F] -> wav [B, 1, F * decode_chunk_size] at ``out_sample_rate`` (offline)."""
        return self.decoder(latents)

    def fold_weight_norm(self) -> AudioVAE:
        """Inference: replace every ``weight_g``/``weight_v`` pair by the plain ``weight`` it defines."""
        for m in self.modules():
            if isinstance(m, WeightNormConv):
                m.fold()
        return self


# ----------------------------------------------------------------------------------------------------------------------
# Checkpoints


def expected_shapes(config: AudioVAEConfig) -> dict[str, torch.Size]:
    """Names and shapes of the release state dict for ``config`` (built on the meta device: no memory)."""
    with torch.device("meta"):
        return {k: v.shape for k, v in AudioVAE(config).state_dict().items()}


def random_state_dict(config: AudioVAEConfig, seed: int) -> dict[str, Tensor]:
    """A release-format fp32 state dict with random weights: exactly the release's keys, shapes and dtypes.

    weight_v ~ N(0, 1/fan_in) with fan_in = inputs summed per output sample ((Cin/groups)*k for a conv, Cin*k/stride
    for a transposed conv), weight_g = ||weight_v|| per dim-0 channel (so the effective weight is weight_v), biases 0,
    snake alpha 1, SR conditioning the identity (scale 1, bias/add/concat embeddings 0). Each conv is then unit-gain,
    but every residual unit adds its branch to its input, so activations grow ~3x per decoder block: the full VoxCPM2
    decoder reaches a pre-tanh std of ~400 and its output is a saturated +-1 signal. Fine for plumbing and parity
    tests; scale the residual branches down for audio that is meant to be listened to."""
    gen = torch.Generator().manual_seed(seed)
    with torch.device("meta"):
        ref = AudioVAE(config)
    convs = {name: m for name, m in ref.named_modules() if isinstance(m, WeightNormConv)}
    out: dict[str, Tensor] = {}
    for name, conv in convs.items():
        shape = conv.weight_v.shape
        fan_in = shape[0] * shape[2] // conv.stride if isinstance(conv, CausalConvTranspose1d) else shape[1:].numel()
        v = torch.randn(shape, generator=gen) / math.sqrt(fan_in)
        out[f"{name}.weight_v"] = v
        out[f"{name}.weight_g"] = torch.linalg.vector_norm(v.flatten(1), dim=1).view(conv.weight_g.shape)
    for key, meta in ref.state_dict().items():
        if key in out:
            continue
        if key == "decoder.sr_bin_boundaries":
            out[key] = torch.tensor(config.sr_bin_boundaries, dtype=torch.int32)
        elif key.endswith((".alpha", ".scale_embed.weight")):
            out[key] = torch.ones(meta.shape)
        else:  # biases; bias/add/concat embeddings
            out[key] = torch.zeros(meta.shape)
    return {key: out[key] for key in ref.state_dict()}  # the module's key order, as torch.save of it would have


def _read_state_dict(path: Path) -> dict[str, Tensor]:
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        return load_file(str(path))
    ckpt = torch.load(path, map_location="cpu", weights_only=True)
    # The release wraps it as {"state_dict": ...}; the reference also accepts a bare dict.
    if isinstance(ckpt, Mapping) and isinstance(ckpt.get("state_dict"), Mapping):
        ckpt = ckpt["state_dict"]
    if not isinstance(ckpt, Mapping):
        raise ValueError(f"{path}: expected a state dict, got {type(ckpt).__name__}")
    return dict(ckpt)


def check_state_dict(state_dict: Mapping[str, Tensor], config: AudioVAEConfig, source: str = "state dict") -> None:
    """Raise ValueError naming every unknown, missing or mis-shaped tensor."""
    problems = mismatches({name: tensor.shape for name, tensor in state_dict.items()}, expected_shapes(config))
    if problems:
        rates = list(config.decoder_rates)
        raise ValueError(f"{source} does not match AudioVAE v{config.version} (decoder_rates={rates}): {problems}")


def load_audio_vae(
    path: Path, config: AudioVAEConfig, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32
) -> AudioVAE:
    """Load audiovae.pth ({"state_dict": ...} or bare) or audiovae.safetensors strictly, fold weight norm in fp32,
    then move to ``device``/``dtype`` (the int32 ``sr_bin_boundaries`` buffer keeps its dtype). Returns an eval-mode
    module without gradients."""
    path = Path(path)
    sd = _read_state_dict(path)
    check_state_dict(sd, config, str(path))
    # Fold in fp32 even if the file is half precision: the norm of a bf16 weight_v is too coarse.
    sd = {k: v.float() if v.is_floating_point() else v for k, v in sd.items()}
    with torch.device("meta"):
        vae = AudioVAE(config)
    vae.load_state_dict(sd, strict=True, assign=True)
    vae.fold_weight_norm().to(device=device, dtype=dtype)
    vae.requires_grad_(False)
    return vae.eval()
