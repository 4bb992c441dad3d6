"""Global CMVN statistics: computed in parallel from a data list, stored as JSON and as
Kaldi-format stats (2 x (D+1) matrix: sums and count, sums of squares), and read back
from either (a Kaldi `cmvn.ark` made by `compute-cmvn-stats` works too)."""
import json
import logging
from typing import Optional, Tuple

import numpy as np

from toolkit.data.audio import BadEntry
from toolkit.data.datalist import BadCounter, DataList, split_range
from toolkit.progress import tick

logger = logging.getLogger(__name__)


def _accumulate(args) -> Tuple[np.ndarray, np.ndarray, int, BadCounter]:
    list_path, dataset_cfg, part, parts = args
    from toolkit.data.pipeline import FeaturePipeline
    datalist = DataList.load(list_path, require_label=False)
    processor = FeaturePipeline(dataset_cfg, seed=0, train=False)
    dim = processor.num_bins
    total = np.zeros(dim, dtype=np.float64)
    total_sq = np.zeros(dim, dtype=np.float64)
    frames = 0
    bad = BadCounter()
    start, end = split_range(len(datalist), parts, part)
    for i in range(start, end):
        entry = datalist.entry(i)
        try:
            feats = processor.features(entry, epoch=0).astype(np.float64)
        except BadEntry as err:
            bad.add(err.reason, entry["key"], err.detail)
            continue
        total += feats.sum(axis=0)
        total_sq += (feats ** 2).sum(axis=0)
        frames += len(feats)
        tick()
    return total, total_sq, frames, bad


def compute_global_cmvn(list_path: str, dataset_cfg, num_workers: int = 2) -> dict:
    parts = max(1, num_workers)
    jobs = [(list_path, dataset_cfg, p, parts) for p in range(parts)]
    from toolkit.progress import parallel_map
    results = parallel_map(_accumulate, jobs, parts,
                           len(DataList.load(list_path, require_label=False)), "CMVN statistics")
    total = sum(r[0] for r in results)
    total_sq = sum(r[1] for r in results)
    frames = sum(r[2] for r in results)
    bad = BadCounter()
    for r in results:
        bad.merge(r[3])
    if frames == 0:
        raise ValueError(f"{list_path}: no usable frames for CMVN (skipped: {bad.summary()})")
    if bad.total():
        logger.warning("CMVN: %d utterances skipped: %s", bad.total(), bad.summary())
    return stats_to_cmvn(total, total_sq, frames)


def stats_to_cmvn(total, total_sq, frames) -> dict:
    mean = np.asarray(total, dtype=np.float64) / frames
    var = np.maximum(np.asarray(total_sq, dtype=np.float64) / frames - mean ** 2, 1e-20)
    # Floor the variance so a constant bin cannot blow up inv_std.
    var = np.maximum(var, 1e-2)
    return {"frames": int(frames), "sum": list(map(float, total)),
            "sum_sq": list(map(float, total_sq)), "mean": list(map(float, mean)),
            "inv_std": list(map(float, 1.0 / np.sqrt(var)))}


def write_cmvn(cmvn: dict, json_path: str, kaldi_path: Optional[str] = None) -> None:
    from toolkit.fileio import atomic_write_text
    atomic_write_text(json_path, json.dumps(cmvn, indent=1))
    if kaldi_path:
        import kaldiio
        dim = len(cmvn["mean"])
        stats = np.zeros((2, dim + 1), dtype=np.float64)
        stats[0, :dim] = cmvn["sum"]
        stats[0, dim] = cmvn["frames"]
        stats[1, :dim] = cmvn["sum_sq"]
        kaldiio.save_mat(kaldi_path, stats)


def read_cmvn(path: str) -> dict:
    """JSON from `write_cmvn`, or Kaldi stats (binary/text `cmvn.ark`, first matrix)."""
    with open(path, "rb") as f:
        head = f.read(1)
    if head == b"{":
        with open(path, encoding="utf-8") as f:
            cmvn = json.load(f)
        missing = {"mean", "inv_std"} - set(cmvn)
        if missing:
            raise ValueError(f"{path}: CMVN JSON lacks {sorted(missing)}")
        return cmvn
    import kaldiio
    not_stats = f"{path}: not Kaldi CMVN stats (expected 2 x (dim+1) with a count)"
    try:
        stats = kaldiio.load_mat(path)
    except Exception:
        # An archive with a key (`spk [ ... ]`), as compute-cmvn-stats writes.
        try:
            stats = next(iter(kaldiio.load_ark(path)))[1]
        except (Exception, StopIteration):
            raise ValueError(not_stats) from None
    stats = np.asarray(stats, dtype=np.float64)
    if stats.ndim != 2 or stats.shape[0] != 2 or stats[0, -1] <= 0:
        raise ValueError(not_stats)
    dim = stats.shape[1] - 1
    return stats_to_cmvn(stats[0, :dim], stats[1, :dim], stats[0, dim])
