"""Spectral front ends in plain torch (no torchaudio): STFT magnitude, mel filterbank, log-mel.

Every function here is an *fp32 island*: it disables autocast and casts its input to float32
before the FFT, because bf16/fp16 FFTs lose most of the dynamic range that log spectra and
spectral losses depend on (a bf16 mantissa holds about 3 significant digits). Callers can run
their networks under autocast and still get float32 spectra out.

Shapes: waveforms are (B, T) or (B, 1, T) (a single (T,) signal is accepted too); spectra come
out as (B, freq, frames).

The mel scale is Slaney's (the Auditory Toolbox definition, librosa's default `htk=False`):
linear below 1 kHz at 200/3 Hz per mel, logarithmic above with 27 mels per factor 6.4 in
frequency. Triangles are built on the continuous FFT bin frequencies like librosa's
`filters.mel`, and `norm="slaney"` scales each triangle to unit area in Hz (librosa's default).
"""
import math
from typing import Optional, Tuple

import numpy as np
import torch

_F_SP = 200.0 / 3.0                   # Hz per mel in the linear part of Slaney's scale
_MIN_LOG_HZ = 1000.0                  # where the scale turns logarithmic
_MIN_LOG_MEL = _MIN_LOG_HZ / _F_SP    # = 15 mel
_LOGSTEP = math.log(6.4) / 27.0       # 27 mels per factor 6.4 above 1 kHz


def hz_to_mel(freq):
    """Slaney mel of `freq` (Hz; scalar or numpy array)."""
    freq = np.asarray(freq, dtype=np.float64)
    linear = freq / _F_SP
    logpart = _MIN_LOG_MEL + np.log(np.maximum(freq, 1e-10) / _MIN_LOG_HZ) / _LOGSTEP
    return np.where(freq >= _MIN_LOG_HZ, logpart, linear)


def mel_to_hz(mel):
    """Inverse of `hz_to_mel`."""
    mel = np.asarray(mel, dtype=np.float64)
    linear = mel * _F_SP
    logpart = _MIN_LOG_HZ * np.exp(_LOGSTEP * (mel - _MIN_LOG_MEL))
    return np.where(mel >= _MIN_LOG_MEL, logpart, linear)


def mel_band_edges(n_mels: int, sample_rate: int, f_min: float = 0.0,
                   f_max: Optional[float] = None) -> np.ndarray:
    """The n_mels + 2 frequencies (Hz) equally spaced in mel: filter i rises from edge i,
    peaks at edge i + 1 (its centre frequency) and falls to zero at edge i + 2."""
    f_max = sample_rate / 2.0 if f_max is None else float(f_max)
    if not 0.0 <= f_min < f_max <= sample_rate / 2.0:
        raise ValueError(f"need 0 <= f_min < f_max <= sample_rate/2, got {f_min}, {f_max}")
    return mel_to_hz(np.linspace(hz_to_mel(f_min), hz_to_mel(f_max), n_mels + 2))


def mel_filterbank(n_mels: int, n_fft: int, sample_rate: int, f_min: float = 0.0,
                   f_max: Optional[float] = None, norm: Optional[str] = "slaney") -> torch.Tensor:
    """(n_mels, n_fft // 2 + 1) float32 triangular filters on the Slaney mel scale.

    norm="slaney": each triangle has unit area in Hz (height 2 / bandwidth), so a band's
    value is a spectral density and does not grow with its width. norm=None: peak height 1.
    A filter narrower than the bin spacing can fall between bins and come out all zero;
    `empty_mel_filters` reports those."""
    if norm not in ("slaney", None):
        raise ValueError(f"norm must be 'slaney' or None, got {norm!r}")
    edges = mel_band_edges(n_mels, sample_rate, f_min, f_max)
    bin_hz = np.linspace(0.0, sample_rate / 2.0, n_fft // 2 + 1)
    lower, centre, upper = edges[:-2, None], edges[1:-1, None], edges[2:, None]
    rising = (bin_hz[None, :] - lower) / (centre - lower)
    falling = (upper - bin_hz[None, :]) / (upper - centre)
    weights = np.maximum(0.0, np.minimum(rising, falling))
    if norm == "slaney":
        weights *= 2.0 / (upper - lower)
    return torch.from_numpy(weights.astype(np.float32))


def empty_mel_filters(n_mels: int, n_fft: int, sample_rate: int, f_min: float = 0.0,
                      f_max: Optional[float] = None) -> int:
    """How many of the filters catch no FFT bin at all (too narrow for this n_fft)."""
    bank = mel_filterbank(n_mels, n_fft, sample_rate, f_min, f_max, norm=None)
    return int((bank.sum(dim=1) == 0).sum())


def _as_batch(x: torch.Tensor) -> torch.Tensor:
    """(T,), (B, T) or (B, 1, T) -> (B, T)."""
    if x.dim() == 1:
        return x.unsqueeze(0)
    if x.dim() == 3:
        if x.shape[1] != 1:
            raise ValueError(f"expected one channel, got shape {tuple(x.shape)}")
        return x[:, 0]
    if x.dim() != 2:
        raise ValueError(f"expected (B, T) or (B, 1, T), got shape {tuple(x.shape)}")
    return x


def reflect_pad(x: torch.Tensor, left: int, right: int) -> torch.Tensor:
    """F.pad(x, (left, right), mode="reflect") on the last dimension, built from slices and
    flips: CUDA's reflection_pad1d backward accumulates with atomics, which is an error
    under torch.use_deterministic_algorithms (training.deterministic); this one's is not."""
    length = x.shape[-1]
    if left >= length or right >= length:
        raise ValueError(f"reflect padding ({left}, {right}) needs more than "
                         f"{max(left, right)} samples, got {length}")
    parts = [x[..., 1:left + 1].flip(-1)] if left else []
    parts.append(x)
    if right:
        parts.append(x[..., length - right - 1:length - 1].flip(-1))
    return torch.cat(parts, dim=-1)


def stft(x: torch.Tensor, n_fft: int, hop: int, win: Optional[int] = None) -> torch.Tensor:
    """Complex STFT (B, n_fft // 2 + 1, frames), fp32 island.

    Periodic Hann window of `win` samples (default n_fft) centred in the n_fft frame, frames
    centred on t = k * hop with reflect padding, so frames = T // hop + 1. Signals too short
    to reflect (T <= n_fft // 2) are zero padded instead."""
    win = n_fft if win is None else win
    if win > n_fft:
        raise ValueError(f"window {win} longer than n_fft {n_fft}")
    with torch.autocast(device_type=x.device.type, enabled=False):
        wave = _as_batch(x).float()
        window = torch.hann_window(win, periodic=True, device=wave.device, dtype=torch.float32)
        half = n_fft // 2
        if wave.shape[-1] > half:
            wave = reflect_pad(wave, half, half)
        else:
            wave = torch.nn.functional.pad(wave, (half, half))
        return torch.stft(wave, n_fft=n_fft, hop_length=hop, win_length=win, window=window,
                          center=False, return_complex=True)


def stft_magnitude(x: torch.Tensor, n_fft: int, hop: int, win: Optional[int] = None,
                   eps: float = 0.0) -> torch.Tensor:
    """|STFT| (B, n_fft // 2 + 1, frames), float32. `eps` > 0 is added inside the square
    root, which keeps the gradient finite where the spectrum is exactly zero."""
    spec = stft(x, n_fft, hop, win)
    with torch.autocast(device_type=spec.device.type, enabled=False):
        if eps > 0:
            return torch.sqrt(spec.real ** 2 + spec.imag ** 2 + eps)
        return spec.abs()


def mel_spectrogram(x: torch.Tensor, sample_rate: int, n_fft: int, hop: int,
                    win: Optional[int] = None, n_mels: int = 80, f_min: float = 0.0,
                    f_max: Optional[float] = None, power: float = 1.0,
                    filterbank: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Mel-weighted |STFT| ** power, (B, n_mels, frames), float32. Pass a precomputed
    `filterbank` (from `mel_filterbank`) to skip rebuilding it on every call."""
    mag = stft_magnitude(x, n_fft, hop, win, eps=1e-12 if power <= 1.0 else 0.0)
    with torch.autocast(device_type=mag.device.type, enabled=False):
        if filterbank is None:
            filterbank = mel_filterbank(n_mels, n_fft, sample_rate, f_min, f_max)
        filterbank = filterbank.to(device=mag.device, dtype=torch.float32)
        spec = mag if power == 1.0 else mag ** power
        return torch.matmul(filterbank, spec)


def log_mel_spectrogram(x: torch.Tensor, sample_rate: int, n_fft: int, hop: int,
                        win: Optional[int] = None, n_mels: int = 80, f_min: float = 0.0,
                        f_max: Optional[float] = None, power: float = 1.0,
                        clamp_min: float = 1e-5, filterbank: Optional[torch.Tensor] = None
                        ) -> torch.Tensor:
    """log10(max(mel, clamp_min)), (B, n_mels, frames), float32 even under autocast.
    The clamp sets the floor of the dynamic range (1e-5 = -100 dB for power 1): silence
    below it costs nothing in a loss built on this."""
    mel = mel_spectrogram(x, sample_rate, n_fft, hop, win, n_mels, f_min, f_max, power,
                          filterbank)
    with torch.autocast(device_type=mel.device.type, enabled=False):
        return torch.log10(torch.clamp(mel, min=clamp_min))


def frames_for(num_samples: int, hop: int) -> int:
    """Frame count of a centred STFT of `num_samples` samples."""
    return num_samples // hop + 1


__all__: Tuple[str, ...] = (
    "hz_to_mel", "mel_to_hz", "mel_band_edges", "mel_filterbank", "empty_mel_filters",
    "stft", "stft_magnitude", "mel_spectrogram", "log_mel_spectrogram", "frames_for",
)
