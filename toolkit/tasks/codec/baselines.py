"""Reference codecs at stated bitrates for judging neural codecs, as registered baselines
of the codec evaluation (toolkit.bin.evaluate_codec --baseline KIND:ARGS).

Real speech codecs, from PyPI wheels that bundle their libraries (the `codec` extra, so no
result depends on what the host has installed; the functions live in
toolkit.data.speech_codecs, which the channel simulation of condition copies shares):
  codec2_codec: Codec2 (pycodec2 4.1.1, bundling libcodec2 1.2) at 8 kHz, resampled there
    and back with the toolkit's resampler; bitrate from the mode's frame size.
  opus_codec: Opus through PyAV's libopus (hard CBR, VoIP application, 20 ms frames);
    bitrate measured from the encoded packet bytes.
Naive codecs, showing what a bitrate buys without a speech model:
  mulaw_codec: resample, mu-law companding to `bits` per sample, resample back (G.711-style;
    bitrate target_sr * bits).
  melgl_codec: a log-mel spectrogram quantised to `bits` per value, inverted by the mel
    pseudo-inverse and Griffin-Lim phase reconstruction (bitrate frame_rate * n_mels * bits).
  Neither uses entropy coding, so both bitrates are fixed-rate upper bounds.
The input itself, `original` (16-bit PCM's bitrate): every intrusive metric's ceiling, and
the non-intrusive ones' (DNSMOS) score of the clean input, which a codec may exceed (a
non-intrusive predictor only judges how natural and clean the output sounds).

Each codec takes a 1-D float waveform in [-1, 1] and returns (decoded float32 of the same
length, bitrate in bit/s). The decoded signal keeps the codec's own delay: the evaluation
estimates and removes it for every system alike (toolkit.tasks.codec.delay).
"""
import math
from dataclasses import dataclass
from typing import Callable, List, Optional, Tuple

import numpy as np

from toolkit.config import ConfigError
from toolkit.data.audio import resample
# The real codecs are generic (the channel simulation of condition copies uses them too);
# from_pcm16 and to_pcm16 stay importable from here, as the evaluation's tests do.
from toolkit.data.speech_codecs import (  # noqa: F401
    CODEC2_MODES, CODEC2_REQUIREMENT, OPUS_KBPS_RANGE,
    OPUS_REQUIREMENT, codec2_codec, from_pcm16, mulaw_decode, mulaw_encode, opus_codec,
    to_pcm16)
from toolkit.data.speech_codecs import check_wave as _check_wave
from toolkit.data.speech_codecs import fit_length as _fit_length
from toolkit.registry import Registry
from toolkit.tasks.codec.packages import import_optional


# --------------------------------------------------------------------------- mu-law

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
    from toolkit.nn.spectral import mel_filterbank
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



# --------------------------------------------------------------------------- registry

CodecFn = Callable[[np.ndarray, int], Tuple[np.ndarray, float]]


@dataclass(frozen=True)
class Baseline:
    """One row of the evaluation: `spec` as given (codec2:2400), the row's `name`, the codec
    and `check`, which raises MissingPackageError when the codec's package is missing."""
    spec: str
    name: str
    run: CodecFn
    check: Callable[[], None]


def _no_package() -> None:
    return None


def _package_check(module: str, requirement: str, what: str) -> Callable[[], None]:
    def check() -> None:
        import_optional(module, requirement, what)
    return check


class BaselineKind:
    """A registered family of baselines: `syntax` and `summary` are the --help text;
    build() turns the arguments after `KIND:` into a Baseline or raises ValueError."""
    syntax = ""
    summary = ""

    def build(self, spec: str, args: List[str]) -> Baseline:
        raise NotImplementedError


BASELINES: Registry = Registry("codec baseline")


def _ints(args: List[str], count: int) -> List[int]:
    if len(args) != count:
        raise ValueError(f"expected {count} numbers after the kind, got {len(args)}")
    try:
        return [int(a) for a in args]
    except ValueError:
        raise ValueError(f"expected integers, got {':'.join(args)!r}") from None


@BASELINES.register("mulaw")
class MulawBaseline(BaselineKind):
    syntax = "mulaw:TARGET_RATE:BITS"
    summary = ("resample to TARGET_RATE, mu-law quantise to BITS per sample, resample back "
               "(TARGET_RATE x BITS bit/s; 8000:8 is G.711's 64 kbit/s; no entropy coding)")

    def build(self, spec, args):
        target, bits = _ints(args, 2)
        if target <= 0 or not 1 <= bits <= 16:
            raise ValueError("TARGET_RATE must be positive and BITS in 1-16")
        return Baseline(spec, f"mu-law {target / 1000:g} kHz {bits} bit",
                        lambda x, sr: mulaw_codec(x, sr, target, bits), _no_package)


@BASELINES.register("melgl")
class MelGriffinLimBaseline(BaselineKind):
    syntax = "melgl:N_MELS:FRAME_RATE:BITS"
    summary = ("a log-mel spectrogram quantised to BITS per value, decoded by Griffin-Lim "
               "(FRAME_RATE x N_MELS x BITS bit/s; no entropy coding)")

    def build(self, spec, args):
        n_mels, frame_rate, bits = _ints(args, 3)
        if n_mels <= 0 or frame_rate <= 0 or not 1 <= bits <= 16:
            raise ValueError("N_MELS and FRAME_RATE must be positive and BITS in 1-16")
        return Baseline(spec, f"mel+Griffin-Lim {n_mels} mels {frame_rate} fps {bits} bit",
                        lambda x, sr: melgl_codec(x, sr, n_mels, frame_rate, bits),
                        _no_package)


@BASELINES.register("codec2")
class Codec2Baseline(BaselineKind):
    syntax = "codec2:MODE"
    summary = (f"Codec2 ({CODEC2_REQUIREMENT}, libcodec2 1.2) at 8 kHz, MODE one of "
               f"{', '.join(CODEC2_MODES)} (bit/s; 700C: 700)")

    def build(self, spec, args):
        mode = args[0].upper() if len(args) == 1 else ""
        if mode not in CODEC2_MODES:
            raise ValueError(f"MODE must be one of {', '.join(CODEC2_MODES)} (the modes of "
                             f"{CODEC2_REQUIREMENT}; it has no 450)")
        return Baseline(spec, f"Codec2 {mode}", lambda x, sr: codec2_codec(x, sr, mode),
                        _package_check("pycodec2", CODEC2_REQUIREMENT, f"baseline {spec}"))


@BASELINES.register("opus")
class OpusBaseline(BaselineKind):
    syntax = "opus:KBPS"
    summary = (f"Opus through libopus ({OPUS_REQUIREMENT}), hard CBR at KBPS kbit/s "
               f"({OPUS_KBPS_RANGE[0]:g}-{OPUS_KBPS_RANGE[1]:g}), VoIP application, 20 ms "
               "frames; kbit/s column measured from the packet bytes")

    def build(self, spec, args):
        try:
            kbps = float(args[0]) if len(args) == 1 else math.nan
        except ValueError:
            kbps = math.nan
        if not OPUS_KBPS_RANGE[0] <= kbps <= OPUS_KBPS_RANGE[1]:
            raise ValueError(f"KBPS must be a number in {OPUS_KBPS_RANGE[0]:g}-"
                             f"{OPUS_KBPS_RANGE[1]:g}")
        return Baseline(spec, f"Opus {kbps:g} kbit/s CBR",
                        lambda x, sr: opus_codec(x, sr, kbps),
                        _package_check("av", OPUS_REQUIREMENT, f"baseline {spec}"))


@BASELINES.register("original")
class OriginalBaseline(BaselineKind):
    syntax = "original"
    summary = ("the input unchanged, counted as 16-bit PCM (sample rate x 16 bit/s): the "
               "reference itself, so every intrusive metric's ceiling, and the DNSMOS of the "
               "clean input (which a codec may exceed)")

    def build(self, spec, args):
        if args:
            raise ValueError(f"it takes no arguments, got {':'.join(args)!r}")
        return Baseline(spec, "original (16-bit PCM)",
                        lambda x, sr: (_check_wave(x).copy(), float(sr * 16)), _no_package)


def parse_baseline(spec: str) -> Baseline:
    """`KIND:ARGS` (one of BASELINES, see baseline_help()) -> Baseline; ConfigError naming
    the expected syntax otherwise."""
    kind, _, rest = spec.partition(":")
    if kind not in BASELINES:
        raise ConfigError(f"baseline {spec!r}: unknown kind {kind!r}; expected one of "
                          + ", ".join(BASELINES.get(k).syntax for k in BASELINES.names()))
    builder = BASELINES.get(kind)()
    try:
        return builder.build(spec, rest.split(":") if rest else [])
    except ValueError as err:
        raise ConfigError(f"baseline {spec!r}: expected {builder.syntax}: {err}") from None


def baseline_help(width: int = 88) -> str:
    """Each registered kind: its syntax and what it does, wrapped to `width`."""
    import textwrap
    return "\n".join(textwrap.fill(f"{BASELINES.get(k).syntax}: {BASELINES.get(k).summary}",
                                    width, initial_indent="  ", subsequent_indent="      ")
                     for k in BASELINES.names())
