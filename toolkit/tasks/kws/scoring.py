"""Keyword-spotting scoring: reads a data list, posteriors and the keyword inventory,
scores them on the DET curves of toolkit.tasks.kws.det (FRR and false alarms per hour
over a threshold grid, operating points, bootstrap intervals), and reports: per-keyword
DET tables and error lists at the selected threshold, det.json, the DET plot and the
summary lines. A data list with wake-word kinds (`kind`: make_datalist from a corpus's
utt2kind) is scored as a product: the DET curves over positives and general negatives,
neighbours and accent variants measured apart at the selected threshold
(toolkit.tasks.kws.product, product.md)."""
import io
import json
import logging
import math
import os
import re
from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from toolkit.data.datalist import DataList
from toolkit.data.inventory import read_inventory
from toolkit.fileio import atomic_write_bytes, atomic_write_text
from toolkit.tasks.kws.decision import (DEFAULT_FRAME_SHIFT_MS, DEFAULT_REFRACTORY_FRAMES,
                                        DEFAULT_SMOOTH_FRAMES, smooth_scores)
from toolkit.tasks.kws import product
from toolkit.tasks.kws.det import (DetCurves, FrrInterval, OperatingPoint, all_firings,
                                   bootstrap_frr_intervals, compute_det, operating_point,
                                   threshold_grid)

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
    kind: str = ""  # wake-word corpus kind and neighbour category (product scoring)
    category: str = ""


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
                              e.get("spk", ""), e.get("txt", ""), e.get("kind", ""),
                              e.get("cat", "")))
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
    reports = result.extra.get("product", {})
    if reports:
        atomic_write_text(os.path.join(out_dir, "product.md"), "\n".join(
            product.markdown(keyword_file_name(kw), reports[kw]) for kw in keywords))
    elif os.path.exists(os.path.join(out_dir, "product.md")):   # an earlier scoring's
        os.remove(os.path.join(out_dir, "product.md"))


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
          bootstrap_unit: str = "utterance",
          deployed_threshold: Optional[float] = None) -> ScoreResult:
    """Read the inputs, score every keyword, pick operating points (with bootstrap
    intervals of their FRR when `bootstrap_replicates` > 0) and list the errors at the
    threshold selected for `target_fa_per_hour`.

    `deployed_threshold`: the threshold a model ships with (chosen on a dev set); this
    set's FRR, false alarms per hour and product report are also given at it (at the
    lowest grid threshold >= it), since the set's own operating points are chosen on
    the set itself."""
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

    # Neighbours and accent variants never set the threshold: measured apart at it.
    apart = [u for u in present if u.kind in product.MEASURED_APART]
    present = [u for u in present if u.kind not in product.MEASURED_APART]
    mats = []
    for u in present + apart:
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
    all_fired = all_firings(mats, len(keywords), thresholds, smooth_frames, refractory_frames)
    mats, firings, apart_firings = mats[:len(present)], all_fired[:len(present)], \
        all_fired[len(present):]
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
    extra = {"num_utterances": len(utts), "num_scored": len(present) + len(apart)}
    has_kinds = any(u.kind for u in present + apart)
    if has_kinds:
        reports = product_reports(present + apart, firings + apart_firings, keywords,
                                  det.thresholds, [p.threshold for p in selected],
                                  target_fa_per_hour)
        extra["product"] = reports
        summary += [product.summary_line(keyword_file_name(kw), reports[kw]) for kw in keywords]
    if deployed_threshold is not None:
        g = grid_index(det.thresholds, deployed_threshold)
        thr = float(det.thresholds[g])
        reports = (product_reports(present + apart, firings + apart_firings, keywords,
                                   det.thresholds, [thr] * len(keywords), target_fa_per_hour)
                   if has_kinds else {})
        deployed = {"requested": float(deployed_threshold), "threshold": thr, "keywords": {}}
        for k, kw in enumerate(keywords):
            entry = {"frr": float(frr[g, k]), "fa_per_hour": float(fa[g, k]),
                     "product": reports.get(kw)}
            deployed["keywords"][kw] = entry
            summary.append(deployed_line(keyword_file_name(kw), thr, entry))
        extra["deployed"] = deployed
    if intervals is not None:
        extra["bootstrap"] = {
            "replicates": bootstrap_replicates, "level": bootstrap_level, "seed": bootstrap_seed,
            "unit": bootstrap_unit,
            "frr_intervals": {kw: [vars(ci) for ci in intervals[k]]
                              for k, kw in enumerate(keywords)}}
    return ScoreResult(det=det, keywords=keywords, points=points, selected=selected,
                       summary=summary, missing_keys=missing, extra=extra, errors=errors)


def grid_index(thresholds: np.ndarray, threshold: float) -> int:
    """The lowest grid threshold >= `threshold` (the highest where none is)."""
    if not 0.0 <= threshold <= 1.0:
        raise ValueError(f"deployed threshold {threshold} is outside [0, 1]")
    return min(int(np.searchsorted(thresholds, threshold - 1e-12)), len(thresholds) - 1)


def deployed_line(name: str, threshold: float, entry: Dict) -> str:
    """One summary line: FRR and false alarms per hour at the shipped threshold, with
    neighbours and accents when the set has them."""
    line = (f"{name} at the deployed threshold {threshold:.6g} (chosen on dev): FRR "
            f"{100 * entry['frr']:.1f}%, {entry['fa_per_hour']:.2f} FA/h")
    rep = entry.get("product")
    if rep:
        n, a = rep["neighbours"], rep["accent"]
        line += (f" of general negatives; neighbours fire {product.share_text(n['fired'], n['clips'])}"
                 f"; accent variants accepted {product.share_text(a['accepted'], a['clips'])}")
    return line


def product_reports(utts: Sequence[Utterance], firings: List[Tuple], keywords: Sequence[str],
                    thresholds: np.ndarray, chosen: Sequence[Optional[float]],
                    target_fa_per_hour: float) -> Dict[str, Dict]:
    """Per keyword, toolkit.tasks.kws.product's report at its chosen grid threshold (None:
    none met the target): a clip fired when the decision rule fired that keyword on it
    there."""
    out = {}
    for k, kw in enumerate(keywords):
        thr = chosen[k]
        g = None if thr is None else int(np.searchsorted(thresholds, thr))
        clips = []
        for u, (kws, lo, hi, frames) in zip(utts, firings):
            fired = g is not None and bool(np.any((kws == k) & (lo <= g) & (g < hi)))
            kind = u.kind or ("pos" if u.label == k else "neg")
            if kind == "pos" and u.label != k:
                kind = "other_keyword"
            clips.append(product.ClipOutcome(kind, fired, u.category, u.text, u.speaker))
        out[kw] = product.product_report(clips, thr, target_fa_per_hour)
    return out
