"""Waveform discriminators for codec GAN training.

MultiPeriodDiscriminator (HiFi-GAN, Kong et al. 2020): the waveform folded into a 2-D grid of
(T / p, p) for each period p, convs with kernel (5, 1) along the folded time axis, so each
sub-discriminator judges the samples p apart: periodic structure (pitch harmonics) that a
spectral loss smears.

MultiResolutionSTFTDiscriminator (EnCodec's MS-STFTD, Defossez et al. 2022): the complex STFT
(real and imaginary parts as two channels) at several FFT sizes, 2-D convs dilated along time
and strided along frequency: it sees phase as well as magnitude, at several time-frequency
trade-offs.

Both take audio (B, 1, T) or (B, T) and return (logits_list, feature_maps_list) with one entry
per sub-discriminator; feature_maps_list[i] lists the activations of its hidden layers (the
logits are not repeated there), for the feature-matching loss.
"""
from dataclasses import dataclass, field
from typing import List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.parametrizations import weight_norm as _weight_norm

from toolkit.config import ConfigError
from toolkit.nn.spectral import reflect_pad, stft

DiscriminatorOutput = Tuple[List[torch.Tensor], List[List[torch.Tensor]]]


def _as_b1t(x: torch.Tensor) -> torch.Tensor:
    if x.dim() == 2:
        return x.unsqueeze(1)
    if x.dim() != 3 or x.shape[1] != 1:
        raise ValueError(f"expected (B, 1, T) or (B, T) audio, got {tuple(x.shape)}")
    return x


def _scaled(widths: List[int], scale: float, max_channels: int) -> List[int]:
    return [max(1, min(max_channels, int(round(w * scale)))) for w in widths]


def _wn(module: nn.Module, enabled: bool) -> nn.Module:
    return _weight_norm(module) if enabled else module


# --------------------------------------------------------------------------- MPD

@dataclass
class MultiPeriodDiscriminatorConfig:
    # folding periods; primes, so that the sub-discriminators' patterns overlap little (HiFi-GAN)
    periods: List[int] = field(default_factory=lambda: [2, 3, 5, 7, 11])
    # conv widths before scaling: HiFi-GAN's full size
    channels: List[int] = field(default_factory=lambda: [32, 128, 512, 1024, 1024])
    channels_scale: float = 1.0     # multiplies every width (e.g. 0.25 for a CPU-sized discriminator)
    max_channels: int = 1024        # cap on any width after scaling
    kernel_size: int = 5            # taps along the folded time axis
    stride: int = 3                 # stride along folded time for all but the last width (HiFi-GAN)
    leaky_slope: float = 0.1        # LeakyReLU negative slope (HiFi-GAN)
    weight_norm: bool = True        # weight-normalised convs, standard for GAN discriminators

    def validate(self) -> "MultiPeriodDiscriminatorConfig":
        if not self.periods or any(p < 1 for p in self.periods):
            raise ConfigError(f"mpd.periods: need integers >= 1, got {self.periods}")
        if not self.channels or self.channels_scale <= 0 or self.max_channels < 1:
            raise ConfigError("mpd.channels/channels_scale/max_channels: need a non-empty "
                              "width list, a positive scale and max_channels >= 1")
        return self


class PeriodDiscriminator(nn.Module):
    def __init__(self, period: int, cfg: MultiPeriodDiscriminatorConfig):
        super().__init__()
        self.period = period
        self.slope = cfg.leaky_slope
        widths = _scaled(cfg.channels, cfg.channels_scale, cfg.max_channels)
        pad = ((cfg.kernel_size - 1) // 2, 0)
        convs, previous = [], 1
        for i, width in enumerate(widths):
            stride = (cfg.stride, 1) if i < len(widths) - 1 else (1, 1)
            convs.append(_wn(nn.Conv2d(previous, width, (cfg.kernel_size, 1), stride, pad),
                             cfg.weight_norm))
            previous = width
        self.convs = nn.ModuleList(convs)
        self.post = _wn(nn.Conv2d(previous, 1, (3, 1), 1, (1, 0)), cfg.weight_norm)

    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, List[torch.Tensor]]:
        batch, _, length = x.shape
        extra = (-length) % self.period
        if extra:
            # Reflect where the signal is long enough, zeros for a very short one.
            x = reflect_pad(x, 0, extra) if length > extra else F.pad(x, (0, extra))
        h = x.view(batch, 1, -1, self.period)
        features = []
        for conv in self.convs:
            h = F.leaky_relu(conv(h), self.slope)
            features.append(h)
        return self.post(h).flatten(1), features


class MultiPeriodDiscriminator(nn.Module):
    def __init__(self, config: Optional[MultiPeriodDiscriminatorConfig] = None):
        super().__init__()
        self.config = (config or MultiPeriodDiscriminatorConfig()).validate()
        self.discriminators = nn.ModuleList(
            PeriodDiscriminator(p, self.config) for p in self.config.periods)

    def forward(self, audio: torch.Tensor) -> DiscriminatorOutput:
        x = _as_b1t(audio)
        logits, features = [], []
        for disc in self.discriminators:
            out, feats = disc(x)
            logits.append(out)
            features.append(feats)
        return logits, features


# --------------------------------------------------------------------------- MS-STFTD

@dataclass
class MultiResolutionSTFTDiscriminatorConfig:
    # FFT sizes: EnCodec's [2048, 1024, 512] at 24 kHz, halved for 16 kHz
    n_ffts: List[int] = field(default_factory=lambda: [1024, 512, 256])
    hop_ratio: float = 0.25         # hop = n_fft * hop_ratio (75 % overlap, EnCodec)
    filters: int = 32               # width of the first conv (EnCodec)
    filters_scale: float = 1.0      # width growth per dilated layer; 1: constant width (EnCodec default)
    max_filters: int = 1024         # cap on any width
    # time dilations of the middle convs, which widen the time context layer by layer
    dilations: List[int] = field(default_factory=lambda: [1, 2, 4])
    # (time, frequency) taps of the convs (EnCodec)
    kernel_size: List[int] = field(default_factory=lambda: [3, 9])
    leaky_slope: float = 0.2        # LeakyReLU negative slope (EnCodec)
    normalized: bool = True         # STFT divided by the window's L2 norm: similar scales at every resolution
    weight_norm: bool = True        # weight-normalised convs, standard for GAN discriminators

    def validate(self) -> "MultiResolutionSTFTDiscriminatorConfig":
        if not self.n_ffts or any(n < 8 for n in self.n_ffts):
            raise ConfigError(f"mstftd.n_ffts: need FFT sizes >= 8, got {self.n_ffts}")
        if not 0 < self.hop_ratio <= 1:
            raise ConfigError(f"mstftd.hop_ratio: must be in (0, 1], got {self.hop_ratio}")
        if len(self.kernel_size) != 2:
            raise ConfigError(f"mstftd.kernel_size: need [time, freq], got {self.kernel_size}")
        if self.filters < 1 or self.filters_scale <= 0:
            raise ConfigError("mstftd.filters/filters_scale: must be positive")
        return self


class STFTDiscriminator(nn.Module):
    def __init__(self, n_fft: int, cfg: MultiResolutionSTFTDiscriminatorConfig):
        super().__init__()
        self.n_fft = n_fft
        self.hop = max(1, int(n_fft * cfg.hop_ratio))
        self.normalized = cfg.normalized
        self.slope = cfg.leaky_slope
        kt, kf = cfg.kernel_size
        width = min(cfg.max_filters, cfg.filters)
        convs = [_wn(nn.Conv2d(2, width, (kt, kf), padding=(kt // 2, kf // 2)), cfg.weight_norm)]
        for i, dilation in enumerate(cfg.dilations):
            out = min(cfg.max_filters, int(round(cfg.filters * cfg.filters_scale ** (i + 1))))
            convs.append(_wn(nn.Conv2d(width, out, (kt, kf), stride=(1, 2),
                                       dilation=(dilation, 1),
                                       padding=(dilation * (kt // 2), kf // 2)),
                             cfg.weight_norm))
            width = out
        convs.append(_wn(nn.Conv2d(width, width, (kt, kt), padding=(kt // 2, kt // 2)),
                         cfg.weight_norm))
        self.convs = nn.ModuleList(convs)
        self.post = _wn(nn.Conv2d(width, 1, (kt, kt), padding=(kt // 2, kt // 2)),
                        cfg.weight_norm)

    def spectrogram(self, x: torch.Tensor) -> torch.Tensor:
        """(B, 1, T) -> (B, 2, frames, freq) float32: real and imaginary parts."""
        spec = stft(x, self.n_fft, self.hop)              # fp32 island
        with torch.autocast(device_type=spec.device.type, enabled=False):
            if self.normalized:
                spec = spec / torch.hann_window(self.n_fft, device=spec.device).pow(2).sum().sqrt()
            return torch.stack([spec.real, spec.imag], dim=1).transpose(2, 3)

    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, List[torch.Tensor]]:
        h = self.spectrogram(x)
        features = []
        for conv in self.convs:
            h = F.leaky_relu(conv(h), self.slope)
            features.append(h)
        return self.post(h).flatten(1), features


class MultiResolutionSTFTDiscriminator(nn.Module):
    def __init__(self, config: Optional[MultiResolutionSTFTDiscriminatorConfig] = None):
        super().__init__()
        self.config = (config or MultiResolutionSTFTDiscriminatorConfig()).validate()
        self.discriminators = nn.ModuleList(
            STFTDiscriminator(n, self.config) for n in self.config.n_ffts)

    def forward(self, audio: torch.Tensor) -> DiscriminatorOutput:
        x = _as_b1t(audio)
        logits, features = [], []
        for disc in self.discriminators:
            out, feats = disc(x)
            logits.append(out)
            features.append(feats)
        return logits, features
