"""VoxCPMModel: one packed engine step (prefill and decode positions mixed) for VoxCPM v1 and v2.

Per position: text embedding, or LocEnc of the latent patch at audio positions; the base LM (causal, paged
KV); FSQ at audio positions; the residual LM on `enc + audio*feat_emb` (v1) or
`fusion_concat_proj(cat(enc, audio*feat_emb))` (v2). Per sequence, at its last position: mu from the two LM
hiddens (v1: sum of the projections, v2: their concatenation), the CFM sampler conditioned on that
position's patch, and the stop head on the base LM hidden. Reference: voxcpm `model/voxcpm.py` and
`model/voxcpm2.py` (`_inference`).

`forward` = `backbone` (every packed position, variable N) then `generate` (per sequence, fixed shapes per batch
size) = `start` then the CFM solver's Euler iterations (`feat_decoder.step`): the runtime graphs these pieces per
batch bucket and runs each Euler iteration only on the rows that still have steps. The composition is the same
sequence of operations as one function, so the same bits.

The parameter tree mirrors the released checkpoints except for the fused q/k/v and gate/up GEMMs
(see checkpoint.py). The AudioVAE is a separate module (audio_vae.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.attention import AttentionBackend, get_attention_backend
from engine.lora.linear import AdapterRows
from engine.models.voxcpm.batch import BackboneInputs, ModelInputs, ModelOutputs
from engine.models.voxcpm.cfm import CFM, FlowState
from engine.models.voxcpm.config import VoxCPMConfig
from engine.models.voxcpm.locdit import LocDiT
from engine.models.voxcpm.locenc import LocEnc
from engine.models.voxcpm.minicpm4 import Attention, LongRoPE, MiniCPM4


class ScalarQuantization(nn.Module):
    """FSQ: out_proj(round(tanh(in_proj(h)) * scale) / scale)."""

    def __init__(self, dim: int, latent_dim: int, scale: int) -> None:
        super().__init__()
        self.in_proj = nn.Linear(dim, latent_dim)
        self.out_proj = nn.Linear(latent_dim, dim)
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out_proj(torch.round(torch.tanh(self.in_proj(x)) * self.scale) / self.scale)


class VoxCPMModel(nn.Module):
    def __init__(self, config: VoxCPMConfig, backend: AttentionBackend | None = None) -> None:
        super().__init__()
        backend = backend or get_attention_backend("torch", "cpu")
        self.config = config
        self.backend = backend
        lm = config.lm_config
        hidden = lm.hidden_size
        self.patch_size = config.patch_size
        self.feat_dim = config.feat_dim
        self.base_lm = MiniCPM4(lm, backend, rope_length=lm.max_position_embeddings)
        self.residual_lm = MiniCPM4(config.residual_lm(), backend, rope_length=lm.max_position_embeddings)
        self.feat_encoder = LocEnc(
            config.local_stack(config.encoder_config), config.feat_dim, config.patch_size, backend
        )
        estimator = LocDiT(
            config.local_stack(config.dit_config),
            config.feat_dim,
            config.patch_size,
            mu_tokens=2 if config.is_v2 else 0,
            backend=backend,
        )
        self.feat_decoder = CFM(estimator, config.mean_mode)
        self.fsq_layer = ScalarQuantization(
            hidden, config.scalar_quantization_latent_dim, config.scalar_quantization_scale
        )
        enc_hidden, dit_hidden = config.encoder_config.hidden_dim, config.dit_config.hidden_dim
        self.enc_to_lm_proj = nn.Linear(enc_hidden, hidden)
        self.lm_to_dit_proj = nn.Linear(hidden, dit_hidden)
        self.res_to_dit_proj = nn.Linear(hidden, dit_hidden)
        self.fusion_concat_proj = nn.Linear(2 * hidden, hidden) if config.is_v2 else None
        self.stop_proj = nn.Linear(hidden, hidden)
        self.stop_head = nn.Linear(hidden, 2, bias=False)
        self.embed_scale = lm.scale_emb if lm.use_mup else None
        # Per-row LoRA slots of the forward in progress, read by the LoRALinear layers (set by attach_lora).
        self.adapter_rows: AdapterRows | None = None

    # -- setup ---------------------------------------------------------------------------------------------------

    @property
    def dtype(self) -> torch.dtype:
        return self.stop_head.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.stop_head.weight.device

    def fill_rope_tables(self) -> None:
        """Compute the RoPE tables in the buffers' current dtype/device (after building on the meta device)."""
        for module in self.modules():
            if isinstance(module, LongRoPE):
                module.fill()

    def flow_buffers(self, rows: int) -> FlowState:
        """A solver state of `rows` inert rows (the runtime's static buffers for graphed Euler iterations)."""
        mu_dim = self.lm_to_dit_proj.out_features * (2 if self.fusion_concat_proj is not None else 1)
        hidden = self.feat_decoder.estimator.hidden
        return FlowState.empty(rows, mu_dim, hidden, self.patch_size, self.feat_dim, self.dtype, self.device)

    def _causal_attention(self) -> list[Attention]:
        return [layer.self_attn for stack in (self.base_lm, self.residual_lm) for layer in stack.layers]

    def kv_cache_bytes_per_token(self) -> int:
        """Bytes of K and V per LM position over all causal layers (base + residual LM) in the model dtype."""
        elem = torch.empty(0, dtype=self.dtype).element_size()
        return sum(2 * a.num_kv_heads * a.head_dim * elem for a in self._causal_attention())

    def allocate_kv_cache(self, num_blocks: int, block_size: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Allocate and bind one [num_blocks, block_size, kv_heads, head_dim] K and V pool per causal layer.

        Zero-filled: the torch kernels gather whole blocks and mask afterwards, and 0 * NaN from
        uninitialised memory would poison the masked sum.
        """
        caches = []
        for attn in self._causal_attention():
            shape = (num_blocks, block_size, attn.num_kv_heads, attn.head_dim)
            attn.k_cache = torch.zeros(shape, dtype=self.dtype, device=self.device)
            attn.v_cache = torch.zeros(shape, dtype=self.dtype, device=self.device)
            caches.append((attn.k_cache, attn.v_cache))
        return caches

    # -- step ----------------------------------------------------------------------------------------------------

    def _embed_audio(self, inputs: BackboneInputs, feats: torch.Tensor) -> torch.Tensor:
        """LocEnc embedding at audio positions, zero elsewhere. [N, P, D] -> [N, hidden]."""
        audio = inputs.audio_mask
        rows = self.adapter_rows
        if inputs.attn.decode_only:  # decode positions are fed-back patches: encode every row (graph-friendly)
            if rows is not None:
                rows.audio = inputs.adapter
            emb = self.enc_to_lm_proj(self.feat_encoder(feats))
            return torch.where(audio[:, None], emb, torch.zeros_like(emb))
        emb = torch.zeros(feats.shape[0], self.config.lm_config.hidden_size, dtype=self.dtype, device=feats.device)
        if inputs.text_only:
            return emb
        index = audio.nonzero().squeeze(1)  # a prefill with prompt audio runs eagerly: this host sync is acceptable
        if index.numel():
            if rows is not None:
                rows.audio = None if inputs.adapter is None else inputs.adapter[index]
            emb[index] = self.enc_to_lm_proj(self.feat_encoder(feats[index]))
        return emb

    @torch.inference_mode()
    def forward(self, inputs: ModelInputs, max_timesteps: int | None = None) -> ModelOutputs:
        """One step per batch.py: `backbone` then `generate`. `max_timesteps` (host int, >= every row's
        timesteps) saves reading `inputs.timesteps.max()` back from the device (needed for CUDA graphs)."""
        lm_h, res_h, cond = self.backbone(inputs)
        if max_timesteps is None:
            max_timesteps = int(inputs.timesteps.max())
        adapter = None if inputs.adapter is None else inputs.adapter[inputs.last_index]
        return self.generate(
            lm_h,
            res_h,
            cond,
            inputs.cfg_value,
            inputs.temperature,
            inputs.timesteps,
            inputs.noise,
            max_timesteps,
            adapter=adapter,
        )

    @torch.inference_mode()
    def backbone(self, inputs: BackboneInputs) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The part of a step over the N packed positions (LocEnc, base LM, FSQ, residual LM, paged KV writes),
        reduced to each sequence's last position: (base LM hidden [B, H], residual LM hidden [B, H], that
        position's latent patch [B, P, D]), all in the model dtype. N varies per step; the outputs do not."""
        attn = inputs.attn
        audio = inputs.audio_mask
        if self.adapter_rows is not None:
            self.adapter_rows.tokens = inputs.adapter
        feats = inputs.feats.to(self.dtype)
        feat_emb = self._embed_audio(inputs, feats)
        text_emb = self.base_lm.embed_tokens(inputs.token_ids)
        if self.embed_scale is not None:
            text_emb = text_emb * self.embed_scale
        mask = audio[:, None]
        enc = self.base_lm(torch.where(mask, feat_emb, text_emb), inputs.positions, attn)
        enc = torch.where(mask, self.fsq_layer(enc), enc)
        if self.fusion_concat_proj is not None:
            residual_in = self.fusion_concat_proj(torch.cat((enc, feat_emb), dim=-1))
        else:
            residual_in = enc + feat_emb
        res = self.residual_lm(residual_in, inputs.positions, attn)
        last = inputs.last_index
        return enc[last], res[last], feats[last]

    @torch.inference_mode()
    def start(
        self,
        lm_h: torch.Tensor,
        res_h: torch.Tensor,
        cond: torch.Tensor,
        cfg_value: torch.Tensor,
        temperature: torch.Tensor,
        timesteps: torch.Tensor,
        noise: torch.Tensor,
        adapter: torch.Tensor | None = None,
    ) -> tuple[FlowState, torch.Tensor]:
        """What follows the backbone up to the Euler iterations, fixed shapes per batch size B (capturable): mu from
        `backbone`'s two hiddens, the CFM solver's start conditioned on `cond`, and the stop head on the base LM
        hidden -> (FlowState, stop bool [B]). Per-row settings as in ModelInputs (cfg_value, temperature [B]
        float32, timesteps [B] int64, noise [B, D, P] float32). Rows are independent: a row's result does not
        depend on the others' values. `adapter`: int32 [B] LoRA slot per row (0 or None: none)."""
        if self.adapter_rows is not None:
            self.adapter_rows.seqs = adapter
        if self.fusion_concat_proj is not None:
            mu = torch.cat((self.lm_to_dit_proj(lm_h), self.res_to_dit_proj(res_h)), dim=-1)
        else:
            mu = self.lm_to_dit_proj(lm_h) + self.res_to_dit_proj(res_h)
        state = self.feat_decoder.begin(mu, cond, noise.transpose(1, 2), temperature, cfg_value, timesteps, adapter)
        stop = self.stop_head(F.silu(self.stop_proj(lm_h))).argmax(dim=-1) == 1
        return state, stop

    @torch.inference_mode()
    def generate(
        self,
        lm_h: torch.Tensor,
        res_h: torch.Tensor,
        cond: torch.Tensor,
        cfg_value: torch.Tensor,
        temperature: torch.Tensor,
        timesteps: torch.Tensor,
        noise: torch.Tensor,
        max_timesteps: int,
        adapter: torch.Tensor | None = None,
    ) -> ModelOutputs:
        """The rest of a step: `start`, then every Euler iteration (max_timesteps >= each row's timesteps)."""
        state, stop = self.start(lm_h, res_h, cond, cfg_value, temperature, timesteps, noise, adapter)
        return ModelOutputs(patches=self.feat_decoder.solve(state, max_timesteps).float(), stop=stop)
