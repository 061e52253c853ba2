"""Cloned voices against the reference package, through the HTTP API (fp32, tiny VoxCPM2 checkpoint).

An upload must give the reference's latents for the same file (its `_encode_wav`: librosa's load, soxr's HQ
resampler, channels averaged, the VAE encoder), and speech with that voice must give the reference's generation in
the voice's mode (`prompt` = continuation, `reference`, `both` = reference + continuation) when both draw the same
noise: the server's engine runs with the noise the model parity tests inject into the reference.

Tolerances: latents within the model parity tests' 2e-5 of their scale (the same decode, resampler and encoder
on both sides; observed bit-identical); the waveform sample by sample as `_mismatched` explains.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path

import httpx
import numpy as np
import pytest
import soundfile as sf
import torch

from engine import AsyncEngine, EngineConfig
from engine.engine_core import EngineCore
from engine.models.voxcpm.runner import VoxCPMRunner
from tests.engine.models.voxcpm.reference import load_reference
from tests.engine.models.voxcpm.test_model import NUM_PATCHES, REL_TOL, _noise, run_reference
from tests.servers import RunningServer, running_server
from wsserver.normalize import normalize

TEXT = normalize("hello world, 你好 speech test")
TRANSCRIPT = "the voice model speaks"
RATE = 22050  # not the encoder's rate, and stereo: the upload is resampled and averaged as the reference does


@pytest.fixture(scope="module")
def clip(tmp_path_factory: pytest.TempPathFactory) -> Path:
    t = np.arange(int(1.5 * RATE)) / RATE
    rng = np.random.default_rng(3)
    left = 0.3 * np.sin(2 * np.pi * 180 * t) + 0.02 * rng.standard_normal(t.size)
    right = 0.2 * np.sin(2 * np.pi * 270 * t + 1.0)
    path = tmp_path_factory.mktemp("clip") / "voice.wav"
    sf.write(path, np.stack([left, right], 1), RATE, subtype="PCM_16")
    return path


@pytest.fixture(scope="module")
def reference(tiny_checkpoint: Callable[..., Path], tmp_path_factory: pytest.TempPathFactory) -> torch.nn.Module:
    return load_reference(tiny_checkpoint("voxcpm2", stop=False), tmp_path_factory.mktemp("reference"))


@pytest.fixture
async def server(
    tiny_checkpoint: Callable[..., Path], reference: torch.nn.Module, tmp_path: Path
) -> AsyncIterator[RunningServer]:
    """A server whose engine draws the reference's noise: patch k of every request starts from noise[k]."""
    checkpoint = tiny_checkpoint("voxcpm2", stop=False)
    config = EngineConfig(model=str(checkpoint), device="cpu", max_num_seqs=4, max_patches=NUM_PATCHES)
    noise = _noise(reference.config)
    runner = VoxCPMRunner(config, noise=lambda seeds, steps, shape: noise[steps])
    engine = AsyncEngine(config, EngineCore(config, runner))
    await engine.start()
    try:
        async with running_server(engine, tmp_path / "voices", max_patches=NUM_PATCHES) as running:
            yield running
    finally:
        await engine.close()


@pytest.mark.parametrize("role", ["prompt", "reference", "both"])
async def test_cloned_voice_matches_the_reference(
    server: RunningServer, reference: torch.nn.Module, clip: Path, role: str
) -> None:
    async with httpx.AsyncClient(base_url=server.http_url, timeout=60) as client:
        response = await client.post(
            "/v1/voices",
            files={"audio": ("voice.wav", clip.read_bytes(), "audio/wav")},
            data={"name": "parity", "transcript": TRANSCRIPT, "role": role},
        )
        assert response.status_code == 201, response.text
        voice_id = response.json()["id"]
        speech = await client.post(
            "/v1/audio/speech",
            json={"input": TEXT, "voice": voice_id, "response_format": "pcm", "sample_rate": 48000, "stream": False},
        )
        assert speech.status_code == 200, speech.text

    stored = server.server.voices.get(voice_id)
    prompt_wav = str(clip) if role != "reference" else None
    cache = reference.build_prompt_cache(
        prompt_text=TRANSCRIPT if prompt_wav else None,
        prompt_wav_path=prompt_wav,
        reference_wav_path=str(clip) if role != "prompt" else None,
    )
    for ours, theirs in (
        (stored.latents, cache.get("audio_feat")),
        (stored.reference_latents, cache.get("ref_audio_feat")),
    ):
        assert (ours is None) == (theirs is None)
        if theirs is not None:
            assert ours.shape == tuple(theirs.shape)
            assert float(np.abs(ours - theirs.numpy()).max() / theirs.abs().max()) <= REL_TOL

    noise = _noise(reference.config)
    expected = run_reference(reference, TEXT, cache, noise)["audio"].numpy()
    audio = np.frombuffer(speech.content, "<i2").astype(np.float32) / 32768
    assert audio.size == expected.size == NUM_PATCHES * server.server.engine.info.samples_per_patch
    assert _mismatched(audio, expected) <= 0.005, role
    # The check can fail: the same noise without the voice (zero-shot) gives other audio.
    assert _mismatched(audio, run_reference(reference, TEXT, None, noise)["audio"].numpy()) > 0.1


def _mismatched(audio: np.ndarray, expected: np.ndarray) -> float:
    """The fraction of samples off by more than 1e-3.

    The tiny random VAE decoder has a huge gain (99.8% of its samples sit at +-1), so the fp32 rounding in which the
    engine's latents differ from the reference's (2e-6 of their scale) moves the few unsaturated samples by up to
    ~0.25: a sample-wise tolerance cannot hold. Observed: 0.16% of the samples off; other conditioning: ~50%.
    """
    return float(np.mean(np.abs(audio - expected) > 1e-3))


async def test_uploads_decode_like_the_reference_in_every_format(
    server: RunningServer, reference: torch.nn.Module, clip: Path, tmp_path: Path
) -> None:
    """FLAC is lossless: the same latents as the WAV. MP3 and Ogg go through each side's own decoder (FFmpeg's here,
    libsndfile's in librosa), which may differ by a rounding; the latents agree to that."""
    wav, rate = sf.read(clip)
    async with httpx.AsyncClient(base_url=server.http_url, timeout=60) as client:
        for fmt, subtype, tolerance in (
            ("FLAC", "PCM_16", REL_TOL),
            ("OGG", "VORBIS", 1e-3),
            ("MP3", "MPEG_LAYER_III", 1e-3),
        ):
            path = tmp_path / f"voice.{fmt.lower()}"
            sf.write(path, wav, rate, format=fmt, subtype=subtype)
            response = await client.post(
                "/v1/voices",
                files={"audio": (path.name, path.read_bytes(), "application/octet-stream")},
                data={"name": fmt, "transcript": TRANSCRIPT},
            )
            assert response.status_code == 201, response.text
            ours = server.server.voices.get(response.json()["id"]).latents
            with torch.no_grad():
                theirs = reference._encode_wav(str(path), padding_mode="left")
            assert ours.shape == tuple(theirs.shape)
            assert float(np.abs(ours - theirs.numpy()).max() / theirs.abs().max()) <= tolerance, fmt
