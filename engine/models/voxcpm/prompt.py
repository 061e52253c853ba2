"""Packed prompt positions of one request, for every conditioning mode (reference `_generate_with_prompt_cache`).

- zero-shot:                 [tok(text), 101]
- continuation:              [tok(prompt.text + text), 101, a_1 .. a_n]
- reference (VoxCPM2):       [103, r_1 .. r_m, 104, tok(text), 101]
- reference + continuation:  [103, r_1 .. r_m, 104, tok(prompt.text + text), 101, a_1 .. a_n]

Text positions (including 101/103/104) carry their token id and a zero patch; audio positions carry token id 0,
their latent patch and audio_mask True. The generation cap of the reference is 6 * n + 10 patches with n the
token count of the target text alone (`reference_patch_cap`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from engine.models.voxcpm.config import (
    AUDIO_START_TOKEN,
    REF_AUDIO_END_TOKEN,
    REF_AUDIO_START_TOKEN,
    VoxCPMConfig,
)
from engine.models.voxcpm.tokenizer import VoxCPMTokenizer, preprocess_text
from engine.params import Prompt


@dataclass(frozen=True, slots=True)
class HostPrompt:
    """A packed prompt as host arrays: what the runner stages at the request's prefill, and the FamilyPrompt the
    engine core reads (engine/sequence.py). Built with numpy, not torch: an engine process builds a burst's prompts
    on its readers' threads, and small torch ops there cost several times the work itself (each one gives up the GIL
    and waits for it back behind the other readers: on one H200, 512 arrivals took 171 ms to build, 334 us each)."""

    token_ids: np.ndarray  # int64 [T] text token ids (0 at audio positions)
    feats: np.ndarray  # float32 [T, P, D] latent patches (zeros at text positions; read-only when all text)
    audio_mask: np.ndarray  # bool [T]
    patch_cap: int  # the reference's length cap, reference_patch_cap(target text tokens)

    @property
    def num_positions(self) -> int:
        return len(self.token_ids)

    def decode_context(self, max_patches: int) -> np.ndarray | None:
        """The last prompt audio patches [n <= max_patches, P, D] when the prompt ends in audio (continuation).

        The reference decodes continuation output together with these patches, so the streaming VAE is
        primed with them; a prompt ending in text (zero-shot, reference-only) starts from silence.
        """
        if not self.audio_mask[-1]:
            return None
        return self.feats[self.audio_mask][-max_patches:]


def reference_patch_cap(target_text_tokens: int) -> int:
    """The reference's text-proportional cap on generated patches (`max_len = 6 * n + 10` in its generate loop)."""
    return 6 * target_text_tokens + 10


def _latents(name: str, value: np.ndarray, patch_size: int, feat_dim: int) -> np.ndarray:
    array = np.array(value, dtype=np.float32)  # a copy: the caller's array may change after the request
    if array.ndim != 3 or array.shape[1:] != (patch_size, feat_dim):
        raise ValueError(f"{name} must be shaped [patches, {patch_size}, {feat_dim}], got {list(array.shape)}")
    if not np.isfinite(array).all():
        raise ValueError(f"{name} contains non-finite values")
    return array


def _zero_feats(positions: int, patch_size: int, feat_dim: int) -> np.ndarray:
    """[positions, P, D] zeros that hold no memory of their own (every position views one zero patch)."""
    return np.broadcast_to(np.zeros((1, patch_size, feat_dim), dtype=np.float32), (positions, patch_size, feat_dim))


def build_prompt(text: str, prompt: Prompt, tokenizer: VoxCPMTokenizer, config: VoxCPMConfig) -> HostPrompt:
    """Pack one request. Both texts get the reference's preprocessing (newlines, whitespace runs); the
    reference applies it to the target text only, but a prompt text is usually an earlier target text."""
    for name in ("speaker", "instruction", "language"):
        if getattr(prompt, name):
            raise ValueError(f"VoxCPM models take no {name}")
    p, d = config.patch_size, config.feat_dim
    target = preprocess_text(text)
    if not target.strip():
        raise ValueError("text must contain something to say")
    ids: list[int] = []  # token id per position, 0 at audio positions
    audio: list[tuple[int, np.ndarray]] = []  # (first position, latents) of each audio run
    if prompt.reference_latents is not None:
        if not config.is_v2:
            raise ValueError("reference audio needs a VoxCPM2 model")
        reference = _latents("reference_latents", prompt.reference_latents, p, d)
        audio.append((1, reference))
        ids += [REF_AUDIO_START_TOKEN, *[0] * len(reference), REF_AUDIO_END_TOKEN]
    target_ids = tokenizer.encode(target)
    cap = reference_patch_cap(len(target_ids))
    if prompt.latents is None:
        ids += [*target_ids, AUDIO_START_TOKEN]
    else:
        ids += [*tokenizer.encode(preprocess_text(prompt.text) + target), AUDIO_START_TOKEN]
        latents = _latents("latents", prompt.latents, p, d)
        audio.append((len(ids), latents))
        ids += [0] * len(latents)
    # Text alone (most requests) holds no latents: a view of one zero patch, where each of a burst's prompts would
    # otherwise fault in ~90 KB of zeros on its submitter's thread (VoxCPM2: 91 positions of 4 x 64 floats).
    feats = np.zeros((len(ids), p, d), dtype=np.float32) if audio else _zero_feats(len(ids), p, d)
    audio_mask = np.zeros(len(ids), dtype=bool)
    for start, latents in audio:
        feats[start : start + len(latents)] = latents
        audio_mask[start : start + len(latents)] = True
    return HostPrompt(np.array(ids, dtype=np.int64), feats, audio_mask, cap)
