"""A built-in teacher of periodicity for codec training (`teachers.distillation.model:
builtin:periodicity`): per 20 ms frame, the normalized autocorrelation of the input at lags
of 2-25 ms on a log scale (40-500 Hz), and the frame's log energy.

Why: a codec trained on mel and adversarial losses alone on two CPU cores learned to code
the spectral envelope and dropped the pitch; its decoders, whatever their design, then
render voiced speech as noise with the right envelope (RESULTS.md: no frame of their output
is voiced for a pitch tracker). Distilling these features into the first codebook makes
the codes carry the period, which the decoder can then render.

No weights: the module computes a fixed function of the audio, differentiable like any
torch code, so it also serves where a teacher must pass gradients.
"""
import math
from functools import lru_cache

import torch
import torch.nn.functional as F
from torch import nn


class PeriodicityFeatures(nn.Module):
    """(B, T) 16 kHz audio -> (B, frames, n_lags + 1): for frame t, centred on sample
    (t + 0.5) * hop, the Hann-windowed frame's autocorrelation divided by its energy at
    `n_lags` lags spaced evenly in log between the periods of `max_hz` and `min_hz` (linear
    interpolation between integer lags), then log10 of the energy."""

    def __init__(self, sample_rate: int = 16000, hop: int = 320, frame: int = 1024,
                 min_hz: float = 40.0, max_hz: float = 500.0, n_lags: int = 64):
        super().__init__()
        if frame < 2 * sample_rate / min_hz:
            raise ValueError(f"a {frame}-sample frame holds under two periods of {min_hz} Hz")
        self.hop, self.frame = hop, frame
        self.n_fft = 1 << (2 * frame - 1).bit_length()       # no circular wrap
        lags = torch.logspace(math.log10(sample_rate / max_hz), math.log10(sample_rate / min_hz),
                              n_lags, dtype=torch.float64)
        self.register_buffer("lags", lags.float(), persistent=False)     # in samples
        # Linear interpolation between integer lags as a matmul: its backward is
        # deterministic on CUDA, which index_select's (an index_add) is not.
        floor, frac = lags.floor().long(), (lags - lags.floor()).float()
        self.max_lag = int(floor.max()) + 2
        pick = torch.zeros(self.max_lag, n_lags)
        columns = torch.arange(n_lags)
        pick[floor, columns] = 1.0 - frac
        pick[floor + 1, columns] = frac
        self.register_buffer("interpolation", pick, persistent=False)
        self.register_buffer("window", torch.hann_window(frame, periodic=True),
                             persistent=False)

    def forward(self, audio: torch.Tensor) -> torch.Tensor:
        frames = max(1, audio.shape[-1] // self.hop)
        # Frame t spans [(t + 0.5) * hop - frame / 2, ... + frame): centred on its code frame.
        left = self.frame // 2 - self.hop // 2
        total = (frames - 1) * self.hop + self.frame
        padded = F.pad(audio, (left, max(0, total - left - audio.shape[-1])))
        windows = padded.unfold(-1, self.frame, self.hop)[:, :frames] * self.window
        spectrum = torch.fft.rfft(windows, n=self.n_fft)
        autocorr = torch.fft.irfft(spectrum.real ** 2 + spectrum.imag ** 2, n=self.n_fft)
        energy = autocorr[..., :1]
        normalized = autocorr[..., :self.max_lag] / (energy + 1e-6)
        periodicity = normalized @ self.interpolation
        return torch.cat([periodicity, torch.log10(energy + 1e-6)], dim=-1)


def voiced_periods(features: torch.Tensor, lags: torch.Tensor, threshold: float = 0.6,
                   floor_db: float = -40.0):
    """(frames, n_lags + 1) features of one signal -> (voiced (frames,) bool, period in
    samples (frames,)): a frame is voiced when its best normalized autocorrelation reaches
    `threshold` and its energy is within `floor_db` of the signal's loudest frame."""
    periodicity, log_energy = features[:, :-1], features[:, -1]
    best, index = periodicity.max(-1)
    loud = log_energy >= log_energy.max() + floor_db / 10.0
    return (best >= threshold) & loud, lags[index]


@lru_cache(maxsize=1)
def _features() -> PeriodicityFeatures:
    return PeriodicityFeatures()


def pitch_kept(reference, decoded, tolerance: float = 0.1) -> float:
    """Share of the reference's voiced frames where the decoded signal is voiced at the
    same period within `tolerance` (a codec that renders voiced speech as shaped noise
    keeps none); NaN when the reference has no voiced frame. Signals at 16 kHz, both the
    same length."""
    module = _features()
    lags = module.lags
    with torch.no_grad():
        ref = module(torch.as_tensor(reference, dtype=torch.float32)[None])[0]
        dec = module(torch.as_tensor(decoded, dtype=torch.float32)[None])[0]
    ref_voiced, ref_period = voiced_periods(ref, lags)
    dec_voiced, dec_period = voiced_periods(dec, lags, floor_db=-60.0)
    if not bool(ref_voiced.any()):
        return float("nan")
    same = dec_voiced & ((dec_period / ref_period - 1.0).abs() <= tolerance)
    return float((same & ref_voiced).sum()) / float(ref_voiced.sum())


# `builtin:NAME` teachers (toolkit.tasks.codec.teachers): name -> module factory.
BUILTIN_TEACHERS = {"periodicity": PeriodicityFeatures}
