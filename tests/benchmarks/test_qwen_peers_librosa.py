"""benchmarks/qwen_peers/librosa, the stand-in the Qwen3-TTS peer benchmark puts before the peers: each of its three
functions gives the real librosa's result for the arguments qwen-tts passes, and refuses other arguments."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

librosa = pytest.importorskip("librosa")
soundfile = pytest.importorskip("soundfile")

SHIM = Path(__file__).resolve().parents[2] / "benchmarks" / "qwen_peers" / "librosa" / "__init__.py"


@pytest.fixture(scope="module")
def shim():
    spec = importlib.util.spec_from_file_location("librosa_shim", SHIM, submodule_search_locations=[str(SHIM.parent)])
    module = importlib.util.module_from_spec(spec)
    sys.modules["librosa_shim"] = module
    spec.loader.exec_module(module)
    yield module
    for name in [n for n in sys.modules if n == "librosa_shim" or n.startswith("librosa_shim.")]:
        del sys.modules[name]


@pytest.mark.parametrize(
    "kwargs",
    [
        # the Base speaker encoder's log-mel (modeling_qwen3_tts.mel_spectrogram)
        {"sr": 24000, "n_fft": 1024, "n_mels": 128, "fmin": 0, "fmax": 12000},
        # fmax left to librosa's default (sr / 2)
        {"sr": 16000, "n_fft": 400, "n_mels": 80},
    ],
)
def test_mel_is_librosas(shim, kwargs):
    ours, theirs = shim.filters.mel(**kwargs), librosa.filters.mel(**kwargs)
    assert ours.dtype == theirs.dtype == np.float32
    np.testing.assert_allclose(ours, theirs, rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize(("orig", "target"), [(24000, 16000), (16000, 24000), (44100, 24000), (24000, 24000)])
def test_resample_is_librosas(shim, orig, target):
    y = np.random.default_rng(0).standard_normal(orig // 3).astype(np.float32)
    ours = shim.resample(y, orig_sr=orig, target_sr=target)
    theirs = librosa.resample(y, orig_sr=orig, target_sr=target)
    assert ours.dtype == theirs.dtype and ours.shape == theirs.shape
    np.testing.assert_array_equal(ours, theirs)


@pytest.mark.parametrize("channels", [1, 2])
@pytest.mark.parametrize("sr", [None, 16000])
def test_load_is_librosas(shim, tmp_path, channels, sr):
    path = tmp_path / "voice.wav"
    audio = 0.3 * np.random.default_rng(1).standard_normal((24000, channels))
    soundfile.write(path, audio, 24000, subtype="PCM_16")
    ours, ours_sr = shim.load(str(path), sr=sr, mono=True)
    theirs, theirs_sr = librosa.load(str(path), sr=sr, mono=True)
    assert ours_sr == theirs_sr
    assert ours.dtype == theirs.dtype == np.float32
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-7)


def test_other_arguments_are_refused(shim, tmp_path):
    with pytest.raises(NotImplementedError, match="htk"):
        shim.filters.mel(sr=16000, n_fft=400, htk=True)
    with pytest.raises(NotImplementedError, match="res_type"):
        shim.resample(np.zeros(100, np.float32), orig_sr=16000, target_sr=8000, res_type="polyphase")
    with pytest.raises(NotImplementedError, match="mono"):
        shim.load(str(tmp_path / "x.wav"), mono=False)
