"""Keyword-spotting DET maths: FRR and false alarms per hour over a threshold grid, the
operating point at a false-alarm target, bootstrap intervals of its FRR.

Every grid threshold is scored by replaying the deployment rule of
``toolkit.tasks.kws.decision`` (smoothing, firing, refractory) on each utterance, with
one threshold shared by all keywords:

* FRR_k(θ): fraction of utterances labelled k on which the rule fires no
  detection of keyword k.
* FA/h_k(θ): detections of keyword k on utterances whose label != k
  (negatives and other keywords), divided by the hours of that audio.

Multiple keywords: as in deployment, each keyword fires under its own refractory
period, so its curve is exact whatever the other keywords do, and per-keyword
thresholds read from these curves are what a deployed detector with them does
(the decision rule's nested-keyword rule 5 is not replayed: no recipe model has
keywords inside one another).

The count is exact for every threshold (see ``_firing_events``), not an
approximation by sampling thresholds. Reading the inputs and writing the reports (tables,
the DET plot, error lists) is toolkit.tasks.kws.scoring.
"""
import heapq
import math
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from toolkit.tasks.kws.decision import (DEFAULT_REFRACTORY_FRAMES, DEFAULT_SMOOTH_FRAMES,
                                        smooth_scores)


def threshold_grid(step: float = 0.001, start: float = 0.0, stop: float = 1.0,
                   tail_decades: int = 0) -> np.ndarray:
    """Inclusive grid start..stop; values are rounded so that e.g. 0.812 is the
    same double a deployment config would parse, keeping scores reproducible.

    `tail_decades` > 0 adds 1 - m*10^-k (m = 1..9) for the next `tail_decades` powers
    of ten below `step` (0.9991 ... 0.9999999 for step 0.001 and 4 decades): a sharp
    model's confusables score above 1 - step, and a uniform grid cannot place a
    threshold between them and 1."""
    if step <= 0 or stop < start or tail_decades < 0:
        raise ValueError(f"bad threshold grid start={start} stop={stop} step={step} "
                         f"tail_decades={tail_decades}")
    n = int(math.floor((stop - start) / step + 1e-9))
    grid = np.round(start + np.arange(n + 1) * step, 10)
    if tail_decades and stop == 1.0:
        first = int(math.ceil(-math.log10(step) - 1e-9)) + 1
        tail = [round(1.0 - m * 10.0 ** -k, 12) for k in range(first, first + tail_decades)
                for m in range(1, 10)]
        below = grid[-2] if grid.size > 1 else start
        grid = np.unique(np.concatenate([grid, [t for t in tail if t > below]]))
    return grid


def _firing_events(c: np.ndarray, refractory_frames: int, num_thresholds: int
                   ) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Exact firings of the refractory rule for every grid threshold at once.

    ``c[t]`` = number of grid thresholds <= the frame's best smoothed score, so
    frame t is over threshold index g iff ``g < c[t]``.  Returns arrays
    (frame, lo, hi): the frame fires for every threshold index in [lo, hi).

    Thresholds are tracked as interval sets sharing a history: "free to fire
    from frame p on" for thresholds in [lo, hi).  The first firing for
    threshold g is then the first frame t >= p with c[t] > g, i.e. one of the
    running-maximum records of c[p:]; record i fires for g in
    [previous record value, its value) and those thresholds are free again
    after the refractory period.  Positions are visited in increasing order and
    touching intervals waiting at the same position are merged, so the work is
    proportional to the number of distinct firing events rather than to
    frames x thresholds (2000 utts x 400 frames x 1001 thresholds with a 1 s
    refractory period takes about a second; very short periods cost more).
    """
    T = int(c.size)
    frames: List[int] = []
    los: List[int] = []
    his: List[int] = []
    pending: Dict[int, List[Tuple[int, int]]] = {0: [(0, num_thresholds)]}
    heap = [0]
    while heap:
        p = heapq.heappop(heap)
        run = np.maximum.accumulate(c[p:])
        rec = np.concatenate(([0], np.flatnonzero(run[1:] > run[:-1]) + 1))
        val = run[rec]
        prev = np.concatenate(([0], val[:-1]))
        merged: List[List[int]] = []
        for lo, hi in sorted(pending.pop(p)):
            if merged and merged[-1][1] == lo:
                merged[-1][1] = hi
            else:
                merged.append([lo, hi])
        for lo, hi in merged:
            i0 = int(np.searchsorted(val, lo, side="right"))  # first record reaching past lo
            i1 = int(np.searchsorted(prev, hi, side="left"))  # records starting below hi
            for r, v, pv in zip(rec[i0:i1].tolist(), val[i0:i1].tolist(), prev[i0:i1].tolist()):
                a, b = max(lo, pv), min(hi, v)
                frames.append(p + r)
                los.append(a)
                his.append(b)
                q = p + r + refractory_frames + 1
                if q < T:
                    if q not in pending:
                        pending[q] = []
                        heapq.heappush(heap, q)
                    pending[q].append((a, b))
    return (np.asarray(frames, dtype=np.int64), np.asarray(los, dtype=np.int64),
            np.asarray(his, dtype=np.int64))


@dataclass
class DetCurves:
    thresholds: np.ndarray  # [G], ascending
    fa_count: np.ndarray  # [G, K] detections of k on audio not labelled k
    miss_count: np.ndarray  # [G, K] utterances labelled k without a detection of k
    num_positives: np.ndarray  # [K]
    negative_hours: np.ndarray  # [K] hours of audio not labelled k

    @property
    def frr(self) -> np.ndarray:
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(self.num_positives > 0, self.miss_count / np.maximum(self.num_positives, 1), np.nan)

    @property
    def fa_per_hour(self) -> np.ndarray:
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(self.negative_hours > 0,
                            self.fa_count / np.where(self.negative_hours > 0, self.negative_hours, 1), np.nan)


def _utterance_firings(x: np.ndarray, num_keywords: int, thresholds: np.ndarray,
                       smooth_frames: int, refractory_frames: int
                       ) -> Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """One utterance's detections for every grid threshold: arrays (keyword, lo, hi,
    frame), each detection firing at `frame` for threshold indices [lo, hi). Keywords
    fire independently (rule 2), so each column is replayed on its own."""
    s = smooth_scores(x, smooth_frames)
    if s.shape[1] != num_keywords:
        raise ValueError(f"posteriors have {s.shape[1]} columns, expected {num_keywords}")
    parts = []
    for k in range(num_keywords):
        # Same `score >= threshold` comparison, in float64, as DecisionState.
        c = np.searchsorted(thresholds, s[:, k], side="right")
        frames, lo, hi = _firing_events(c, refractory_frames, thresholds.size)
        parts.append((np.full(frames.size, k, dtype=np.int64), lo, hi, frames))
    order = np.argsort(np.concatenate([p[3] for p in parts]), kind="stable")
    return tuple(np.concatenate([p[i] for p in parts])[order] for i in range(4))


def all_firings(probs: Sequence[np.ndarray], num_keywords: int, thresholds: np.ndarray,
                smooth_frames: int = DEFAULT_SMOOTH_FRAMES,
                refractory_frames: int = DEFAULT_REFRACTORY_FRAMES) -> List[Tuple]:
    """Every utterance's (keyword, lo, hi, frame) detections: the replay that compute_det and
    bootstrap_frr_intervals share, so scoring with intervals replays once."""
    thresholds = np.asarray(thresholds, dtype=np.float64)
    return [_utterance_firings(x, num_keywords, thresholds, smooth_frames, refractory_frames)
            for x in probs]


def compute_det(probs: Sequence[np.ndarray], labels: Sequence[int], durations: Sequence[float],
                num_keywords: int, thresholds: Optional[np.ndarray] = None,
                smooth_frames: int = DEFAULT_SMOOTH_FRAMES,
                refractory_frames: int = DEFAULT_REFRACTORY_FRAMES,
                firings: Optional[List[Tuple]] = None) -> DetCurves:
    """DET counts for every threshold; probs[i] is utterance i's posteriors [T, K]
    (or `firings` from all_firings with the same thresholds and rule)."""
    thresholds = threshold_grid() if thresholds is None else np.asarray(thresholds, dtype=np.float64)
    if thresholds.ndim != 1 or thresholds.size == 0 or np.any(np.diff(thresholds) <= 0):
        raise ValueError("thresholds must be a non-empty strictly increasing 1-D array")
    if not len(probs) == len(labels) == len(durations):
        raise ValueError("probs, labels and durations must have the same length")
    K, G = int(num_keywords), thresholds.size
    labels_arr = np.asarray(labels, dtype=np.int64)
    dur = np.asarray(durations, dtype=np.float64)
    num_pos = np.array([(labels_arr == k).sum() for k in range(K)], dtype=np.int64)
    neg_hours = np.array([dur[labels_arr != k].sum() / 3600.0 for k in range(K)])

    fa_diff = np.zeros((G + 1, K), dtype=np.int64)  # difference arrays over threshold index
    hits = np.zeros((G, K), dtype=np.int64)
    if firings is None:
        firings = all_firings(probs, K, thresholds, smooth_frames, refractory_frames)
    for (kw, lo, hi, _), label in zip(firings, labels_arr.tolist()):
        if kw.size == 0:
            continue
        fa = kw != label
        np.add.at(fa_diff, (lo[fa], kw[fa]), 1)
        np.add.at(fa_diff, (hi[fa], kw[fa]), -1)
        if label >= 0 and not fa.all():
            d = np.zeros(G + 1, dtype=np.int64)
            np.add.at(d, lo[~fa], 1)
            np.add.at(d, hi[~fa], -1)
            hits[:, label] += np.cumsum(d[:-1]) > 0
    return DetCurves(thresholds=thresholds, fa_count=np.cumsum(fa_diff[:-1], axis=0),
                     miss_count=num_pos[None, :] - hits, num_positives=num_pos,
                     negative_hours=neg_hours)


@dataclass
class OperatingPoint:
    target_fa_per_hour: float
    threshold: Optional[float]  # None when no grid threshold meets the target
    frr: Optional[float]
    fa_per_hour: Optional[float]


def operating_point(thresholds: np.ndarray, fa_per_hour: np.ndarray, frr: np.ndarray,
                    target: float) -> OperatingPoint:
    """Best threshold with FA/h <= target: lowest FRR, ties to the lowest threshold.

    With one keyword FRR rises and FA/h falls with the threshold, so this is the
    lowest threshold meeting the target; with competing keywords the curves need
    not be monotone, hence the explicit minimum.
    """
    ok = np.flatnonzero(fa_per_hour <= target * (1 + 1e-9))  # NaN compares False
    if ok.size == 0:
        return OperatingPoint(float(target), None, None, None)
    f = frr[ok]
    i = int(ok[0]) if np.all(np.isnan(f)) else int(ok[np.nanargmin(f)])
    fr = float(frr[i])
    return OperatingPoint(float(target), float(thresholds[i]), None if math.isnan(fr) else fr,
                          float(fa_per_hour[i]))


@dataclass
class FrrInterval:
    """Percentile bootstrap interval of the FRR at one FA/h target."""
    target_fa_per_hour: float
    low: Optional[float]
    high: Optional[float]


def _detections_per_threshold(firings, utterances: np.ndarray, keyword: int,
                              num_thresholds: int) -> np.ndarray:
    """(utterances, thresholds) float32: detections of `keyword` in each utterance."""
    rows = np.zeros((utterances.size, num_thresholds + 1), dtype=np.float32)
    for row, i in enumerate(utterances.tolist()):
        kw, lo, hi, _ = firings[i]
        mine = kw == keyword
        np.add.at(rows[row], lo[mine], 1)
        np.add.at(rows[row], hi[mine], -1)
    return np.cumsum(rows[:, :-1], axis=1)


def bootstrap_frr_intervals(probs: Sequence[np.ndarray], labels: Sequence[int],
                            durations: Sequence[float], num_keywords: int,
                            thresholds: np.ndarray, targets: Sequence[float],
                            replicates: int = 1000, level: float = 0.95, seed: int = 0,
                            smooth_frames: int = DEFAULT_SMOOTH_FRAMES,
                            refractory_frames: int = DEFAULT_REFRACTORY_FRAMES,
                            firings: Optional[List[Tuple]] = None,
                            speakers: Optional[Sequence[str]] = None) -> List[List[FrrInterval]]:
    """How far the FRR at each FA/h target could move with another test set of the same
    size: utterances are drawn with replacement (a keyword's positives and the other
    utterances separately, so every replicate keeps the positive count), the operating
    point is chosen again in each replicate, and the central `level` of the FRRs is
    returned per keyword and target. At 1 FA/h over a few hours the threshold rests on
    a handful of negatives, and this interval shows how much that matters.

    With `speakers` (one per utterance) whole speakers are drawn instead, each bringing
    all its utterances: errors cluster by voice (one voice's near-homophones can set the
    threshold, another's keywords be missed), so with a few dozen test voices this is
    the interval for another set of voices, wider than the per-utterance one."""
    thresholds = np.asarray(thresholds, dtype=np.float64)
    K, G = int(num_keywords), thresholds.size
    labels_arr = np.asarray(labels, dtype=np.int64)
    dur = np.asarray(durations, dtype=np.float64)
    if speakers is not None and len(speakers) != labels_arr.size:
        raise ValueError("speakers must have one entry per utterance")
    if firings is None:
        firings = all_firings(probs, K, thresholds, smooth_frames, refractory_frames)
    rng = np.random.default_rng(seed)
    tail = (1.0 - level) / 2
    out: List[List[FrrInterval]] = []
    for k in range(K):
        pos = np.flatnonzero(labels_arr == k)
        neg = np.flatnonzero(labels_arr != k)
        if replicates <= 0 or pos.size == 0 or neg.size == 0 or dur[neg].sum() <= 0:
            out.append([FrrInterval(float(t), None, None) for t in targets])
            continue
        # Per utterance and threshold: false alarms of k, and whether a positive is hit.
        fa_rows = _detections_per_threshold(firings, neg, k, G)
        hit_rows = (_detections_per_threshold(firings, pos, k, G) > 0).astype(np.float32)
        if speakers is None:
            w_neg = np.stack([np.bincount(rng.integers(0, neg.size, neg.size),
                                          minlength=neg.size)
                              for _ in range(replicates)]).astype(np.float32)
            w_pos = np.stack([np.bincount(rng.integers(0, pos.size, pos.size),
                                          minlength=pos.size)
                              for _ in range(replicates)]).astype(np.float32)
        else:
            names, spk_index = np.unique(np.asarray(speakers, dtype=str), return_inverse=True)
            draws = np.stack([np.bincount(rng.integers(0, names.size, names.size),
                                          minlength=names.size)
                              for _ in range(replicates)]).astype(np.float32)
            w_all = draws[:, spk_index]  # (replicates, utterances)
            w_neg, w_pos = w_all[:, neg], w_all[:, pos]
        # A speaker draw can miss every negative or every positive: no curve, skipped.
        valid = np.flatnonzero(((w_neg @ dur[neg]) > 0) & (w_pos.sum(axis=1) > 0))
        if valid.size == 0:
            out.append([FrrInterval(float(t), None, None) for t in targets])
            continue
        w_neg, w_pos = w_neg[valid], w_pos[valid]
        fa_per_hour = (w_neg @ fa_rows) / ((w_neg @ dur[neg]) / 3600.0)[:, None]
        frr = 1.0 - (w_pos @ hit_rows) / w_pos.sum(axis=1, keepdims=True)
        per_target = []
        for t in targets:
            # A replicate where no threshold meets the target rejects everything.
            vals = [1.0 if op.frr is None else op.frr for op in
                    (operating_point(thresholds, fa_per_hour[r], frr[r], t)
                     for r in range(valid.size))]
            low, high = np.quantile(vals, [tail, 1.0 - tail])
            per_target.append(FrrInterval(float(t), float(low), float(high)))
        out.append(per_target)
    return out
