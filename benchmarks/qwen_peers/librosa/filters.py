"""librosa.filters.mel (Slaney scale and norm), from our speaker encoder's filterbank."""

from __future__ import annotations

import numpy as np


def mel(*, sr, n_fft, n_mels=128, fmin=0.0, fmax=None, htk=False, norm="slaney", dtype=np.float32):
    if htk or norm != "slaney" or dtype != np.float32:
        raise NotImplementedError(f"librosa stand-in: filters.mel(htk={htk}, norm={norm!r}, dtype={dtype})")
    # Imported here: the engine package is on the peer's sys.path only through the repo root.
    from engine.models.qwen3tts.speaker_encoder import mel_filterbank

    return mel_filterbank(sr, n_fft, n_mels, fmin, float(sr) / 2 if fmax is None else fmax)
