"""One configuration schema for every recipe.

A YAML file has four sections (dataset, model, optim, training) plus `loss`. Every key is
checked against the dataclasses below: unknown keys and wrong types are errors that name the
full key path. `model`, `loss` and `optim.scheduler` are polymorphic: their `type` selects a
registered class whose own Config dataclass validates the remaining keys.

Command-line overrides (`training.max_epoch=5`) are merged into the raw mapping before
validation, so they go through exactly the same checks as the file.
"""
from __future__ import annotations

import copy
import dataclasses
import os
import re
import typing
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

import yaml


class ConfigError(ValueError):
    """A configuration problem; the message names the key path (and file when known)."""


# --------------------------------------------------------------------------- sections

@dataclass
class FeatureConfig:
    num_mel_bins: int = 40
    frame_length_ms: float = 25.0
    frame_shift_ms: float = 10.0
    dither: float = 0.0


@dataclass
class SpecAugConfig:
    enabled: bool = False
    num_time_masks: int = 2
    max_time_width: int = 20
    num_freq_masks: int = 2
    max_freq_width: int = 8
    # false: mask only filler utterances (label -1). A time mask over the final /s/ of
    # "hey snips", or a frequency mask over its vowel's formants, leaves a positive that
    # sounds like "hey snip" or "hey sneeps": label noise against exactly the confusables
    # a wake word must reject. (Classification lists have no fillers: nothing is masked.)
    keyword_utterances: bool = True


@dataclass
class NoiseConfig:
    noise_list: str = ""          # data list (JSON lines with `wav`) of noise recordings
    prob: float = 0.0
    snr_db: List[float] = field(default_factory=lambda: [5.0, 20.0])


@dataclass
class ReverbConfig:
    rir_list: str = ""            # data list of room impulse responses
    prob: float = 0.0


@dataclass
class VoicePerturbConfig:
    """Per-utterance spectral changes a new voice makes, on the fbank features (training
    only): formants below `split_hz` scaled by a factor from `low_range`, those above by
    one from `high_range` (espeak-ng's variants move F1 and F2-F3 by different ratios),
    and a spectral tilt from `tilt_db` (dB, highest mel bin against the lowest)."""
    prob: float = 0.0             # share of training utterances perturbed; 0: off
    low_range: List[float] = field(default_factory=lambda: [1.0, 1.0])
    high_range: List[float] = field(default_factory=lambda: [1.0, 1.0])
    split_hz: float = 1000.0
    tilt_db: List[float] = field(default_factory=lambda: [0.0, 0.0])


@dataclass
class DatasetConfig:
    data_type: str = "auto"       # raw: JSON-lines data list; shard: tar shard list; auto: look
    train_data: str = ""
    dev_data: str = ""
    sample_rate: int = 16000
    channel: int = -1             # -1 mixes all channels down; >= 0 selects one
    feature: FeatureConfig = field(default_factory=FeatureConfig)
    speed_perturb: List[float] = field(default_factory=list)   # e.g. [0.9, 1.0, 1.1]
    volume_range: List[float] = field(default_factory=list)    # e.g. [0.5, 1.5] gain
    # Vocal tract length perturbation, e.g. [0.9, 1.1]: formants scaled by a factor drawn
    # per utterance, on the fbank features (so it also works on precomputed ones).
    vtlp_range: List[float] = field(default_factory=list)
    voice_perturb: VoicePerturbConfig = field(default_factory=VoicePerturbConfig)
    noise: NoiseConfig = field(default_factory=NoiseConfig)
    reverb: ReverbConfig = field(default_factory=ReverbConfig)
    spec_aug: SpecAugConfig = field(default_factory=SpecAugConfig)
    min_duration: float = 0.05
    max_duration: float = 30.0
    shuffle: bool = True
    sort_window: int = 2000       # utterances sorted by length inside each window (bucketing)
    batch_size: int = 256
    max_frames_in_batch: int = 0  # > 0: dynamic batches holding at most this many padded frames
    num_workers: int = 2          # per node; divided across the local ranks
    prefetch_factor: int = 4
    max_bad_fraction: float = 0.01


@dataclass
class SchedulerConfig:
    type: str = "warmup_cosine"   # see toolkit.trainer.scheduler.SCHEDULERS
    warmup_steps: int = 0
    total_steps: int = 0          # 0: derived from max_epoch and the training list
    final_lr_ratio: float = 0.01
    factor: float = 0.5           # reduce_on_plateau
    patience: int = 1             # reduce_on_plateau, in validations


@dataclass
class OptimConfig:
    type: str = "adam"            # see toolkit.trainer.optim.OPTIMIZERS
    lr: float = 1e-3
    weight_decay: float = 0.0
    betas: List[float] = field(default_factory=lambda: [0.9, 0.999])
    momentum: float = 0.9
    eps: float = 1e-8
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)


@dataclass
class TrainingConfig:
    seed: int = 777
    max_epoch: int = 10
    grad_clip: float = 50.0
    max_nonfinite_steps: int = 100
    accum_grad: int = 1
    log_interval: int = 20
    save_interval_steps: int = 1000
    val_interval_steps: int = 0   # 0: validate at epoch end only
    keep_last: int = 3
    keep_best: int = 5
    use_amp: bool = False
    amp_dtype: str = "float16"    # float16 | bfloat16
    deterministic: bool = True
    init_checkpoint: str = ""
    init_allow_missing: bool = False
    tensorboard: bool = True
    rank_failure_timeout_s: float = 60.0
    malloc_trim_interval: int = 1   # CPU: return freed memory to the OS every N steps (0: never)


@dataclass
class Config:
    dataset: DatasetConfig = field(default_factory=DatasetConfig)
    model: Any = None             # the registered model's Config dataclass
    loss: Any = None              # the registered loss's Config dataclass
    optim: OptimConfig = field(default_factory=OptimConfig)
    training: TrainingConfig = field(default_factory=TrainingConfig)


# --------------------------------------------------------------------------- validation

def _type_name(tp) -> str:
    return getattr(tp, "__name__", str(tp))


def _coerce(value, tp, path: str):
    """Returns `value` converted to annotation `tp`, or raises ConfigError naming `path`."""
    origin = typing.get_origin(tp)
    if tp is Any:
        return value
    if origin is typing.Union:
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if value is None:
            return None
        return _coerce(value, args[0], path)
    if dataclasses.is_dataclass(tp):
        return build_dataclass(tp, value, path)
    if origin in (list, List):
        (item_tp,) = typing.get_args(tp) or (Any,)
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{path}: expected a list, got {value!r}")
        return [_coerce(v, item_tp, f"{path}[{i}]") for i, v in enumerate(value)]
    if origin in (dict, Dict):
        if not isinstance(value, dict):
            raise ConfigError(f"{path}: expected a mapping, got {value!r}")
        return dict(value)
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{path}: expected true/false, got {value!r}")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise ConfigError(f"{path}: expected an integer, got {value!r}")
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        # YAML 1.1 reads `1e-3` (no dot) as a string; accept it as the number it means.
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                pass
        raise ConfigError(f"{path}: expected a number, got {value!r}")
    if tp is str:
        if isinstance(value, str):
            return value
        if value is None:
            return ""
        raise ConfigError(f"{path}: expected a string, got {value!r}")
    raise ConfigError(f"{path}: unsupported schema type {_type_name(tp)}")


def build_dataclass(cls, raw, path: str):
    """Builds dataclass `cls` from mapping `raw`; unknown keys and bad types are errors."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{path or '<root>'}: expected a mapping, got {raw!r}")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(raw) - names)
    if unknown:
        where = path + "." if path else ""
        raise ConfigError(
            "unknown key(s): " + ", ".join(where + k for k in unknown)
            + f" (allowed in {path or '<root>'}: {', '.join(sorted(names))})")
    kwargs = {}
    for name in names:
        if name in raw:
            kwargs[name] = _coerce(raw[name], hints[name], f"{path}.{name}" if path else name)
    return cls(**kwargs)


def _build_poly(raw, registry, path: str, default_type: Optional[str]):
    """Validates a section whose `type` picks a registered class with a `Config` dataclass."""
    raw = dict(raw or {})
    type_name = raw.get("type", default_type)
    if not type_name:
        raise ConfigError(f"{path}.type is required (one of: {', '.join(registry.names())})")
    if type_name not in registry:
        raise ConfigError(f"{path}.type: unknown '{type_name}' (one of: {', '.join(registry.names())})")
    raw["type"] = type_name
    return build_dataclass(registry.get(type_name).Config, raw, path)


def validate(raw: Dict[str, Any]) -> Config:
    # Imported here: the registries import this module for their Config base classes.
    from toolkit.losses import LOSSES
    from toolkit.models import MODELS

    if not isinstance(raw, dict):
        raise ConfigError("the configuration must be a mapping with sections "
                          "dataset, model, loss, optim, training")
    raw = dict(raw)
    model_raw, loss_raw = raw.pop("model", None), raw.pop("loss", None)
    cfg = build_dataclass(Config, raw, "")
    cfg.model = _build_poly(model_raw, MODELS, "model", None)
    cfg.loss = _build_poly(loss_raw, LOSSES, "loss", "max_pooling")
    _check_values(cfg)
    return cfg


def _check_values(cfg: Config) -> None:
    t = cfg.training
    if t.amp_dtype not in ("float16", "bfloat16"):
        raise ConfigError(f"training.amp_dtype: expected float16 or bfloat16, got {t.amp_dtype!r}")
    if t.accum_grad < 1:
        raise ConfigError("training.accum_grad must be >= 1")
    if t.grad_clip <= 0:
        raise ConfigError("training.grad_clip must be > 0")
    d = cfg.dataset
    if d.data_type not in ("auto", "raw", "shard"):
        raise ConfigError(f"dataset.data_type: expected auto, raw or shard, got {d.data_type!r}")
    if d.batch_size < 1 and d.max_frames_in_batch < 1:
        raise ConfigError("dataset.batch_size or dataset.max_frames_in_batch must be positive")
    if d.speed_perturb and any(s <= 0 for s in d.speed_perturb):
        raise ConfigError("dataset.speed_perturb: factors must be positive")
    for name in ("volume_range", "vtlp_range"):
        v = getattr(d, name)
        if v and (len(v) != 2 or v[0] > v[1]):
            raise ConfigError(f"dataset.{name}: expected [low, high]")
    if d.vtlp_range and not 0.5 <= d.vtlp_range[0] <= d.vtlp_range[1] <= 2.0:
        raise ConfigError(f"dataset.vtlp_range: warp factors must lie in [0.5, 2.0], "
                          f"got {d.vtlp_range}")
    vp = d.voice_perturb
    if not 0.0 <= vp.prob <= 1.0:
        raise ConfigError(f"dataset.voice_perturb.prob must be in [0, 1], got {vp.prob}")
    for name in ("low_range", "high_range", "tilt_db"):
        v = getattr(vp, name)
        if len(v) != 2 or v[0] > v[1]:
            raise ConfigError(f"dataset.voice_perturb.{name}: expected [low, high], got {v}")
    for name in ("low_range", "high_range"):
        if not 0.5 <= getattr(vp, name)[0] <= getattr(vp, name)[1] <= 2.0:
            raise ConfigError(f"dataset.voice_perturb.{name}: warp factors must lie in "
                              f"[0.5, 2.0], got {getattr(vp, name)}")
    if not 0 < vp.split_hz < d.sample_rate / 2:
        raise ConfigError(f"dataset.voice_perturb.split_hz must lie in (0, "
                          f"{d.sample_rate / 2:g}), got {vp.split_hz}")
    if len(d.noise.snr_db) != 2:
        raise ConfigError("dataset.noise.snr_db: expected [low, high]")


# --------------------------------------------------------------------------- I/O

def parse_override(text: str):
    """`a.b.c=value` -> (['a','b','c'], parsed value). Values are YAML scalars/lists."""
    if "=" not in text:
        raise ConfigError(f"override '{text}': expected key.path=value")
    key, value = text.split("=", 1)
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*", key):
        raise ConfigError(f"override '{text}': bad key path '{key}'")
    try:
        parsed = yaml.safe_load(value) if value != "" else ""
    except yaml.YAMLError as err:
        raise ConfigError(f"override '{text}': cannot parse value: {err}") from None
    return key.split("."), parsed


def apply_overrides(raw: Dict[str, Any], overrides: List[str]) -> Dict[str, Any]:
    raw = copy.deepcopy(raw)
    for text in overrides:
        keys, value = parse_override(text)
        node = raw
        for k in keys[:-1]:
            child = node.get(k)
            if child is None:
                child = node[k] = {}
            if not isinstance(child, dict):
                raise ConfigError(f"override '{text}': '{k}' is not a section")
            node = child
        node[keys[-1]] = value
    return raw


def load_yaml(path: str) -> Dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as f:
            raw = yaml.safe_load(f)
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: invalid YAML: {err}") from None
    return raw or {}


def load_config(path: str, overrides: Optional[List[str]] = None) -> Config:
    raw = apply_overrides(load_yaml(path), overrides or [])
    try:
        return validate(raw)
    except ConfigError as err:
        raise ConfigError(f"{path}: {err}") from None


SECRET_KEY = re.compile(r"(token|password|passwd|secret|api_?key|credential)", re.IGNORECASE)
REDACTED = "<redacted>"


def secret_env_values():
    """Values of environment variables whose names look secret (tokens, passwords...)."""
    return {v for k, v in os.environ.items() if SECRET_KEY.search(k) and len(v) >= 4}


def redact(obj):
    """Copy of a nested mapping with secret-looking keys and env-provided values hidden."""
    env_secrets = secret_env_values()
    def walk(node, key=""):
        if isinstance(node, dict):
            return {k: (REDACTED if SECRET_KEY.search(str(k)) and v not in (None, "")
                        else walk(v, k)) for k, v in node.items()}
        if isinstance(node, list):
            return [walk(v, key) for v in node]
        if isinstance(node, str) and any(s in node for s in env_secrets):
            return REDACTED
        return node
    return walk(obj)


def to_dict(cfg: Config) -> Dict[str, Any]:
    return dataclasses.asdict(cfg)


def dump_config(cfg: Config, path: str) -> None:
    from toolkit.fileio import atomic_write_text
    atomic_write_text(path, yaml.safe_dump(redact(to_dict(cfg)), sort_keys=False))


def from_dict(raw: Dict[str, Any]) -> Config:
    return validate(copy.deepcopy(raw))
