"""One configuration schema for every recipe and every task.

A YAML file has the sections `task` (its `type` picks a registered task: kws, speaker,
codec), `dataset`, `optim`, `training`, plus the sections that task owns (`model`,
`loss`, `head`, `discriminator`, ...). Every key is checked against dataclasses: unknown
keys and wrong types are errors that name the full key path. A section whose `type`
selects a registered class (model, loss, scheduler) is validated by that class's own
Config dataclass.

Composition: a file may start from others, `defaults: [../../conf/model/ecapa.yaml, ...]`
(paths relative to the file), merged in order with the file's own keys on top; then the
command-line overrides (`training.max_epoch=5`) go on top, through the same checks. The
resolved result is what an experiment records in `config.yaml`.

Values that change over training (a margin, a loss weight, an augmentation probability)
are `Ramp` fields: a plain number, or a mapping such as `{initial: 0, final: 0.2,
start: 0.1, end: 0.4}` over the fraction of `max_steps` done (toolkit.trainer.progress).
"""
from __future__ import annotations

import copy
import dataclasses
import hashlib
import inspect
import io
import math
import os
import re
import secrets
import tokenize
import typing
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Optional, Tuple

import yaml

from toolkit.errors import UserError
from toolkit.registry import Registry


class ConfigError(UserError, ValueError):
    """A configuration problem; the message names the key path (and file when known)."""


# --------------------------------------------------------------------------- ramps

RAMP_SHAPES = ("linear", "cosine", "exponential", "step")
RAMP_UNITS = ("fraction", "steps")


@dataclass
class Ramp:
    """A value over training progress: `initial` until `start`, `final` from `end` on,
    and in between a `shape`d change (step: a switch at `start`)."""
    initial: float = 0.0       # value before `start`
    final: float = 0.0         # value from `end` on
    start: float = 0.0         # where the change begins, in `unit`s
    end: float = 0.0           # where it ends; equal to `start` for a switch
    shape: str = "linear"      # linear | cosine | exponential | step
    unit: str = "fraction"     # fraction (of max_steps) | steps

    @classmethod
    def constant(cls, value: float) -> "Ramp":
        return cls(initial=float(value), final=float(value))

    def check(self, path: str) -> None:
        if self.shape not in RAMP_SHAPES:
            raise ConfigError(f"{path}.shape: expected one of {', '.join(RAMP_SHAPES)}, "
                              f"got {self.shape!r}")
        if self.unit not in RAMP_UNITS:
            raise ConfigError(f"{path}.unit: expected fraction or steps, got {self.unit!r}")
        if self.end < self.start:
            raise ConfigError(f"{path}: end {self.end} is before start {self.start}")
        if self.unit == "fraction" and not 0.0 <= self.start <= 1.0:
            raise ConfigError(f"{path}.start: a fraction of max_steps lies in [0, 1], "
                              f"got {self.start}")

    @property
    def is_constant(self) -> bool:
        return self.initial == self.final

    def value(self, step: int, total_steps: int) -> float:
        where = step if self.unit == "steps" else step / max(1, total_steps)
        if where < self.start:
            return self.initial
        if self.shape == "step" or where >= self.end:
            return self.final
        t = (where - self.start) / (self.end - self.start)
        if self.shape == "cosine":
            t = 0.5 * (1.0 - math.cos(math.pi * t))
        elif self.shape == "exponential":
            # Fast at first, then settling: 1 - 1000^-t rescaled to reach 1 at t = 1.
            t = (1.0 - 1e-3 ** t) / (1.0 - 1e-3)
        return self.initial + (self.final - self.initial) * t

    def active_from(self) -> float:
        """Progress (in `unit`s) from which the value is nonzero, for switched-on parts."""
        if self.initial != 0.0:
            return 0.0
        return self.start if self.final != 0.0 else math.inf


# --------------------------------------------------------------------------- generic sections

@dataclass
class FeatureConfig:
    type: str = "fbank"           # fbank | speech_embedding (openWakeWord's ONNX front end, opt-in)
    num_mel_bins: int = 40        # fbank bins; 40 for wake words, 80 for speakers
    frame_length_ms: float = 25.0  # Kaldi's default window
    frame_shift_ms: float = 10.0  # 100 frames per second
    # Gaussian noise added to the samples (int16 scale) before framing; drawn from the
    # utterance's own random stream (seed, epoch, key), so resume stays exact.
    dither: float = 0.0
    mel_model: str = ""           # speech_embedding: melspectrogram.onnx; empty: the installed openwakeword's
    embedding_model: str = ""     # speech_embedding: embedding_model.onnx; empty: the installed openwakeword's


@dataclass
class SpecAugConfig:
    enabled: bool = False         # time and frequency masks on training features
    num_time_masks: int = 2       # masks per utterance along time
    max_time_width: int = 20      # frames per time mask at most
    num_freq_masks: int = 2       # masks per utterance along frequency
    max_freq_width: int = 8       # bins per frequency mask at most


@dataclass
class NoiseConfig:
    noise_list: str = ""          # data list (JSON lines with `wav`) of noise recordings
    prob: Ramp = field(default_factory=lambda: Ramp.constant(0.0))  # share of utterances noised
    snr_db: List[float] = field(default_factory=lambda: [5.0, 20.0])  # [low, high] SNR drawn per utterance
    # Optional per-type SNR ranges for MUSAN-style lists whose entries carry a `kind`
    # (noise, music, babble/speech), e.g. {noise: [0, 15], music: [5, 15], babble: [13, 20]}.
    snr_db_by_kind: Dict[str, List[float]] = field(default_factory=dict)


@dataclass
class ReverbConfig:
    rir_list: str = ""            # data list of room impulse responses
    prob: Ramp = field(default_factory=lambda: Ramp.constant(0.0))  # share of utterances reverberated


@dataclass
class VoicePerturbConfig:
    """Per-utterance spectral changes a new voice makes, on the fbank features (training
    only): formants below `split_hz` scaled by a factor from `low_range`, those above by
    one from `high_range`, and a spectral tilt from `tilt_db`."""
    prob: float = 0.0             # share of training utterances perturbed; 0: off
    low_range: List[float] = field(default_factory=lambda: [1.0, 1.0])  # warp of formants below split_hz
    high_range: List[float] = field(default_factory=lambda: [1.0, 1.0])  # warp above split_hz
    split_hz: float = 1000.0      # boundary between the two warp bands (F1 vs F2-F3)
    tilt_db: List[float] = field(default_factory=lambda: [0.0, 0.0])  # tilt, highest bin vs lowest


@dataclass
class SamplerConfig:
    # bucket: shuffled, length-sorted inside windows; class_balanced: each batch draws
    # `classes_per_batch` labels (e.g. speakers), then `utts_per_class` utterances of each.
    type: str = "bucket"
    classes_per_batch: int = 0    # class_balanced: labels per batch (0: batch_size / utts_per_class)
    utts_per_class: int = 2       # class_balanced: utterances drawn per label


@dataclass
class HFDatasetConfig:
    """One Hugging Face dataset split read as training or dev input (`datasets` reads it;
    the audio column is decoded here with soundfile, never through `datasets`' decoders)."""
    # hub name (org/name) or local directory (parquet/Arrow files, save_to_disk output, audio files)
    path: str = ""
    name: str = ""                # the dataset's configuration (subset) name; empty: its default
    split: str = "train"          # split to read, e.g. train.clean.100
    audio_column: str = "audio"   # Audio feature or {bytes, path} struct column
    id_column: str = ""           # column of utterance ids; empty: row numbers
    # column of durations in seconds, read instead of decoding every audio header once
    duration_column: str = ""
    label_column: str = ""        # integer class column, for tasks that need labels
    revision: str = ""            # hub commit, tag or branch (pin it: the data then cannot change)
    # hub access token of this dataset (redacted from every saved copy); empty: HF_TOKEN
    token: str = ""


@dataclass
class HFDataConfig:
    # Hugging Face datasets mixed into one training input (instead of dataset.train_data)
    train: List[HFDatasetConfig] = field(default_factory=list)
    # datasets mixed into the validation input (instead of dataset.dev_data)
    dev: List[HFDatasetConfig] = field(default_factory=list)


@dataclass
class DatasetConfig:
    data_type: str = "auto"       # raw: JSON-lines data list; shard: tar shard list; auto: look
    train_data: str = ""          # training data list or shard list
    dev_data: str = ""            # validation list; empty: no validation
    hf: HFDataConfig = field(default_factory=HFDataConfig)   # Hugging Face datasets as input
    # Bearer token for http(s) shard URLs; never written to any file. Falls back to the
    # TOOLKIT_DATA_TOKEN environment variable.
    auth_token: str = ""
    sample_rate: int = 16000      # audio is resampled to this rate on the fly
    channel: int = -1             # -1 mixes all channels down; >= 0 selects one
    feature: FeatureConfig = field(default_factory=FeatureConfig)
    speed_perturb: List[float] = field(default_factory=list)   # e.g. [0.9, 1.0, 1.1], one drawn per utterance
    volume_range: List[float] = field(default_factory=list)    # e.g. [0.5, 1.5] gain
    # Vocal tract length perturbation, e.g. [0.9, 1.1]: formants scaled by a factor drawn
    # per utterance, on the fbank features (so it also works on precomputed ones).
    vtlp_range: List[float] = field(default_factory=list)
    voice_perturb: VoicePerturbConfig = field(default_factory=VoicePerturbConfig)
    noise: NoiseConfig = field(default_factory=NoiseConfig)
    reverb: ReverbConfig = field(default_factory=ReverbConfig)
    spec_aug: SpecAugConfig = field(default_factory=SpecAugConfig)
    min_duration: float = 0.05    # seconds; shorter utterances are left out (and named in the log)
    max_duration: float = 30.0    # seconds; longer ones too (memory follows the longest)
    shuffle: bool = True          # shuffle training batches each epoch
    sort_window: int = 2000       # utterances sorted by length inside each window (bucketing)
    batch_size: int = 256         # utterances per batch at most
    max_frames_in_batch: int = 0  # > 0: dynamic batches holding at most this many padded frames
    sampler: SamplerConfig = field(default_factory=SamplerConfig)
    num_workers: int = 2          # loader processes per node; divided across the local ranks
    prefetch_factor: int = 4      # batches each worker prepares ahead
    max_bad_fraction: float = 0.01  # share of unusable utterances that stops training


@dataclass
class SchedulerConfig:
    type: str = "warmup_cosine"   # constant | warmup_linear | warmup_cosine | exponential | reduce_on_plateau
    warmup_steps: int = 0         # linear warm-up from 0; 0 starts at the peak
    total_steps: int = 0          # 0: derived from training.max_steps / max_epoch and the data
    final_lr_ratio: float = 0.01  # LR at the end relative to the peak
    gamma: float = 0.0            # exponential: decay per step (0: reach final_lr_ratio at the end)
    factor: float = 0.5           # reduce_on_plateau: LR multiplier per reduction
    patience: int = 1             # reduce_on_plateau: validations without improvement tolerated


@dataclass
class OptimConfig:
    type: str = "adam"            # adam | adamw | sgd
    lr: float = 1e-3              # peak learning rate
    weight_decay: float = 0.0     # L2 (adam, sgd) or decoupled (adamw) decay
    betas: List[float] = field(default_factory=lambda: [0.9, 0.999])  # adam/adamw moments
    momentum: float = 0.9         # sgd (Nesterov when > 0)
    eps: float = 1e-8             # adam/adamw denominator term
    amsgrad: bool = False         # adam/adamw: AMSGrad variant
    grad_clip: float = 0.0        # global-norm clip for this optimizer; 0: training.grad_clip
    # Fraction of max_steps before which this optimizer does nothing (a phase switch:
    # e.g. discriminators start after the reconstruction warm-up).
    start_fraction: float = 0.0
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)


@dataclass
class WandbConfig:
    """Weights & Biases logging beside TensorBoard (rank 0; the config it records and the
    values it logs carry no secret)."""
    mode: str = "disabled"        # disabled | online | offline (no network: `wandb sync` later)
    project: str = ""             # W&B project; empty: wandb's default
    entity: str = ""              # team or user; empty: the logged-in user's default
    name: str = ""                # run name; empty: the exp dir's name
    group: str = ""               # run group (e.g. a sweep or recipe)
    tags: List[str] = field(default_factory=list)  # run tags
    notes: str = ""               # run description
    dir: str = ""                 # where wandb writes its files; empty: the exp dir


@dataclass
class TrainingConfig:
    seed: int = 777               # seeds weights, batch plans and augmentation
    max_epoch: int = 10           # epochs; with the data length this gives max_steps
    max_steps: int = 0            # > 0: stop after this many optimizer steps instead
    grad_clip: float = 50.0       # default global-norm clip of every optimizer
    max_nonfinite_steps: int = 100  # consecutive skipped (non-finite) updates that stop training
    accum_grad: int = 1           # micro-batches per optimizer step
    log_interval: int = 20        # optimizer steps between log lines
    save_interval_steps: int = 1000  # optimizer steps between mid-epoch checkpoints
    val_interval_steps: int = 0   # 0: validate at epoch end only
    keep_last: int = 3            # newest checkpoints kept
    keep_best: int = 5            # best checkpoints (by the task's dev metric) kept
    use_amp: bool = False         # mixed precision autocast
    amp_dtype: str = "float16"    # float16 (with a GradScaler) | bfloat16
    # Bitwise-reproducible kernels; on CUDA also cuBLAS's workspace setting, and a
    # nondeterministic op is an error instead of a warning.
    deterministic: bool = True
    init_checkpoint: str = ""     # weights to start from (checkpoint or .safetensors export)
    # Accept missing/unexpected/mismatched tensors when initialising; mismatched ones keep
    # their fresh initialisation (e.g. a classifier for another inventory size).
    init_allow_missing: bool = False
    tensorboard: bool = True      # write <exp>/tensorboard event files
    rank_failure_timeout_s: float = 60.0  # collective timeout: a dead rank stops the others
    # CPU: return freed heap pages to the OS every N steps (0: never). Varying batch shapes
    # fragment glibc's arenas; trimming bounds RSS, but every step it costs page faults
    # (20 steps: a quarter of the system time of 1, for more RSS; egs/wake_word/s0/RESULTS.md).
    malloc_trim_interval: int = 20
    trace_keys: bool = False      # write log/keys.rank<r>.txt: the keys of every trained batch
    # Weights & Biases; the run id is kept in the exp dir, so a resumed run continues it
    wandb: WandbConfig = field(default_factory=WandbConfig)


# --------------------------------------------------------------------------- the config object

class OptimizerConfigs(dict):
    """Optimizer name -> OptimConfig. With a single optimizer its keys read directly too
    (cfg.optim.lr), as the YAML of such a task writes them."""

    def __getattr__(self, name: str):
        if len(self) == 1:
            return getattr(next(iter(self.values())), name)
        raise AttributeError(f"optim has optimizers {', '.join(self)}: use optim[name].{name}")

    def __setattr__(self, name: str, value) -> None:
        if len(self) == 1:
            setattr(next(iter(self.values())), name, value)
        else:
            raise AttributeError(f"optim has optimizers {', '.join(self)}")


GENERIC_SECTIONS = ("task", "dataset", "optim", "training")


class Config:
    """Validated sections, as attributes (cfg.dataset.batch_size). `optim` maps optimizer
    names to OptimConfig; `cfg.sections` lists the names in file order."""

    def __init__(self, sections: Dict[str, Any]):
        object.__setattr__(self, "_sections", dict(sections))

    def __getattr__(self, name: str):
        try:
            return self._sections[name]
        except KeyError:
            raise AttributeError(f"config has no section '{name}'") from None

    def __setattr__(self, name: str, value) -> None:
        self._sections[name] = value

    @property
    def sections(self) -> List[str]:
        return list(self._sections)

    def has(self, name: str) -> bool:
        return name in self._sections


@dataclass
class TaskConfigBase:
    type: str = ""                # the task: kws | speaker | codec


@dataclass
class Section:
    """A task-owned top-level section: a fixed dataclass, or a registry whose `type`
    key selects the class (with `default_type` when the key is absent)."""
    schema: Any = None
    registry: Optional[Registry] = None
    default_type: Optional[str] = None
    required: bool = True


# Filled by task packages when they are imported (toolkit.tasks); generic code only looks up.
TASKS: Registry = Registry("task")


# --------------------------------------------------------------------------- validation

def _type_name(tp) -> str:
    return getattr(tp, "__name__", str(tp))


def _coerce(value, tp, path: str):
    """Returns `value` converted to annotation `tp`, or raises ConfigError naming `path`."""
    origin = typing.get_origin(tp)
    if tp is Any:
        return value
    if tp is Ramp:
        if isinstance(value, Ramp):
            return value
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return Ramp.constant(float(value))
        ramp = build_dataclass(Ramp, value, path)
        ramp.check(path)
        return ramp
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
        args = typing.get_args(tp)
        if len(args) == 2 and args[1] is not Any:
            return {str(k): _coerce(v, args[1], f"{path}.{k}") for k, v in value.items()}
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
    """Builds dataclass `cls` from mapping `raw`; unknown keys and bad types are errors.
    A ValueError raised by the class's own checks (__post_init__) gets `path` in front."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{path or '<root>'}: expected a mapping, got {raw!r}")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls) if f.init]
    unknown = sorted(set(raw) - set(names))
    if unknown:
        where = path + "." if path else ""
        raise ConfigError(
            "unknown key(s): " + ", ".join(where + str(k) for k in unknown)
            + f" (allowed in {path or '<root>'}: {', '.join(sorted(names))})")
    kwargs = {}
    for name in names:
        if name in raw:
            kwargs[name] = _coerce(raw[name], hints[name], f"{path}.{name}" if path else name)
    try:
        return cls(**kwargs)
    except ConfigError as err:
        text = str(err)
        raise ConfigError(text if not path or text.startswith(path) else f"{path}: {text}") \
            from None


def build_poly(raw, registry: Registry, path: str, default_type: Optional[str] = None):
    """Validates a section whose `type` picks a registered class with a `Config` dataclass."""
    raw = dict(raw or {})
    type_name = raw.get("type", default_type)
    if not type_name:
        raise ConfigError(f"{path}.type is required (one of: {', '.join(registry.names())})")
    if type_name not in registry:
        raise ConfigError(f"{path}.type: unknown '{type_name}' (one of: "
                          f"{', '.join(registry.names())})")
    raw["type"] = type_name
    return build_dataclass(registry.get(type_name).Config, raw, path)


def _build_section(raw, section: Section, path: str):
    if section.registry is not None:
        return build_poly(raw, section.registry, path, section.default_type)
    return build_dataclass(section.schema, raw, path)


def _with_defaults(default: Dict[str, Any], raw):
    """An optimizer's raw section over the task's defaults for it. Key by key: a changed
    `type` keeps the other defaults (adam and adamw share one schema); nested sections
    (scheduler) merge, a scheduler of another type replacing the default one whole."""
    if not default or not (raw is None or isinstance(raw, dict)):
        return raw
    out = copy.deepcopy(default)
    for key, value in (raw or {}).items():
        old = out.get(key)
        out[key] = merge(old, value) if isinstance(old, dict) and isinstance(value, dict) \
            else copy.deepcopy(value)
    return out


def _build_optim(raw, names: Tuple[str, ...],
                 defaults: Optional[Dict[str, Dict[str, Any]]] = None) -> "OptimizerConfigs":
    """`optim` is one OptimConfig when the task has one optimizer, or a mapping from each
    of the task's optimizer names to an OptimConfig. `defaults` (the task's
    `optim_defaults`) replace generic defaults per optimizer name."""
    defaults = defaults or {}
    raw = raw or {}
    if not isinstance(raw, dict):
        raise ConfigError(f"optim: expected a mapping, got {raw!r}")
    fields = {f.name for f in dataclasses.fields(OptimConfig)}
    if raw and set(raw) <= set(names) and not set(raw) & fields:
        missing = [n for n in names if n not in raw]
        if missing:
            raise ConfigError(f"optim: no settings for optimizer(s) {', '.join(missing)} "
                              f"(this task steps {', '.join(names)})")
        return OptimizerConfigs({n: build_dataclass(OptimConfig,
                                                    _with_defaults(defaults.get(n, {}), raw[n]),
                                                    f"optim.{n}")
                                 for n in names})
    if len(names) > 1:
        unknown = sorted(set(raw) - set(names))
        raise ConfigError(f"optim: this task steps optimizers {', '.join(names)}; give each its "
                          f"own section (optim.{names[0]}.lr=...)"
                          + (f", not {', '.join(unknown)}" if unknown else ""))
    return OptimizerConfigs({names[0]: build_dataclass(
        OptimConfig, _with_defaults(defaults.get(names[0], {}), raw), "optim")})


def validate(raw: Dict[str, Any]) -> Config:
    if not isinstance(raw, dict):
        raise ConfigError("the configuration must be a mapping with sections task, dataset, "
                          "optim, training and the task's own")
    raw = dict(raw)
    raw.pop("defaults", None)
    task_raw = raw.pop("task", None)
    if not isinstance(task_raw, dict) or not task_raw.get("type"):
        raise ConfigError("task.type is required (one of: " + (", ".join(TASKS.names()) or
                          "no task registered: import toolkit.tasks") + ")")
    task_cls_name = task_raw["type"]
    if task_cls_name not in TASKS:
        raise ConfigError(f"task.type: unknown '{task_cls_name}' (one of: "
                          f"{', '.join(TASKS.names())})")
    task_cls = TASKS.get(task_cls_name)
    sections: Dict[str, Any] = {"task": build_dataclass(task_cls.Config, task_raw, "task")}
    own: Dict[str, Section] = dict(task_cls.sections)
    allowed = set(GENERIC_SECTIONS) | set(own)
    unknown = sorted(set(raw) - allowed)
    if unknown:
        raise ConfigError(f"unknown section(s): {', '.join(unknown)} (task {task_cls_name} has: "
                          f"{', '.join(sorted(allowed))})")
    sections["dataset"] = build_dataclass(DatasetConfig, raw.get("dataset"), "dataset")
    for name, section in own.items():
        if name not in raw and not section.required:
            sections[name] = None
            continue
        sections[name] = _build_section(raw.get(name), section, name)
    sections["optim"] = _build_optim(raw.get("optim"), tuple(task_cls.optimizers),
                                     getattr(task_cls, "optim_defaults", None))
    sections["training"] = build_dataclass(TrainingConfig, raw.get("training"), "training")
    cfg = Config(sections)
    _check_values(cfg)
    task_cls.check_config(cfg)
    return cfg


def _check_range_pair(value: List[float], path: str) -> None:
    if value and (len(value) != 2 or value[0] > value[1]):
        raise ConfigError(f"{path}: expected [low, high], got {value}")


def _check_values(cfg: Config) -> None:
    t = cfg.training
    if t.amp_dtype not in ("float16", "bfloat16"):
        raise ConfigError(f"training.amp_dtype: expected float16 or bfloat16, got {t.amp_dtype!r}")
    if t.accum_grad < 1:
        raise ConfigError("training.accum_grad must be >= 1")
    if t.grad_clip <= 0:
        raise ConfigError("training.grad_clip must be > 0")
    if t.max_epoch < 1 and t.max_steps < 1:
        raise ConfigError("training.max_epoch or training.max_steps must be positive")
    for name, o in cfg.optim.items():
        where = "optim" if len(cfg.optim) == 1 else f"optim.{name}"
        if not 0.0 <= o.start_fraction < 1.0:
            raise ConfigError(f"{where}.start_fraction must lie in [0, 1), got {o.start_fraction}")
        if o.grad_clip < 0:
            raise ConfigError(f"{where}.grad_clip must be >= 0 (0: training.grad_clip)")
        if len(o.betas) != 2:
            raise ConfigError(f"{where}.betas: expected [beta1, beta2], got {o.betas}")
    if t.wandb.mode not in WANDB_MODES:
        raise ConfigError(f"training.wandb.mode: expected one of {', '.join(WANDB_MODES)}, "
                          f"got {t.wandb.mode!r}")
    _check_dataset(cfg.dataset)


WANDB_MODES = ("disabled", "online", "offline")


def _check_hf(d: DatasetConfig) -> None:
    for split in ("train", "dev"):
        entries = getattr(d.hf, split)
        if entries and getattr(d, f"{split}_data"):
            raise ConfigError(f"dataset.{split}_data and dataset.hf.{split} both name the {split} "
                              "input: give one of them")
        if entries and d.data_type != "auto":
            raise ConfigError(f"dataset.data_type={d.data_type} describes dataset.{split}_data; "
                              f"Hugging Face datasets (dataset.hf.{split}) need data_type auto")
        seen = set()
        for i, e in enumerate(entries):
            where = f"dataset.hf.{split}[{i}]"
            if not e.path:
                raise ConfigError(f"{where}.path: a hub name or local directory is required")
            if not e.audio_column:
                raise ConfigError(f"{where}.audio_column must name the audio column")
            ident = (e.path, e.name, e.split, e.revision)
            if ident in seen:
                raise ConfigError(f"{where}: {e.path} {e.name} split {e.split} is listed twice")
            seen.add(ident)


def _check_dataset(d: DatasetConfig) -> None:
    _check_hf(d)
    if d.data_type not in ("auto", "raw", "shard"):
        raise ConfigError(f"dataset.data_type: expected auto, raw or shard, got {d.data_type!r}")
    if d.batch_size < 1 and d.max_frames_in_batch < 1:
        raise ConfigError("dataset.batch_size or dataset.max_frames_in_batch must be positive")
    if d.sampler.type not in ("bucket", "class_balanced"):
        raise ConfigError(f"dataset.sampler.type: expected bucket or class_balanced, got "
                          f"{d.sampler.type!r}")
    if d.sampler.type == "class_balanced" and d.sampler.utts_per_class < 1:
        raise ConfigError("dataset.sampler.utts_per_class must be >= 1")
    if d.speed_perturb and any(s <= 0 for s in d.speed_perturb):
        raise ConfigError("dataset.speed_perturb: factors must be positive")
    if d.feature.dither < 0:
        raise ConfigError("dataset.feature.dither must be >= 0")
    from toolkit.data.features import FEATURES   # here: the feature types import numpy
    if d.feature.type not in FEATURES:
        raise ConfigError(f"dataset.feature.type: unknown {d.feature.type!r} (one of: "
                          f"{', '.join(FEATURES.names())})")
    feature_problem = FEATURES.get(d.feature.type).check_config(d)
    if feature_problem:
        raise ConfigError(feature_problem)
    for name in ("volume_range", "vtlp_range"):
        _check_range_pair(getattr(d, name), f"dataset.{name}")
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
    for kind, pair in d.noise.snr_db_by_kind.items():
        if len(pair) != 2 or pair[0] > pair[1]:
            raise ConfigError(f"dataset.noise.snr_db_by_kind.{kind}: expected [low, high]")
    for name, ramp in (("noise.prob", d.noise.prob), ("reverb.prob", d.reverb.prob)):
        if not (0.0 <= ramp.initial <= 1.0 and 0.0 <= ramp.final <= 1.0):
            raise ConfigError(f"dataset.{name}: probabilities lie in [0, 1]")


# --------------------------------------------------------------------------- composition and I/O

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


def merge(base: Dict[str, Any], top: Dict[str, Any]) -> Dict[str, Any]:
    """Deep merge: mappings merge key by key, anything else in `top` replaces. A section
    whose `type` changes is replaced whole (another class has other keys)."""
    out = copy.deepcopy(base)
    for key, value in top.items():
        old = out.get(key)
        if isinstance(value, dict) and isinstance(old, dict) and not (
                "type" in value and "type" in old and value["type"] != old["type"]):
            out[key] = merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _read_yaml(path: str) -> Dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as f:
            raw = yaml.safe_load(f)
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: invalid YAML: {err}") from None
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping of sections, got {type(raw).__name__}")
    return raw


def load_yaml(path: str, _chain: Tuple[str, ...] = ()) -> Dict[str, Any]:
    """A config file with its `defaults` list resolved (recursively, relative paths)."""
    real = os.path.realpath(path)
    if real in _chain:
        raise ConfigError(f"{path}: defaults include themselves ("
                          + " -> ".join(_chain + (real,)) + ")")
    raw = _read_yaml(path)
    defaults = raw.pop("defaults", None) or []
    if not isinstance(defaults, list) or not all(isinstance(d, str) for d in defaults):
        raise ConfigError(f"{path}: defaults: expected a list of file paths")
    base: Dict[str, Any] = {}
    for name in defaults:
        sub = name if os.path.isabs(name) else os.path.join(os.path.dirname(path), name)
        base = merge(base, load_yaml(sub, _chain + (real,)))
    return merge(base, raw)


def load_config(path: str, overrides: Optional[List[str]] = None) -> Config:
    raw = apply_overrides(load_yaml(path), overrides or [])
    try:
        return validate(raw)
    except ConfigError as err:
        raise ConfigError(f"{path}: {err}") from None


def load_dataset_config(path: str, overrides: Optional[List[str]] = None) -> DatasetConfig:
    """The `dataset` section of a training config, checked as training checks it (unknown
    keys are errors), without importing the task's modules (torch): for the stages before
    training (fbank, CMVN). The task's own sections are checked when training starts."""
    raw = apply_overrides(load_yaml(path), overrides or [])
    try:
        task = raw.get("task") if isinstance(raw, dict) else None
        if not isinstance(task, dict) or task.get("type") not in TASKS:
            raise ConfigError(f"task.type: expected one of {', '.join(TASKS.names())}, got "
                              f"{task.get('type') if isinstance(task, dict) else None!r}")
        dataset = build_dataclass(DatasetConfig, raw.get("dataset"), "dataset")
        _check_dataset(dataset)
    except ConfigError as err:
        raise ConfigError(f"{path}: {err}") from None
    return dataset


def to_dict(cfg: Config) -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    for name in cfg.sections:
        value = getattr(cfg, name)
        if name == "optim":
            value = {k: dataclasses.asdict(v) for k, v in value.items()}
            if len(value) == 1 and next(iter(value)) == "model":
                value = next(iter(value.values()))
        elif dataclasses.is_dataclass(value):
            value = dataclasses.asdict(value)
        out[name] = value
    return out


def from_dict(raw: Dict[str, Any]) -> Config:
    return validate(copy.deepcopy(raw))


# --------------------------------------------------------------------------- secrets

SECRET_KEY = re.compile(r"(token|password|passwd|secret|api_?key|credential)", re.IGNORECASE)
REDACTED = "<redacted>"
_REDACTED_HASH = re.compile(r"^<redacted:([0-9a-f]{16}):([0-9a-f]{16})>$")


def secret_env_values() -> set:
    """Values of environment variables whose names look secret (tokens, passwords...)."""
    return {v for k, v in os.environ.items() if SECRET_KEY.search(k) and len(v) >= 4}


def is_secret_key(key: str) -> bool:
    return bool(SECRET_KEY.search(str(key)))


def _digest(salt: str, value: str) -> str:
    return hashlib.sha256((salt + value).encode("utf-8")).hexdigest()[:16]


def redact(obj, salt: Optional[str] = None):
    """Copy of a nested mapping fit for writing: values under secret-named keys, and values
    that equal a secret environment variable's value as a whole, become
    `<redacted:salt:digest>` (a salted hash: a rerun can tell whether the value changed,
    a reader cannot recover it). Nothing else changes, so later stages read the same paths."""
    env_secrets = secret_env_values()
    salt = salt or secrets.token_hex(8)

    def hide(value):
        return f"<redacted:{salt}:{_digest(salt, str(value))}>"

    def walk(node, key=""):
        if isinstance(node, dict):
            return {k: (hide(v) if is_secret_key(k) and v not in (None, "") and not
                        is_redacted(v) else walk(v, k)) for k, v in node.items()}
        if isinstance(node, list):
            return [walk(v, key) for v in node]
        if isinstance(node, str) and node in env_secrets:
            return hide(node)
        return node
    return walk(obj)


def is_redacted(value) -> bool:
    return isinstance(value, str) and (value == REDACTED or bool(_REDACTED_HASH.match(value)))


def same_value(saved, current) -> bool:
    """Compares a value read back from a redacted file with the live one."""
    if isinstance(saved, str):
        m = _REDACTED_HASH.match(saved)
        if m:
            return isinstance(current, str) and _digest(m.group(1), current) == m.group(2) \
                or saved == current
    return saved == current


def dump_config(cfg: Config, path: str) -> None:
    from toolkit.fileio import atomic_write_text
    atomic_write_text(path, yaml.safe_dump(redact(to_dict(cfg)), sort_keys=False))


def scrub_text(text: str, extra: Iterable[str] = ()) -> str:
    """`text` with every known secret (environment, registered config secrets, `extra`)
    replaced."""
    from toolkit.logging_utils import known_secrets
    for secret in known_secrets() | {s for s in extra if s and len(s) >= 4}:
        text = text.replace(secret, REDACTED)
    return text


def config_secrets(cfg: "Config") -> List[str]:
    """Values under secret-named keys of a validated config."""
    out: List[str] = []

    def walk(node):
        if isinstance(node, dict):
            for k, v in node.items():
                if is_secret_key(k) and isinstance(v, str) and v:
                    out.append(v)
                else:
                    walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)
    walk(to_dict(cfg))
    return out


# --------------------------------------------------------------------------- reference

def field_docs(cls) -> Dict[str, str]:
    """One line per dataclass field, read from the comment on the field's line or the
    comment lines just above it, across the class's bases."""
    docs: Dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        own = klass.__dict__.get("__annotations__", {})
        if not own:
            continue
        try:
            source = inspect.getsource(klass)
        except (OSError, TypeError):
            continue
        docs.update(_parse_field_comments(source, set(own)))
    return docs


def _parse_field_comments(source: str, names: set) -> Dict[str, str]:
    lines = source.splitlines()
    # Only the class's own body: skip the lines of nested classes/functions.
    body_indent = None
    out: Dict[str, str] = {}
    pending: List[str] = []
    comments = {}
    try:
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            if tok.type == tokenize.COMMENT:
                comments[tok.start[0]] = tok.string.lstrip("#").strip()
    except (tokenize.TokenError, IndentationError):
        pass
    first = next((i for i, l in enumerate(lines) if l.lstrip().startswith("class ")), 0)
    for lineno, line in enumerate(lines[first + 1:], first + 2):
        stripped = line.strip()
        if not stripped:
            pending = []
            continue
        indent = len(line) - len(line.lstrip())
        if body_indent is None and not stripped.startswith(('"""', "'''", "#", "@")):
            body_indent = indent
        if stripped.startswith("#"):
            if body_indent is None or indent == body_indent:
                pending.append(comments.get(lineno, stripped.lstrip("#").strip()))
            continue
        m = re.match(r"(\w+)\s*:", stripped)
        if m and indent == body_indent and m.group(1) in names:
            trailing = comments.get(lineno)
            text = trailing or " ".join(pending)
            if text:
                out[m.group(1)] = text
        pending = []
    return out


def _default_text(f: dataclasses.Field) -> str:
    if f.default is not dataclasses.MISSING:
        value = f.default
    elif f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        value = f.default_factory()  # type: ignore[misc]
    else:
        return "(required)"
    if isinstance(value, Ramp):
        return f"{value.final:g}" if value.is_constant else str(dataclasses.asdict(value))
    if dataclasses.is_dataclass(value):
        return "(section)"
    if value == "":
        return '""'
    return yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("...").strip()


def reference_rows(cls, path: str) -> List[Tuple[str, str, str, str]]:
    """(key path, type, default, doc) for every field of `cls`, nested sections expanded."""
    rows = []
    hints = typing.get_type_hints(cls)
    docs = field_docs(cls)
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        tp = hints[f.name]
        key = f"{path}.{f.name}" if path else f.name
        if dataclasses.is_dataclass(tp) and tp is not Ramp:
            rows.extend(reference_rows(tp, key))
            continue
        item = (typing.get_args(tp) or (None,))[0]
        if typing.get_origin(tp) in (list, List) and dataclasses.is_dataclass(item):
            # A list of sections: the list itself, then the keys of each item.
            rows.append((key, "list", "[]", docs.get(f.name, "")))
            rows.extend(reference_rows(item, key + "[]"))
            continue
        type_text = "number or ramp" if tp is Ramp else _type_name(tp).replace("typing.", "")
        rows.append((key, type_text, _default_text(f), docs.get(f.name, "")))
    return rows


def _flat_defaults(node: Dict[str, Any], path: str) -> List[Tuple[str, Any]]:
    out: List[Tuple[str, Any]] = []
    for key, value in node.items():
        if isinstance(value, dict):
            out.extend(_flat_defaults(value, f"{path}.{key}"))
        else:
            out.append((f"{path}.{key}", value))
    return out


def config_reference(tasks: Iterable[type]) -> str:
    """Markdown listing every key of every section of every task (docs/config_reference.md)."""
    out = ["# Configuration reference", "",
           "Generated by `python -m toolkit.bin.train --print-config-reference`; a test keeps "
           "it in sync with the code. Every section rejects keys not listed here.", ""]

    def table(title: str, rows) -> None:
        out.extend([f"### {title}", "", "| key | type | default | what it does |",
                    "|---|---|---|---|"])
        for key, tp, default, doc in rows:
            out.append(f"| `{key}` | {tp} | `{default}` | {doc.replace('|', '/')} |")
        out.append("")

    out.extend(["## Generic sections", ""])
    table("dataset", reference_rows(DatasetConfig, "dataset"))
    table("optim (one optimizer, or one such section per optimizer name)",
          reference_rows(OptimConfig, "optim"))
    table("training", reference_rows(TrainingConfig, "training"))
    table("ramp (any `number or ramp` key)", reference_rows(Ramp, "<key>"))
    for task in sorted(tasks, key=lambda t: t.name):
        out.extend([f"## Task `{task.name}`", "",
                    f"Optimizers: {', '.join(f'`{n}`' for n in task.optimizers)}.", ""])
        overrides = _flat_defaults(getattr(task, "optim_defaults", None) or {}, "optim")
        if overrides:
            out.extend(["Defaults this task sets over the optim table: "
                        + ", ".join(f"`{k}={v}`" for k, v in overrides) + ".", ""])
        table("task", reference_rows(task.Config, "task"))
        for name, section in task.sections.items():
            if section.registry is not None:
                for type_name in section.registry.names():
                    table(f"{name} (type: {type_name})",
                          reference_rows(section.registry.get(type_name).Config, name))
            else:
                table(name, reference_rows(section.schema, name))
    return "\n".join(out).rstrip() + "\n"
