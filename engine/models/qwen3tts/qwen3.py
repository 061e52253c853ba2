"""The Qwen3 decoder stack of the talker and of the code predictor (pre-RMSNorm, GQA with per-head q/k RMSNorm,
1-D RoPE, SwiGLU, no biases).

The talker's interleaved M-RoPE always receives three equal position streams (the reference's `get_rope_index`
is `cumsum(mask) - 1` per row, decode adds the row's offset), so it is exactly 1-D RoPE on positions 0..L-1 of
each sequence. Numerics follow the reference: RMSNorm normalises in fp32 and rounds before the weight multiply;
cos/sin are computed in fp32 (here from the positions, so no table bounds the length) and the rotation is done
in fp32; attention scores, softmax and the weighted sum run in fp32 (the predictor's 15 sequential passes
compound any bf16 rounding there, vLLM-Omni issue 2274).

Two attention forms: `paged` (the talker: packed positions, K/V in the engine's paged pool through the attention
backend) and `cached` (the code predictor: B rows in lockstep, K/V in a small dense per-row cache [B, S, kv, D]
that lives for one frame).
"""

from __future__ import annotations

import torch
from torch import nn

from engine import kernels
from engine.attention import AttentionBackend
from engine.attention.metadata import AttentionMetadata
from engine.models.layers import Linear, RMSNorm
from engine.models.qwen3tts.config import DecoderStackConfig


def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 cos/sin [..., 1, head_dim] for integer positions [...] (the reference's default RoPE)."""
    inv_freq = 1.0 / (
        theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64, device=positions.device).float() / head_dim)
    )
    freqs = positions.float()[..., None] * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().unsqueeze(-2), emb.sin().unsqueeze(-2)


@torch.no_grad()
def _fuse(linears: tuple[nn.Linear, ...]) -> torch.Tensor:
    """The linears' weights stacked on the output axis in one tensor; each linear's weight becomes a view of it."""
    fused = torch.cat([lin.weight for lin in linears])
    start = 0
    for lin in linears:
        rows = lin.weight.shape[0]
        lin.weight = nn.Parameter(fused[start : start + rows], requires_grad=False)
        start += rows
    return fused


class Attention(nn.Module):
    def __init__(self, config: DecoderStackConfig, backend: AttentionBackend | None) -> None:
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.scale = self.head_dim**-0.5
        self.backend = backend
        hidden = config.hidden_size
        self.q_proj = Linear(hidden, self.num_heads * self.head_dim, bias=False)
        self.k_proj = Linear(hidden, self.num_kv_heads * self.head_dim, bias=False)
        self.v_proj = Linear(hidden, self.num_kv_heads * self.head_dim, bias=False)
        self.o_proj = Linear(self.num_heads * self.head_dim, hidden, bias=False)
        self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
        self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
        # Paged pool of the talker's layer, bound by Qwen3TTSModel.allocate_kv_cache (not in the state dict).
        self.k_cache = torch.empty(0)
        self.v_cache = torch.empty(0)
        self.qkv_weight: torch.Tensor | None = None  # set by fuse_projections

    def fuse_projections(self) -> None:
        """One [q; k; v] weight, so a call is one GEMM and one norm+RoPE kernel instead of three GEMMs and ~20 small
        kernels (the code predictor's 15 passes a frame are bound by kernel count). q/k/v_proj become views of it:
        the state dict and memory stay as they were."""
        self.qkv_weight = _fuse((self.q_proj, self.k_proj, self.v_proj))

    def _qkv(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]):
        lead = x.shape[:-1]
        if self.qkv_weight is not None:
            widths = (self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim)
            q, k, v = kernels.linear(x, self.qkv_weight).split((widths[0], widths[1], widths[1]), dim=-1)
            q, k = kernels.qk_norm_rope(
                q.view(*lead, self.num_heads, self.head_dim),
                k.view(*lead, self.num_kv_heads, self.head_dim),
                self.q_norm.weight,
                self.k_norm.weight,
                self.q_norm.eps,
                *rope,
            )
            return q, k, v.view(*lead, self.num_kv_heads, self.head_dim)
        q = self.q_norm(self.q_proj(x).view(*lead, self.num_heads, self.head_dim))
        k = self.k_norm(self.k_proj(x).view(*lead, self.num_kv_heads, self.head_dim))
        v = self.v_proj(x).view(*lead, self.num_kv_heads, self.head_dim)
        # The twin, not the fused kernel: that one rotates inside a fused qkv buffer, which this layer has not.
        q, k = kernels.rope_torch(q, *rope), kernels.rope_torch(k, *rope)
        return q, k, v

    def paged(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], attn: AttentionMetadata):
        """x [N, hidden] packed positions of B sequences -> [N, hidden]."""
        assert self.backend is not None
        q, k, v = self._qkv(x, rope)
        out = self.backend.paged(q, k, v, self.k_cache, self.v_cache, attn, self.scale)
        return self.o_proj(out.reshape(x.shape[0], -1))

    def cached(
        self,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        cache: tuple[torch.Tensor, torch.Tensor],
        start: int,
    ) -> torch.Tensor:
        """x [B, S, hidden] at positions start..start+S-1 of every row; cache (k, v) [B, max, kv, D] is written
        there and read causally. Scores, softmax and the weighted sum in fp32 (the code predictor keeps its caches in
        fp32)."""
        q, k, v = self._qkv(x, rope)
        out = kernels.cached_attention(q, k, v, *cache, start, self.scale)
        return self.o_proj(out)


class MLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.gate_proj = Linear(hidden, intermediate, bias=False)
        self.up_proj = Linear(hidden, intermediate, bias=False)
        self.down_proj = Linear(intermediate, hidden, bias=False)
        self.gate_up_weight: torch.Tensor | None = None  # set by fuse_projections

    def fuse_projections(self) -> None:
        """One [gate; up] GEMM and the fused SiLU*mul instead of two GEMMs and two elementwise passes."""
        self.gate_up_weight = _fuse((self.gate_proj, self.up_proj))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gate_up_weight is not None:
            return self.down_proj(kernels.gate_up_silu(x, self.gate_up_weight))
        return self.down_proj(nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, config: DecoderStackConfig, backend: AttentionBackend | None) -> None:
        super().__init__()
        self.self_attn = Attention(config, backend)
        self.mlp = MLP(config.hidden_size, config.intermediate_size)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, x: torch.Tensor, update: torch.Tensor | None, attend) -> tuple[torch.Tensor, torch.Tensor]:
        """(residual, the previous layer's pending MLP output or None) -> (residual, this layer's MLP output): each
        residual add runs fused with the norm after it (the same two roundings as an add then a norm)."""
        if update is None:
            h = self.input_layernorm(x)
        else:
            x, h = self.input_layernorm.add_forward(x, update)
        x, h = self.post_attention_layernorm.add_forward(x, attend(self.self_attn, h))
        return x, self.mlp(h)


class Qwen3Stack(nn.Module):
    """Layers + final norm (the reference's `*.model` minus its embeddings)."""

    def __init__(self, config: DecoderStackConfig, backend: AttentionBackend | None) -> None:
        super().__init__()
        self.config = config
        self.layers = nn.ModuleList(DecoderLayer(config, backend) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return rope_cos_sin(positions, self.config.head_dim, self.config.rope_theta)

    def forward_paged(self, x: torch.Tensor, positions: torch.Tensor, attn: AttentionMetadata) -> torch.Tensor:
        """x [N, hidden] packed, positions [N] -> normed hidden [N, hidden]."""
        rope = self.rope(positions)
        update = None
        for layer in self.layers:
            x, update = layer(x, update, lambda a, h: a.paged(h, rope, attn))
        return self._final_norm(x, update)

    def forward_cached(
        self,
        x: torch.Tensor,
        start: int,
        caches: list[tuple[torch.Tensor, torch.Tensor]],
        rope: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """x [B, S, hidden] at positions start.. of every row, one (k, v) cache per layer -> normed [B, S, hidden].
        `rope`: cos/sin of positions 0.. (at least start + S of them), which a caller running many passes computes
        once; else computed here."""
        end = start + x.shape[1]
        if rope is None:
            rope = self.rope(torch.arange(start, end, device=x.device))
        else:
            rope = (rope[0][start:end], rope[1][start:end])
        update = None
        for layer, cache in zip(self.layers, caches, strict=True):
            x, update = layer(x, update, lambda a, h, cache=cache: a.cached(h, rope, cache, start))
        return self._final_norm(x, update)

    def _final_norm(self, x: torch.Tensor, update: torch.Tensor | None) -> torch.Tensor:
        return self.norm(x) if update is None else self.norm.add_forward(x, update)[1]

    def fuse_projections(self) -> None:
        """See Attention.fuse_projections and MLP.fuse_projections (CUDA: fewer, larger kernels per layer)."""
        for layer in self.layers:
            layer.self_attn.fuse_projections()
            layer.mlp.fuse_projections()

    def new_caches(self, batch: int, length: int, device: torch.device, dtype: torch.dtype):
        shape = (batch, length, self.config.num_key_value_heads, self.config.head_dim)
        return [
            (torch.empty(shape, device=device, dtype=dtype), torch.empty(shape, device=device, dtype=dtype))
            for _ in self.layers
        ]
