"""Slot-indexed exact streaming decoder for the VoxCPM AudioVAE.

This file owns ``StreamingVAEDecoder``: the causal context of every stateful conv of ``AudioVAE.decoder`` for up to
``max_slots`` concurrent streams, kept in one preallocated tensor ``state`` [max_slots, state_size]. Each conv owns the
column slice ``[offset, offset + C*ctx)`` of it, i.e. a [max_slots, C, ctx] view (``ctx`` = 2*padding -
output_padding left-pad frames for a causal conv, (k-1)//stride = 1 input frame for a transposed conv).

A ``decode`` call gathers the rows of its slots once (``index_select``), runs the batched decoder, which reads the old
context and writes the new one into a fresh [B, state_size] tensor, and scatters it back once (``index_copy_``). There
is no per-stream Python and no data-dependent shape, so a call with a fixed batch size and frame count can be captured
in a CUDA graph (``slots`` and ``latents`` as static input buffers). State is only written after the whole decoder ran,
so a failing call leaves every stream's context untouched.

Streaming is exact: decoding latents in pieces equals the offline ``AudioVAE.decode`` of their concatenation up to float
rounding, because every layer is causal and the reset state (zeros) is the offline zero padding.
"""

from __future__ import annotations

import torch
from torch import Tensor

from engine.models.voxcpm.audio_vae import AudioVAE, StreamState


class StreamingVAEDecoder:
    """Per-slot streaming decode. ``slots`` within one call must be distinct (``index_copy_`` of duplicates is
    undefined), except for a scratch slot whose state nobody reads (padded graph rows); the caller calls
    ``reset`` when a slot is handed to a new request."""

    def __init__(
        self, vae: AudioVAE, max_slots: int, device: torch.device | str, dtype: torch.dtype = torch.float32
    ) -> None:
        param = next(vae.decoder.parameters())
        device = torch.empty(0, device=device).device  # "cuda" -> "cuda:0", to compare with the parameters'
        if param.device != device or param.dtype != dtype:
            raise ValueError(f"vae is on {param.device}/{param.dtype}, decoder asked for {device}/{dtype}")
        self.vae = vae
        self.max_slots = max_slots
        self.dtype = dtype
        self.hop = vae.decode_chunk_size
        self.state = torch.zeros(max_slots, vae.decoder.state_size, device=device, dtype=dtype)

    @property
    def state_bytes_per_slot(self) -> int:
        return self.state.shape[1] * self.state.element_size()

    @torch.no_grad()
    def reset(self, slots: Tensor) -> None:
        """Zero the context of ``slots`` (int64 [N], on the state's device): the next decode starts a fresh stream."""
        self.state.index_fill_(0, slots, 0)

    @torch.no_grad()
    def prime(self, slots: Tensor, latents: Tensor) -> None:
        """Push context latents [B, D, F] (e.g. the prompt audio's last frames) through the decoder, discarding the
        audio, so that the next ``decode`` continues them seamlessly."""
        self._run(slots, latents)

    @torch.no_grad()
    def decode(self, slots: Tensor, latents: Tensor) -> Tensor:
        """latents [B, D, F] of streams ``slots`` (int64 [B]) -> float32 audio [B, F * hop] at ``out_sample_rate``."""
        return self._run(slots, latents).squeeze(1).float()

    def _run(self, slots: Tensor, latents: Tensor) -> Tensor:
        if slots.shape[0] != latents.shape[0]:  # else the first conv's context view fails with a shape riddle
            raise ValueError(f"{slots.shape[0]} slots for {latents.shape[0]} rows of latents")
        prev = self.state.index_select(0, slots)
        stream = StreamState(prev, torch.empty_like(prev))
        wav = self.vae.decoder(latents.to(self.dtype), stream)
        self.state.index_copy_(0, slots, stream.next)
        return wav
