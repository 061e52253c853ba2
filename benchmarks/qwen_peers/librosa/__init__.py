"""The three librosa functions the Qwen3-TTS peers call, for the benchmark on the GPU machine only.

qwen-tts (and its Transformers 5 port) imports librosa at module level but, for a 12 Hz checkpoint, calls only
`librosa.load(path, sr=None, mono=True)` (reading a reference voice file), `librosa.resample` (to the speaker
encoder's and codec's rates) and `librosa.filters.mel` (the speaker encoder's Slaney filterbank). Real librosa
needs numba and llvmlite (over 60 MB), more than the device call may carry, so bench_qwen3_peers.py puts this
directory first on the peer's sys.path. Each function reproduces librosa 0.11 for the arguments the peers pass
(tests/benchmarks/test_qwen_peers_librosa.py compares them with the real one) and refuses any other.
"""

from __future__ import annotations

import math

import numpy as np

from . import filters

__all__ = ["filters", "load", "resample"]


def load(path, *, sr=None, mono=True, **kwargs):
    """librosa.load for a file soundfile reads: float32 samples, channels averaged, resampled if sr is given."""
    if kwargs or not mono:
        raise NotImplementedError(f"librosa stand-in: load(mono={mono}, {sorted(kwargs)}) is not reproduced")
    import soundfile

    y, native = soundfile.read(str(path), dtype="float32", always_2d=True)
    y = y.mean(axis=1, dtype=np.float32)
    if sr is not None and sr != native:
        return resample(y, orig_sr=native, target_sr=sr), sr
    return y, native


def resample(y, *, orig_sr, target_sr, res_type="soxr_hq", fix=True, scale=False, **kwargs):
    """librosa.resample with its default soxr_hq filter, on the last axis, length fixed to ceil(n * ratio)."""
    if res_type != "soxr_hq" or not fix or scale or kwargs:
        raise NotImplementedError(f"librosa stand-in: resample(res_type={res_type!r}, fix={fix}, scale={scale})")
    import soxr

    y = np.asarray(y)
    if orig_sr == target_sr:
        return y
    n = math.ceil(y.shape[-1] * (float(target_sr) / orig_sr))  # librosa's rounding: ratio first
    out = np.apply_along_axis(soxr.resample, -1, y, in_rate=orig_sr, out_rate=target_sr, quality="soxr_hq")
    if out.shape[-1] > n:
        out = out[..., :n]
    elif out.shape[-1] < n:
        out = np.pad(out, [(0, 0)] * (out.ndim - 1) + [(0, n - out.shape[-1])])
    return np.asarray(out, dtype=y.dtype)
