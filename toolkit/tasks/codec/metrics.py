"""Objective codec metrics on (reference, decoded) 1-D numpy waveforms.

mel_distance and stft_distance are the training losses evaluated without gradients (lower is
better); si_sdr is in dB (higher is better); stoi needs the `pystoi` package.
"""
from functools import lru_cache
from typing import Dict, Optional, Tuple

import numpy as np
import torch

from toolkit.tasks.codec.losses import MultiResolutionMelLoss, MultiResolutionSTFTLoss


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


@lru_cache(maxsize=4)
def _mel_loss(sample_rate: int) -> MultiResolutionMelLoss:
    return MultiResolutionMelLoss(sample_rate)


@lru_cache(maxsize=1)
def _stft_loss() -> MultiResolutionSTFTLoss:
    return MultiResolutionSTFTLoss()


def _tensor(x: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))[None]


def mel_distance(reference, decoded, sample_rate: int) -> float:
    """DAC's multi-resolution log-mel L1 (MultiResolutionMelLoss defaults)."""
    ref, dec = align(reference, decoded)
    with torch.no_grad():
        return float(_mel_loss(int(sample_rate))(_tensor(dec), _tensor(ref)))


def stft_distance(reference, decoded) -> float:
    """Spectral convergence + log-magnitude L1 (MultiResolutionSTFTLoss defaults)."""
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


def stoi(reference, decoded, sample_rate: int, extended: bool = False) -> float:
    """Short-time objective intelligibility (Taal et al. 2011) via pystoi; extended=True: ESTOI."""
    try:
        from pystoi import stoi as _pystoi
    except ImportError:
        from toolkit.errors import UserError
        raise UserError("the STOI metric needs the pystoi package (the codec extra): rerun "
                        "bash tools/install.sh, or pip install pystoi") from None
    ref, dec = align(reference, decoded)
    return float(_pystoi(ref, dec, int(sample_rate), extended=extended))


def evaluate_pair(reference, decoded, sample_rate: int,
                  with_stoi: bool = True) -> Dict[str, float]:
    """All metrics for one pair, lengths aligned first. STOI needs pystoi (installed by
    tools/install.sh); with_stoi=False leaves it out rather than depending on the host."""
    ref, dec = align(reference, decoded)
    result = {
        "mel_distance": mel_distance(ref, dec, sample_rate),
        "stft_distance": stft_distance(ref, dec),
        "si_sdr": si_sdr(ref, dec),
    }
    if with_stoi:
        result["stoi"] = stoi(ref, dec, sample_rate)
    return result
