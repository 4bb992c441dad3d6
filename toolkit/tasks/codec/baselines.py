"""Signal-processing codecs at a chosen bitrate, as reference points for neural codecs.

mulaw_codec: resample, mu-law companding to `bits` per sample, resample back (G.711-style;
bitrate target_sr * bits). melgl_codec: a log-mel spectrogram quantised to `bits` per value,
inverted by the mel pseudo-inverse and Griffin-Lim phase reconstruction (bitrate
frame_rate * n_mels * bits): it shows what a codec that transmits only a coarse magnitude
envelope sounds like. Neither uses entropy coding, so both bitrates are fixed-rate upper bounds.

Each codec takes a 1-D float waveform in [-1, 1] and returns (decoded float32 of the same
length, bitrate in bit/s).
"""
import math
from typing import Optional, Tuple

import numpy as np

from toolkit.data.audio import resample
from toolkit.nn.spectral import mel_filterbank


def _check_wave(x) -> np.ndarray:
    x = np.asarray(x, dtype=np.float32)
    if x.ndim != 1 or len(x) == 0:
        raise ValueError(f"expected a non-empty 1-D waveform, got shape {x.shape}")
    return x


def _fit_length(y: np.ndarray, n: int) -> np.ndarray:
    if len(y) >= n:
        return y[:n]
    return np.pad(y, (0, n - len(y)))


# --------------------------------------------------------------------------- mu-law

def mulaw_encode(x: np.ndarray, bits: int) -> np.ndarray:
    """[-1, 1] -> integer levels 0 .. 2^bits - 1 after mu-law companding (mu = 2^bits - 1)."""
    mu = 2 ** bits - 1
    x = np.clip(np.asarray(x, dtype=np.float64), -1.0, 1.0)
    companded = np.sign(x) * np.log1p(mu * np.abs(x)) / math.log1p(mu)
    return np.rint((companded + 1.0) / 2.0 * mu).astype(np.int64)


def mulaw_decode(levels: np.ndarray, bits: int) -> np.ndarray:
    mu = 2 ** bits - 1
    companded = 2.0 * np.asarray(levels, dtype=np.float64) / mu - 1.0
    return (np.sign(companded) * np.expm1(np.abs(companded) * math.log1p(mu)) / mu).astype(
        np.float32)


def mulaw_codec(x, sr: int, target_sr: int, bits: int) -> Tuple[np.ndarray, float]:
    """Resample to target_sr, mu-law quantise to `bits` per sample, decode, resample back.
    Bitrate target_sr * bits (8 kHz x 8 bits = G.711's 64 kbit/s)."""
    x = _check_wave(x)
    if not 1 <= bits <= 16:
        raise ValueError(f"bits must be in [1, 16], got {bits}")
    low = resample(x, sr, target_sr)
    decoded = mulaw_decode(mulaw_encode(low, bits), bits)
    back = _fit_length(resample(decoded, target_sr, sr), len(x))
    return back.astype(np.float32), float(target_sr * bits)


# --------------------------------------------------------------------------- mel + Griffin-Lim

def _hann(n: int) -> np.ndarray:
    return (0.5 - 0.5 * np.cos(2.0 * np.pi * np.arange(n) / n)).astype(np.float64)  # periodic


def _stft(x: np.ndarray, n_fft: int, hop: int, window: np.ndarray) -> np.ndarray:
    """Centred (reflect-padded) STFT, (n_fft // 2 + 1, frames) complex."""
    pad = n_fft // 2
    xp = np.pad(x, pad, mode="reflect" if len(x) > pad else "constant")
    n_frames = 1 + (len(xp) - n_fft) // hop
    frames = np.lib.stride_tricks.as_strided(
        xp, shape=(n_frames, n_fft), strides=(hop * xp.strides[0], xp.strides[0]))
    return np.fft.rfft(frames * window, axis=1).T


def _istft(spec: np.ndarray, n_fft: int, hop: int, window: np.ndarray, length: int) -> np.ndarray:
    """Weighted overlap-add inverse of `_stft` (least-squares estimate for a modified STFT)."""
    frames = np.fft.irfft(spec.T, n=n_fft, axis=1) * window
    n_frames = frames.shape[0]
    total = n_fft + hop * (n_frames - 1)
    out = np.zeros(total)
    envelope = np.zeros(total)
    for i in range(n_frames):
        out[i * hop:i * hop + n_fft] += frames[i]
        envelope[i * hop:i * hop + n_fft] += window ** 2
    out /= np.where(envelope > 1e-10, envelope, 1.0)
    pad = n_fft // 2
    return _fit_length(out[pad:], length)


def griffin_lim(magnitude: np.ndarray, n_fft: int, hop: int, length: int, n_iter: int = 32,
                momentum: float = 0.99, seed: int = 0) -> np.ndarray:
    """Phase for a magnitude spectrogram (n_fft // 2 + 1, frames) by alternating projections
    (Griffin & Lim 1984) with the momentum ("fast Griffin-Lim") of Perraudin et al. 2013,
    which converges in far fewer iterations. Deterministic for a seed."""
    window = _hann(n_fft)
    rng = np.random.default_rng(seed)
    phase = np.exp(2j * np.pi * rng.random(magnitude.shape))
    previous = np.zeros_like(phase)
    for _ in range(n_iter):
        rebuilt = _stft(_istft(magnitude * phase, n_fft, hop, window, length), n_fft, hop,
                        window)
        phase = rebuilt - (momentum / (1.0 + momentum)) * previous
        phase /= np.maximum(np.abs(phase), 1e-12)
        previous = rebuilt
    return _istft(magnitude * phase, n_fft, hop, window, length)


def melgl_codec(x, sr: int, n_mels: int, frame_rate: int, bits: int,
                db_range: Tuple[float, float] = (-90.0, 10.0), n_iter: int = 32,
                n_fft: Optional[int] = None) -> Tuple[np.ndarray, float]:
    """Log-mel at `frame_rate` frames/s, each value uniformly quantised to `bits` over the
    fixed `db_range`, decoded by the mel pseudo-inverse and `n_iter` Griffin-Lim iterations.

    Magnitudes are scaled so that a full-scale sinusoid reads about 0 dB, and each mel band
    is the weighted mean of its bins (rows summing to 1), so values stay below about +6 dB:
    the default range spans a 16-bit noise floor to full scale with headroom. The window is
    4 hops (75 % overlap, which Griffin-Lim needs) unless `n_fft` is given.
    Bitrate frame_rate * n_mels * bits; sr must be a multiple of frame_rate."""
    x = _check_wave(x).astype(np.float64)
    if sr % frame_rate:
        raise ValueError(f"sample rate {sr} is not a multiple of frame_rate {frame_rate}")
    if not 1 <= bits <= 16:
        raise ValueError(f"bits must be in [1, 16], got {bits}")
    low_db, high_db = db_range
    if not low_db < high_db:
        raise ValueError(f"db_range must be increasing, got {db_range}")
    hop = sr // frame_rate
    n_fft = n_fft or 4 * hop
    window = _hann(n_fft)
    bank = mel_filterbank(n_mels, n_fft, sr, norm=None).double().numpy()
    row_sums = bank.sum(axis=1)
    if np.any(row_sums == 0):
        raise ValueError(f"{int((row_sums == 0).sum())} of {n_mels} mel filters are narrower "
                         f"than the {sr / n_fft:.1f} Hz bins of n_fft={n_fft}: use fewer mels")
    bank /= row_sums[:, None]
    scale = window.sum() / 2.0          # |STFT| of a full-scale sinusoid at its bin

    # Encoder: quantised log-mel.
    mel = bank @ (np.abs(_stft(x, n_fft, hop, window)) / scale)
    db = 20.0 * np.log10(np.maximum(mel, 1e-12))
    levels = 2 ** bits - 1
    codes = np.rint((np.clip(db, low_db, high_db) - low_db) / (high_db - low_db) * levels)

    # Decoder.
    mel_hat = 10.0 ** ((low_db + codes / levels * (high_db - low_db)) / 20.0)
    magnitude = np.maximum(np.linalg.pinv(bank) @ mel_hat, 0.0) * scale
    decoded = griffin_lim(magnitude, n_fft, hop, len(x), n_iter=n_iter)
    return decoded.astype(np.float32), float(frame_rate * n_mels * bits)
