"""Keyword-spotting DET scoring: FRR and false alarms per hour over a threshold grid.

Every grid threshold is scored by replaying the deployment rule of
``toolkit.decision`` (smoothing, firing, refractory) on each utterance, with
one threshold shared by all keywords:

* FRR_k(θ): fraction of utterances labelled k on which the rule fires no
  detection of keyword k.
* FA/h_k(θ): detections of keyword k on utterances whose label != k
  (negatives and other keywords), divided by the hours of that audio.

Multiple keywords: as in deployment, the full multi-keyword rule runs and each
detection is attributed to the keyword that fired it, so a firing of another
keyword starts the refractory period and can hide a later detection of k.
Scores are therefore exact for a detector that uses a single threshold for all
keywords (and trivially for one keyword); per-keyword thresholds picked from
these curves are an approximation when keywords compete in one utterance.

The count is exact for every threshold (see ``_firing_events``), not an
approximation by sampling thresholds.
"""
import heapq
import io
import json
import logging
import math
import os
import re
from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from toolkit.tasks.kws.decision import (DEFAULT_FRAME_SHIFT_MS, DEFAULT_REFRACTORY_FRAMES,
                              DEFAULT_SMOOTH_FRAMES, frame_max_and_argmax, smooth_scores)
from toolkit.data.datalist import DataList
from toolkit.data.inventory import read_inventory
from toolkit.fileio import atomic_write_bytes, atomic_write_text

logger = logging.getLogger(__name__)

DEFAULT_FA_TARGETS = (0.5, 1.0, 2.0)
DEFAULT_MAX_MISSING_FRACTION = 0.01
BOOTSTRAP_UNITS = ("utterance", "speaker")  # what one bootstrap draw picks


# ----------------------------------------------------------------------------- inputs

@dataclass(frozen=True)
class Utterance:
    key: str
    duration: float  # seconds
    label: int  # keyword index, -1 for negatives / filler
    speaker: str = ""  # optional data-list fields, for the error report
    text: str = ""


def read_keywords(path: str) -> List[str]:
    """keywords.txt: the class inventory (line index = keyword index)."""
    return read_inventory(path)


def read_data_list(path: str, num_keywords: Optional[int] = None) -> List[Utterance]:
    """The scored data list; needs ``key``, ``duration`` (s) and ``label`` per line. Any
    bad line is an error naming it (scoring a silently shortened test set would be
    wrong)."""
    datalist = DataList.load(path, num_classes=num_keywords, require_label=True,
                             allow_negative=True, strict=True)
    utts = []
    for i in range(len(datalist)):
        e = datalist.entry(i)
        utts.append(Utterance(e["key"], float(e["duration"]), int(e["label"]),
                              e.get("spk", ""), e.get("txt", "")))
    return utts


def load_posteriors(path: str) -> Mapping[str, np.ndarray]:
    """Kaldi ark (read fully) or scp (loaded lazily) of key -> float matrix [T, K]."""
    import kaldiio  # deferred: only the file readers need it

    if path.endswith(".scp"):
        return kaldiio.load_scp(path)
    table: Dict[str, np.ndarray] = {}
    for key, mat in kaldiio.load_ark(path):
        if key in table:
            raise ValueError(f"{path}: duplicate key {key!r}")
        table[key] = mat
    return table


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


# ----------------------------------------------------------------------------- DET core

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
    frame), each detection firing at `frame` for threshold indices [lo, hi)."""
    s = smooth_scores(x, smooth_frames)
    if s.shape[1] != num_keywords:
        raise ValueError(f"posteriors have {s.shape[1]} columns, expected {num_keywords}")
    best, which = frame_max_and_argmax(s)
    # Same `score >= threshold` comparison, in float64, as DecisionState.
    c = np.searchsorted(thresholds, best, side="right")
    frames, lo, hi = _firing_events(c, refractory_frames, thresholds.size)
    return which[frames], lo, hi, frames


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


# ----------------------------------------------------------------------------- error report

@dataclass
class ErrorReport:
    """A keyword's errors at one threshold: which phrases fire and which voices go
    unheard, the first thing to read before changing the data or the model."""
    keyword: str
    threshold: float
    target_fa_per_hour: float
    negative_hours: float
    num_positives: int
    false_alarms: List[Dict]  # key, speaker, label, text, time_s, peak; highest peak first
    misses: List[Dict]  # key, speaker, text, peak; lowest peak first
    speakers: List[Dict]  # speaker, positives, missed, frr, false_alarms; most missed first


def error_report(utts: Sequence[Utterance], probs: Sequence[np.ndarray], firings: List[Tuple],
                 keyword_index: int, keyword: str, thresholds: np.ndarray, threshold: float,
                 target_fa_per_hour: float, negative_hours: float,
                 smooth_frames: int = DEFAULT_SMOOTH_FRAMES,
                 frame_shift_ms: float = DEFAULT_FRAME_SHIFT_MS) -> ErrorReport:
    """False alarms and misses of `keyword_index` at `threshold` (a value of the grid
    the firings were computed on). `peak` is the utterance's highest smoothed score of
    the keyword: how far a miss is from the threshold, how sure a false alarm is."""
    g = int(np.searchsorted(thresholds, threshold))
    if g >= thresholds.size or thresholds[g] != threshold:
        raise ValueError(f"threshold {threshold!r} is not on the scoring grid")

    def peak(x: np.ndarray) -> float:
        return float(smooth_scores(x, smooth_frames)[:, keyword_index].max(initial=0.0))

    false_alarms: List[Dict] = []
    misses: List[Dict] = []
    per_speaker: Dict[str, List[int]] = {}  # speaker -> [positives, missed, false alarms]
    for u, x, (kw, lo, hi, frames) in zip(utts, probs, firings):
        fired = frames[(kw == keyword_index) & (lo <= g) & (g < hi)]
        counts = per_speaker.setdefault(u.speaker, [0, 0, 0])
        if u.label == keyword_index:
            counts[0] += 1
            if fired.size == 0:
                counts[1] += 1
                misses.append({"key": u.key, "speaker": u.speaker, "text": u.text,
                               "peak": peak(x)})
        elif fired.size:
            counts[2] += int(fired.size)
            p = peak(x)
            for f in fired.tolist():
                false_alarms.append({"key": u.key, "speaker": u.speaker, "label": u.label,
                                     "text": u.text, "time_s": f * frame_shift_ms / 1000.0,
                                     "peak": p})
    false_alarms.sort(key=lambda e: (-e["peak"], e["key"], e["time_s"]))
    misses.sort(key=lambda e: (e["peak"], e["key"]))
    speakers = [{"speaker": spk, "positives": n, "missed": m,
                 "frr": (m / n) if n else None, "false_alarms": f}
                for spk, (n, m, f) in per_speaker.items() if n or f]
    speakers.sort(key=lambda e: (-(e["frr"] or 0.0), -e["false_alarms"], e["speaker"]))
    return ErrorReport(keyword, float(threshold), float(target_fa_per_hour),
                       float(negative_hours), sum(1 for u in utts if u.label == keyword_index),
                       false_alarms, misses, speakers)


def format_error_report(rep: ErrorReport) -> str:
    """errors_<keyword>.txt: three space-separated tables, the text last on each line."""
    lines = [f"# {rep.keyword}: threshold {format_threshold(rep.threshold)} (selected for "
             f"{rep.target_fa_per_hour:g} FA/h): {len(rep.false_alarms)} false alarms in "
             f"{rep.negative_hours:.2f} h of other audio, {len(rep.misses)} of "
             f"{rep.num_positives} positives missed",
             "# false alarms, highest peak first: peak time_s key speaker label text"]
    lines += [f"{e['peak']:.6f} {e['time_s']:.2f} {e['key']} {e['speaker'] or '-'} "
              f"{e['label']} {e['text']}".rstrip() for e in rep.false_alarms]
    lines.append("# speakers, most missed first: speaker missed/positives frr false_alarms")
    lines += [f"{e['speaker'] or '-'} {e['missed']}/{e['positives']} {_fmt_pct(e['frr'])} "
              f"{e['false_alarms']}" for e in rep.speakers]
    lines.append("# misses, lowest peak first: peak key speaker text")
    lines += [f"{e['peak']:.6f} {e['key']} {e['speaker'] or '-'} {e['text']}".rstrip()
              for e in rep.misses]
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- outputs

def keyword_file_name(keyword: str) -> str:
    name = re.sub(r"[^\w.-]+", "_", keyword).strip("_.")
    return name or "keyword"


def format_threshold(t: float) -> str:
    """Shortest decimal form with at least 3 decimals: 0.500, 0.999, 0.99995."""
    text = f"{t:.12f}".rstrip("0")
    whole, _, frac = text.partition(".")
    return f"{whole}.{frac.ljust(3, '0')}"


def _fmt_pct(x: Optional[float]) -> str:
    return "n/a" if x is None else f"{100 * x:.2f}%"


def summary_line(keyword: str, points: Sequence[OperatingPoint], num_positives: int,
                 negative_hours: float, intervals: Optional[Sequence[FrrInterval]] = None,
                 level: float = 0.95) -> str:
    parts = []
    for i, op in enumerate(points):
        thr = "none meets it" if op.threshold is None else f"thr {format_threshold(op.threshold)}"
        ci = intervals[i] if intervals else None
        if ci is not None and ci.low is not None:
            thr += f", {100 * level:g}% CI {100 * ci.low:.2f}-{100 * ci.high:.2f}%"
        parts.append(f"{_fmt_pct(op.frr)} @{op.target_fa_per_hour:g} FA/h ({thr})")
    return (f"{keyword}: FRR {', '.join(parts)}; "
            f"{num_positives} positives, {negative_hours:.2f} h negatives")


def json_safe(x):
    """NaN/inf are not JSON; write null instead."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [json_safe(v) for v in x]
    return x


def plot_det(path: str, keywords: Sequence[str], det: DetCurves,
             points: Sequence[Sequence[OperatingPoint]], max_fa_per_hour: float) -> None:
    # Figure + Agg canvas directly: no pyplot global state, no backend switch
    # that could disturb a caller that already imported pyplot.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.4, 4.8), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    fa, frr = det.fa_per_hour, det.frr
    ymax = 1.0
    for k, kw in enumerate(keywords):
        if np.all(np.isnan(fa[:, k])) or np.all(np.isnan(frr[:, k])):
            continue
        # Reverse threshold order: FA/h grows left to right.
        line, = ax.plot(fa[::-1, k], 100 * frr[::-1, k], label=kw, linewidth=1.5)
        for op in points[k]:
            if op.threshold is not None and op.frr is not None:
                ax.plot([op.fa_per_hour], [100 * op.frr], "o", color=line.get_color(), markersize=4)
        vis = frr[:, k][fa[:, k] <= max_fa_per_hour]
        if vis.size and not np.all(np.isnan(vis)):
            ymax = max(ymax, float(np.nanmax(vis)) * 100)
    for op in points[0] if points else []:
        ax.axvline(op.target_fa_per_hour, color="0.8", linestyle="--", linewidth=0.8, zorder=0)
    ax.set_xlim(0, max_fa_per_hour)
    ax.set_ylim(0, min(100.0, ymax * 1.05))
    ax.set_xlabel("false alarms per hour")
    ax.set_ylabel("false rejection rate (%)")
    ax.set_title("DET")
    ax.grid(True, alpha=0.3)
    if keywords:
        ax.legend(loc="upper right")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    atomic_write_bytes(path, buf.getvalue())


@dataclass
class ScoreResult:
    det: DetCurves
    keywords: List[str]
    points: List[List[OperatingPoint]]  # per keyword, one per FA target
    selected: List[OperatingPoint]  # per keyword, at target_fa_per_hour
    summary: List[str]
    missing_keys: int = 0
    extra: Dict = field(default_factory=dict)
    errors: List[ErrorReport] = field(default_factory=list)  # per keyword with a threshold


def write_outputs(out_dir: str, result: ScoreResult, config: Dict,
                  plot_max_fa_per_hour: Optional[float] = None) -> None:
    """det_<keyword>.txt, errors_<keyword>.txt, det.json, det.png and summary.txt in
    out_dir."""
    os.makedirs(out_dir, exist_ok=True)
    det, keywords = result.det, result.keywords
    fa, frr = det.fa_per_hour, det.frr
    names: Dict[str, int] = {}
    for k, kw in enumerate(keywords):
        name = keyword_file_name(kw)
        if name in names:  # two phrases mapping to one file name
            name = f"{name}_{k}"
        names[name] = k
        lines = ["# threshold fa_per_hour frr"]
        lines += [f"{format_threshold(t)} {a:.6f} {r:.6f}"
                  for t, a, r in zip(det.thresholds, fa[:, k], frr[:, k])]
        atomic_write_text(os.path.join(out_dir, f"det_{name}.txt"), "\n".join(lines) + "\n")
        rep = next((r for r in result.errors if r.keyword == kw), None)
        errors_path = os.path.join(out_dir, f"errors_{name}.txt")
        if rep is not None:
            atomic_write_text(errors_path, format_error_report(rep))
        elif os.path.exists(errors_path):  # an earlier scoring's, for another threshold
            os.remove(errors_path)

    curves = {}
    for k, kw in enumerate(keywords):
        curves[kw] = {
            "index": k,
            "num_positives": int(det.num_positives[k]),
            "negative_hours": float(det.negative_hours[k]),
            "fa_per_hour": fa[:, k].tolist(),
            "frr": frr[:, k].tolist(),
            "fa_count": det.fa_count[:, k].tolist(),
            "miss_count": det.miss_count[:, k].tolist(),
            "operating_points": [vars(op) for op in result.points[k]],
            "selected": vars(result.selected[k]),
        }
    doc = {
        "config": config,
        "keywords": list(keywords),
        "thresholds": det.thresholds.tolist(),
        "missing_keys": result.missing_keys,
        "curves": curves,
        "summary": result.summary,
        "errors": {r.keyword: vars(r) for r in result.errors},
        **result.extra,
    }
    atomic_write_text(os.path.join(out_dir, "det.json"),
                      json.dumps(json_safe(doc), allow_nan=False) + "\n")
    targets = [op.target_fa_per_hour for op in result.points[0]] if result.points else [1.0]
    xmax = plot_max_fa_per_hour or max(5.0, 2.5 * max(targets))
    plot_det(os.path.join(out_dir, "det.png"), keywords, det, result.points, xmax)
    atomic_write_text(os.path.join(out_dir, "summary.txt"), "\n".join(result.summary) + "\n")


def score(data_list: str, posteriors: str, keywords_path: str,
          thresholds: Optional[np.ndarray] = None,
          smooth_frames: int = DEFAULT_SMOOTH_FRAMES,
          refractory_frames: int = DEFAULT_REFRACTORY_FRAMES,
          fa_targets: Sequence[float] = DEFAULT_FA_TARGETS,
          target_fa_per_hour: float = 1.0,
          max_missing_fraction: float = DEFAULT_MAX_MISSING_FRACTION,
          bootstrap_replicates: int = 0, bootstrap_seed: int = 0,
          bootstrap_level: float = 0.95,
          frame_shift_ms: float = DEFAULT_FRAME_SHIFT_MS,
          bootstrap_unit: str = "utterance") -> ScoreResult:
    """Read the inputs, score every keyword, pick operating points (with bootstrap
    intervals of their FRR when `bootstrap_replicates` > 0) and list the errors at the
    threshold selected for `target_fa_per_hour`."""
    if bootstrap_unit not in BOOTSTRAP_UNITS:  # checked before any file is read
        raise ValueError(f"bootstrap unit must be one of {', '.join(BOOTSTRAP_UNITS)}, "
                         f"got {bootstrap_unit!r}")
    keywords = read_keywords(keywords_path)
    utts = read_data_list(data_list, num_keywords=len(keywords))
    table = load_posteriors(posteriors)
    present = [u for u in utts if u.key in table]
    missing = len(utts) - len(present)
    if missing:
        msg = (f"{missing} of {len(utts)} utterances in {data_list} have no posteriors in "
               f"{posteriors} (first: {next(u.key for u in utts if u.key not in table)!r})")
        if missing > max_missing_fraction * len(utts):
            raise ValueError(msg + f"; more than {100 * max_missing_fraction:g}% missing")
        logger.warning("%s; scoring without them", msg)

    mats = []
    for u in present:
        m = np.asarray(table[u.key])
        if m.ndim != 2 or m.shape[1] != len(keywords):
            raise ValueError(f"{posteriors}: {u.key!r} has shape {m.shape}, expected [T, {len(keywords)}]")
        if not np.all(np.isfinite(m)):
            raise ValueError(f"{posteriors}: {u.key!r} has non-finite values")
        if m.size and (m.min() < 0 or m.max() > 1 + 1e-4):
            raise ValueError(f"{posteriors}: {u.key!r} has values outside [0, 1] "
                             "(posteriors expected, not logits or log-probabilities)")
        mats.append(m)
    thresholds = threshold_grid() if thresholds is None else thresholds
    firings = all_firings(mats, len(keywords), thresholds, smooth_frames, refractory_frames)
    det = compute_det(mats, [u.label for u in present], [u.duration for u in present],
                      len(keywords), thresholds, firings=firings)

    targets = sorted(set(float(t) for t in fa_targets) | {float(target_fa_per_hour)})
    intervals = None
    if bootstrap_replicates > 0:
        speakers = None
        if bootstrap_unit == "speaker":
            unnamed = next((u.key for u in present if not u.speaker), None)
            if unnamed is not None:
                raise ValueError(f"{data_list}: --bootstrap-unit speaker needs a 'spk' field "
                                 f"on every line; {unnamed!r} has none")
            speakers = [u.speaker for u in present]
        intervals = bootstrap_frr_intervals(
            mats, [u.label for u in present], [u.duration for u in present], len(keywords),
            det.thresholds, targets, bootstrap_replicates, bootstrap_level, bootstrap_seed,
            firings=firings, speakers=speakers)
    fa, frr = det.fa_per_hour, det.frr
    points, selected, summary = [], [], []
    for k, kw in enumerate(keywords):
        pts = [operating_point(det.thresholds, fa[:, k], frr[:, k], t) for t in targets]
        points.append(pts)
        selected.append(next(p for p in pts if p.target_fa_per_hour == float(target_fa_per_hour)))
        summary.append(summary_line(keyword_file_name(kw), pts, int(det.num_positives[k]),
                                    float(det.negative_hours[k]),
                                    intervals[k] if intervals else None, bootstrap_level))
    errors = []
    for k, kw in enumerate(keywords):
        if selected[k].threshold is None:
            logger.warning("%s: no threshold meets %g FA/h; no error report", kw,
                           target_fa_per_hour)
            continue
        errors.append(error_report(present, mats, firings, k, kw, det.thresholds,
                                   selected[k].threshold, target_fa_per_hour,
                                   float(det.negative_hours[k]), smooth_frames, frame_shift_ms))
    extra = {"num_utterances": len(utts), "num_scored": len(present)}
    if intervals is not None:
        extra["bootstrap"] = {
            "replicates": bootstrap_replicates, "level": bootstrap_level, "seed": bootstrap_seed,
            "unit": bootstrap_unit,
            "frr_intervals": {kw: [vars(ci) for ci in intervals[k]]
                              for k, kw in enumerate(keywords)}}
    return ScoreResult(det=det, keywords=keywords, points=points, selected=selected,
                       summary=summary, missing_keys=missing, extra=extra, errors=errors)
