"""Batch plans: which utterances form each batch of an epoch, and which rank trains it.

Determinism contract (exact resume depends on it):
- the plan of an epoch depends only on (seed, epoch, data list, config);
- global batch i goes to rank i % world_size; after `done` global batches of an epoch,
  the rest are dealt round-robin again (`rank_batches(plan[done:], ...)`), so a resume on
  another world size still trains every utterance once per epoch;
- every rank gets the same number of micro-batches (a rank short of one gets an empty
  batch and takes a zero-weight step, so collectives never hang).
"""
import logging
import math
from typing import List, Optional

import numpy as np

from toolkit.registry import Registry

logger = logging.getLogger(__name__)
PLANNERS: Registry = Registry("sampler")


def estimated_frames(durations: np.ndarray, dataset_cfg) -> np.ndarray:
    """fbank frames (snip_edges) of each duration at the configured rate and framing."""
    f = dataset_cfg.feature
    rate = dataset_cfg.sample_rate
    win = int(rate * f.frame_length_ms / 1000)
    hop = int(rate * f.frame_shift_ms / 1000)
    samples = np.round(durations.astype(np.float64) * rate)
    return np.maximum(0, 1 + (samples - win) // hop).astype(np.int64)


def usable_indices(durations: np.ndarray, dataset_cfg) -> np.ndarray:
    d = dataset_cfg
    return np.nonzero((durations >= d.min_duration) & (durations <= d.max_duration))[0]


def report_duration_filter(durations: np.ndarray, key_of, dataset_cfg, path: str,
                           show: int = 10) -> int:
    """Logs (by name) the utterances the duration limits leave out; returns their count."""
    d = dataset_cfg
    outside = np.nonzero((durations < d.min_duration) | (durations > d.max_duration))[0]
    if len(outside):
        named = ", ".join(f"{key_of(int(i))} ({float(durations[i]):.2f} s)"
                          for i in outside[:show])
        more = f" and {len(outside) - show} more" if len(outside) > show else ""
        logger.warning("%s: %d utterances outside dataset.min_duration/max_duration "
                       "[%g, %g] s are left out: %s%s", path, len(outside), d.min_duration,
                       d.max_duration, named, more)
    return int(len(outside))


@PLANNERS.register("bucket")
def plan_batches(frames: np.ndarray, keep: np.ndarray, dataset_cfg, seed: int, epoch: int,
                 train: bool, labels: Optional[np.ndarray] = None) -> List[np.ndarray]:
    """Global list of batches (arrays of entry indices) for one epoch: shuffled, sorted by
    length inside windows (so padding stays small but the order still varies between
    epochs), batched by count or by padded frames, batches shuffled."""
    d = dataset_cfg
    rng = np.random.default_rng([seed & 0xFFFFFFFF, epoch, 0x5EED])
    order = rng.permutation(keep) if (train and d.shuffle) else keep
    window = max(1, d.sort_window)
    parts = []
    for start in range(0, len(order), window):
        chunk = order[start:start + window]
        parts.append(chunk[np.argsort(frames[chunk], kind="stable")])
    order = np.concatenate(parts) if parts else order
    batches: List[np.ndarray] = []
    if d.max_frames_in_batch > 0:
        start, longest = 0, 0
        for i, idx in enumerate(order):
            longest_if_added = max(longest, int(frames[idx]))
            count = i - start + 1
            too_many = d.batch_size > 0 and count > d.batch_size
            if i > start and (longest_if_added * count > d.max_frames_in_batch or too_many):
                batches.append(order[start:i])
                start, longest_if_added = i, int(frames[idx])
            longest = longest_if_added
        if start < len(order):
            batches.append(order[start:])
    else:
        batches = [order[i:i + d.batch_size] for i in range(0, len(order), d.batch_size)]
    if train and d.shuffle and batches:
        batches = [batches[i] for i in rng.permutation(len(batches))]
    return batches


@PLANNERS.register("class_balanced")
def plan_class_balanced(frames: np.ndarray, keep: np.ndarray, dataset_cfg, seed: int,
                        epoch: int, train: bool,
                        labels: Optional[np.ndarray] = None) -> List[np.ndarray]:
    """Each batch draws classes (labels, e.g. speakers), then utterances of each: as many
    batches as the bucket plan would have, every class drawn about equally often.
    Evaluation lists keep the plain plan (every utterance once)."""
    if not train or labels is None:
        return plan_batches(frames, keep, dataset_cfg, seed, epoch, train)
    s = dataset_cfg.sampler
    per = max(1, s.utts_per_class)
    classes = s.classes_per_batch or max(1, dataset_cfg.batch_size // per)
    rng = np.random.default_rng([seed & 0xFFFFFFFF, epoch, 0x5BA1])
    kept_labels = labels[keep]
    names = np.unique(kept_labels)
    if len(names) == 0:
        return []
    pools = {int(c): rng.permutation(keep[kept_labels == c]) for c in names}
    cursor = {c: 0 for c in pools}
    num_batches = max(1, math.ceil(len(keep) / (classes * per)))
    class_stream: List[int] = []
    batches = []
    for _ in range(num_batches):
        while len(class_stream) < classes:
            class_stream.extend(int(c) for c in rng.permutation(names))
        chosen, class_stream = class_stream[:classes], class_stream[classes:]
        rows = []
        for c in chosen:
            pool = pools[c]
            for _ in range(per):
                if cursor[c] >= len(pool):      # used up: a new pass in a new order
                    pools[c] = pool = rng.permutation(pool)
                    cursor[c] = 0
                rows.append(pool[cursor[c]])
                cursor[c] += 1
        batches.append(np.asarray(rows, dtype=np.int64))
    return batches


def plan_epoch(frames: np.ndarray, keep: np.ndarray, dataset_cfg, seed: int, epoch: int,
               train: bool, labels: Optional[np.ndarray] = None) -> List[np.ndarray]:
    return PLANNERS.get(dataset_cfg.sampler.type)(frames, keep, dataset_cfg, seed, epoch,
                                                  train, labels)


def rank_batches(batches: List[np.ndarray], rank: int, world_size: int) -> List[np.ndarray]:
    """Round-robin share of one rank, padded with empty batches to the common length."""
    steps = math.ceil(len(batches) / world_size) if batches else 0
    mine = batches[rank::world_size]
    empty = np.zeros(0, dtype=np.int64)
    return mine + [empty] * (steps - len(mine))


def real_batches_per_rank(num_batches: int, world_size: int) -> List[int]:
    """How many of each rank's `rank_batches` are real (not padding)."""
    return [len(range(r, num_batches, world_size)) for r in range(world_size)]
