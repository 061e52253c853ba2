"""Qwen3-TTS 12 Hz talker + code predictor (+ the Base checkpoints' speaker encoder), module names as released.

One frame (80 ms) per step, per row (the reference's `Qwen3TTSTalkerForConditionalGeneration.forward`):
    h      = talker's last normed hidden (the prompt's last row for frame 0)
    c0     = choose(codec_head(h))                       # EOS (codec_eos_id) ends the row
    c1     = choose(lm_head[0](predictor([h, E0(c0)])))  # 2-position prefill of the predictor
    c_g    = choose(lm_head[g-1](predictor(E_{g-1}(c_{g-1}))))   g = 2..15, one position each
    next   = E0(c0) + sum_g E_g(c_g) + trailing_text[t] (or tts_pad once the text is consumed)
E0 is the talker's codec embedding, E_g the predictor's (talker width, mapped to the predictor's width by
`small_to_mtp_projection` on the 1.7B models, absent on 0.6B where the widths agree).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn

from engine.attention import AttentionBackend
from engine.attention.metadata import AttentionMetadata
from engine.models.layers import Linear
from engine.models.qwen3tts.config import Qwen3TTSConfig, TalkerConfig
from engine.models.qwen3tts.prompt import Qwen3Prompt
from engine.models.qwen3tts.qwen3 import Qwen3Stack
from engine.models.qwen3tts.sampling import RowSampling, choose
from engine.models.qwen3tts.speaker_encoder import SpeakerEncoder

# noise(codebook, vocab): what `choose` draws codebook `codebook` (0..15) of this frame with, for every row
Noise = Callable[[int, int], "torch.Tensor | Sequence[torch.Generator | None]"]


def _to(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host tensor on `device` without a host sync (through pinned memory on CUDA)."""
    if device.type == "cuda" and tensor.device.type == "cpu":
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor.to(device)


class TalkerStack(Qwen3Stack):
    """`talker.model`: the decoder plus its two input tables."""

    def __init__(self, config: TalkerConfig, backend: AttentionBackend | None) -> None:
        super().__init__(config.stack, backend)
        self.codec_embedding = nn.Embedding(config.stack.vocab_size, config.stack.hidden_size)
        self.text_embedding = nn.Embedding(config.text_vocab_size, config.text_hidden_size)


class TextProjection(nn.Module):
    """`talker.text_projection`: text width -> talker width (Linear, SiLU, Linear, with biases)."""

    def __init__(self, text_hidden: int, hidden: int) -> None:
        super().__init__()
        self.linear_fc1 = nn.Linear(text_hidden, text_hidden)
        self.linear_fc2 = nn.Linear(text_hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_fc2(nn.functional.silu(self.linear_fc1(x)))


class PredictorStack(Qwen3Stack):
    def __init__(self, config: TalkerConfig) -> None:
        super().__init__(config.predictor, None)
        groups = config.predictor.num_code_groups - 1
        self.codec_embedding = nn.ModuleList(
            nn.Embedding(config.predictor.vocab_size, config.stack.hidden_size) for _ in range(groups)
        )


class CodePredictor(nn.Module):
    """`talker.code_predictor`: codebooks 1..15 of a frame from the talker's hidden and codebook 0."""

    def __init__(self, config: TalkerConfig) -> None:
        super().__init__()
        self.model = PredictorStack(config)
        p = config.predictor
        self.lm_head = nn.ModuleList(
            Linear(p.hidden_size, p.vocab_size, bias=False) for _ in range(p.num_code_groups - 1)
        )
        if p.hidden_size != config.stack.hidden_size:
            self.small_to_mtp_projection = nn.Linear(config.stack.hidden_size, p.hidden_size)

    def _project(self, x: torch.Tensor) -> torch.Tensor:
        proj = getattr(self, "small_to_mtp_projection", None)
        return x if proj is None else proj(x)

    def forward(self, hidden: torch.Tensor, first: torch.Tensor, sampling: RowSampling, noise: Noise) -> torch.Tensor:
        """hidden [B, H_talker] (talker output), first [B, H_talker] = E0(c0) -> codes [B, groups-1]; codebook g
        draws with `noise(g, vocab)`."""
        groups = len(self.lm_head)
        # K/V kept in fp32, where the attention reads them: the bf16 values exactly, without a conversion per pass
        caches = self.model.new_caches(hidden.shape[0], groups + 1, hidden.device, torch.float32)
        # cos/sin of every position once a frame, not once a pass (the same numbers: elementwise from positions)
        rope = self.model.rope(torch.arange(groups + 1, device=hidden.device))
        x = self._project(torch.stack((hidden, first), dim=1))
        codes = []
        for g in range(groups):
            start = 0 if g == 0 else g + 1
            out = self.model.forward_cached(x, start, caches, rope)
            logits = self.lm_head[g](out[:, -1]).float()
            code = choose(logits, sampling, noise(g + 1, logits.shape[-1]))
            codes.append(code)
            if g + 1 < groups:
                x = self._project(self.model.codec_embedding[g](code))[:, None]
        return torch.stack(codes, dim=1)


class Talker(nn.Module):
    def __init__(self, config: TalkerConfig, backend: AttentionBackend | None) -> None:
        super().__init__()
        self.model = TalkerStack(config, backend)
        self.text_projection = TextProjection(config.text_hidden_size, config.stack.hidden_size)
        self.codec_head = Linear(config.stack.hidden_size, config.stack.vocab_size, bias=False)
        self.code_predictor = CodePredictor(config)


class Qwen3TTSModel(nn.Module):
    def __init__(self, config: Qwen3TTSConfig, backend: AttentionBackend | None) -> None:
        super().__init__()
        self.config = config
        self.talker = Talker(config.talker, backend)
        if config.speaker_encoder is not None:
            self.speaker_encoder = SpeakerEncoder(config.speaker_encoder)

    def fuse_projections(self) -> None:
        """Fused q/k/v and gate/up weights in the talker and the code predictor (see Qwen3Stack.fuse_projections):
        on CUDA, where a step is bound by kernel count; the CPU keeps the reference's separate GEMMs."""
        self.talker.model.fuse_projections()
        self.talker.code_predictor.model.fuse_projections()

    @property
    def device(self) -> torch.device:
        return self.talker.codec_head.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.talker.codec_head.weight.dtype

    # -- embeddings ---------------------------------------------------------------------------------------------

    def text_embed(self, ids: torch.Tensor) -> torch.Tensor:
        """T(ids): the text track of rows, [..., H]."""
        return self.talker.text_projection(self.talker.model.text_embedding(ids))

    def codec_embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.talker.model.codec_embedding(ids)

    def frame_embed(self, codes: torch.Tensor) -> torch.Tensor:
        """codes [..., 16] -> E0(c0) + sum_g E_g(c_g) [..., H], summed in the reference's order."""
        tables = [self.talker.model.codec_embedding, *self.talker.code_predictor.model.codec_embedding]
        parts = [table(codes[..., g]) for g, table in enumerate(tables)]
        return torch.stack(parts, dim=-2).sum(dim=-2)

    def embed_prompt(self, prompt: Qwen3Prompt) -> torch.Tensor:
        """The prefill rows [R, H]: text track + codec track per row (either may be absent)."""
        return self.embed_prompts([prompt])

    def embed_prompts(self, prompts: Sequence[Qwen3Prompt], ids: torch.Tensor | None = None) -> torch.Tensor:
        """The prefill rows of prompts packed one after the other [N, H], N >= their total rows (rows past them,
        with ids -1, are zero). `ids`: int64 [2, N], their text ids then codec ids already on the device (the
        engine stages them with its other inputs); None copies them from the prompts. Fixed shapes and no host
        sync but for a voice clone's x-vector and reference codes: every track is embedded for every row and
        masked, so an absent track adds exactly zero (the reference's rows bit for bit)."""
        device = self.device
        if ids is None:
            ids = torch.stack([torch.cat([getattr(p, f) for p in prompts]) for f in ("text_ids", "codec_ids")])
            ids = ids.to(device)
        text_ids, codec_ids = ids
        text = self.text_embed(text_ids.clamp(min=0))
        codec = self.codec_embed(codec_ids.clamp(min=0))
        rows = torch.where((text_ids >= 0)[:, None], text, 0) + torch.where((codec_ids >= 0)[:, None], codec, 0)
        start = 0
        for prompt in prompts:
            if prompt.speaker_row is not None:
                assert prompt.speaker_vector is not None
                rows[start + prompt.speaker_row] += _to(prompt.speaker_vector, device).to(self.dtype)
            if prompt.ref_codes is not None:
                first = start + prompt.ref_start
                rows[first : first + prompt.ref_codes.shape[0]] += self.frame_embed(_to(prompt.ref_codes, device))
            start += len(prompt)
        return rows

    def trailing_embed(self, prompt: Qwen3Prompt) -> torch.Tensor:
        """The text fed one row per generated frame [T, H], ending in tts_pad (fed once the rest is used up)."""
        ids = torch.cat((prompt.trailing_ids, torch.tensor([self.config.tts_pad_token_id])))
        return self.text_embed(ids.to(self.device))

    # -- one step -----------------------------------------------------------------------------------------------

    def talker_forward(self, x: torch.Tensor, positions: torch.Tensor, attn: AttentionMetadata) -> torch.Tensor:
        """Packed input rows x [N, H] at positions [N] -> normed hidden [N, H] (K/V written to the pool)."""
        return self.talker.model.forward_paged(x, positions, attn)

    def codebook0_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.talker.codec_head(hidden).float()

    def predict_rest(self, hidden: torch.Tensor, c0: torch.Tensor, sampling: RowSampling, noise: Noise) -> torch.Tensor:
        """Codebooks 1..15 for rows with talker hidden [B, H] and codebook 0 [B] -> full frames [B, 16]."""
        rest = self.talker.code_predictor(hidden, self.codec_embed(c0), sampling, noise)
        return torch.cat((c0[:, None], rest), dim=1)

    # -- KV pool ------------------------------------------------------------------------------------------------

    def kv_cache_bytes_per_token(self, dtype: torch.dtype | None = None) -> int:
        s = self.config.talker.stack
        element = torch.empty(0, dtype=dtype or self.dtype).element_size()
        return 2 * s.num_hidden_layers * s.num_key_value_heads * s.head_dim * element

    def allocate_kv_cache(self, num_blocks: int, block_size: int) -> None:
        s = self.config.talker.stack
        shape = (num_blocks, block_size, s.num_key_value_heads, s.head_dim)
        for layer in self.talker.model.layers:
            layer.self_attn.k_cache = torch.zeros(shape, device=self.device, dtype=self.dtype)
            layer.self_attn.v_cache = torch.zeros(shape, device=self.device, dtype=self.dtype)
