"""Signal processing for synthetic speech (numpy only): coloured and babble noise, the
active-speech level, placing speech at a level between silences, mixing at an SNR, peak
protection and int16 quantization, trimming the TTS's silence. Every corpus generator
mixes through these (toolkit.voicebank.render.place_in_noise puts them together)."""
import math
from typing import Sequence, Tuple

import numpy as np

BABBLE_SOURCES = (3, 6)      # talkers summed into one babble noise
NOISE_TYPES = ("white", "pink", "brown", "babble")


def colored_noise(n: int, color: str, rng: np.random.Generator, sr: int = 16000) -> np.ndarray:
    """Unit-RMS white / pink (1/f power) / brown (1/f^2 power) Gaussian noise."""
    white = rng.standard_normal(n, dtype=np.float32)
    if color == "white" or n < 4:
        noise = white
    else:
        exponent = {"pink": 0.5, "brown": 1.0}[color]
        n_fft = 1 << (n - 1).bit_length()    # odd lengths make pocketfft slow
        white = np.concatenate([white, rng.standard_normal(n_fft - n, dtype=np.float32)])
        freqs = np.fft.rfftfreq(n_fft, d=1.0 / sr)
        # Flat below 20 Hz: a true 1/f^2 slope would make brown noise a slow DC drift.
        shape = (1.0 / np.maximum(freqs, 20.0) ** exponent).astype(np.float32)
        noise = np.fft.irfft(np.fft.rfft(white) * shape, n=n_fft)[:n]
    return (noise / (np.sqrt(np.mean(noise ** 2)) + 1e-12)).astype(np.float32)


def babble_noise(n: int, pool: Sequence[np.ndarray], rng: np.random.Generator) -> np.ndarray:
    """Unit-RMS sum of 3-6 talkers from `pool`, each looped from a random offset."""
    usable = [p for p in pool if len(p) > 0 and np.any(p)]
    if not usable:
        return np.zeros(n, np.float32)
    k = int(rng.integers(BABBLE_SOURCES[0], BABBLE_SOURCES[1] + 1))
    out = np.zeros(n, np.float64)
    for _ in range(k):
        src = usable[int(rng.integers(len(usable)))]
        src = src / (np.sqrt(active_power(src)) + 1e-12)
        start = int(rng.integers(len(src)))
        reps = (start + n) // len(src) + 1
        out += np.tile(src, reps)[start:start + n] * 10 ** (rng.uniform(-6, 0) / 20)
    return (out / (np.sqrt(np.mean(out ** 2)) + 1e-12)).astype(np.float32)


def background_noise(n: int, kind: str, rng: np.random.Generator, sr: int = 16000,
                     babble_pool: Sequence[np.ndarray] = ()) -> np.ndarray:
    """Unit-RMS noise of one of NOISE_TYPES: babble of `babble_pool`, else coloured."""
    if kind == "babble":
        return babble_noise(n, babble_pool, rng)
    return colored_noise(n, kind, rng, sr)


def active_power(x: np.ndarray, frame: int = 320, floor_db: float = 40.0) -> float:
    """Mean power over frames within `floor_db` of the loudest: speech level that is not
    diluted by pauses and padding (the SNR reference)."""
    x = np.asarray(x, dtype=np.float64)
    if len(x) == 0:
        return 0.0
    n = max(1, len(x) // frame)
    p = np.mean(x[:n * frame].reshape(n, -1) ** 2, axis=1) if len(x) >= frame else \
        np.array([np.mean(x ** 2)])
    top = p.max()
    if top <= 0:
        return 0.0
    return float(p[p >= top * 10 ** (-floor_db / 10)].mean())


def samples(seconds: float, sr: int) -> int:
    """A duration as a whole number of samples (rounded), as placements count them."""
    return int(round(seconds * sr))


def place_at_level(speech: np.ndarray, sr: int, level_db: float, lead_s: float,
                   trail_s: float) -> np.ndarray:
    """`speech` at an active level of `level_db` dBFS, after `lead_s` and before `trail_s`
    seconds of silence (float32)."""
    lead, trail = samples(lead_s, sr), samples(trail_s, sr)
    out = np.zeros(lead + len(speech) + trail, np.float32)
    out[lead:lead + len(speech)] = speech / (math.sqrt(active_power(speech)) + 1e-12) * \
        10 ** (level_db / 20)
    return out


def mix_at_snr(speech: np.ndarray, noise: np.ndarray, snr_db: float
               ) -> Tuple[np.ndarray, np.ndarray]:
    """Scales `noise` (same length) so active-speech power / noise power = snr_db.
    Returns (mixture, scaled noise)."""
    ps, pn = active_power(speech), float(np.mean(np.asarray(noise, np.float64) ** 2))
    gain = math.sqrt(ps / (pn * 10 ** (snr_db / 10))) if pn > 0 and ps > 0 else 0.0
    scaled = (noise * gain).astype(np.float32)
    return (speech + scaled).astype(np.float32), scaled


PEAK = 0.98                  # highest sample level a clip is written at


def peak_gain(*clips: np.ndarray) -> float:
    """The one gain that brings the loudest of `clips` down to PEAK (1.0 when none is
    above it): scaling whole clips alike keeps their SNR and their clean/noisy pairing."""
    peak = max((float(np.max(np.abs(x))) for x in clips if len(x)), default=0.0)
    return min(1.0, PEAK / peak) if peak > 0 else 1.0


def pcm16(x: np.ndarray) -> np.ndarray:
    """Quantize to int16, clipping at full scale (callers scale first: peak_gain)."""
    return np.round(np.clip(x, -1.0, 1.0) * 32767).astype(np.int16)


def to_int16(x: np.ndarray) -> np.ndarray:
    """Peak-protect (scale down whole clip, so the SNR is kept) then quantize."""
    return pcm16(x * peak_gain(x))


def speech_bounds(x: np.ndarray, threshold: float = 1e-3) -> Tuple[int, int]:
    """[start, stop) without the TTS's own leading/trailing near-silence."""
    idx = np.flatnonzero(np.abs(x) > threshold)
    return (int(idx[0]), int(idx[-1]) + 1) if len(idx) else (0, 0)


def trim_silence(x: np.ndarray, threshold: float = 1e-3) -> np.ndarray:
    """Drop the TTS's own leading/trailing near-silence, so that the caller's padding is
    the only silence."""
    start, stop = speech_bounds(x, threshold)
    return x[start:stop]
