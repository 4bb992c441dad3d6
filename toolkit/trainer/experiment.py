"""The experiment directory as a durable boundary: one configuration, one inventory, one
architecture. A rerun resumes; an incompatible rerun is refused naming every difference."""
import dataclasses
import json
import logging
import os
from typing import Dict, List, Tuple

import torch
import yaml

from toolkit.config import Config, ConfigError, from_dict, redact, to_dict
from toolkit.fileio import atomic_write_text, sha256_file

logger = logging.getLogger(__name__)

CONFIG_NAME = "config.yaml"
INVENTORY_NAME = "inventory.txt"
FINGERPRINT_NAME = "data_fingerprint.json"

# Keys whose change is allowed on resume (logged); every other difference in these
# sections makes the exp dir refuse the run.
ALLOWED_CHANGES = {
    "optim.lr", "optim.scheduler.warmup_steps", "optim.scheduler.final_lr_ratio",
    "optim.scheduler.factor", "optim.scheduler.patience", "optim.weight_decay",
    "training.max_epoch", "training.log_interval", "training.save_interval_steps",
    "training.val_interval_steps", "training.keep_last", "training.keep_best",
    "training.tensorboard", "training.max_nonfinite_steps", "training.rank_failure_timeout_s",
    "training.grad_clip", "training.malloc_trim_interval", "dataset.num_workers", "dataset.prefetch_factor",
    "dataset.max_bad_fraction", "training.init_checkpoint", "training.init_allow_missing",
}


def flatten(d, prefix: str = "") -> Dict[str, object]:
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


def diff_configs(old: dict, new: dict) -> Tuple[List[str], List[str]]:
    """(refused differences, allowed differences), each as 'key: old -> new'."""
    a, b = flatten(old), flatten(new)
    refused, allowed = [], []
    for key in sorted(set(a) | set(b)):
        if a.get(key) == b.get(key):
            continue
        text = f"{key}: {a.get(key)!r} -> {b.get(key)!r}"
        (allowed if key in ALLOWED_CHANGES else refused).append(text)
    return refused, allowed


def data_fingerprint(cfg: Config) -> dict:
    """Content hashes of the training and dev lists: a changed list under the same path is
    as incompatible as a different path."""
    return {name: sha256_file(path) if path and os.path.exists(path) else ""
            for name, path in (("train_data", cfg.dataset.train_data),
                               ("dev_data", cfg.dataset.dev_data))}


def prepare_exp_dir(exp_dir: str, cfg: Config, inventory: List[str],
                    write: bool) -> Tuple[Config, bool]:
    """Checks `cfg` against what the exp dir holds. Returns (config to use, resuming).
    Only rank 0 passes write=True; it records config, inventory and data fingerprint."""
    os.makedirs(exp_dir, exist_ok=True)
    config_path = os.path.join(exp_dir, CONFIG_NAME)
    inv_path = os.path.join(exp_dir, INVENTORY_NAME)
    fp_path = os.path.join(exp_dir, FINGERPRINT_NAME)
    new_raw = to_dict(cfg)
    new_fp = data_fingerprint(cfg)
    resuming = os.path.exists(config_path)
    if resuming:
        with open(config_path, encoding="utf-8") as f:
            old_raw = yaml.safe_load(f)
        problems, allowed = diff_configs(redact(old_raw), redact(new_raw))
        if os.path.exists(inv_path):
            with open(inv_path, encoding="utf-8") as f:
                old_inv = [line.rstrip("\n") for line in f if line.strip()]
            if old_inv != inventory:
                problems.append(f"class inventory (or its order): {old_inv} -> {inventory}")
        if os.path.exists(fp_path):
            with open(fp_path, encoding="utf-8") as f:
                old_fp = json.load(f)
            for name in ("train_data", "dev_data"):
                if old_fp.get(name) != new_fp[name]:
                    problems.append(f"dataset.{name} content changed (sha256 "
                                    f"{str(old_fp.get(name))[:12]} -> {new_fp[name][:12]})")
        if problems:
            raise ConfigError(
                f"{exp_dir} holds an experiment with an incompatible configuration; start a new "
                "exp dir or revert these changes:\n  " + "\n  ".join(problems))
        for text in allowed:
            logger.info("allowed configuration change on resume: %s", text)
    if write:
        from toolkit.config import dump_config
        dump_config(cfg, config_path)
        atomic_write_text(inv_path, "".join(name + "\n" for name in inventory))
        atomic_write_text(fp_path, json.dumps(new_fp, indent=1))
    return cfg, resuming


def load_exp_config(exp_dir: str) -> Config:
    """The resolved config that later stages (averaging, export, scoring) read."""
    path = os.path.join(exp_dir, CONFIG_NAME)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path} not found: train into {exp_dir} first")
    with open(path, encoding="utf-8") as f:
        return from_dict(yaml.safe_load(f))


def read_exp_inventory(exp_dir: str) -> List[str]:
    with open(os.path.join(exp_dir, INVENTORY_NAME), encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f if line.strip()]


def load_init_weights(model: torch.nn.Module, path: str, allow_missing: bool) -> None:
    """Weights only (no optimizer/scheduler/step). Strict unless `allow_missing`: then
    missing and unexpected keys are logged instead of refused. A safetensors file must
    have its config.json beside it describing the same architecture."""
    from toolkit.trainer.checkpoint import model_state_from_file
    if not os.path.exists(path):
        raise FileNotFoundError(f"init_checkpoint {path} not found")
    if path.endswith(".safetensors"):
        side = os.path.join(os.path.dirname(path), "config.json")
        if not os.path.exists(side):
            raise FileNotFoundError(f"init_checkpoint {path}: adjacent config.json missing")
        with open(side, encoding="utf-8") as f:
            meta = json.load(f)
        theirs = meta.get("model", {})
        mine = dataclasses.asdict(model.config)
        arch_keys = [k for k in theirs if k not in ("cmvn_file",)]
        diffs = [f"{k}: {theirs[k]!r} vs {mine.get(k)!r}" for k in arch_keys
                 if k in mine and theirs[k] != mine[k]]
        if diffs and not allow_missing:
            raise ConfigError(f"init_checkpoint {path} describes another architecture: "
                              + "; ".join(diffs))
    state = model_state_from_file(path)
    result = model.load_state_dict(state, strict=False)
    if result.missing_keys or result.unexpected_keys:
        msg = (f"init_checkpoint {path}: missing keys {result.missing_keys}, "
               f"unexpected keys {result.unexpected_keys}")
        if not allow_missing:
            raise ConfigError(msg + " (set training.init_allow_missing=true to accept)")
        logger.warning(msg)
    logger.info("initialised weights from %s", path)
