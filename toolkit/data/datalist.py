"""Data lists: one JSON object per utterance (`key`, `wav` or `feat`, `duration`,
`label`, optional `txt`, `start`/`end`, and `tokens`: CTC target ids).

A list is held as one bytes blob plus offset/duration/label arrays instead of a Python
list of dicts: forked loader workers then share its pages (no per-object refcounts are
touched), so memory per worker stays flat however long the list and the epoch.
"""
import json
import logging
import math
from collections import Counter
from typing import Dict, Iterable, List, Optional, Tuple

import numpy as np

logger = logging.getLogger(__name__)

# Stable order of the reasons an entry can be skipped for; counters are all-reduced
# across ranks as a vector in this order.
BAD_REASONS = (
    "malformed_json", "missing_field", "missing_label", "label_not_in_inventory",
    "absurd_duration", "missing_file", "unreadable_audio", "truncated_audio", "pipe_failed",
    "empty_audio", "silent_audio", "nonfinite_samples", "bad_channel_count",
    "unreadable_features", "too_short_after_processing", "corrupt_shard", "truncated_shard",
    "unreadable_shard", "missing_from_shard", "missing_tokens", "token_not_in_units", "other",
)
MAX_ABSURD_DURATION = 3600.0


class BadCounter:
    """Counts skipped entries per reason and keeps a few example keys for the report."""

    def __init__(self):
        self.counts: Counter = Counter()
        self.examples: Dict[str, List[str]] = {}

    def add(self, reason: str, key: str, detail: str = "", log: bool = True) -> None:
        if reason not in BAD_REASONS:
            reason = "other"
        self.counts[reason] += 1
        ex = self.examples.setdefault(reason, [])
        if len(ex) < 5:
            ex.append(key)
        if log:
            logger.warning("skip %s: %s%s", key, reason, f" ({detail})" if detail else "")

    def merge(self, other: "BadCounter") -> None:
        self.counts.update(other.counts)
        for reason, keys in other.examples.items():
            ex = self.examples.setdefault(reason, [])
            ex.extend(keys[: max(0, 5 - len(ex))])

    def total(self) -> int:
        return sum(self.counts.values())

    def vector(self) -> List[int]:
        return [self.counts.get(r, 0) for r in BAD_REASONS]

    def summary(self, top: int = 5) -> str:
        parts = []
        for reason, n in self.counts.most_common(top):
            parts.append(f"{reason}={n} (e.g. {', '.join(self.examples.get(reason, [])[:3])})")
        return "; ".join(parts) if parts else "none"


class DataList:
    """Read-only, compact view of a data list."""

    def __init__(self, blob: bytes, offsets: np.ndarray, durations: np.ndarray,
                 labels: np.ndarray, path: str = "", bad: Optional[BadCounter] = None):
        self.blob = blob
        self.offsets = offsets
        self.durations = durations
        self.labels = labels
        self.path = path
        self.bad = bad or BadCounter()

    def __len__(self) -> int:
        return len(self.durations)

    def entry(self, i: int) -> dict:
        return json.loads(self.blob[self.offsets[i]:self.offsets[i + 1]])

    def key(self, i: int) -> str:
        return self.entry(i)["key"]

    def total_hours(self) -> float:
        return float(self.durations.sum()) / 3600.0

    def has_features(self) -> bool:
        return len(self) > 0 and "feat" in self.entry(0)

    @classmethod
    def load(cls, path: str, num_classes: Optional[int] = None,
             require_label: bool = True, num_units: Optional[int] = None) -> "DataList":
        """Parses a JSON-lines list. Bad lines are logged, counted and left out; the
        caller decides (via max_bad_fraction) whether too many were bad. With `num_units`
        (a CTC loss), entries also need `tokens`: ids in [1, num_units)."""
        bad = BadCounter()
        chunks: List[bytes] = []
        durations: List[float] = []
        labels: List[int] = []
        with open(path, "rb") as f:
            for lineno, raw in enumerate(f, 1):
                if not raw.strip():
                    continue
                where = f"{path}:{lineno}"
                try:
                    obj = json.loads(raw)
                    if not isinstance(obj, dict):
                        raise ValueError("not an object")
                except (ValueError, UnicodeDecodeError) as err:
                    bad.add("malformed_json", where, str(err))
                    continue
                key = obj.get("key")
                if not isinstance(key, str) or not key or not (obj.get("wav") or obj.get("feat")):
                    bad.add("missing_field", str(key or where), "needs key and wav or feat")
                    continue
                dur = obj.get("duration")
                if not isinstance(dur, (int, float)) or isinstance(dur, bool) \
                        or not math.isfinite(dur) \
                        or dur <= 0 or dur > MAX_ABSURD_DURATION:
                    bad.add("absurd_duration", key, f"duration={dur!r}")
                    continue
                label = obj.get("label")
                if require_label:
                    if not isinstance(label, int) or isinstance(label, bool):
                        bad.add("missing_label", key)
                        continue
                    if label < -1 or (num_classes is not None and label >= num_classes):
                        bad.add("label_not_in_inventory", key, f"label={label}")
                        continue
                if num_units is not None:
                    problem = token_problem(obj.get("tokens"), num_units)
                    if problem:
                        bad.add(problem[0], key, problem[1])
                        continue
                chunks.append(json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode())
                durations.append(float(dur))
                labels.append(int(label) if isinstance(label, int) else -1)
        offsets = np.zeros(len(chunks) + 1, dtype=np.int64)
        np.cumsum([len(c) for c in chunks], out=offsets[1:])
        if bad.total():
            logger.warning("%s: %d of %d lines skipped: %s", path, bad.total(),
                           bad.total() + len(chunks), bad.summary())
        return cls(b"".join(chunks), offsets, np.asarray(durations, dtype=np.float32),
                   np.asarray(labels, dtype=np.int32), path, bad)


def token_problem(tokens, num_units: int) -> Optional[Tuple[str, str]]:
    if not isinstance(tokens, list) or not all(isinstance(t, int) and not isinstance(t, bool)
                                               for t in tokens):
        return "missing_tokens", "needs a `tokens` list of unit ids (make_datalist --lexicon)"
    outside = [t for t in tokens if not 0 < t < num_units]
    if outside:
        return "token_not_in_units", f"ids {outside[:5]} outside [1, {num_units})"
    return None


def write_datalist(path: str, entries: Iterable[dict]) -> int:
    from toolkit.fileio import atomic_write_text
    lines = [json.dumps(e, ensure_ascii=False) for e in entries]
    atomic_write_text(path, "".join(line + "\n" for line in lines))
    return len(lines)


def read_inventory(path: str) -> List[str]:
    """Class/keyword inventory: one name per line; line order is the class index."""
    from toolkit.fileio import read_lines
    names = [line.strip() for _, line in read_lines(path)]
    dup = [n for n, c in Counter(names).items() if c > 1]
    if dup:
        raise ValueError(f"{path}: duplicate entries {dup}")
    if not names:
        raise ValueError(f"{path}: empty inventory")
    return names


def split_range(n: int, parts: int, index: int) -> Tuple[int, int]:
    start = n * index // parts
    return start, n * (index + 1) // parts
