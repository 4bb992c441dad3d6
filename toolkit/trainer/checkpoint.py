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
    dev_loss: Optional[float]
    meta: dict


def rng_state() -> dict:
    """Python, NumPy and torch RNG states as weights_only-safe values."""
    py = random.getstate()
    np_state = np.random.get_state()
    return {
        "python": [py[0], list(py[1]), py[2]],
        "numpy": [np_state[0], torch.from_numpy(np_state[1].astype(np.int64)),
                  int(np_state[2]), int(np_state[3]), float(np_state[4])],
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def set_rng_state(state: dict) -> None:
    py = state["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    n = state["numpy"]
    np.random.set_state((n[0], n[1].numpy().astype(np.uint32), n[2], n[3], n[4]))
    torch.set_rng_state(state["torch"])
    if state.get("cuda") and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


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
        except (OSError, ValueError) as err:
            logger.warning("ignoring unreadable checkpoint metadata %s: %s", meta_path, err)
            continue
        found.append(CheckpointInfo(meta_path[:-5] + ".pt", int(meta["step"]),
                                    int(meta.get("epoch", 0)), meta.get("dev_loss"), meta))
    return sorted(found, key=lambda c: c.step)


def verify(info: CheckpointInfo) -> Optional[str]:
    """None when the .pt matches its recorded size and hash, else what is wrong."""
    try:
        size = os.path.getsize(info.path)
    except OSError:
        return "file missing"
    if size != info.meta.get("size"):
        return f"size {size} != recorded {info.meta.get('size')} (truncated?)"
    if sha256_file(info.path) != info.meta.get("sha256"):
        return "sha256 mismatch (corrupt)"
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


def prune(exp_dir: str, keep_last: int, keep_best: int) -> List[str]:
    """Deletes checkpoints that are neither among the last `keep_last` by step nor the
    best `keep_best` by dev loss. Also removes temp files left by killed writes."""
    infos = list_checkpoints(exp_dir)
    keep = {c.step for c in infos[-keep_last:]} if keep_last > 0 else set()
    scored = [c for c in infos if c.dev_loss is not None]
    keep |= {c.step for c in sorted(scored, key=lambda c: (c.dev_loss, -c.step))[:keep_best]}
    removed = []
    for c in infos:
        if c.step not in keep:
            for p in (c.path, c.path[:-3] + ".json"):
                try:
                    os.unlink(p)
                except FileNotFoundError:
                    pass
            removed.append(c.path)
    for tmp in glob.glob(os.path.join(exp_dir, ".tmp-*")):
        try:
            os.unlink(tmp)
        except OSError:
            pass
    return removed


def model_state_from_file(path: str) -> Dict[str, torch.Tensor]:
    """Model weights from one of our checkpoints or a .safetensors export."""
    if path.endswith(".safetensors"):
        from safetensors.torch import load_file
        return load_file(path)
    payload = load_payload(path)
    return payload["model"] if "model" in payload else payload
