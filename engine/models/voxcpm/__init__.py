"""VoxCPM (VoxCPM-0.5B, VoxCPM1.5: architecture "voxcpm"; VoxCPM2: "voxcpm2") for the engine.

The engine drives the family through `runner.VoxCPMRunner` (engine/models/family.py's ModelRunner; loaded by
`runner.load`, which engine/models/registry.py picks for config.json `architecture` "voxcpm" or "voxcpm2"; not
imported here). Its building blocks:
- `load_voxcpm(path_or_repo, device, dtype, attention_backend) -> LoadedVoxCPM`
  (model, vae, tokenizer, config, path, vae_sha256)
- `build_prompt(text, prompt, tokenizer, config) -> HostPrompt` (token_ids, feats, audio_mask, patch_cap: numpy)
- `VoxCPMModel.forward(ModelInputs, max_timesteps=None) -> ModelOutputs` (= `.backbone(BackboneInputs) ->
  (lm_h, res_h, cond)` then `.generate(lm_h, res_h, cond, cfg_value, temperature, timesteps, noise,
  max_timesteps)` = `.start(...) -> (FlowState, stop)` then `.feat_decoder.step(state, k)` per Euler iteration),
  `.allocate_kv_cache(num_blocks, block_size)`, `.kv_cache_bytes_per_token()`
- `engine.models.voxcpm.make_checkpoint.make_checkpoint(variant, size, out, seed, no_stop)`: random checkpoints
  in the released layout (not imported here, so that `python -m` runs it cleanly).
"""

from engine.models.voxcpm.checkpoint import CheckpointError, LoadedVoxCPM, load_voxcpm
from engine.models.voxcpm.config import ConfigError, VoxCPMConfig, load_config
from engine.models.voxcpm.model import VoxCPMModel
from engine.models.voxcpm.prompt import HostPrompt, build_prompt
from engine.models.voxcpm.tokenizer import VoxCPMTokenizer, preprocess_text

__all__ = [
    "CheckpointError",
    "ConfigError",
    "HostPrompt",
    "LoadedVoxCPM",
    "VoxCPMConfig",
    "VoxCPMModel",
    "VoxCPMTokenizer",
    "build_prompt",
    "load_config",
    "load_voxcpm",
    "preprocess_text",
]
