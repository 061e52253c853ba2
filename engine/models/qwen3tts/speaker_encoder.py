"""The Base checkpoints' speaker encoder: ECAPA-TDNN on a 128-bin log-mel of 24 kHz audio -> an x-vector of
the talker's width, placed on the codec track of the prompt (the reference's `Qwen3TTSSpeakerEncoder` and
`mel_spectrogram`, `modeling_qwen3_tts.py`). Convs pad "same" with reflection, as the reference's do.

The mel filterbank is librosa's (`librosa.filters.mel`, Slaney scale and norm), computed here in float64 and
stored as float32 like librosa's, so the engine does not need librosa.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

from engine.models.qwen3tts.config import SpeakerEncoderConfig

N_FFT = 1024
HOP = 256
WIN = 1024
FMAX = 12000.0


def _hz_to_mel(f: np.ndarray) -> np.ndarray:
    f_sp, min_log_hz = 200.0 / 3, 1000.0
    min_log_mel, logstep = min_log_hz / f_sp, math.log(6.4) / 27.0
    mels = f / f_sp
    return np.where(f >= min_log_hz, min_log_mel + np.log(np.maximum(f, 1e-10) / min_log_hz) / logstep, mels)


def _mel_to_hz(m: np.ndarray) -> np.ndarray:
    f_sp, min_log_hz = 200.0 / 3, 1000.0
    min_log_mel, logstep = min_log_hz / f_sp, math.log(6.4) / 27.0
    return np.where(m >= min_log_mel, min_log_hz * np.exp(logstep * (m - min_log_mel)), f_sp * m)


def mel_filterbank(sr: int, n_fft: int, n_mels: int, fmin: float, fmax: float) -> np.ndarray:
    """librosa.filters.mel(sr=sr, n_fft=n_fft, n_mels=n_mels, fmin=fmin, fmax=fmax) (Slaney), float32 [M, F]."""
    fftfreqs = np.fft.rfftfreq(n=n_fft, d=1.0 / sr)
    mel_f = _mel_to_hz(np.linspace(_hz_to_mel(np.array(fmin)), _hz_to_mel(np.array(fmax)), n_mels + 2))
    fdiff = np.diff(mel_f)
    ramps = np.subtract.outer(mel_f, fftfreqs)
    weights = np.zeros((n_mels, len(fftfreqs)), dtype=np.float32)
    for i in range(n_mels):
        lower = -ramps[i] / fdiff[i]
        upper = ramps[i + 2] / fdiff[i + 1]
        weights[i] = np.maximum(0, np.minimum(lower, upper))
    enorm = 2.0 / (mel_f[2 : n_mels + 2] - mel_f[:n_mels])
    weights *= enorm[:, np.newaxis]
    return weights


def log_mel(audio: torch.Tensor, n_mels: int, sample_rate: int) -> torch.Tensor:
    """audio [B, S] float32 at 24 kHz -> log-mel [B, frames, n_mels] (the reference's `mel_spectrogram`)."""
    basis = torch.from_numpy(mel_filterbank(sample_rate, N_FFT, n_mels, 0.0, FMAX)).to(audio.device)
    window = torch.hann_window(WIN, device=audio.device)
    pad = (N_FFT - HOP) // 2
    y = nn.functional.pad(audio.unsqueeze(1), (pad, pad), mode="reflect").squeeze(1)
    spec = torch.stft(
        y,
        N_FFT,
        hop_length=HOP,
        win_length=WIN,
        window=window,
        center=False,
        normalized=False,
        onesided=True,
        return_complex=True,
    )
    spec = torch.sqrt(torch.view_as_real(spec).pow(2).sum(-1) + 1e-9)
    return torch.log(torch.clamp(torch.matmul(basis, spec), min=1e-5)).transpose(1, 2)


def _conv(cin: int, cout: int, kernel: int, dilation: int = 1) -> nn.Conv1d:
    return nn.Conv1d(cin, cout, kernel, dilation=dilation, padding="same", padding_mode="reflect")


class TDNNBlock(nn.Module):
    def __init__(self, cin: int, cout: int, kernel: int, dilation: int) -> None:
        super().__init__()
        self.conv = _conv(cin, cout, kernel, dilation)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.conv(x))


class Res2NetBlock(nn.Module):
    def __init__(self, channels: int, scale: int, kernel: int, dilation: int) -> None:
        super().__init__()
        self.scale = scale
        width = channels // scale
        self.blocks = nn.ModuleList(TDNNBlock(width, width, kernel, dilation) for _ in range(scale - 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        outputs = []
        out = x
        for i, part in enumerate(torch.chunk(x, self.scale, dim=1)):
            out = part if i == 0 else self.blocks[i - 1](part if i == 1 else part + out)
            outputs.append(out)
        return torch.cat(outputs, dim=1)


class SEBlock(nn.Module):
    def __init__(self, channels: int, se_channels: int) -> None:
        super().__init__()
        self.conv1 = _conv(channels, se_channels, 1)
        self.conv2 = _conv(se_channels, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = torch.sigmoid(self.conv2(torch.relu(self.conv1(x.mean(dim=2, keepdim=True)))))
        return x * s


class SERes2NetBlock(nn.Module):
    def __init__(self, cin: int, cout: int, scale: int, se_channels: int, kernel: int, dilation: int) -> None:
        super().__init__()
        self.tdnn1 = TDNNBlock(cin, cout, 1, 1)
        self.res2net_block = Res2NetBlock(cout, scale, kernel, dilation)
        self.tdnn2 = TDNNBlock(cout, cout, 1, 1)
        self.se_block = SEBlock(cout, se_channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.se_block(self.tdnn2(self.res2net_block(self.tdnn1(x)))) + x


class AttentiveStatsPool(nn.Module):
    eps = 1e-12

    def __init__(self, channels: int, attention_channels: int) -> None:
        super().__init__()
        self.tdnn = TDNNBlock(channels * 3, attention_channels, 1, 1)
        self.conv = _conv(attention_channels, channels, 1)

    def _stats(self, x: torch.Tensor, weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mean = (weights * x).sum(2)
        std = torch.sqrt((weights * (x - mean.unsqueeze(2)).pow(2)).sum(2).clamp(self.eps))
        return mean, std

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        length = x.shape[-1]
        uniform = torch.full((x.shape[0], 1, length), 1.0 / length, device=x.device, dtype=x.dtype)
        mean, std = self._stats(x, uniform)
        context = torch.cat((x, mean.unsqueeze(2).expand(-1, -1, length), std.unsqueeze(2).expand(-1, -1, length)), 1)
        attention = torch.softmax(self.conv(torch.tanh(self.tdnn(context))), dim=2)
        mean, std = self._stats(x, attention)
        return torch.cat((mean, std), dim=1).unsqueeze(2)


class SpeakerEncoder(nn.Module):
    """`speaker_encoder`: log-mel [B, frames, mel] -> x-vector [B, enc_dim]."""

    def __init__(self, config: SpeakerEncoderConfig) -> None:
        super().__init__()
        self.config = config
        ch, ks, dil = config.enc_channels, config.enc_kernel_sizes, config.enc_dilations
        blocks: list[nn.Module] = [TDNNBlock(config.mel_dim, ch[0], ks[0], dil[0])]
        for i in range(1, len(ch) - 1):
            blocks.append(
                SERes2NetBlock(ch[i - 1], ch[i], config.enc_res2net_scale, config.enc_se_channels, ks[i], dil[i])
            )
        self.blocks = nn.ModuleList(blocks)
        self.mfa = TDNNBlock(ch[-1], ch[-1], ks[-1], dil[-1])
        self.asp = AttentiveStatsPool(ch[-1], config.enc_attention_channels)
        self.fc = _conv(ch[-1] * 2, config.enc_dim, 1)

    def forward(self, mels: torch.Tensor) -> torch.Tensor:
        x = mels.transpose(1, 2)
        outs = []
        for block in self.blocks:
            x = block(x)
            outs.append(x)
        x = self.mfa(torch.cat(outs[1:], dim=1))
        return self.fc(self.asp(x)).squeeze(-1)

    @torch.inference_mode()
    def embed(self, audio: torch.Tensor) -> torch.Tensor:
        """24 kHz mono float32 audio [S] -> x-vector [enc_dim] (the reference's `extract_speaker_embedding`)."""
        param = self.fc.weight
        mels = log_mel(audio.float()[None].to(param.device), self.config.mel_dim, self.config.sample_rate)
        return self(mels.to(param.dtype))[0]
