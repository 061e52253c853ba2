"""MiniCPM4 decoder stack (pre-RMSNorm, GQA attention with LongRoPE, SwiGLU MLP), causal or bidirectional.

Causal stacks (base LM, residual LM) run on the packed positions of a step and keep K/V in the paged pool
through the attention backend. Bidirectional stacks (LocEnc, LocDiT) run on [rows, S, hidden] with positions
0..S-1 and no cache. q/k/v and gate/up are fused GEMMs; the checkpoint loader splits the released names.

Numerics follow the reference (voxcpm `modules/minicpm4/model.py`): RMSNorm normalises in fp32 and rounds
before the weight multiply; RoPE is applied in fp32 with cos/sin tables that live in the model dtype (the
reference's `model.to(dtype)` rounds its fp32 tables, so a bf16 model uses bf16-rounded tables).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from engine import kernels
from engine.attention import AttentionBackend
from engine.attention.metadata import AttentionMetadata
from engine.models.layers import (
    Fp8Rows,
    Linear,
    RMSNorm,
    multiplies_fp8,
    takes_fp8,
    takes_fp8_blocks,
    takes_fp8_rows,
    unwrapped,
    use_fp8_,
)
from engine.models.voxcpm.config import MiniCPM4Config

# A stack's linears that run in FP8 when asked (EngineConfig.fp8_gemms for the LocDiT, fp8_backbone for the others):
# all of its per-token GEMM work.
FP8_LINEARS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")


class LongRoPE(nn.Module):
    """cos/sin tables of MiniCPM's LongRoPE for positions [0, length).

    The factors are chosen by `max_position_embeddings` (not `length`), so a table cut to the few positions
    a local stack needs holds the same values as the reference's full one.
    """

    def __init__(self, config: MiniCPM4Config, length: int) -> None:
        super().__init__()
        self.config = config
        self.length = length
        dim = config.head_dim
        self.register_buffer("cos", torch.empty(length, dim), persistent=False)
        self.register_buffer("sin", torch.empty(length, dim), persistent=False)
        if self.cos.device.type != "meta":
            self.fill()

    @torch.no_grad()
    def fill(self) -> None:
        """(Re)compute the tables in fp32 on the CPU and store them in the buffers' dtype and device."""
        cfg = self.config
        dim = cfg.head_dim
        scaling = cfg.rope_scaling
        scale = cfg.max_position_embeddings / scaling.original_max_position_embeddings
        amplitude = math.sqrt(1 + math.log(scale) / math.log(scaling.original_max_position_embeddings))
        inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, dim, 2).float() / dim))
        long = cfg.max_position_embeddings > scaling.original_max_position_embeddings
        ext = torch.tensor(scaling.long_factor if long else scaling.short_factor, dtype=torch.float32)
        t = torch.arange(self.length, dtype=torch.float32)
        freqs = torch.mul(torch.outer(t, 1.0 / ext), inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        self.cos.copy_(emb.cos() * amplitude)
        self.sin.copy_(emb.sin() * amplitude)
        # The fused local attention reads only each row's first half (triton_ops.rope_attention_fits).
        assert all(torch.equal(*t.chunk(2, dim=-1)) for t in (self.cos, self.sin))


class Attention(nn.Module):
    def __init__(self, config: MiniCPM4Config, backend: AttentionBackend) -> None:
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.scale = self.head_dim**-0.5
        self.backend = backend
        q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        self.split = (q_size, kv_size, kv_size)
        self.qkv_proj = Linear(config.hidden_size, q_size + 2 * kv_size, bias=False)
        self.o_proj = Linear(q_size, config.hidden_size, bias=False)
        # Paged KV pool of a causal layer, bound by VoxCPMModel.allocate_kv_cache (not part of the state dict).
        self.k_cache = torch.empty(0)
        self.v_cache = torch.empty(0)

    def forward(
        self,
        x: torch.Tensor | Fp8Rows,
        rope: tuple[torch.Tensor, torch.Tensor] | None,
        attn: AttentionMetadata | None,
        keep: int | None = None,
    ) -> torch.Tensor:
        """Causal over the KV pool if `attn` is given (x [N, hidden]), else bidirectional per row (x [B, S, hidden]);
        `keep` (bidirectional): the output of only the last `keep` positions of each row, which attend to all."""
        qkv = self.qkv_proj(x)
        lead = qkv.shape[:-1]
        q, k, v = qkv.split(self.split, dim=-1)
        q = q.view(*lead, self.num_heads, self.head_dim)
        k = k.view(*lead, self.num_kv_heads, self.head_dim)
        v = v.view(*lead, self.num_kv_heads, self.head_dim)
        if attn is None:
            return self.o_proj(self._dense(q, k, v, rope, q.shape[1] if keep is None else keep))
        if rope is not None:
            q, k = kernels.rope_qk(q, k, *rope)
        out = self.backend.paged(q, k, v, self.k_cache, self.v_cache, attn, self.scale)
        return self.o_proj(out.reshape(*lead, self.num_heads * self.head_dim))

    def _dense(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor] | None,
        keep: int,
    ) -> torch.Tensor | Fp8Rows:
        """Bidirectional attention's last `keep` positions of each row, as o_proj reads them: an FP8 o_proj takes e4m3
        rows scaled by each row's bound (kernels.bounded_fp8_rows_torch), which the attention kernel writes itself on
        the GPU, RoPE applied as it loads q and k; a LoRA o_proj over an FP8 GEMM takes the same rows with their
        model-dtype source beside them, for its adapter."""
        rows = q.shape[0] * keep
        fp8 = takes_fp8_rows(self.o_proj, rows)
        out = kernels.rope_attention(q, k, v, rope, self.scale, keep, fp8, self.backend.dense)
        if isinstance(out, tuple):
            return Fp8Rows(*out)
        if multiplies_fp8(self.o_proj, rows):
            return Fp8Rows(*kernels.bounded_fp8_rows_torch(out, v), source=out)
        return out


class MLP(nn.Module):
    def __init__(self, config: MiniCPM4Config) -> None:
        super().__init__()
        self.gate_up_proj = Linear(config.hidden_size, 2 * config.intermediate_size, bias=False)
        self.down_proj = Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor | Fp8Rows) -> torch.Tensor:
        down = self.down_proj
        if isinstance(x, Fp8Rows) and takes_fp8_blocks(down):
            # The gate/up GEMM applies SiLU*mul and writes the down GEMM's block-scaled e4m3 input itself.
            gate_up, blocks = self.gate_up_proj.fp8, down.fp8_blocks  # the norm wrote Fp8Rows: an Fp8Linear's
            args = (gate_up.weight, gate_up.scale, blocks.weight, blocks.scale, down.bias, down.weight.dtype)
            return kernels.fp8_block_mlp(x.q, x.scale, *args)
        if not isinstance(x, Fp8Rows) and x.numel() <= kernels.FEW_ROWS * x.shape[-1] and unwrapped(self.gate_up_proj):
            # A few rows (one stream's step): one kernel streams the gate/up weight and applies SiLU*mul.
            return down(kernels.gate_up_silu(x, self.gate_up_proj.weight))
        gate_up = self.gate_up_proj(x)
        if takes_fp8(down, gate_up):  # SiLU*mul writes the e4m3 rows the down GEMM reads
            return down.forward_fp8(*kernels.silu_mul_fp8(gate_up))
        return down(kernels.silu_mul(gate_up))


class DecoderLayer(nn.Module):
    def __init__(self, config: MiniCPM4Config, backend: AttentionBackend) -> None:
        super().__init__()
        self.self_attn = Attention(config, backend)
        self.mlp = MLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        # muP residual scaling; off (1.0) in the released configs.
        self.residual_scale = config.scale_depth / math.sqrt(config.num_hidden_layers) if config.use_mup else None

    def _scaled(self, update: torch.Tensor) -> torch.Tensor:
        return update if self.residual_scale is None else update * self.residual_scale

    def forward(
        self,
        x: torch.Tensor,
        normed: torch.Tensor | Fp8Rows,
        rope: tuple[torch.Tensor, torch.Tensor] | None,
        attn: AttentionMetadata | None,
        next_norm: RMSNorm,
        next_fp8: bool,
        keep: int | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | Fp8Rows]:
        """x: the residual stream; normed: input_layernorm(x), computed by the previous layer's last add.
        Returns the new residual stream and `next_norm` of it (as Fp8Rows if `next_fp8`): each residual add is fused
        with the norm after, and a norm whose GEMM runs in FP8 writes its e4m3 rows directly.
        `keep` (bidirectional): return only each row's last `keep` positions (all of them still attended to)."""
        update = self._scaled(self.self_attn(normed, rope, attn, keep))
        if keep is not None:
            x = x[:, -keep:].contiguous()
        x, h = self.post_attention_layernorm.add_forward(x, update, takes_fp8(self.mlp.gate_up_proj, x))
        return next_norm.add_forward(x, self._scaled(self.mlp(h)), next_fp8)


class MiniCPM4(nn.Module):
    """One stack. `rope_length`: positions its RoPE table covers (ignored when the config has no_rope)."""

    def __init__(self, config: MiniCPM4Config, backend: AttentionBackend, rope_length: int) -> None:
        super().__init__()
        self.config = config
        if config.vocab_size > 0:
            self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config, backend) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rope = None if config.no_rope else LongRoPE(config, rope_length)

    def use_fp8(self, min_rows: int | None = None) -> None:
        """Run FP8_LINEARS in FP8 (engine/models/layers.Fp8Linear) for inputs of `min_rows` rows or more (None:
        layers.FP8_MIN_ROWS): call once, after loading, before LoRA. Each MLP's down projection multiplies 1x128 and
        128x128 block-scaled operands, which its gate/up GEMM writes (kernels.gate_up_silu_fp8), where both its dims
        are multiples of 128: no gate/up output and no SiLU*mul pass go through memory."""
        use_fp8_(self, FP8_LINEARS, blocks=("down_proj",), min_rows=min_rows)

    def forward(
        self,
        x: torch.Tensor,
        positions: torch.Tensor | None = None,
        attn: AttentionMetadata | None = None,
        keep: int | None = None,
    ) -> torch.Tensor:
        """Causal: x [N, hidden] with positions [N] and attn. Bidirectional: x [B, S, hidden], positions 0..S-1;
        `keep`: only each row's last `keep` outputs are wanted, so the last layer's o_proj, MLP and norms run on
        those alone (in the LocDiT 4 of 11 positions: ~5 % of its GEMM work saved)."""
        rope = None
        if self.rope is not None:
            if positions is None:
                cos, sin = self.rope.cos[: x.shape[-2]], self.rope.sin[: x.shape[-2]]
            else:
                cos, sin = self.rope.cos[positions], self.rope.sin[positions]
            rope = (cos.unsqueeze(-2), sin.unsqueeze(-2))
        norms = [layer.input_layernorm for layer in self.layers[1:]] + [self.norm]
        # What reads each norm's output: the next layer's qkv GEMM, and for the final norm the caller (model dtype).
        readers = [layer.self_attn.qkv_proj for layer in self.layers[1:]] + [None]
        normed = self.layers[0].input_layernorm(x, takes_fp8(self.layers[0].self_attn.qkv_proj, x))
        last = len(self.layers) - 1
        for i, (layer, next_norm, reader) in enumerate(zip(self.layers, norms, readers, strict=True)):
            x, normed = layer(x, normed, rope, attn, next_norm, takes_fp8(reader, x), keep if i == last else None)
        assert isinstance(normed, torch.Tensor)  # the final norm's reader is not an Fp8Linear
        return normed
