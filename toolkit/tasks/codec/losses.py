"""Reconstruction and adversarial losses for codec training.

Spectral losses are fp32 islands (their STFTs run in float32 under autocast; see
toolkit.nn.spectral), so they can be called on bf16 generator outputs.

Weights used by DAC for orientation: mel 15, feature matching 2, adversarial 1,
commitment 0.25, codebook 1.
"""
from typing import List, Optional, Sequence, Tuple, Union

import torch
import torch.nn.functional as F
from torch import nn

from toolkit.nn.spectral import empty_mel_filters, mel_filterbank, stft, stft_magnitude

Logits = Union[torch.Tensor, Sequence[torch.Tensor]]


def fitting_mel_count(n_mels: int, n_fft: int, sample_rate: int, f_min: float = 0.0,
                      f_max: Optional[float] = None) -> int:
    """The largest count <= n_mels whose filters all catch at least one FFT bin.

    A mel filter narrower than the bin spacing can lie between two bins: its band is then
    always zero, its log is the clamp constant for both signals, and it adds nothing to the
    loss but a smaller mean. At 16 kHz DAC's counts [5, ..., 320] with windows [32, ..., 2048]
    all fit (the 320 lowest triangles are 19 Hz wide against 7.8 Hz bins at 2048 points);
    clipping matters for other rates or for more mels on a short window (20 mels on 32
    points at 16 kHz already leaves 4 empty)."""
    count = n_mels
    while count > 1 and empty_mel_filters(count, n_fft, sample_rate, f_min, f_max) > 0:
        count -= 1
    return count


class MultiResolutionMelLoss(nn.Module):
    """Sum over resolutions of L1 between log10 mel magnitudes (and optionally between the
    mel magnitudes themselves).

    Defaults follow DAC: windows [32 .. 2048] samples with hop window / 4, mel counts
    [5 .. 320] (each clipped by `fitting_mel_count`), magnitude (power 1) mels floored at 1e-5
    before the log. Short windows check timing (transients), long ones pitch and harmonics.
    Summed, not averaged, over resolutions, as DAC does, so DAC's weight of 15 carries over."""

    def __init__(self, sample_rate: int = 16000,
                 window_lengths: Sequence[int] = (32, 64, 128, 256, 512, 1024, 2048),
                 n_mels: Sequence[int] = (5, 10, 20, 40, 80, 160, 320),
                 log_weight: float = 1.0, mag_weight: float = 0.0, clamp_min: float = 1e-5,
                 f_min: float = 0.0, f_max: Optional[float] = None):
        super().__init__()
        if len(window_lengths) != len(n_mels):
            raise ValueError("window_lengths and n_mels must have the same length")
        self.sample_rate = sample_rate
        self.window_lengths = list(window_lengths)
        self.n_mels = [fitting_mel_count(m, w, sample_rate, f_min, f_max)
                       for w, m in zip(window_lengths, n_mels)]
        self.log_weight, self.mag_weight, self.clamp_min = log_weight, mag_weight, clamp_min
        for i, (w, m) in enumerate(zip(self.window_lengths, self.n_mels)):
            self.register_buffer(f"filterbank_{i}",
                                 mel_filterbank(m, w, sample_rate, f_min, f_max),
                                 persistent=False)

    def forward(self, prediction: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        loss = prediction.new_zeros((), dtype=torch.float32)
        for i, window in enumerate(self.window_lengths):
            bank = getattr(self, f"filterbank_{i}")
            hop = max(1, window // 4)
            pred_mag = stft_magnitude(prediction, window, hop, eps=1e-12)
            target_mag = stft_magnitude(target, window, hop, eps=1e-12)
            with torch.autocast(device_type=pred_mag.device.type, enabled=False):
                pred_mel, target_mel = bank @ pred_mag, bank @ target_mag
                if self.log_weight:
                    loss = loss + self.log_weight * F.l1_loss(
                        torch.log10(pred_mel.clamp(min=self.clamp_min)),
                        torch.log10(target_mel.clamp(min=self.clamp_min)))
                if self.mag_weight:
                    loss = loss + self.mag_weight * F.l1_loss(pred_mel, target_mel)
        return loss


class MultiResolutionSTFTLoss(nn.Module):
    """Parallel WaveGAN's loss (Yamamoto et al. 2020): spectral convergence
    ||  |Y| - |X|  ||_F / || |Y| ||_F plus L1 between log magnitudes, each averaged over the
    resolutions. Defaults are PWG's (FFT 1024/2048/512, hop 120/240/50, window 600/1200/240).
    Returns (spectral_convergence, log_magnitude)."""

    def __init__(self, fft_sizes: Sequence[int] = (1024, 2048, 512),
                 hop_sizes: Sequence[int] = (120, 240, 50),
                 win_lengths: Sequence[int] = (600, 1200, 240), eps: float = 1e-7):
        super().__init__()
        if not len(fft_sizes) == len(hop_sizes) == len(win_lengths):
            raise ValueError("fft_sizes, hop_sizes and win_lengths must have the same length")
        self.resolutions = list(zip(fft_sizes, hop_sizes, win_lengths))
        self.eps = eps

    def forward(self, prediction: torch.Tensor, target: torch.Tensor
                ) -> Tuple[torch.Tensor, torch.Tensor]:
        sc_total = prediction.new_zeros((), dtype=torch.float32)
        mag_total = prediction.new_zeros((), dtype=torch.float32)
        for n_fft, hop, win in self.resolutions:
            pred = stft_magnitude(prediction, n_fft, hop, win, eps=self.eps)
            ref = stft_magnitude(target, n_fft, hop, win, eps=self.eps)
            with torch.autocast(device_type=pred.device.type, enabled=False):
                sc_total = sc_total + torch.linalg.norm(ref - pred) / torch.linalg.norm(ref)
                mag_total = mag_total + F.l1_loss(torch.log(pred), torch.log(ref))
        n = len(self.resolutions)
        return sc_total / n, mag_total / n


class CompressedComplexSTFTLoss(nn.Module):
    """Phase-aware spectral loss: mean L1 between power-law compressed complex spectra,
    |X|^c e^{i angle X} with c = 0.3 (as speech enhancement trains on), averaged over the
    resolutions (FFT sizes, hop a quarter). A magnitude loss leaves phase to the
    discriminators; this one charges a wrong phase in proportion to the (compressed) energy
    of the bin, which is what waveform-comparing metrics such as PESQ and STOI's envelope
    correlations hear as roughness. Both signals' STFTs are fp32 islands."""

    def __init__(self, fft_sizes: Sequence[int] = (256, 512, 1024), power: float = 0.3,
                 eps: float = 1e-8):
        super().__init__()
        if not fft_sizes or any(n < 4 for n in fft_sizes):
            raise ValueError(f"fft_sizes must be a non-empty list of sizes >= 4, got {fft_sizes}")
        if not 0 < power <= 1:
            raise ValueError(f"power must lie in (0, 1], got {power}")
        self.fft_sizes, self.power, self.eps = list(fft_sizes), power, eps

    def _compressed(self, x: torch.Tensor, n_fft: int) -> torch.Tensor:
        spec = stft(x, n_fft, n_fft // 4)
        # |X|^c e^{i phi} = X |X|^(c - 1); eps keeps the gradient finite at exact zeros.
        magnitude = torch.sqrt(spec.real ** 2 + spec.imag ** 2 + self.eps)
        scale = magnitude ** (self.power - 1.0)
        return torch.stack([spec.real * scale, spec.imag * scale])

    def forward(self, prediction: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        with torch.autocast(device_type=prediction.device.type, enabled=False):
            loss = prediction.new_zeros((), dtype=torch.float32)
            for n_fft in self.fft_sizes:
                loss = loss + F.l1_loss(self._compressed(prediction, n_fft),
                                        self._compressed(target, n_fft))
            return loss / len(self.fft_sizes)


def _as_list(logits: Logits) -> List[torch.Tensor]:
    return [logits] if isinstance(logits, torch.Tensor) else list(logits)


def discriminator_loss(real_logits: Logits, fake_logits: Logits) -> torch.Tensor:
    """LSGAN: mean over sub-discriminators of E[(1 - D(real))^2] + E[D(fake)^2].
    Averaged rather than summed (HiFi-GAN sums) so its scale does not depend on how many
    sub-discriminators there are; pass fake logits computed from detached audio."""
    real, fake = _as_list(real_logits), _as_list(fake_logits)
    if len(real) != len(fake) or not real:
        raise ValueError(f"need matching non-empty logit lists, got {len(real)} and {len(fake)}")
    terms = [torch.mean((1.0 - r.float()) ** 2) + torch.mean(f.float() ** 2)
             for r, f in zip(real, fake)]
    return torch.stack(terms).mean()


def generator_adversarial_loss(fake_logits: Logits) -> torch.Tensor:
    """LSGAN generator term: mean over sub-discriminators of E[(1 - D(fake))^2]."""
    fake = _as_list(fake_logits)
    if not fake:
        raise ValueError("need at least one logit tensor")
    return torch.stack([torch.mean((1.0 - f.float()) ** 2) for f in fake]).mean()


def feature_matching_loss(real_features: Sequence[Sequence[torch.Tensor]],
                          fake_features: Sequence[Sequence[torch.Tensor]],
                          eps: float = 1e-8) -> torch.Tensor:
    """L1 between discriminator activations of real and generated audio, each layer divided
    by the mean |real activation| (so layers of very different scale weigh alike, as in
    MelGAN/EnCodec), averaged over all layers of all sub-discriminators. Real features are
    detached: this loss trains the generator only."""
    if len(real_features) != len(fake_features) or not real_features:
        raise ValueError("need matching non-empty feature lists")
    terms = []
    for real_layers, fake_layers in zip(real_features, fake_features):
        if len(real_layers) != len(fake_layers):
            raise ValueError("sub-discriminator feature lists differ in length")
        for real, fake in zip(real_layers, fake_layers):
            real = real.detach().float()
            terms.append(F.l1_loss(fake.float(), real) / (real.abs().mean() + eps))
    return torch.stack(terms).mean()
