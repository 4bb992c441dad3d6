"""Scoring a wake word as a product is judged: the threshold is set on general negatives
(everyday speech and noise: utt2kind `neg` and `noise`) at a false-alarm rate per hour;
then, at that threshold, the share of the keyword's neighbours that fire (per category and
per phrase, and on how many voices) and the share of accent variants accepted
(toolkit.tasks.kws.neighbours). Neighbours and accent variants never set the threshold:
a test whose threshold is set by "hey jarvus" measures a room no user lives in.

Headline neighbours are every confusable category but `inside_word` ("alexandria" for
"alexa"), which is reported apart: whether a detector should fire inside a longer word is
a product decision, not an error.

Input per clip: its kind, category, text, speaker and whether it fired at the threshold
(the caller applies its own decision rule: toolkit.tasks.kws.scoring for the recipe,
tools/benchmarks/oww_compare.py for the peers).
"""
import math
from dataclasses import dataclass
from typing import Dict, Optional, Sequence

import numpy as np

GENERAL = ("neg", "noise")          # what sets the threshold
NEIGHBOUR = "conf"
ACCENT = "accent"
MEASURED_APART = (NEIGHBOUR, ACCENT)
APART_CATEGORIES = ("inside_word",)
TOP_PHRASES = 12


@dataclass(frozen=True)
class ClipOutcome:
    kind: str           # pos | neg | noise | conf | accent
    fired: bool
    category: str = ""
    text: str = ""
    speaker: str = ""


def peak_threshold(general_peaks: Sequence[float], hours: float, target_fa_per_hour: float
                   ) -> Optional[float]:
    """The lowest threshold at which at most target x hours of the general negatives fire,
    a clip firing when its peak score reaches the threshold (one alarm a clip at most):
    just above the peak of the first negative that must not fire, as a float32. None
    without negatives or hours."""
    if not len(general_peaks) or hours <= 0:
        return None
    allowed = int(math.floor(target_fa_per_hour * hours + 1e-9))
    peaks = np.sort(np.asarray(general_peaks, np.float32))[::-1]
    if allowed >= len(peaks):
        return 0.0
    return float(np.nextafter(peaks[allowed], np.float32(np.inf)))


def _share(fired: int, total: int) -> Optional[float]:
    return fired / total if total else None


def product_report(clips: Sequence[ClipOutcome], threshold: Optional[float],
                   target_fa_per_hour: float) -> Dict:
    """FRR, neighbour false accepts (all headline categories, each category, the phrases
    that fire most) and accent acceptance at `threshold`."""
    pos = [c for c in clips if c.kind == "pos"]
    conf = [c for c in clips if c.kind == NEIGHBOUR]
    accent = [c for c in clips if c.kind == ACCENT]
    headline = [c for c in conf if c.category not in APART_CATEGORIES]
    categories: Dict[str, Dict] = {}
    for c in conf:
        entry = categories.setdefault(c.category or "uncategorized", {"clips": 0, "fired": 0})
        entry["clips"] += 1
        entry["fired"] += int(bool(c.fired))
    for entry in categories.values():
        entry["share"] = _share(entry["fired"], entry["clips"])
    phrases: Dict[str, Dict] = {}
    for c in conf:
        p = phrases.setdefault(c.text, {"text": c.text, "category": c.category, "clips": 0,
                                        "fired": 0, "voices": set(), "voices_fired": set()})
        p["clips"] += 1
        p["fired"] += int(bool(c.fired))
        p["voices"].add(c.speaker)
        if c.fired:
            p["voices_fired"].add(c.speaker)
    firing = sorted((p for p in phrases.values() if p["fired"]),
                    key=lambda p: (-p["fired"], -len(p["voices_fired"]), p["text"]))
    top = [dict(p, voices=len(p["voices"]), voices_fired=len(p["voices_fired"]))
           for p in firing[:TOP_PHRASES]]
    missed = sum(1 for c in pos if not c.fired)
    fired = sum(bool(c.fired) for c in headline)
    accepted = sum(bool(c.fired) for c in accent)
    return {
        "threshold": threshold, "target_fa_per_hour": target_fa_per_hour,
        "positives": len(pos), "frr": _share(missed, len(pos)) if threshold is not None else None,
        "neighbours": {"clips": len(headline), "fired": fired,
                       "share": _share(fired, len(headline))},
        "categories": dict(sorted(categories.items())),
        "phrases_firing": len(firing), "phrases": len(phrases), "top_phrases": top,
        "accent": {"clips": len(accent), "accepted": accepted,
                   "share": _share(accepted, len(accent))},
    }


def _pct(x: Optional[float]) -> str:
    return "—" if x is None else f"{100 * x:.1f}%"


def share_text(count: int, total: int) -> str:
    """'5.9% (40/675)', or '— (0/0)' of nothing."""
    return f"{_pct(_share(count, total))} ({count}/{total})"


def summary_line(name: str, rep: Dict) -> str:
    """One line: FRR, neighbours firing and accent variants accepted at the threshold."""
    if rep["threshold"] is None:
        return f"{name}: no threshold meets {rep['target_fa_per_hour']:g} FA/h on general negatives"
    n, a = rep["neighbours"], rep["accent"]
    apart = "; ".join(f"{k} {v['fired']}/{v['clips']}" for k, v in rep["categories"].items()
                      if k in APART_CATEGORIES)
    return (f"{name} at {rep['target_fa_per_hour']:g} FA/h of general negatives "
            f"(thr {rep['threshold']:.6g}): FRR {_pct(rep['frr'])}; neighbours fire "
            f"{_pct(n['share'])} ({n['fired']}/{n['clips']}"
            + (f"; apart: {apart}" if apart else "") + f"); accent variants accepted "
            f"{_pct(a['share'])} ({a['accepted']}/{a['clips']})")


def markdown(name: str, rep: Dict) -> str:
    """product.md: the summary line, the per-category table and the phrases that fire."""
    lines = [f"# {name}: scored as a product", "", summary_line(name, rep), ""]
    if rep["threshold"] is None:
        return "\n".join(lines)
    lines += ["| neighbour category | clips | fired | share |", "|---|---:|---:|---:|"]
    for k, v in rep["categories"].items():
        tag = " (apart)" if k in APART_CATEGORIES else ""
        lines.append(f"| {k}{tag} | {v['clips']} | {v['fired']} | {_pct(v['share'])} |")
    lines += ["", f"{rep['phrases_firing']} of {rep['phrases']} neighbour phrases fire; "
              "the most:", "", "| phrase | category | fired / clips | voices fired / voices |",
              "|---|---|---:|---:|"]
    for p in rep["top_phrases"]:
        lines.append(f"| {p['text']} | {p['category']} | {p['fired']} / {p['clips']} | "
                     f"{p['voices_fired']} / {p['voices']} |")
    return "\n".join(lines) + "\n"
