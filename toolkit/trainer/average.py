"""Checkpoint averaging: best N by dev loss or last N by step."""
import logging
from typing import Dict, List

import torch

from toolkit.trainer import checkpoint as ckpt

logger = logging.getLogger(__name__)


def select_checkpoints(exp_dir: str, num: int, mode: str) -> List[ckpt.CheckpointInfo]:
    infos = [c for c in ckpt.list_checkpoints(exp_dir) if ckpt.verify(c) is None]
    if mode == "best":
        infos = sorted((c for c in infos if c.dev_metric is not None),
                       key=lambda c: (c.dev_metric, -c.step))
    elif mode == "last":
        infos = sorted(infos, key=lambda c: -c.step)
    else:
        raise ValueError(f"unknown averaging mode {mode!r} (best or last)")
    if not infos:
        raise FileNotFoundError(f"{exp_dir}: no usable checkpoints"
                                + (" with a dev loss" if mode == "best" else ""))
    return infos[:num]


def average_states(states: List[Dict[str, torch.Tensor]], names: List[str]) -> Dict[str, torch.Tensor]:
    """Mean of floating tensors. Integer buffers (BatchNorm's num_batches_tracked) are
    counters, not weights: they take the maximum instead of a truncated mean."""
    reference = states[0]
    for state, name in zip(states[1:], names[1:]):
        if set(state) != set(reference):
            raise ValueError(f"{name} has different parameters than {names[0]} "
                             f"(differs in {sorted(set(state) ^ set(reference))[:5]}); "
                             "refusing to average different architectures")
        for key, value in state.items():
            if value.shape != reference[key].shape:
                raise ValueError(f"{name}: {key} has shape {tuple(value.shape)}, {names[0]} has "
                                 f"{tuple(reference[key].shape)}; refusing to average "
                                 "different architectures")
    out = {}
    for key, value in reference.items():
        if value.is_floating_point():
            acc = torch.zeros_like(value, dtype=torch.float64)
            for state in states:
                acc += state[key].to(torch.float64)
            out[key] = (acc / len(states)).to(value.dtype)
        else:
            out[key] = torch.stack([s[key] for s in states]).max(dim=0).values
    return out


def _architecture(payload: dict) -> dict:
    """The config sections that define the modules (everything but training/data/optim)."""
    cfg = payload.get("config") or {}
    return {k: v for k, v in cfg.items() if k not in ("dataset", "optim", "training")}


def average_checkpoints(exp_dir: str, num: int, mode: str = "best") -> dict:
    """Mean weights of every module over the chosen checkpoints, as a payload export and
    scoring read like a checkpoint (no optimizer or position: not resumable)."""
    chosen = select_checkpoints(exp_dir, num, mode)
    payloads = [ckpt.load_payload(c.path) for c in chosen]
    if any("modules" not in p for p in payloads):
        raise ValueError(f"{exp_dir}: checkpoints from before the task contract cannot be "
                         "averaged by this version")
    archs = [_architecture(p) for p in payloads]
    for info, arch in zip(chosen[1:], archs[1:]):
        if arch != archs[0]:
            a, b = flatten_dict(archs[0]), flatten_dict(arch)
            diff = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
            raise ValueError(
                f"{info.path} has a different model configuration than {chosen[0].path} ("
                + ", ".join(f"{k}: {a.get(k)!r} vs {b.get(k)!r}" for k in diff[:8])
                + "); refusing to average different architectures")
    names = [c.path for c in chosen]
    modules = {name: average_states([p["modules"][name] for p in payloads], names)
               for name in payloads[0]["modules"]}
    logger.info("averaged %d checkpoints (%s): %s", len(chosen), mode,
                ", ".join(f"step {c.step} dev {c.dev_metric}" for c in chosen))
    return {"format": payloads[0].get("format"), "task": payloads[0].get("task"),
            "modules": modules, "config": payloads[0].get("config"),
            # e.g. the speaker inventory: an init from the average keeps the trained head
            "task_state": payloads[0].get("task_state", {}),
            "averaged_from": [{"step": c.step, "dev_metric": c.dev_metric} for c in chosen]}


def flatten_dict(d, prefix: str = "") -> dict:
    out = {}
    for k, v in (d or {}).items():
        if isinstance(v, dict):
            out.update(flatten_dict(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out
