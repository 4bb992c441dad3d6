"""DNSMOS (Reddy et al., ICASSP 2022): Microsoft's non-intrusive speech quality predictor,
which scores a signal alone, without a reference. From one 16 kHz signal it predicts
ITU-T P.835's three MOS (SIG: the speech itself, BAK: the background noise, OVRL: overall)
and a P.808 overall MOS, each on the 1-5 absolute category rating scale (the P.835 ones
mapped by DNSMOS' fitted polynomials, not clipped to it).

The ONNX models (sig_bak_ovr.onnx, model_v8.onnx; MIT licence) and the scoring
(speechmos.dnsmos.DNSMOS: 9.01 s windows at 1 s hops, a shorter clip looped to fill one,
the window scores averaged) come from PyPI speechmos 0.0.1.1 (MIT), the DNS Challenge
organisers' packaging of dnsmos_local.py; only the sessions are made here.
"""
import os
from functools import lru_cache
from typing import Dict

import numpy as np

from toolkit.tasks.codec.metric_error import MetricError
from toolkit.tasks.codec.packages import import_optional

DNSMOS_REQUIREMENT = "speechmos==0.0.1.1"
DNSMOS_RATE = 16000             # the only rate the models take


@lru_cache(maxsize=1)
def _model():
    # speechmos declares no dependencies: each is checked here so that a missing one is
    # named with its own fix, not as speechmos' ImportError.
    import_optional("onnxruntime", "onnxruntime", "the DNSMOS metrics")
    import_optional("librosa", "librosa>=0.10", "the DNSMOS metrics (P.808's mel spectrogram)")
    import_optional("requests", "requests", "the DNSMOS metrics (speechmos.dnsmos imports it)")
    speechmos = import_optional("speechmos.dnsmos", DNSMOS_REQUIREMENT, "the DNSMOS metrics")
    import onnxruntime as ort

    class _DNSMOS(speechmos.DNSMOS):
        """speechmos' scoring with sessions on one thread each: the evaluation's metric
        workers (--jobs) are processes already, and onnxruntime's default of a thread per
        core in each of them would oversubscribe the machine."""

        def __init__(self, primary_model_path: str, p808_model_path: str):
            options = ort.SessionOptions()
            options.intra_op_num_threads = 1
            options.inter_op_num_threads = 1
            self.primary_model_path = primary_model_path

            def session(path):
                return ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
            self.onnx_sess = session(primary_model_path)
            self.p808_onnx_sess = session(p808_model_path)

    models = os.path.join(os.path.dirname(speechmos.__file__), "dnsmos_models")
    return _DNSMOS(os.path.join(models, "sig_bak_ovr.onnx"),
                   os.path.join(models, "model_v8.onnx"))


def check_dnsmos() -> None:
    """Raises MissingPackageError when DNSMOS cannot run (loads the models once)."""
    _model()


def dnsmos_scores(wave, sample_rate: int) -> Dict[str, float]:
    """{"ovrl", "sig", "bak", "p808"} MOS of a 1-D waveform, resampled to 16 kHz with the
    toolkit's resampler and clipped to [-1, 1] (speechmos refuses samples beyond, which a
    16-bit file could not hold either). MetricError for an empty or silent signal: DNSMOS
    would score silence (about 1.8 OVRL) as if it were speech."""
    model = _model()
    x = np.asarray(wave, dtype=np.float64)
    if x.ndim != 1:
        x = np.squeeze(x)
    if x.ndim != 1:
        raise ValueError(f"expected a 1-D waveform, got shape {x.shape}")
    if int(sample_rate) != DNSMOS_RATE:
        from toolkit.data.audio import resample
        x = np.asarray(resample(x, int(sample_rate), DNSMOS_RATE), dtype=np.float64)
    if not len(x) or not np.any(x):
        raise MetricError(f"DNSMOS is undefined for {'an empty' if not len(x) else 'a silent'}"
                          " signal")
    if not np.all(np.isfinite(x)):
        raise MetricError("DNSMOS is undefined for a signal with non-finite samples")
    scores = model(np.clip(x, -1.0, 1.0), DNSMOS_RATE, False)   # False: not personalised
    return {"ovrl": float(scores["ovrl_mos"]), "sig": float(scores["sig_mos"]),
            "bak": float(scores["bak_mos"]), "p808": float(scores["p808_mos"])}
