"""Checkpoints that survive being killed at any moment.

Each checkpoint is two files: `ckpt-<step>.pt` (torch.save of tensors, numbers, strings,
lists and dicts only, so `torch.load(weights_only=True)` reads it) and `ckpt-<step>.json`
(step, epoch, dev loss, size, sha256). Both are written atomically, the .pt first: a
checkpoint counts only once its .json exists and the hash matches, so a kill inside a
write, a truncated or a corrupted file is reported and the previous checkpoint is used.
"""
import glob
import hashlib
import io
import json
import logging
import os
import random
import re
import time
from dataclasses import dataclass
from typing import Dict, List, Optional

import numpy as np
import torch

from toolkit.fileio import atomic_write_bytes, atomic_write_text, sha256_file

logger = logging.getLogger(__name__)
NAME = re.compile(r"ckpt-(\d+)\.json$")


@dataclass
class CheckpointInfo:
    path: str          # the .pt file
    step: int
    epoch: int
    dev_metric: Optional[float]   # the task's selection metric at this step (lower is better)
    meta: dict


def dev_metric_of(meta: dict) -> Optional[float]:
    """The dev metric a checkpoint's metadata records; exp dirs written before the field
    was named `dev_metric` hold it as `dev_loss` (and the metric's name in `dev_metric`)."""
    value = meta.get("dev_metric")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return meta.get("dev_loss")


def rng_state(cuda: bool = False) -> dict:
    """Python, NumPy and torch RNG states as weights_only-safe values. CUDA's only for a
    CUDA run: asking for it would start CUDA in a CPU run on a GPU host."""
    py = random.getstate()
    np_state = np.random.get_state()
    return {
        "python": [py[0], list(py[1]), py[2]],
        "numpy": [np_state[0], torch.from_numpy(np_state[1].astype(np.int64)),
                  int(np_state[2]), int(np_state[3]), float(np_state[4])],
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if cuda else [],
    }


def set_rng_state(state: dict) -> None:
    py = state["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    n = state["numpy"]
    np.random.set_state((n[0], n[1].numpy().astype(np.uint32), n[2], n[3], n[4]))
    torch.set_rng_state(state["torch"])
    if state.get("cuda") and torch.cuda.is_initialized():
        torch.cuda.set_rng_state_all(state["cuda"])


def _file_id(path: str):
    st = os.stat(path)
    return (path, st.st_size, st.st_mtime_ns)


# (path, size, mtime) of checkpoints known to verify: the ones this process wrote and the
# ones it hashed, so pruning does not rehash every checkpoint at every save.
_VERIFIED: set = set()


def save_checkpoint(exp_dir: str, step: int, payload: dict, meta: dict) -> str:
    """Writes ckpt-<step>.pt and its .json; returns the .pt path. A full disk raises a
    clear OSError and leaves every earlier checkpoint as it was."""
    buf = io.BytesIO()
    torch.save(payload, buf)
    data = buf.getvalue()
    path = os.path.join(exp_dir, f"ckpt-{step:09d}.pt")
    atomic_write_bytes(path, data)
    meta = dict(meta, step=step, size=len(data), sha256=hashlib.sha256(data).hexdigest(),
                file=os.path.basename(path))
    atomic_write_text(path[:-3] + ".json", json.dumps(meta, indent=1))
    _VERIFIED.add(_file_id(path))
    return path


def list_checkpoints(exp_dir: str) -> List[CheckpointInfo]:
    """Checkpoints with a readable .json, sorted by step (not file time)."""
    found = []
    for meta_path in glob.glob(os.path.join(exp_dir, "ckpt-*.json")):
        if not NAME.search(meta_path):
            continue
        try:
            with open(meta_path, encoding="utf-8") as f:
                meta = json.load(f)
            step = int(meta["step"])
        except (OSError, ValueError, KeyError, TypeError) as err:
            logger.warning("ignoring unreadable checkpoint metadata %s: %s", meta_path, err)
            continue
        found.append(CheckpointInfo(meta_path[:-5] + ".pt", step,
                                    int(meta.get("epoch", 0)), dev_metric_of(meta), meta))
    return sorted(found, key=lambda c: c.step)


def verify(info: CheckpointInfo) -> Optional[str]:
    """None when the .pt matches its recorded size and hash, else what is wrong."""
    try:
        size = os.path.getsize(info.path)
        file_id = _file_id(info.path)
    except OSError:
        return "file missing"
    if size != info.meta.get("size"):
        return f"size {size} != recorded {info.meta.get('size')} (truncated?)"
    if file_id in _VERIFIED:
        return None
    started = time.time()
    digest = sha256_file(info.path)
    if size > (64 << 20):
        logger.info("verified %s (%.0f MB) in %.1f s", os.path.basename(info.path),
                    size / 2 ** 20, time.time() - started)
    if digest != info.meta.get("sha256"):
        return "sha256 mismatch (corrupt)"
    _VERIFIED.add(file_id)
    return None


def load_payload(path: str, map_location="cpu") -> dict:
    return torch.load(path, map_location=map_location, weights_only=True)


def latest_valid(exp_dir: str) -> Optional[CheckpointInfo]:
    """Newest checkpoint that verifies; broken newer ones are reported and skipped."""
    for info in reversed(list_checkpoints(exp_dir)):
        problem = verify(info)
        if problem is None:
            return info
        logger.error("checkpoint %s is unusable (%s); falling back to an earlier one",
                     info.path, problem)
    return None


def has_checkpoint_files(exp_dir: str) -> bool:
    return bool(glob.glob(os.path.join(exp_dir, "ckpt-*")))


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def remove_checkpoint(pt_path: str) -> None:
    """The .json goes first: a kill in between leaves an orphan .pt (pruned later), never
    a .json whose .pt is gone (reported as unusable at the next resume)."""
    _unlink(pt_path[:-3] + ".json")
    _unlink(pt_path)


TMP_CHECKPOINT = re.compile(r"^\.tmp-.*-ckpt-\d+\.(pt|json)$")


def prune(exp_dir: str, keep_last: int, keep_best: int) -> List[str]:
    """Deletes checkpoints that are neither among the last `keep_last` (at least one)
    valid ones by step nor the best `keep_best` by dev metric. Corrupt checkpoints and
    orphan .pt files older than the newest valid checkpoint go too, as do temp files of
    this trainer's killed checkpoint writes (other tools' temp files are left alone)."""
    infos = list_checkpoints(exp_dir)
    valid = [c for c in infos if verify(c) is None]
    broken = [c for c in infos if c not in valid]
    # The newest valid checkpoint always stays: it is what a rerun resumes from.
    keep = {c.step for c in valid[-max(1, keep_last):]}
    scored = [c for c in valid if c.dev_metric is not None]
    keep |= {c.step for c in sorted(scored, key=lambda c: (c.dev_metric, -c.step))[:keep_best]}
    newest = valid[-1].step if valid else -1
    removed = []
    for c in valid:
        if c.step not in keep:
            remove_checkpoint(c.path)
            removed.append(c.path)
    for c in broken:
        if c.step < newest:
            logger.warning("removing unusable checkpoint %s", c.path)
            remove_checkpoint(c.path)
            removed.append(c.path)
    listed = {c.path for c in infos}
    for pt in glob.glob(os.path.join(exp_dir, "ckpt-*.pt")):
        m = re.search(r"ckpt-(\d+)\.pt$", pt)
        if m and pt not in listed and int(m.group(1)) < newest:
            _unlink(pt)                      # orphan: its .json never got written
            removed.append(pt)
    for tmp in os.listdir(exp_dir):
        if TMP_CHECKPOINT.match(tmp):
            _unlink(os.path.join(exp_dir, tmp))
    return removed


def module_states_from_file(path: str) -> Dict[str, Dict[str, torch.Tensor]]:
    """Module name -> weights, from one of our checkpoints (or an averaged one). A
    .safetensors export holds one module: {"": state}."""
    if path.endswith(".safetensors"):
        from safetensors.torch import load_file
        return {"": load_file(path)}
    payload = load_payload(path)
    if "modules" in payload:
        return payload["modules"]
    if "model" in payload:                   # checkpoints before the task contract
        return {"model": payload["model"]}
    return {"": payload}
