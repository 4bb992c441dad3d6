"""Speaker-verification scoring: trial lists, cosine scoring with optional mean
subtraction, length normalisation and adaptive s-norm, EER, minDCF and DET curves."""
import os
from dataclasses import dataclass
from statistics import NormalDist
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

KALDI_LABELS = {"target": 1, "nontarget": 0}
VOXCELEB_LABELS = {"1": 1, "0": 0}


# ------------------------------------------------------------------------------- trials

@dataclass
class Trials:
    enroll: List[str]
    test: List[str]
    labels: np.ndarray        # int8, 1 target / 0 nontarget

    def __len__(self) -> int:
        return len(self.labels)


def read_trials(path: str) -> Trials:
    """Reads a trial list in VoxCeleb form (`1 enroll test`, 1 target / 0 nontarget) or
    Kaldi form (`enroll test target|nontarget`). Blank lines are skipped; a malformed line,
    or a line in the other form than the file's first, raises ValueError naming
    `path:line`."""
    enroll, test, labels = [], [], []
    form = None
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            fields = line.split()
            if not fields:
                continue
            where = f"{path}:{number}"
            if len(fields) != 3:
                raise ValueError(f"{where}: expected 3 fields (VoxCeleb '1|0 enroll test' or "
                                 f"Kaldi 'enroll test target|nontarget'), got {line.strip()!r}")
            if fields[2] in KALDI_LABELS:
                line_form, (e, t, label) = "kaldi", (fields[0], fields[1],
                                                     KALDI_LABELS[fields[2]])
            elif fields[0] in VOXCELEB_LABELS:
                line_form, (e, t, label) = "voxceleb", (fields[1], fields[2],
                                                        VOXCELEB_LABELS[fields[0]])
            else:
                raise ValueError(f"{where}: no trial label: the first field must be 1|0 "
                                 f"(VoxCeleb) or the third target|nontarget (Kaldi), "
                                 f"got {line.strip()!r}")
            if form is None:
                form = line_form
            elif line_form != form:
                raise ValueError(f"{where}: {line_form} trial line in a file whose first "
                                 f"trial is in {form} form")
            enroll.append(e)
            test.append(t)
            labels.append(label)
    return Trials(enroll, test, np.asarray(labels, dtype=np.int8))


# ------------------------------------------------------------------------ cosine scoring

def stack_embeddings(embeddings: Mapping[str, np.ndarray], keys: Sequence[str]) -> np.ndarray:
    """(len(keys), E) float64 matrix of the embeddings of `keys`; KeyError names the
    missing ones."""
    missing = [k for k in keys if k not in embeddings]
    if missing:
        raise KeyError(f"{len(missing)} utterance(s) without an embedding, e.g. "
                       f"{', '.join(missing[:3])}")
    return np.stack([np.asarray(embeddings[k], dtype=np.float64).reshape(-1) for k in keys])


def _unit_rows(x: np.ndarray) -> np.ndarray:
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


def embedding_mean(vectors: np.ndarray, length_norm: bool = False) -> np.ndarray:
    """Mean of a cohort or training embedding set (N, E), to subtract before scoring.
    Use the same `length_norm` as in scoring: the mean is then that of unit vectors."""
    vectors = np.asarray(vectors, dtype=np.float64)
    return (_unit_rows(vectors) if length_norm else vectors).mean(axis=0)


def normalize_embeddings(vectors: np.ndarray, mean: Optional[np.ndarray] = None,
                         length_norm: bool = False) -> np.ndarray:
    """Rows ready for cosine scoring by dot product: optionally scaled to unit length
    (before the mean, so embeddings with large norms do not dominate the centring), then
    the mean subtracted, then scaled to unit length."""
    x = np.asarray(vectors, dtype=np.float64)
    if length_norm:
        x = _unit_rows(x)
    if mean is not None:
        x = x - np.asarray(mean, dtype=np.float64)
    return _unit_rows(x)


def cohort_top_stats(vectors: np.ndarray, cohort: np.ndarray, top_n: int,
                     chunk: int = 2048) -> Tuple[np.ndarray, np.ndarray]:
    """Mean and (population) standard deviation of each row's `top_n` highest scores
    against the cohort; both inputs are normalised rows. Chunked so that only
    chunk x len(cohort) scores are held at once."""
    top_n = min(top_n, len(cohort))
    if top_n < 1:
        raise ValueError("adaptive s-norm needs a non-empty cohort and top_n >= 1")
    means = np.empty(len(vectors))
    stds = np.empty(len(vectors))
    for start in range(0, len(vectors), chunk):
        scores = vectors[start:start + chunk] @ cohort.T
        top = -np.partition(-scores, top_n - 1, axis=1)[:, :top_n]
        means[start:start + chunk] = top.mean(axis=1)
        stds[start:start + chunk] = top.std(axis=1)
    return means, stds


def adaptive_snorm(scores: np.ndarray, enroll_index: np.ndarray, test_index: np.ndarray,
                   vectors: np.ndarray, cohort: np.ndarray, top_n: int = 300) -> np.ndarray:
    """AS-Norm (Matejka et al. 2017, "AS-Norm1"): each side of a trial is normalised by
    the statistics of its own `top_n` most similar cohort scores, and the two z-scores
    are averaged:

        0.5 * ((s - mu_e) / sigma_e + (s - mu_t) / sigma_t)

    `vectors` holds the normalised embedding of every utterance once; `enroll_index` and
    `test_index` pick each trial's rows, so an utterance's cohort statistics are computed
    once however many trials it is in."""
    means, stds = cohort_top_stats(vectors, cohort, top_n)
    stds = np.maximum(stds, 1e-12)       # a cohort of identical scores has std 0
    scores = np.asarray(scores, dtype=np.float64)
    return 0.5 * ((scores - means[enroll_index]) / stds[enroll_index]
                  + (scores - means[test_index]) / stds[test_index])


def score_trials(trials: Trials, embeddings: Mapping[str, np.ndarray],
                 mean: Optional[np.ndarray] = None, length_norm: bool = False,
                 cohort: Optional[np.ndarray] = None, top_n: int = 300) -> np.ndarray:
    """Cosine score of every trial; with `cohort` (raw cohort embeddings (N, E),
    normalised here exactly like the trial embeddings) the scores are AS-Norm'ed.
    `mean` is subtracted from every embedding (see `embedding_mean`)."""
    keys = sorted(set(trials.enroll) | set(trials.test))
    index = {k: i for i, k in enumerate(keys)}
    vectors = normalize_embeddings(stack_embeddings(embeddings, keys), mean, length_norm)
    enroll_index = np.fromiter((index[k] for k in trials.enroll), dtype=np.int64,
                               count=len(trials))
    test_index = np.fromiter((index[k] for k in trials.test), dtype=np.int64, count=len(trials))
    scores = np.einsum("ij,ij->i", vectors[enroll_index], vectors[test_index])
    if cohort is None:
        return scores
    cohort_vectors = normalize_embeddings(cohort, mean, length_norm)
    return adaptive_snorm(scores, enroll_index, test_index, vectors, cohort_vectors, top_n)


# ---------------------------------------------------------------------------- metrics

def _check_scores(scores, labels) -> Tuple[np.ndarray, np.ndarray]:
    scores = np.asarray(scores, dtype=np.float64).reshape(-1)
    labels = np.asarray(labels).reshape(-1)
    if scores.shape != labels.shape:
        raise ValueError(f"{scores.size} scores but {labels.size} labels")
    if not np.isin(labels, (0, 1)).all():
        raise ValueError("labels must be 1 (target) or 0 (nontarget)")
    labels = labels.astype(bool)
    if labels.all() or not labels.any():
        raise ValueError("scoring needs both target and nontarget trials")
    if not np.isfinite(scores).all():
        raise ValueError("scores contain NaN or infinity")
    return scores, labels


def error_rates(scores, labels) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Miss and false-alarm rates for the decision "accept if score >= threshold" at
    every distinct score, plus threshold +inf (accept nothing) first.
    Returns (p_miss, p_fa, thresholds), p_miss non-increasing and p_fa non-decreasing.
    Tied scores form a single point: a threshold cannot separate them."""
    scores, labels = _check_scores(scores, labels)
    order = np.argsort(-scores, kind="stable")
    sorted_scores, sorted_labels = scores[order], labels[order]
    # last position of each run of equal scores (descending)
    ends = np.flatnonzero(np.r_[sorted_scores[1:] != sorted_scores[:-1], True])
    accepted_targets = np.cumsum(sorted_labels)[ends]
    accepted_nontargets = (ends + 1) - accepted_targets
    n_target, n_nontarget = labels.sum(), (~labels).sum()
    p_miss = np.r_[1.0, 1.0 - accepted_targets / n_target]
    p_fa = np.r_[0.0, accepted_nontargets / n_nontarget]
    thresholds = np.r_[np.inf, sorted_scores[ends]]
    return p_miss, p_fa, thresholds


def compute_eer(scores, labels) -> Tuple[float, float]:
    """Equal error rate (fraction, not %) and its threshold. The ROC is the polyline
    through the points of `error_rates`; the EER is where it crosses p_miss = p_fa,
    linearly interpolated within the crossing segment. The threshold is interpolated
    the same way, except on the first segment (from threshold +inf), where it is the
    highest score."""
    p_miss, p_fa, thresholds = error_rates(scores, labels)
    diff = p_miss - p_fa                          # 1 at the start, -1 at the end
    i = int(np.flatnonzero(diff <= 0)[0])         # first point at or past the crossing
    alpha = diff[i - 1] / (diff[i - 1] - diff[i])
    eer = p_fa[i - 1] + alpha * (p_fa[i] - p_fa[i - 1])
    if np.isinf(thresholds[i - 1]):
        threshold = thresholds[i]
    else:
        threshold = thresholds[i - 1] + alpha * (thresholds[i] - thresholds[i - 1])
    return float(eer), float(threshold)


def compute_min_dcf(scores, labels, p_target: float, c_miss: float = 1.0,
                    c_fa: float = 1.0) -> Tuple[float, float]:
    """Normalised minimum detection cost (NIST SRE / Kaldi's compute_min_dcf.py):
    min over thresholds of c_miss*P_miss*p_target + c_fa*P_fa*(1 - p_target), divided by
    min(c_miss*p_target, c_fa*(1 - p_target)), the cost of always rejecting or always
    accepting, so a useless system scores 1. Both extreme thresholds are included.
    Returns (min_dcf, threshold); threshold +inf means rejecting every trial is best."""
    if not 0.0 < p_target < 1.0:
        raise ValueError(f"p_target must be in (0, 1), got {p_target}")
    p_miss, p_fa, thresholds = error_rates(scores, labels)
    # the first point rejects everything, the last accepts everything
    cost = c_miss * p_miss * p_target + c_fa * p_fa * (1.0 - p_target)
    best = int(np.argmin(cost))
    default = min(c_miss * p_target, c_fa * (1.0 - p_target))
    return float(cost[best] / default), float(thresholds[best])


def det_curve(scores, labels) -> Tuple[np.ndarray, np.ndarray]:
    """DET points (p_fa, p_miss) of every threshold, p_fa ascending."""
    p_miss, p_fa, _ = error_rates(scores, labels)
    return p_fa, p_miss


def _probit(p: np.ndarray) -> np.ndarray:
    inv_cdf = NormalDist().inv_cdf
    return np.array([inv_cdf(float(v)) for v in np.ravel(p)]).reshape(np.shape(p))


# Sparse below 1 %: probit spacing there is too tight for every 1-2-5 label.
DET_TICKS = [0.0001, 0.001, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.4]


def plot_det(path: str, systems: Mapping[str, Tuple[Sequence[float], Sequence[int]]],
             title: str = "DET curve") -> None:
    """Writes a PNG of the DET curves of `systems` (name -> (scores, labels)) on probit
    axes (normal deviate of the error rates, so Gaussian score distributions give
    straight lines), each with its EER point marked."""
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    curves = {}
    smallest = 0.4
    for name, (scores, labels) in systems.items():
        p_fa, p_miss = det_curve(scores, labels)
        eer, _ = compute_eer(scores, labels)
        curves[name] = (p_fa, p_miss, eer)
        positive = np.r_[p_fa[p_fa > 0], p_miss[p_miss > 0]]
        if positive.size:
            smallest = min(smallest, float(positive.min()))
    ticks = [t for t in DET_TICKS if t >= smallest / 2] or DET_TICKS[-2:]
    low, high = ticks[0], 0.5
    # Rates of 0 or 1 have an infinite deviate: clip them to just outside the axes.
    clip = lambda p: np.clip(p, low / 2, 1.0 - low / 2)   # noqa: E731

    fig, ax = plt.subplots(figsize=(5.5, 5.5))
    for name, (p_fa, p_miss, eer) in curves.items():
        line, = ax.plot(_probit(clip(p_fa)), _probit(clip(p_miss)),
                        label=f"{name} (EER {100 * eer:.2f}%)")
        if low / 2 < eer:
            ax.plot(*_probit(np.array([eer, eer])), "o", color=line.get_color())
    limits = _probit(np.array([low, high]))
    ax.plot(limits, limits, ":", color="grey", linewidth=0.8)   # p_miss = p_fa
    tick_pos = _probit(np.array(ticks))
    labels = [f"{100 * t:g}" for t in ticks]
    ax.set_xticks(tick_pos, labels)
    ax.set_yticks(tick_pos, labels)
    ax.set_xlim(*limits)
    ax.set_ylim(*limits)
    ax.set_xlabel("False alarm rate (%)")
    ax.set_ylabel("Miss rate (%)")
    ax.set_title(title)
    ax.grid(True, linewidth=0.4)
    ax.legend(loc="lower left", fontsize=8)   # DET curves rarely reach that corner
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, format="png", dpi=100)
    plt.close(fig)


# ------------------------------------------------------------------------------ summary

def summarize(scores, labels, p_targets: Sequence[float] = (0.01, 0.05)) -> Dict[str, float]:
    """EER (%) and threshold, minDCF at each p_target (c_miss = c_fa = 1), trial counts."""
    scores, labels = _check_scores(scores, labels)
    eer, threshold = compute_eer(scores, labels)
    summary: Dict[str, float] = {"eer_percent": 100.0 * eer, "eer_threshold": threshold}
    for p in p_targets:
        summary[f"min_dcf_{p:g}"] = compute_min_dcf(scores, labels, p)[0]
    summary.update(trials=int(labels.size), targets=int(labels.sum()),
                   nontargets=int((~labels).sum()))
    return summary


def format_summary(summary: Mapping[str, float]) -> str:
    """One line, e.g. `EER 1.23% minDCF(0.01) 0.123 minDCF(0.05) 0.080 over 37611 trials
    (4874 target)`."""
    parts = [f"EER {summary['eer_percent']:.2f}%"]
    for key, value in summary.items():
        if key.startswith("min_dcf_"):
            parts.append(f"minDCF({key[len('min_dcf_'):]}) {value:.3f}")
    parts.append(f"over {summary['trials']} trials ({summary['targets']} target)")
    return " ".join(parts)
