"""VoxCPMModel's step as ONE function, as it was before the backbone/generate split (commit c55908a).

The reference the split forward (`backbone` then `generate`, and the runner's graphed tail) is tested against
bit for bit: the split only moves code, so any difference in the results is a bug.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.models.voxcpm.batch import ModelInputs, ModelOutputs
from engine.models.voxcpm.model import VoxCPMModel


@torch.inference_mode()
def single_forward(model: VoxCPMModel, inputs: ModelInputs, max_timesteps: int | None = None) -> ModelOutputs:
    attn = inputs.attn
    audio = inputs.audio_mask
    feats = inputs.feats.to(model.dtype)
    feat_emb = model._embed_audio(inputs, feats)
    text_emb = model.base_lm.embed_tokens(inputs.token_ids)
    if model.embed_scale is not None:
        text_emb = text_emb * model.embed_scale
    mask = audio[:, None]
    enc = model.base_lm(torch.where(mask, feat_emb, text_emb), inputs.positions, attn)
    enc = torch.where(mask, model.fsq_layer(enc), enc)
    if model.fusion_concat_proj is not None:
        residual_in = model.fusion_concat_proj(torch.cat((enc, feat_emb), dim=-1))
    else:
        residual_in = enc + feat_emb
    res = model.residual_lm(residual_in, inputs.positions, attn)

    last = inputs.last_index
    lm_h, res_h = enc[last], res[last]
    if model.fusion_concat_proj is not None:
        mu = torch.cat((model.lm_to_dit_proj(lm_h), model.res_to_dit_proj(res_h)), dim=-1)
    else:
        mu = model.lm_to_dit_proj(lm_h) + model.res_to_dit_proj(res_h)
    if max_timesteps is None:
        max_timesteps = int(inputs.timesteps.max())
    patches = model.feat_decoder(
        mu,
        feats[last],
        inputs.noise.transpose(1, 2),
        inputs.temperature,
        inputs.cfg_value,
        inputs.timesteps,
        max_timesteps,
    )
    stop = model.stop_head(F.silu(model.stop_proj(lm_h))).argmax(dim=-1) == 1
    return ModelOutputs(patches=patches.float(), stop=stop)
