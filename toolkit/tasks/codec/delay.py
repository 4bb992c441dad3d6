"""Delay compensation for codec evaluation: every codec (Codec2, Opus, a neural codec) puts
out the signal some samples late, and waveform and frame metrics compare sample n with
sample n, so each system's delay is estimated and removed before any metric.

The delay is a property of the system, not of the utterance (each codec here has a fixed
algorithmic delay), so it is estimated once per system from several utterances pooled:
  1. coarse: cross-correlation of band envelopes (log energy in 8 bands, 100 Hz - 4 kHz,
     1 ms hop), which survives codecs that resynthesise the phase (Codec2, Griffin-Lim,
     a neural decoder): their waveforms correlate with the input at 0.1-0.4, with the
     per-utterance peak scattered over tens of milliseconds;
  2. fine: the waveform cross-correlation (absolute value, so an inverted output counts)
     within +-2 ms of the coarse lag, which is sample-exact for waveform-matching codecs.
One estimate per system also keeps a poor system from picking its best of many lags on
each utterance.
"""
import math
from typing import Sequence, Tuple

import numpy as np

N_BANDS = 8
BAND_EDGES_HZ = (100.0, 4000.0)


def _frames(x: np.ndarray, win: int, hop: int) -> np.ndarray:
    if len(x) < win:
        x = np.pad(x, (0, win - len(x)))
    n = 1 + (len(x) - win) // hop
    return np.lib.stride_tricks.as_strided(x, shape=(n, win), strides=(hop * x.strides[0],
                                                                      x.strides[0]))


def band_envelopes(x, sample_rate: int, hop: int, win: int) -> np.ndarray:
    """(N_BANDS, frames) log band energies, each band made zero-mean and unit-variance."""
    x = np.ascontiguousarray(x, dtype=np.float64)
    spec = np.abs(np.fft.rfft(_frames(x, win, hop) * np.hanning(win), axis=1)) ** 2
    freqs = np.fft.rfftfreq(win, 1.0 / sample_rate)
    high = min(BAND_EDGES_HZ[1], 0.45 * sample_rate)
    edges = np.geomspace(BAND_EDGES_HZ[0], high, N_BANDS + 1)
    bands = np.stack([spec[:, (freqs >= lo) & (freqs < hi)].sum(axis=1)
                      for lo, hi in zip(edges[:-1], edges[1:])])
    # A floor relative to each band's mean power keeps silent stretches from dominating.
    floor = 1e-3 * bands.mean(axis=1, keepdims=True) + 1e-20
    env = np.log(bands + floor)
    env -= env.mean(axis=1, keepdims=True)
    std = env.std(axis=1, keepdims=True)
    return env / np.where(std > 0, std, 1.0)


def _xcorr(reference: np.ndarray, decoded: np.ndarray, max_lag: int) -> np.ndarray:
    """c[max_lag + l] = sum_n decoded[n + l] * reference[n] for l in [-max_lag, max_lag],
    along the last axis (FFT)."""
    n = reference.shape[-1] + decoded.shape[-1] + max_lag
    size = 1 << (n - 1).bit_length()
    spec = np.fft.rfft(decoded, size) * np.conj(np.fft.rfft(reference, size))
    full = np.fft.irfft(spec, size)
    return np.concatenate([full[..., size - max_lag:], full[..., :max_lag + 1]], axis=-1)


def estimate_delay(pairs: Sequence[Tuple[np.ndarray, np.ndarray]], sample_rate: int,
                   max_delay: int) -> int:
    """Samples by which `decoded` lags `reference` (decoded[n + d] ~ reference[n]), in
    [-max_delay, max_delay], pooled over (reference, decoded) pairs of one system."""
    if not pairs:
        raise ValueError("no (reference, decoded) pair to estimate a delay from")
    hop = max(1, int(round(sample_rate / 1000)))        # 1 ms
    win = 16 * hop
    max_frames = int(math.ceil(max_delay / hop))
    coarse = np.zeros(2 * max_frames + 1)
    for ref, dec in pairs:
        env_ref = band_envelopes(ref, sample_rate, hop, win)
        env_dec = band_envelopes(dec, sample_rate, hop, win)
        coarse += _xcorr(env_ref, env_dec, max_frames).sum(axis=0) / env_ref.shape[1]
    lag = (int(np.argmax(coarse)) - max_frames) * hop
    lo, hi = max(-max_delay, lag - 2 * hop), min(max_delay, lag + 2 * hop)
    reach = max(abs(lo), abs(hi))
    fine = np.zeros(2 * reach + 1)
    for ref, dec in pairs:
        ref = np.asarray(ref, dtype=np.float64)
        dec = np.asarray(dec, dtype=np.float64)
        norm = math.sqrt(float(np.dot(ref, ref)) * float(np.dot(dec, dec))) or 1.0
        fine += _xcorr(ref, dec, reach) / norm
    window = np.abs(fine[reach + lo:reach + hi + 1])
    return lo + int(np.argmax(window))


def apply_delay(reference, decoded, delay: int) -> Tuple[np.ndarray, np.ndarray]:
    """The overlapping parts once `decoded` is moved `delay` samples earlier, both the
    same length."""
    ref = np.asarray(reference)
    dec = np.asarray(decoded)
    if delay >= 0:
        dec = dec[delay:]
    else:
        ref = ref[-delay:]
    n = min(len(ref), len(dec))
    if n <= 0:
        raise ValueError(f"a delay of {delay} samples leaves no overlap "
                         f"({len(reference)} reference, {len(decoded)} decoded samples)")
    return ref[:n], dec[:n]
