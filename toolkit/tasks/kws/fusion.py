"""Fusing a keyword head on phone posteriors with zero-shot search of its keyword and the
search's verifier (toolkit.tasks.kws.search), and choosing the fusion's weights on a dev
set.

A frame's fused score is the weighted geometric mean head^a * search^b * verifier^c:
the head knows the keyword from its training voices, the search knows every phone from the
front end's many voices, the verifier asks whether another phone beat the keyword's on the
way ("hey travis"). The weights are chosen on the dev set (never a test): every candidate
of a grid sets its threshold on the dev set's general negatives at the target false
alarms per hour, and the one with the fewest misses plus neighbour false accepts at that
threshold wins. Exports store them as `fusion_weights`; a model without them fuses head
and search alone (DEFAULT_WEIGHTS, the fusion of models exported before the verifier).
"""
import itertools
import math
import os
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from toolkit.errors import DataError
from toolkit.tasks.kws.decision import DEFAULT_SMOOTH_FRAMES, smooth_scores
from toolkit.tasks.kws.product import APART_CATEGORIES, GENERAL, NEIGHBOUR, peak_threshold

COMPONENTS = ("head", "search", "verifier")
DEFAULT_WEIGHTS = {"head": 0.5, "search": 0.5, "verifier": 0.0}
HEAD_GRID = (0.0, 0.25, 0.5, 0.75, 1.0)          # a; b = 1 - a
VERIFIER_GRID = (0.0, 0.25, 0.5, 1.0, 2.0)      # c
_FLOOR = 1e-12                                  # log of a zero score


def check_weights(weights: Dict) -> Dict[str, float]:
    """The three weights (missing ones 0); DataError naming a bad key or value."""
    unknown = sorted(set(weights) - set(COMPONENTS))
    if unknown:
        raise DataError(f"fusion_weights: unknown component(s) {unknown}; known: {COMPONENTS}")
    out = {}
    for name in COMPONENTS:
        w = weights.get(name, 0.0)
        if isinstance(w, bool) or not isinstance(w, (int, float)) or not math.isfinite(w) \
                or w < 0:
            raise DataError(f"fusion_weights.{name}: a number >= 0 expected, got {w!r}")
        out[name] = float(w)
    if not any(out.values()):
        raise DataError("fusion_weights: every weight is 0")
    return out


def fuse(head: np.ndarray, search: np.ndarray, verifier: np.ndarray,
         weights: Dict[str, float]) -> np.ndarray:
    """head^a * search^b * verifier^c, frame by frame (float32 in [0, 1])."""
    log = np.zeros(np.shape(head), np.float64)
    for x, name in ((head, "head"), (search, "search"), (verifier, "verifier")):
        w = weights.get(name, 0.0)
        if w:
            log += w * np.log(np.maximum(np.asarray(x, np.float64), _FLOOR))
    return np.exp(log).astype(np.float32)


def split_components(mat: np.ndarray) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(T, 3K) [head | search | verifier] -> three (T, K) arrays."""
    k = mat.shape[1] // 3
    if mat.ndim != 2 or mat.shape[1] != 3 * k or k == 0:
        raise DataError(f"fusion components: (T, 3K) expected, got shape {mat.shape}")
    return mat[:, :k], mat[:, k:2 * k], mat[:, 2 * k:]


@dataclass(frozen=True)
class DevClip:
    kind: str           # pos | neg | noise | conf | ...
    label: int          # the keyword of a positive, else -1
    duration: float     # seconds
    category: str = ""


@dataclass
class Candidate:
    weights: Dict[str, float]
    threshold: Optional[float]
    frr: Optional[float]
    neighbour_fa: Optional[float]

    @property
    def cost(self) -> float:
        if self.threshold is None:
            return math.inf
        return (self.frr or 0.0) + (self.neighbour_fa or 0.0)


def grid() -> List[Dict[str, float]]:
    """Candidate weights, today's default first (it wins ties)."""
    out = [dict(DEFAULT_WEIGHTS)]
    for a, c in itertools.product(HEAD_GRID, VERIFIER_GRID):
        w = {"head": a, "search": 1.0 - a, "verifier": c}
        if w not in out:
            out.append(w)
    return out


def evaluate(peaks: np.ndarray, clips: Sequence[DevClip], target_fa_per_hour: float
             ) -> Tuple[Optional[float], Optional[float], Optional[float]]:
    """(threshold, FRR, neighbour false-accept share) for per-clip peak scores: the lowest
    threshold at which at most target x hours general negatives fire (one alarm a clip at
    most), just above a negative's peak; positives and neighbours counted at it."""
    general = [i for i, c in enumerate(clips) if c.kind in GENERAL]
    hours = sum(clips[i].duration for i in general) / 3600.0
    threshold = peak_threshold(peaks[general], hours, target_fa_per_hour)
    if threshold is None:
        return None, None, None
    pos = [i for i, c in enumerate(clips) if c.kind == "pos"]
    conf = [i for i, c in enumerate(clips) if c.kind == NEIGHBOUR and
            c.category not in APART_CATEGORIES]
    frr = float(np.mean(peaks[pos] < threshold)) if pos else None
    fa = float(np.mean(peaks[conf] >= threshold)) if conf else None
    return threshold, frr, fa


def fused_peaks(parts: Sequence[Tuple[np.ndarray, np.ndarray, np.ndarray]],
                clips: Sequence[DevClip], weights: Dict[str, float],
                smooth_frames: int = DEFAULT_SMOOTH_FRAMES) -> np.ndarray:
    """Per clip, the peak of the smoothed fused score as the detector smooths it: a
    positive's of its keyword, any other clip's the highest over keywords."""
    peaks = np.zeros(len(clips))
    for i, ((h, s, v), clip) in enumerate(zip(parts, clips)):
        if len(h):
            fused = smooth_scores(fuse(h, s, v, weights), smooth_frames)
            peaks[i] = fused[:, clip.label].max() if clip.label >= 0 else fused.max()
    return peaks


def choose_weights(components: Sequence[np.ndarray], clips: Sequence[DevClip],
                   target_fa_per_hour: float, smooth_frames: int = DEFAULT_SMOOTH_FRAMES
                   ) -> Tuple[Dict[str, float], List[Candidate]]:
    """The grid's best weights on a dev set (`components`: per clip (T, 3K) arrays) and
    every candidate's figures (peaks: fused_peaks)."""
    if len(components) != len(clips):
        raise ValueError(f"{len(components)} component arrays for {len(clips)} clips")
    parts = [split_components(np.asarray(m, np.float32)) for m in components]
    candidates = [Candidate(w, *evaluate(fused_peaks(parts, clips, w, smooth_frames), clips,
                                         target_fa_per_hour)) for w in grid()]
    best = min(candidates, key=lambda c: c.cost)     # the first of equals: the default
    if best.threshold is None:
        raise DataError("the dev set has no general negatives (kind neg or noise) to set "
                        "a threshold on: fusion weights need them")
    return best.weights, candidates


def write_fused(path: str, components: Sequence[Tuple[str, np.ndarray]],
                weights: Dict[str, float]) -> None:
    """Per key, the fused (T, K) scores of its (T, 3K) components at `weights`, to a Kaldi
    ark at `path` (written whole, then moved into place)."""
    import kaldiio
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp"
    with kaldiio.WriteHelper(f"ark:{tmp}") as writer:
        for key, mat in components:
            writer(key, fuse(*split_components(np.asarray(mat, np.float32)), weights))
    os.replace(tmp, path)


def markdown(best: Dict[str, float], candidates: Sequence[Candidate], target: float) -> str:
    def pct(x):
        return "—" if x is None else f"{100 * x:.1f}%"
    lines = [f"# Fusion weights chosen on the dev set ({target:g} FA/h of general negatives)",
             "", f"chosen: head {best['head']:g}, search {best['search']:g}, "
             f"verifier {best['verifier']:g}", "",
             "| head | search | verifier | threshold | FRR | neighbours fire | FRR + fire |",
             "|---:|---:|---:|---:|---:|---:|---:|"]
    for c in sorted(candidates, key=lambda c: c.cost):
        w = c.weights
        thr = "—" if c.threshold is None else f"{c.threshold:.4g}"
        lines.append(f"| {w['head']:g} | {w['search']:g} | {w['verifier']:g} | {thr} | "
                     f"{pct(c.frr)} | {pct(c.neighbour_fa)} | {c.cost:.3f} |")
    return "\n".join(lines) + "\n"
