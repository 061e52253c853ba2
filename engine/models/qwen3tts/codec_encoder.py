"""The 12 Hz speech tokenizer's encoder: 24 kHz audio -> codes [frames, 16], for Base voice cloning (ICL).

It is transformers' `MimiModel` encode path (4.57, as the reference loads it; `Qwen3TTSTokenizerV2Encoder` drops
the decoder parts): SEANet (causal convs, strides 4, 5, 6, 8, ELU, residual blocks) -> 25 Hz -> transformer
(LayerNorm, LayerScale, RoPE, GELU MLP; causal over the whole clip) -> stride-2 conv with replicate padding ->
12.5 Hz -> split RVQ by nearest codebook vector (1 semantic + the first 15 acoustic quantizers of 31).
Strided convs pad zeros on the right to complete their last window, as Mimi's `_get_extra_padding_for_conv1d`.
Runs once per reference clip, offline; fp32 like the released weights.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from engine.models.qwen3tts.config import SAMPLES_PER_FRAME, CodecEncoderConfig

NUM_CODEBOOKS = 16


class MimiConv(nn.Module):
    def __init__(
        self,
        cin: int,
        cout: int,
        kernel: int,
        stride: int = 1,
        dilation: int = 1,
        bias: bool = True,
        pad_mode: str = "constant",
    ) -> None:
        super().__init__()
        self.conv = nn.Conv1d(cin, cout, kernel, stride, dilation=dilation, bias=bias)
        self.stride = stride
        self.kernel = (kernel - 1) * dilation + 1
        self.pad_mode = pad_mode

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        length = x.shape[-1]
        padding = self.kernel - self.stride
        frames = math.ceil((length - self.kernel + padding) / self.stride + 1) - 1
        extra = frames * self.stride + self.kernel - padding - length
        mode = "replicate" if self.pad_mode == "replicate" else "constant"
        return self.conv(nn.functional.pad(x, (padding, extra), mode=mode))


class ResnetBlock(nn.Module):
    def __init__(self, dim: int, compress: int, kernel: int, dilation: int) -> None:
        super().__init__()
        hidden = dim // compress
        self.block = nn.ModuleList(
            [nn.ELU(), MimiConv(dim, hidden, kernel, dilation=dilation), nn.ELU(), MimiConv(hidden, dim, 1)]
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x
        for layer in self.block:
            h = layer(h)
        return x + h


class SEANetEncoder(nn.Module):
    def __init__(self, c: CodecEncoderConfig) -> None:
        super().__init__()
        layers: list[nn.Module] = [MimiConv(1, c.num_filters, c.kernel_size)]
        scale = 1
        for ratio in reversed(c.upsampling_ratios):
            dim = scale * c.num_filters
            for j in range(c.num_residual_layers):
                layers.append(ResnetBlock(dim, c.compress, c.residual_kernel_size, c.dilation_growth_rate**j))
            layers += [nn.ELU(), MimiConv(dim, dim * 2, ratio * 2, stride=ratio)]
            scale *= 2
        layers += [nn.ELU(), MimiConv(scale * c.num_filters, c.hidden_size, c.last_kernel_size)]
        self.layers = nn.ModuleList(layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


class LayerScale(nn.Module):
    def __init__(self, dim: int, init: float) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.full((dim,), init))


class Attention(nn.Module):
    def __init__(self, c: CodecEncoderConfig) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim, self.theta = (
            c.num_attention_heads,
            c.num_key_value_heads,
            c.head_dim,
            c.rope_theta,
        )
        self.q_proj = nn.Linear(c.hidden_size, self.heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(c.hidden_size, self.kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(c.hidden_size, self.kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.heads * self.head_dim, c.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        d = self.head_dim
        inv_freq = 1.0 / (self.theta ** (torch.arange(0, d, 2, dtype=torch.int64, device=x.device).float() / d))
        freqs = torch.arange(t, device=x.device).float()[:, None] * inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)

        def rotate(y: torch.Tensor) -> torch.Tensor:
            y1, y2 = y.chunk(2, dim=-1)
            return y * cos + torch.cat((-y2, y1), dim=-1) * sin

        q, k = rotate(q), rotate(k)
        group = self.heads // self.kv_heads
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
        scores = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(d)
        causal = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
        scores = scores.masked_fill(~causal, float("-inf"))
        out = torch.matmul(scores.softmax(dim=-1, dtype=torch.float32).to(q.dtype), v)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1))


class MLP(nn.Module):
    def __init__(self, c: CodecEncoderConfig) -> None:
        super().__init__()
        self.fc1 = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.fc2 = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(nn.functional.gelu(self.fc1(x)))


class TransformerLayer(nn.Module):
    def __init__(self, c: CodecEncoderConfig) -> None:
        super().__init__()
        self.self_attn = Attention(c)
        self.mlp = MLP(c)
        self.input_layernorm = nn.LayerNorm(c.hidden_size, eps=c.norm_eps)
        self.post_attention_layernorm = nn.LayerNorm(c.hidden_size, eps=c.norm_eps)
        self.self_attn_layer_scale = LayerScale(c.hidden_size, c.layer_scale_initial_scale)
        self.mlp_layer_scale = LayerScale(c.hidden_size, c.layer_scale_initial_scale)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn_layer_scale.scale * self.self_attn(self.input_layernorm(x))
        return x + self.mlp_layer_scale.scale * self.mlp(self.post_attention_layernorm(x))


class Transformer(nn.Module):
    def __init__(self, c: CodecEncoderConfig) -> None:
        super().__init__()
        self.layers = nn.ModuleList(TransformerLayer(c) for _ in range(c.num_hidden_layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


class Codebook(nn.Module):
    def __init__(self, size: int, dim: int) -> None:
        super().__init__()
        self.register_buffer("initialized", torch.ones(1))
        self.register_buffer("cluster_usage", torch.ones(size))
        self.register_buffer("embed_sum", torch.zeros(size, dim))

    def vectors(self) -> torch.Tensor:
        return self.embed_sum / self.cluster_usage.clamp(min=1e-5)[:, None]


class VQ(nn.Module):
    def __init__(self, size: int, dim: int) -> None:
        super().__init__()
        self.codebook = Codebook(size, dim)


class RVQ(nn.Module):
    def __init__(self, c: CodecEncoderConfig, layers: int) -> None:
        super().__init__()
        dim = c.vector_quantization_hidden_dimension
        self.layers = nn.ModuleList(VQ(c.codebook_size, c.codebook_dim) for _ in range(layers))
        self.input_proj = nn.Conv1d(c.hidden_size, dim, 1, bias=False)
        self.output_proj = nn.Conv1d(dim, c.hidden_size, 1, bias=False)

    def encode(self, x: torch.Tensor, count: int) -> torch.Tensor:
        """x [B, hidden, T] -> codes [B, count, T]: nearest vector, subtract, next quantizer."""
        residual = self.input_proj(x).transpose(1, 2)
        codes = []
        for layer in self.layers[:count]:
            vectors = layer.codebook.vectors()
            flat = residual.reshape(-1, residual.shape[-1])
            index = torch.cdist(flat[None].float(), vectors[None].float(), p=2)[0].argmin(dim=-1)
            index = index.view(residual.shape[:-1])
            residual = residual - nn.functional.embedding(index, vectors)
            codes.append(index)
        return torch.stack(codes, dim=1)


class SplitRVQ(nn.Module):
    def __init__(self, c: CodecEncoderConfig) -> None:
        super().__init__()
        self.semantic_residual_vector_quantizer = RVQ(c, c.num_semantic_quantizers)
        self.acoustic_residual_vector_quantizer = RVQ(c, c.num_quantizers - c.num_semantic_quantizers)
        self.semantic = c.num_semantic_quantizers


class CodecEncoder(nn.Module):
    """`encoder` of speech_tokenizer/model.safetensors."""

    def __init__(self, config: CodecEncoderConfig) -> None:
        super().__init__()
        self.config = config
        self.encoder = SEANetEncoder(config)
        self.encoder_transformer = Transformer(config)
        encodec_rate = config.sampling_rate / math.prod(config.upsampling_ratios)
        kernel = 2 * int(encodec_rate / config.frame_rate)
        self.downsample = MimiConv(
            config.hidden_size, config.hidden_size, kernel, stride=2, bias=False, pad_mode="replicate"
        )
        self.quantizer = SplitRVQ(config)

    @torch.inference_mode()
    def encode(self, audio: torch.Tensor) -> torch.Tensor:
        """24 kHz mono float32 audio [S] -> codes [ceil(S / 1920), 16] (int64, on the encoder's device)."""
        device = self.downsample.conv.weight.device
        x = audio.float().to(device)[None, None]
        h = self.encoder(x)
        h = self.encoder_transformer(h.transpose(1, 2)).transpose(1, 2)
        h = self.downsample(h)
        q = self.quantizer
        semantic = q.semantic_residual_vector_quantizer.encode(h, q.semantic)
        acoustic = q.acoustic_residual_vector_quantizer.encode(h, NUM_CODEBOOKS - q.semantic)
        codes = torch.cat((semantic, acoustic), dim=1)[0].transpose(0, 1)
        return codes[: -(-audio.shape[-1] // SAMPLES_PER_FRAME)]
