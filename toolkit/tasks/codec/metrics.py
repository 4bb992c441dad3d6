"""Objective codec metrics on (reference, decoded) 1-D numpy waveforms, registered by name
(METRICS) for the evaluation table.

mel_distance and stft_distance are the training losses evaluated without gradients (lower is
better); si_sdr is in dB (higher is better); stoi (pystoi); pesq_wb and pesq_nb: ITU-T
P.862.2 wideband at 16 kHz and P.862 narrowband at 8 kHz (pesq 0.0.4), MOS-LQO; visqol:
ViSQOL v3 speech mode at 16 kHz with its lattice MOS mapping, the C++ tool's default
(visqol-python 3.8.0). dnsmos_ovrl, dnsmos_sig, dnsmos_bak and dnsmos_p808 are
non-intrusive (toolkit.tasks.codec.dnsmos): DNSMOS' P.835 overall, speech and background MOS
and its P.808 MOS of the decoded signal alone (the reference is ignored; run on the
`original` baseline they give the clean input's), not among the default columns.
pitch_kept (toolkit.tasks.codec.pitch) is the share of the reference's voiced 20 ms frames
that the decoded signal voices at the same period (within 10 %). Signals at other rates
are resampled with the toolkit's resampler.
Every metric but the first three and pitch_kept needs a package of the `codec` extra; a missing package,
or a pair a metric cannot score, is an expected error (MetricError) naming the metric.
"""
import hashlib
import warnings
from dataclasses import dataclass
from functools import lru_cache
from typing import Callable, Dict, Optional, Sequence, Tuple

import numpy as np

from toolkit.registry import Registry
from toolkit.tasks.codec.dnsmos import check_dnsmos, dnsmos_scores
from toolkit.tasks.codec.metric_error import MetricError  # noqa: F401  (importable from here)
from toolkit.tasks.codec.packages import import_optional



def _mono(x) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 1:
        x = np.squeeze(x)
    if x.ndim != 1:
        raise ValueError(f"expected a 1-D waveform, got shape {x.shape}")
    return x


def align(reference, decoded) -> Tuple[np.ndarray, np.ndarray]:
    """Both truncated to the shorter length (codecs pad to whole frames)."""
    ref, dec = _mono(reference), _mono(decoded)
    n = min(len(ref), len(dec))
    if n == 0:
        raise ValueError("empty waveform")
    return ref[:n], dec[:n]


# torch is imported where a loss is built, so that listing the metrics (--help) stays light.
@lru_cache(maxsize=4)
def _mel_loss(sample_rate: int):
    from toolkit.tasks.codec.losses import MultiResolutionMelLoss
    return MultiResolutionMelLoss(sample_rate)


@lru_cache(maxsize=1)
def _stft_loss():
    from toolkit.tasks.codec.losses import MultiResolutionSTFTLoss
    return MultiResolutionSTFTLoss()


def _tensor(x: np.ndarray):
    import torch
    return torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))[None]


def mel_distance(reference, decoded, sample_rate: int) -> float:
    """DAC's multi-resolution log-mel L1 (MultiResolutionMelLoss defaults)."""
    import torch
    ref, dec = align(reference, decoded)
    with torch.no_grad():
        return float(_mel_loss(int(sample_rate))(_tensor(dec), _tensor(ref)))


def stft_distance(reference, decoded) -> float:
    """Spectral convergence + log-magnitude L1 (MultiResolutionSTFTLoss defaults)."""
    import torch
    ref, dec = align(reference, decoded)
    with torch.no_grad():
        sc, mag = _stft_loss()(_tensor(dec), _tensor(ref))
    return float(sc + mag)


def si_sdr(reference, estimate, max_db: float = 100.0) -> float:
    """Scale-invariant SDR in dB (Le Roux et al. 2019): both signals made zero-mean, the
    estimate split into alpha * reference plus an error; 10 log10(|target|^2 / |error|^2).
    Clipped to `max_db` so that a perfect (or merely rescaled) estimate gives a finite value."""
    ref, est = align(reference, estimate)
    ref = ref - ref.mean()
    est = est - est.mean()
    ref_energy = float(np.dot(ref, ref))
    if ref_energy == 0.0:
        raise ValueError("reference is constant: SI-SDR undefined")
    target = (np.dot(est, ref) / ref_energy) * ref
    error = est - target
    target_energy, error_energy = float(np.dot(target, target)), float(np.dot(error, error))
    if error_energy <= target_energy * 10.0 ** (-max_db / 10.0):
        return float(max_db)
    if target_energy == 0.0:
        return float(-max_db)
    return float(np.clip(10.0 * np.log10(target_energy / error_energy), -max_db, max_db))


STOI_REQUIREMENT = "pystoi"
PESQ_REQUIREMENT = "pesq==0.0.4"
VISQOL_REQUIREMENT = "visqol-python[lattice,accel]==3.8.0"


def _pystoi():
    return import_optional("pystoi", STOI_REQUIREMENT, "the STOI metric").stoi


# pystoi's answer when fewer than 30 frames (384 ms at its 10 kHz, hop 12.8 ms) are left
# once the reference's silent frames are dropped: a warning and this number, which is no
# score (a perfect copy gets it) and must not be averaged in.
_PYSTOI_TOO_SHORT = 1e-5
_PYSTOI_TOO_SHORT_WARNING = "Not enough STFT frames"


def stoi(reference, decoded, sample_rate: int, extended: bool = False) -> float:
    """Short-time objective intelligibility (Taal et al. 2011) via pystoi; extended=True: ESTOI.
    MetricError, as PESQ and ViSQOL refuse a pair too short for them, when too little speech
    is left for STOI's 384 ms segments (more than about 0.41 s without silent frames)."""
    stoi_of = _pystoi()
    ref, dec = align(reference, decoded)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        value = float(stoi_of(ref, dec, int(sample_rate), extended=extended))
    too_short = value == _PYSTOI_TOO_SHORT
    for warning in caught:
        if _PYSTOI_TOO_SHORT_WARNING in str(warning.message):
            too_short = True
        else:                       # not ours to hide
            warnings.warn_explicit(warning.message, warning.category, warning.filename,
                                   warning.lineno)
    if too_short:
        raise MetricError(f"{'ESTOI' if extended else 'STOI'} is undefined for "
                          f"{len(ref) / sample_rate:.2f} s of audio: less than one 384 ms "
                          f"segment (30 frames) is left once its silent frames are removed")
    return value


def _at_rate(x: np.ndarray, sample_rate: int, rate: int) -> np.ndarray:
    from toolkit.data.audio import resample
    return np.asarray(resample(np.asarray(x, dtype=np.float32), int(sample_rate), rate),
                      dtype=np.float64)


def _pesq_module():
    return import_optional("pesq", PESQ_REQUIREMENT, "the PESQ metric")


def pesq(reference, decoded, sample_rate: int, mode: str = "wb") -> float:
    """PESQ MOS-LQO: mode "wb" (P.862.2, at 16 kHz: 1.04-4.64) or "nb" (P.862 with the
    P.862.1 mapping, at 8 kHz: 1.02-4.55); both signals resampled to that rate."""
    if mode not in ("wb", "nb"):
        raise ValueError(f"PESQ mode must be wb or nb, got {mode!r}")
    library = _pesq_module()
    rate = 16000 if mode == "wb" else 8000
    ref, dec = align(reference, decoded)
    ref, dec = _at_rate(ref, sample_rate, rate), _at_rate(dec, sample_rate, rate)
    name = f"PESQ-{mode.upper()}"
    if not np.any(ref) or not np.any(dec):
        raise MetricError(f"{name} is undefined for a silent "
                          f"{'reference' if not np.any(ref) else 'decoded signal'}")
    try:
        return float(library.pesq(rate, ref, dec, mode))
    except library.PesqError as err:
        reason = err.args[0].decode() if err.args and isinstance(err.args[0], bytes) else err
        raise MetricError(f"{name} failed: {reason} ({len(ref) / rate:.2f} s at {rate} Hz)"
                          ) from None


@lru_cache(maxsize=1)
def _visqol_api():
    visqol = import_optional("visqol", VISQOL_REQUIREMENT, "the ViSQOL metric")
    import_optional("ai_edge_litert.interpreter", VISQOL_REQUIREMENT,
                    "the ViSQOL metric's speech-mode MOS mapping (lattice model)")
    api = visqol.VisqolApi()
    # Pinned rather than left to visqol-python's auto-detection, so that the score does
    # not depend on whether the TFLite runtime happens to be installed.
    api.create(mode="speech", use_lattice_model=True)
    return api


def visqol(reference, decoded, sample_rate: int) -> float:
    """ViSQOL v3 MOS-LQO, speech mode at 16 kHz (its own alignment, voice-activity patch
    selection and lattice mapping)."""
    api = _visqol_api()
    ref, dec = align(reference, decoded)
    ref, dec = _at_rate(ref, sample_rate, 16000), _at_rate(dec, sample_rate, 16000)
    if not np.any(ref) or not np.any(dec):
        raise MetricError(f"ViSQOL is undefined for a silent "
                          f"{'reference' if not np.any(ref) else 'decoded signal'}")
    try:
        return float(api.measure_from_arrays(ref, dec, 16000).moslqo)
    except (ValueError, IndexError, ZeroDivisionError, FloatingPointError) as err:
        raise MetricError(f"ViSQOL failed: {err} ({len(ref) / 16000:.2f} s)") from err


def warm_up_numba_metrics() -> Tuple[float, float]:
    """Scores one second of a synthetic vowel with ViSQOL (against itself) and DNSMOS, so
    that the numba kernels both run on, ViSQOL's and librosa's (DNSMOS' mel spectrogram),
    compile once into numba's on-disk cache (tools/install.sh runs this): uncached,
    ViSQOL's take about a minute and librosa's 16 CPU-s in every process that imports it
    before the cache exists. Returns (ViSQOL MOS-LQO, DNSMOS OVRL)."""
    from toolkit.tasks.codec.dnsmos import dnsmos_scores
    t = np.arange(16000) / 16000.0
    vowel = sum(np.sin(2 * np.pi * k * 140.0 * t) / k for k in range(1, 12))
    vowel *= 0.2 * (0.6 + 0.4 * np.sin(2 * np.pi * 4.0 * t))
    return visqol(vowel, vowel, 16000), dnsmos_scores(vowel, 16000)["ovrl"]


# The four DNSMOS columns come from one model run: the last decoded signal's scores are
# kept (one entry, keyed by a hash of its samples), so the other three columns of a pair
# cost a hash, and a worker process holds one signal's scores at most.
_dnsmos_last = {"key": None, "scores": None}


def cached_dnsmos(decoded, sample_rate: int) -> Dict[str, float]:
    """dnsmos_scores() of `decoded`, computed once for consecutive calls on equal samples."""
    x = np.ascontiguousarray(_mono(decoded))
    key = (hashlib.blake2b(x.tobytes(), digest_size=16).digest(), len(x), int(sample_rate))
    if _dnsmos_last["key"] != key:
        scores = dnsmos_scores(x, sample_rate)
        _dnsmos_last.update(key=key, scores=scores)
    return dict(_dnsmos_last["scores"])


# --------------------------------------------------------------------------- registry

@dataclass(frozen=True)
class Metric:
    """A column of the evaluation table: compute(reference, decoded, sample_rate) on
    aligned signals; check() raises MissingPackageError when its package is missing."""
    name: str
    title: str
    fmt: str
    compute: Callable[[np.ndarray, np.ndarray, int], float]
    check: Callable[[], None]


METRICS: Registry = Registry("codec metric")


def _register(name: str, title: str, fmt: str, compute, check=lambda: None) -> None:
    METRICS.register(name)(Metric(name, title, fmt, compute, check))


_register("mel_distance", "mel distance (lower better)", "{:.3f}", mel_distance)
_register("stft_distance", "STFT distance (lower better)", "{:.3f}",
          lambda ref, dec, sr: stft_distance(ref, dec))
_register("si_sdr", "SI-SDR dB (higher better)", "{:.2f}", lambda ref, dec, sr: si_sdr(ref, dec))
_register("stoi", "STOI (higher better)", "{:.3f}", stoi, _pystoi)
_register("pesq_wb", "PESQ-WB (higher better)", "{:.3f}",
          lambda ref, dec, sr: pesq(ref, dec, sr, "wb"), _pesq_module)
_register("pesq_nb", "PESQ-NB (higher better)", "{:.3f}",
          lambda ref, dec, sr: pesq(ref, dec, sr, "nb"), _pesq_module)
_register("visqol", "ViSQOL speech (higher better)", "{:.3f}", visqol, _visqol_api)
for _score, _title in (("ovrl", "OVRL"), ("sig", "SIG"), ("bak", "BAK"), ("p808", "P.808")):
    _register(f"dnsmos_{_score}", f"DNSMOS {_title} (higher better)", "{:.3f}",
              lambda ref, dec, sr, score=_score: cached_dnsmos(dec, sr)[score],
              check_dnsmos)
del _score, _title


def _pitch_kept(reference, decoded, sample_rate: int) -> float:
    from toolkit.tasks.codec.pitch import pitch_kept
    ref, dec = align(reference, decoded)
    if sample_rate != 16000:
        ref, dec = _at_rate(ref, sample_rate, 16000), _at_rate(dec, sample_rate, 16000)
    value = pitch_kept(ref, dec)
    if np.isnan(value):
        raise MetricError("pitch kept is undefined: the reference has no voiced frame")
    return value


_register("pitch_kept", "voiced frames kept (higher better)", "{:.3f}", _pitch_kept)

# The table's columns, in order, when none are chosen.
ALL_METRICS = ("mel_distance", "stft_distance", "si_sdr", "stoi", "pesq_wb", "pesq_nb",
               "visqol")
# Non-intrusive, chosen by name only (so that existing tables keep their columns).
DNSMOS_METRICS = ("dnsmos_ovrl", "dnsmos_sig", "dnsmos_bak", "dnsmos_p808")


def get_metrics(names: Sequence[str]) -> Tuple[Metric, ...]:
    """The registered metrics `names`, in that order; KeyError names an unknown one."""
    return tuple(METRICS.get(n) for n in names)


def evaluate_pair(reference, decoded, sample_rate: int, with_stoi: bool = True,
                  metrics: Optional[Sequence[str]] = None) -> Dict[str, float]:
    """Metrics for one pair, lengths aligned first (the delay is the caller's: see
    toolkit.tasks.codec.delay). `metrics`: registered names; by default mel, STFT, SI-SDR
    and, unless with_stoi=False, STOI."""
    if metrics is None:
        metrics = ALL_METRICS[:4] if with_stoi else ALL_METRICS[:3]
    ref, dec = align(reference, decoded)
    return {m.name: m.compute(ref, dec, sample_rate) for m in get_metrics(metrics)}
