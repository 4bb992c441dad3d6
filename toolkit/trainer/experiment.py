"""The experiment directory as a durable boundary: one configuration, one inventory, one
architecture, one data fingerprint. A rerun resumes; an incompatible rerun is refused
naming every difference."""
import dataclasses
import hashlib
import json
import logging
import os
import time
from typing import Dict, List, Optional, Sequence, Tuple

import torch
import yaml

from toolkit.config import (Config, ConfigError, config_from_dict, dump_config, is_redacted,
                            is_secret_key, same_value, secret_env_values, to_dict)
from toolkit.data.inventory import inventory_differences, read_inventory, write_inventory
from toolkit.errors import MissingInputError
from toolkit.fileio import atomic_write_text, sha256_file

logger = logging.getLogger(__name__)

CONFIG_NAME = "config.yaml"
INVENTORY_NAME = "inventory.txt"
FINGERPRINT_NAME = "data_fingerprint.json"
# 3: referenced files may be recorded under a location-free name (HF cache files), data
# lists' relative paths are resolved against the list, and task model files are in.
FINGERPRINT_VERSION = 3

# Keys whose change is allowed on resume (logged, and applied); every other difference
# makes the exp dir refuse the run. Per-optimizer keys match any optimizer name.
ALLOWED_CHANGES = {
    "optim.lr", "optim.scheduler.warmup_steps", "optim.scheduler.final_lr_ratio",
    "optim.scheduler.factor", "optim.scheduler.patience", "optim.weight_decay",
    "optim.grad_clip",
    "training.max_epoch", "training.max_steps", "training.log_interval",
    "training.save_interval_steps", "training.val_interval_steps", "training.keep_last",
    "training.keep_best", "training.tensorboard", "training.max_nonfinite_steps",
    "training.rank_failure_timeout_s", "training.grad_clip", "training.malloc_trim_interval",
    "training.lean_units",
    "training.trace_keys", "dataset.num_workers", "dataset.prefetch_factor",
    "dataset.max_bad_fraction", "training.init_checkpoint", "training.init_allow_missing",
}


def flatten(d, prefix: str = "") -> Dict[str, object]:
    """Nested mappings (and lists of mappings, e.g. dataset.hf.train) as dotted keys, so
    that each value, a secret among them, is compared on its own."""
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, list) and v and all(isinstance(x, dict) for x in v):
            v = {str(i): x for i, x in enumerate(v)}
        if isinstance(v, dict) and v:
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


# Sections whose every key may change on resume (where metrics are logged).
ALLOWED_SECTIONS = ("training.wandb.",)


def _allowed(key: str, optimizers: Sequence[str]) -> bool:
    if key in ALLOWED_CHANGES or is_secret_key(key.rsplit(".", 1)[-1]) \
            or key.startswith(ALLOWED_SECTIONS):
        return True
    parts = key.split(".")
    if len(parts) > 2 and parts[0] == "optim" and parts[1] in optimizers:
        return ".".join(["optim"] + parts[2:]) in ALLOWED_CHANGES
    return False


def diff_configs(saved: dict, current: dict,
                 optimizers: Sequence[str] = ()) -> Tuple[List[str], List[str]]:
    """(refused differences, allowed differences), each as 'key: old -> new'. `saved` is
    read back from config.yaml (secrets as salted hashes), `current` is the live config."""
    a, b = flatten(saved), flatten(current)
    refused, allowed = [], []
    for key in sorted(set(a) | set(b)):
        old, new = a.get(key), b.get(key)
        if same_value(old, new):
            continue
        shown_new = "<redacted>" if (is_redacted(old) or (isinstance(new, str) and
                                                          new in secret_env_values())
                                     or is_secret_key(key.rsplit(".", 1)[-1])) else repr(new)
        shown_old = "<redacted>" if is_redacted(old) else repr(old)
        text = f"{key}: {shown_old} -> {shown_new}"
        (allowed if _allowed(key, optimizers) else refused).append(text)
    return refused, allowed


# --------------------------------------------------------------------------- data fingerprint

SAMPLED_FILES = 256          # files whose head and tail bytes are hashed
INDEX_SUFFIX = "_index"      # lists["train_data_index"]: the shard index of train_data
SAMPLE_BYTES = 1 << 16


def _sampled_digest(path: str, size: int) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        h.update(f.read(SAMPLE_BYTES))
        if size > 2 * SAMPLE_BYTES:
            f.seek(size - SAMPLE_BYTES)
        h.update(f.read(SAMPLE_BYTES))
    return h.hexdigest()[:16]


def _list_digest(path: str, token: str = "") -> str:
    if "://" in path:
        from toolkit.data.shards import read_text
        return hashlib.sha256(read_text(path, token).encode("utf-8")).hexdigest()
    return sha256_file(path) if path and os.path.exists(path) else ""


def _shard_index(path: str, dataset_cfg) -> Optional[str]:
    """The index beside `path` when it is a shard list: its labels and durations make
    the batch plan, so it belongs to the data as much as the list does."""
    from toolkit.data.shards import index_path_of
    from toolkit.data.sources import detect_data_type
    data_type = dataset_cfg.data_type
    if data_type == "auto":
        data_type = detect_data_type(path, dataset_cfg.auth_token)
    return index_path_of(path) if data_type == "shard" else None


def _model_identity(key: str, path: str) -> dict:
    try:
        return {"path": os.path.abspath(path), "size": os.path.getsize(path),
                "sha256": sha256_file(path)}
    except OSError as err:
        raise MissingInputError(f"{key}: cannot read {path} ({err.strerror})") from None


def data_fingerprint(cfg: Config, referenced: Dict[str, Sequence],
                     model_files: Optional[Dict[str, str]] = None) -> dict:
    """What training reads, cheaply: the full sha256 of every list file (train, dev, the
    index beside a shard list, noise, RIR lists, CMVN stats; remote ones read with
    dataset.auth_token), and for the files the lists point at (audio, feature
    archives, shards) their sizes plus a hash of the first and last 64 KiB of a fixed
    sample of them. Remote (URL) shards are named only by their list's content. A
    referenced file is a path, or (name, path) for a file whose location is no part of
    the data (a `datasets` cache file, named under the cache: HF_HOME may move). The
    task's `model_files` (config key -> path, e.g. frozen teachers) are hashed whole."""
    started = time.time()
    lists = {"train_data": cfg.dataset.train_data, "dev_data": cfg.dataset.dev_data,
             "noise_list": cfg.dataset.noise.noise_list, "rir_list": cfg.dataset.reverb.rir_list}
    for section in ("model",):
        model = getattr(cfg, section, None) if cfg.has(section) else None
        if model is not None and getattr(model, "cmvn_file", ""):
            lists["cmvn_file"] = model.cmvn_file
    for name in ("train_data", "dev_data"):
        index = _shard_index(lists[name], cfg.dataset) if lists[name] else None
        if index:
            lists[name + INDEX_SUFFIX] = index
    token = cfg.dataset.auth_token
    out = {"version": FINGERPRINT_VERSION,
           "lists": {name: _list_digest(path, token) for name, path in lists.items() if path},
           "models": {key: _model_identity(key, path)
                      for key, path in sorted((model_files or {}).items()) if path}}
    files_total = hashed = 0
    for name, files in referenced.items():
        named = [(f, f) if isinstance(f, str) else tuple(f) for f in files]
        local = [(shown, f) for shown, f in named if "://" not in f]
        sizes = hashlib.sha256()
        missing = 0
        for shown, f in local:
            try:
                sizes.update(f"{shown}\0{os.path.getsize(f)}\n".encode("utf-8"))
            except OSError:
                missing += 1
                sizes.update(f"{shown}\0missing\n".encode("utf-8"))
        step = max(1, len(local) // SAMPLED_FILES)
        sample = hashlib.sha256()
        for _, f in local[::step][:SAMPLED_FILES]:
            try:
                sample.update(_sampled_digest(f, os.path.getsize(f)).encode())
                hashed += 1
            except OSError:
                sample.update(b"missing")
        out[name] = {"files": len(local), "sizes": sizes.hexdigest()[:16],
                     "sampled": sample.hexdigest()[:16]}
        files_total += len(local)
    logger.info("data fingerprint: %d list files hashed, %d referenced files sized, %d of them "
                "sampled (first and last 64 KiB), %d model files hashed in %.1f s",
                len(out["lists"]), files_total, hashed, len(out["models"]),
                time.time() - started)
    return out


def fingerprint_differences(old: dict, new: dict) -> List[str]:
    if old.get("version") != FINGERPRINT_VERSION:
        # Written by another toolkit version: not comparable, not refused (and replaced).
        logger.warning("the exp dir's data fingerprint is of version %s, this toolkit's of %s: "
                       "not compared; this run records its own", old.get("version"),
                       FINGERPRINT_VERSION)
        return []
    problems = []
    for name in sorted(set(old.get("lists", {})) | set(new.get("lists", {}))):
        a, b = old.get("lists", {}).get(name), new.get("lists", {}).get(name)
        if name.endswith(INDEX_SUFFIX) and a is None and old.get("lists", {}).get(
                name[:-len(INDEX_SUFFIX)]) == new.get("lists", {}).get(name[:-len(INDEX_SUFFIX)]):
            continue       # recorded before shard indexes were: the list itself is unchanged
        if a != b:
            what = ("cmvn_file" if name == "cmvn_file" else
                    f"the shard index (labels, durations) of dataset.{name[:-len(INDEX_SUFFIX)]}"
                    if name.endswith(INDEX_SUFFIX) else f"dataset.{name}")
            problems.append(f"{what} content changed (sha256 {str(a)[:12]} -> {str(b)[:12]})")
    old_models, new_models = old.get("models", {}), new.get("models", {})
    for key in sorted(set(old_models) | set(new_models)):
        a, b = old_models.get(key), new_models.get(key)
        if a is None or b is None:
            problems.append(f"{key} {'added' if a is None else 'removed'} since the run began")
        elif a["sha256"] != b["sha256"]:
            problems.append(f"{key} {b['path']} changed since the run began (sha256 "
                            f"{a['sha256'][:12]} -> {b['sha256'][:12]}, {a['size']} -> "
                            f"{b['size']} bytes): put the run's file back or start a new "
                            "exp dir")
    for name in sorted(k for k in set(old) | set(new) if k not in ("version", "lists", "models")):
        a, b = old.get(name) or {}, new.get(name) or {}
        if a != b:
            problems.append(f"files referenced by dataset.{name} changed ({a.get('files')} -> "
                            f"{b.get('files')} files; sizes {a.get('sizes')} -> {b.get('sizes')},"
                            f" sampled content {a.get('sampled')} -> {b.get('sampled')})")
    return problems


# --------------------------------------------------------------------------- the exp dir

def prepare_exp_dir(exp_dir: str, cfg: Config, inventory: Optional[List[str]],
                    fingerprint: dict, optimizers: Sequence[str], write: bool) -> bool:
    """Checks `cfg` against what the exp dir holds; returns whether it held a run. Only
    rank 0 passes write=True; it records config, inventory and data fingerprint."""
    os.makedirs(exp_dir, exist_ok=True)
    config_path = os.path.join(exp_dir, CONFIG_NAME)
    inv_path = os.path.join(exp_dir, INVENTORY_NAME)
    fp_path = os.path.join(exp_dir, FINGERPRINT_NAME)
    new_raw = to_dict(cfg)
    existed = os.path.exists(config_path)
    if existed:
        with open(config_path, encoding="utf-8") as f:
            old_raw = yaml.safe_load(f) or {}
        problems, allowed = diff_configs(old_raw, new_raw, optimizers)
        if os.path.exists(inv_path) or inventory is not None:
            old_inv = read_inventory(inv_path) if os.path.exists(inv_path) else None
            if old_inv != inventory:
                diffs = inventory_differences(old_inv or [], inventory or [])
                problems.append("class inventory (or its order) changed: " + "; ".join(diffs))
        if os.path.exists(fp_path):
            with open(fp_path, encoding="utf-8") as f:
                problems += fingerprint_differences(json.load(f), fingerprint)
        if problems:
            raise ConfigError(
                f"{exp_dir} holds an experiment with an incompatible configuration; start a new "
                "exp dir or revert these changes:\n  " + "\n  ".join(problems))
        for text in allowed:
            logger.info("allowed configuration change on resume: %s", text)
    if write:
        dump_config(cfg, config_path)
        if inventory is not None:
            write_inventory(inv_path, inventory)
        atomic_write_text(fp_path, json.dumps(fingerprint, indent=1))
    return existed


def load_exp_config(exp_dir: str) -> Config:
    """The resolved config that later stages (averaging, export, scoring) read. Values
    redacted as secrets come back empty (stages after training never need them)."""
    path = os.path.join(exp_dir, CONFIG_NAME)
    if not os.path.exists(path):
        raise MissingInputError(f"{path} not found: train into {exp_dir} first")
    with open(path, encoding="utf-8") as f:
        raw = yaml.safe_load(f)
    return config_from_dict(_unredact(raw))


def _unredact(node):
    if isinstance(node, dict):
        return {k: _unredact(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_unredact(v) for v in node]
    return "" if is_redacted(node) else node


def read_exp_inventory(exp_dir: str) -> List[str]:
    return read_inventory(os.path.join(exp_dir, INVENTORY_NAME))


# --------------------------------------------------------------------------- init weights

def _architecture_differences(theirs: dict, mine: dict) -> List[str]:
    skip = {"cmvn_file", "num_outputs", "num_classes"}
    return [f"{k}: {theirs[k]!r} vs {mine.get(k)!r}" for k in theirs
            if k in mine and k not in skip and theirs[k] != mine[k]]


def load_init_weights(modules: Dict[str, torch.nn.Module], task, path: str,
                      allow_missing: bool) -> List[str]:
    """Weights only (no optimizer, schedule or step) into the task's init modules; the
    other modules keep their fresh initialisation. Strict unless `allow_missing`: then
    missing, unexpected and shape-mismatched tensors are logged by name and the
    mismatched ones keep their fresh values. A safetensors export needs its config.json
    beside it, describing the same architecture. Returns the modules loaded."""
    from toolkit import pretrained
    from toolkit.trainer.checkpoint import module_states_from_file
    path = pretrained.resolve(path)
    if not os.path.exists(path):
        raise MissingInputError(f"training.init_checkpoint {path} not found")
    states = module_states_from_file(path)
    task_state = None
    if not path.endswith(".safetensors"):
        from toolkit.trainer.checkpoint import load_payload
        task_state = load_payload(path).get("task_state")
    targets = [m for m in task.init_modules(task_state) if m in modules]
    if "" in states:                   # a one-module export: the task's export module
        if path.endswith(".safetensors"):
            _check_export_config(path, modules[task.export_module], allow_missing)
        states = {task.export_module: states[""]}
        targets = [task.export_module]
    loaded = []
    for name in targets:
        if name not in states:
            raise ConfigError(f"training.init_checkpoint {path} has no weights for module "
                              f"'{name}' (it has {', '.join(sorted(states))})")
        state = task.adapt_init_state(name, modules[name], states[name])
        _load_module(modules[name], state, f"{path} [{name}]", allow_missing)
        loaded.append(name)
    fresh = [n for n in modules if n not in loaded]
    logger.info("initialised %s from %s%s", ", ".join(loaded), path,
                f"; {', '.join(fresh)} start fresh" if fresh else "")
    return loaded


def _check_export_config(path: str, module, allow_missing: bool) -> None:
    side = os.path.join(os.path.dirname(path), "config.json")
    if not os.path.exists(side):
        raise MissingInputError(f"training.init_checkpoint {path}: adjacent config.json missing")
    with open(side, encoding="utf-8") as f:
        meta = json.load(f)
    theirs = meta.get("model", meta.get("model_config")) if isinstance(meta, dict) else None
    config = getattr(module, "config", None)
    mine = dataclasses.asdict(config) if dataclasses.is_dataclass(config) else {}
    if not isinstance(theirs, dict) or not theirs:
        problem = (f"training.init_checkpoint {path}: {side} describes no model (no `model` "
                   "or `model_config` mapping), so its architecture cannot be checked")
        if not allow_missing:
            raise ConfigError(problem + " (set training.init_allow_missing=true to load what "
                              "matches by name and shape)")
        logger.warning("%s; loading what matches by name and shape", problem)
        return
    diffs = _architecture_differences(theirs, mine)
    if diffs and not allow_missing:
        raise ConfigError(f"training.init_checkpoint {path} describes another architecture: "
                          + "; ".join(diffs))
    if diffs:
        logger.warning("training.init_checkpoint %s describes another architecture (%s); "
                       "training.init_allow_missing=true: loading what matches by name and "
                       "shape", path, "; ".join(diffs))


def _load_module(module: torch.nn.Module, state: Dict[str, torch.Tensor], where: str,
                 allow_missing: bool) -> None:
    own = module.state_dict()
    mismatched = [f"{k} {tuple(v.shape)} vs {tuple(own[k].shape)}" for k, v in state.items()
                  if k in own and tuple(v.shape) != tuple(own[k].shape)]
    usable = {k: v for k, v in state.items() if k in own and tuple(v.shape) == tuple(own[k].shape)}
    missing = sorted(set(own) - set(state))
    unexpected = sorted(set(state) - set(own))
    problems = []
    if mismatched:
        problems.append(f"shape mismatch {mismatched}")
    if missing:
        problems.append(f"missing keys {missing}")
    if unexpected:
        problems.append(f"unexpected keys {unexpected}")
    if problems and not allow_missing:
        raise ConfigError(f"training.init_checkpoint {where}: " + "; ".join(problems)
                          + " (set training.init_allow_missing=true to keep those tensors "
                          "freshly initialised)")
    if problems:
        logger.warning("training.init_checkpoint %s: %s; those tensors keep their fresh "
                       "initialisation", where, "; ".join(problems))
    module.load_state_dict(usable, strict=False)
