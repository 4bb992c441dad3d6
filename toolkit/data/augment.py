"""Augmentations. Each takes an explicit numpy Generator: the pipeline derives it from
(seed, epoch, utterance key), so the result never depends on worker count or timing."""
import math
import zlib
from typing import Optional, Tuple

import numpy as np

from toolkit.data.audio import BadEntry, check_and_mix, read_audio, resample


def utterance_rng(seed: int, epoch: int, key: str) -> np.random.Generator:
    return np.random.default_rng([seed & 0xFFFFFFFF, epoch, zlib.crc32(key.encode("utf-8"))])


def speed_perturb(wave: np.ndarray, rate: int, factor: float) -> np.ndarray:
    """Plays the audio `factor` times faster (pitch moves too, like sox `speed`)."""
    if factor == 1.0:
        return wave
    return resample(wave, int(round(rate * factor)), rate)


WHISPER_FRAME_S = 0.032        # analysis frame (a power of two of samples at 16 kHz: 512)
WHISPER_LIFTER_S = 0.0015      # the envelope: quefrencies below 1.5 ms (no pitch up to 660 Hz)


def whisper(x: np.ndarray, rate: int, rng: np.random.Generator, breath: float = 1.0
            ) -> np.ndarray:
    """`x` whispered: per frame (32 ms, hop 8 ms, Hann), the spectral envelope (the real
    cepstrum liftered below 1.5 ms: formants without the harmonics) over complex Gaussian
    noise drawn from `rng`, at the frame's energy, overlap-added; then `breath` of it
    mixed with (1 - breath) of `x`, at `x`'s RMS. float32, the same length."""
    x = np.asarray(x, np.float64)
    if len(x) == 0:
        return x.astype(np.float32)
    n_fft = 1 << int(round(math.log2(WHISPER_FRAME_S * rate)))
    hop = n_fft // 4
    window = np.hanning(n_fft + 1)[:-1]
    padded = np.concatenate([np.zeros(n_fft), x, np.zeros(n_fft)])
    starts = hop * np.arange(1 + (len(padded) - n_fft) // hop)
    spec = np.fft.rfft(padded[starts[:, None] + np.arange(n_fft)] * window, axis=1)
    cepstrum = np.fft.irfft(np.log(np.abs(spec) + 1e-9), n=n_fft, axis=1)
    keep = max(2, int(WHISPER_LIFTER_S * rate))
    cepstrum[:, keep:n_fft - keep + 1] = 0.0
    envelope = np.exp(np.fft.rfft(cepstrum, axis=1).real)
    noise = rng.standard_normal(spec.shape) + 1j * rng.standard_normal(spec.shape)
    out = envelope * noise
    energy = np.sum(np.abs(spec) ** 2, axis=1, keepdims=True)
    out *= np.sqrt(energy / (np.sum(np.abs(out) ** 2, axis=1, keepdims=True) + 1e-20))
    frames = np.fft.irfft(out, n=n_fft, axis=1) * window
    y = np.zeros(len(padded))
    norm = np.zeros(len(padded))
    for start, frame in zip(starts, frames):         # overlap-add
        y[start:start + n_fft] += frame
        norm[start:start + n_fft] += window ** 2
    y = (y / np.maximum(norm, 1e-3))[n_fft:n_fft + len(x)]
    mixed = breath * y + (1.0 - breath) * x
    gain = math.sqrt(np.mean(x ** 2) / (np.mean(mixed ** 2) + 1e-20))
    return (mixed * gain).astype(np.float32)


def apply_volume(wave: np.ndarray, rng: np.random.Generator, low: float, high: float) -> np.ndarray:
    return wave * np.float32(rng.uniform(low, high))


def _power(x: np.ndarray) -> float:
    return float(np.mean(x.astype(np.float64) ** 2)) + 1e-12


def add_noise(wave: np.ndarray, noise: np.ndarray, snr_db: float,
              rng: np.random.Generator) -> np.ndarray:
    """Mixes a random stretch of `noise` (tiled when shorter) at `snr_db`."""
    if len(noise) < len(wave):
        noise = np.tile(noise, int(np.ceil(len(wave) / len(noise))))
    start = int(rng.integers(0, len(noise) - len(wave) + 1))
    segment = noise[start:start + len(wave)]
    scale = np.sqrt(_power(wave) / (_power(segment) * 10.0 ** (snr_db / 10.0)))
    return (wave + scale * segment).astype(np.float32)


def add_reverb(wave: np.ndarray, rir: np.ndarray) -> np.ndarray:
    """Convolves with a room impulse response, aligned on its direct path so labels and
    timing stay put, and rescaled to the dry signal's level."""
    rir = rir / (np.sqrt(np.sum(rir.astype(np.float64) ** 2)) + 1e-12)
    peak = int(np.argmax(np.abs(rir)))
    n = len(wave) + len(rir) - 1
    size = 1 << (n - 1).bit_length()
    wet = np.fft.irfft(np.fft.rfft(wave, size) * np.fft.rfft(rir, size), size)[peak:peak + len(wave)]
    wet *= np.sqrt(_power(wave) / _power(wet))
    return wet.astype(np.float32)


def mel_bin_centers_hz(num_bins: int, low_hz: float, high_hz: float) -> np.ndarray:
    """Centre frequencies of Kaldi's triangular mel filters (1127 ln(1 + f/700) scale)."""
    mel = lambda f: 1127.0 * np.log1p(np.asarray(f, dtype=np.float64) / 700.0)
    lo, hi = mel(low_hz), mel(high_hz)
    centers = lo + (hi - lo) * np.arange(1, num_bins + 1) / (num_bins + 1)
    return 700.0 * np.expm1(centers / 1127.0)


def warp_frequency(feats: np.ndarray, factor: float, centers_hz: np.ndarray,
                   high_factor: Optional[float] = None, split_hz: float = 1000.0) -> np.ndarray:
    """Vocal tract length perturbation on log-mel features: the spectrum a talker with
    formants `factor` times higher would give. Bin i takes the (log-mel) value found at
    frequency centers[i] / factor, interpolated between bins; beyond the edges the edge
    bins are repeated. Works on precomputed features, unlike a warped filterbank.

    With `high_factor`, frequencies up to `split_hz` are scaled by `factor` and those
    above continue with slope `high_factor` (f -> factor*split + high_factor*(f - split)):
    a vocal tract whose first formant moves by another ratio than the higher ones, as
    espeak-ng's voice variants do (e.g. F1 x0.75, F2-F3 x0.85)."""
    high = factor if high_factor is None else high_factor
    if (factor == 1.0 and high == 1.0) or feats.shape[0] == 0:
        return feats
    knee = factor * split_hz  # where the warped low band ends
    source_hz = np.where(centers_hz <= knee, centers_hz / factor,
                         split_hz + (centers_hz - knee) / high)
    src = np.interp(source_hz, centers_hz, np.arange(len(centers_hz)))
    lo = np.floor(src).astype(np.int64)
    hi = np.minimum(lo + 1, len(centers_hz) - 1)
    w = (src - lo).astype(np.float32)
    return (feats[:, lo] * (1.0 - w) + feats[:, hi] * w).astype(np.float32)


def tilt_spectrum(feats: np.ndarray, tilt_db: float) -> np.ndarray:
    """Adds a spectral slope to log-mel features: `tilt_db` more (or less) energy in the
    highest bin than in the lowest, linear over the bins in between, as a brighter or
    breathier voice source (espeak-ng's `tone`) would give."""
    if tilt_db == 0.0 or feats.shape[0] == 0:
        return feats
    ramp = np.linspace(-0.5, 0.5, feats.shape[1], dtype=np.float64)
    # fbank features are natural logs of energies: dB * ln(10) / 10.
    return (feats + (tilt_db * math.log(10.0) / 10.0) * ramp).astype(np.float32)


def flatten_log_posteriors(log_post: np.ndarray, temperature: float) -> np.ndarray:
    """Log posteriors divided by `temperature` and renormalised per frame (a log-softmax):
    above 1, each frame's distribution is flatter, its ranking of the units unchanged."""
    if temperature == 1.0 or log_post.shape[0] == 0:
        return log_post
    x = log_post.astype(np.float64) / temperature
    x -= x.max(axis=1, keepdims=True)
    x -= np.log(np.exp(x).sum(axis=1, keepdims=True))
    return x.astype(np.float32)


def spec_augment(feats: np.ndarray, rng: np.random.Generator, num_time_masks: int,
                 max_time_width: int, num_freq_masks: int, max_freq_width: int) -> np.ndarray:
    """Masks random time and frequency stripes. Features are raw fbank here (CMVN lives
    in the model), so stripes get the utterance's mean rather than zero, which would
    read as a very loud or very quiet band after normalisation."""
    feats = feats.copy()
    frames, bins = feats.shape
    fill = feats.mean(axis=0) if frames else 0.0
    for _ in range(num_time_masks):
        width = int(rng.integers(0, max_time_width + 1))
        if 0 < width < frames:
            start = int(rng.integers(0, frames - width + 1))
            feats[start:start + width, :] = fill
    for _ in range(num_freq_masks):
        width = int(rng.integers(0, max_freq_width + 1))
        if 0 < width < bins:
            start = int(rng.integers(0, bins - width + 1))
            feats[:, start:start + width] = fill[start:start + width] if frames else 0.0
    return feats


def load_mono(source: str, rate: int, channel: int = -1,
              start: float = 0.0, end: float = -1.0, allow_silence: bool = False) -> np.ndarray:
    """Decode + channel handling + resampling to `rate` (another rate is not an error)."""
    audio, file_rate = read_audio(source, start, end)
    wave = check_and_mix(audio, source, channel, allow_silence=allow_silence)
    if file_rate != rate:
        wave = resample(wave, file_rate, rate)
    return wave


def pick_entry_and_load(entries, rng: np.random.Generator,
                        rate: int) -> Optional[Tuple[np.ndarray, str]]:
    """Loads one random entry of a noise or RIR list: (wave, its `kind` or ""). A broken
    one yields None (skipped)."""
    if entries is None or len(entries) == 0:
        return None
    item = entries.entry(int(rng.integers(0, len(entries))))
    try:
        return load_mono(item["wav"], rate), str(item.get("kind", ""))
    except BadEntry:
        return None


def pick_and_load(entries, rng: np.random.Generator, rate: int) -> Optional[np.ndarray]:
    picked = pick_entry_and_load(entries, rng, rate)
    return None if picked is None else picked[0]
