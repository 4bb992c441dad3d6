"""Data lists: one JSON object per utterance (`key`, `wav` or `feat`, `duration`,
`label`, optional `txt`, `spk`, `start`/`end`, and task-specific fields such as `tokens`
or `kw_end`). This is the one parser of the format.

A relative `wav` or `feat` path (also the file of a `file.ark:offset`) names a file
relative to the directory of the list that holds it, never the working directory: a list
reads the same from anywhere, as a shard list does. Absolute paths, URLs and `cmd |`
pipes (run as written) are kept. Entries hold the resolved paths, so every reader of the
list (batches, features, noise and RIR lists, shards, the data fingerprint) sees one rule.

A list is held as one bytes blob plus offset/duration/label arrays instead of a Python
list of dicts: forked loader workers then share its pages (no per-object refcounts are
touched), so memory per worker stays flat however long the list and the epoch.
"""
import json
import logging
import math
import os
import re
from collections import Counter
from typing import Dict, Iterable, List, Optional, Tuple

import numpy as np

from toolkit.errors import DataError

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
PATH_FIELDS = ("wav", "feat")          # entry fields that name files
_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def resolve_source(source: str, base_dir: str) -> str:
    """`source` (a path, `file.ark:offset`, URL or `cmd |` pipe) with a relative file
    path joined to `base_dir`; everything else as it is."""
    if not isinstance(source, str) or not source or _URL.match(source) \
            or source.rstrip().endswith("|") or os.path.isabs(source):
        return source
    return os.path.join(base_dir, source)


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

    def referenced_files(self) -> List[str]:
        """Distinct files the entries read (audio, or feature archives without offsets)."""
        files = {}
        for i in range(len(self)):
            e = self.entry(i)
            source = e.get("feat") or e.get("wav") or ""
            if not source or source.rstrip().endswith("|"):
                continue      # a command's output has no file to fingerprint
            if "feat" in e or ".ark:" in source:
                source = source.rsplit(":", 1)[0]
            files[source] = None
        return list(files)

    @classmethod
    def load(cls, path: str, num_classes: Optional[int] = None,
             require_label: bool = True, allow_negative: bool = True,
             strict: bool = False) -> "DataList":
        """Parses a JSON-lines list. Bad lines are logged, counted and left out (the
        caller decides, via max_bad_fraction, whether too many were bad); with `strict`
        the first bad line is a DataError naming file and line instead, and duplicate
        keys are errors too."""
        bad = BadCounter()
        chunks: List[bytes] = []
        durations: List[float] = []
        labels: List[int] = []
        seen = set() if strict else None
        low = -1 if allow_negative else 0
        base_dir = os.path.dirname(os.path.abspath(path))
        with open(path, "rb") as f:
            for lineno, raw in enumerate(f, 1):
                if not raw.strip():
                    continue
                where = f"{path}:{lineno}"
                problem = _entry_problem(raw, require_label, num_classes, low, strict)
                if problem is not None:
                    reason, key, detail = problem
                    if strict:
                        raise DataError(f"{where}: {detail}")
                    bad.add(reason, key or where, detail)
                    continue
                obj = json.loads(raw)
                if seen is not None:
                    if obj["key"] in seen:
                        raise DataError(f"{where}: duplicate key {obj['key']!r}")
                    seen.add(obj["key"])
                for name in PATH_FIELDS:
                    if name in obj:
                        obj[name] = resolve_source(obj[name], base_dir)
                chunks.append(json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode())
                durations.append(float(obj["duration"]))
                label = obj.get("label")
                labels.append(int(label) if isinstance(label, int) else -1)
        offsets = np.zeros(len(chunks) + 1, dtype=np.int64)
        np.cumsum([len(c) for c in chunks], out=offsets[1:])
        if bad.total():
            logger.warning("%s: %d of %d lines skipped: %s", path, bad.total(),
                           bad.total() + len(chunks), bad.summary())
        if strict and not chunks:
            raise DataError(f"{path}: empty data list")
        return cls(b"".join(chunks), offsets, np.asarray(durations, dtype=np.float32),
                   np.asarray(labels, dtype=np.int32), path, bad)


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _entry_problem(raw: bytes, require_label: bool, num_classes: Optional[int], low: int,
                   strict: bool) -> Optional[Tuple[str, str, str]]:
    """(reason, key, human-readable detail) of a bad data-list line, or None."""
    try:
        obj = json.loads(raw)
        if not isinstance(obj, dict):
            raise ValueError("not a JSON object")
    except (ValueError, UnicodeDecodeError) as err:
        return "malformed_json", "", f"malformed JSON ({err})"
    key = obj.get("key")
    needed = ["key", "duration"] + (["label"] if require_label else [])
    missing = [name for name in needed if name not in obj]
    if not strict and not (obj.get("wav") or obj.get("feat")):
        missing.append("wav or feat")
    if missing:
        # The reason codes of the counters: a list without labels is `missing_label`.
        reason = ("missing_field" if {"key", "wav or feat"} & set(missing) else
                  "absurd_duration" if "duration" in missing else "missing_label")
        return reason, str(key or ""), f"missing field(s) {', '.join(missing)}"
    if not isinstance(key, str) or not key:
        return "missing_field", "", "'key' must be a non-empty string"
    dur = obj.get("duration")
    if not isinstance(dur, (int, float)) or isinstance(dur, bool) or not math.isfinite(dur) \
            or dur <= 0 or dur > MAX_ABSURD_DURATION:
        return "absurd_duration", key, f"'duration' must be a positive number of seconds, got {dur!r}"
    label = obj.get("label")
    if require_label:
        if not _is_int(label):
            return "missing_label", key, f"'label' must be an integer, got {label!r}"
        if label < low or (num_classes is not None and label >= num_classes):
            hi = f"{num_classes - 1}" if num_classes is not None else "K-1"
            return ("label_not_in_inventory", key,
                    f"'label' must be an integer in [{low}, {hi}], got {label!r}")
    for name in ("spk", "txt", "kind", "cat"):
        if name in obj and not isinstance(obj[name], str):
            return "other", key, f"'{name}' must be a string, got {obj[name]!r}"
    return None


def write_datalist(path: str, entries: Iterable[dict]) -> int:
    from toolkit.fileio import atomic_write_text
    lines = [json.dumps(e, ensure_ascii=False) for e in entries]
    atomic_write_text(path, "".join(line + "\n" for line in lines))
    return len(lines)


def split_range(n: int, parts: int, index: int) -> Tuple[int, int]:
    start = n * index // parts
    return start, n * (index + 1) // parts
