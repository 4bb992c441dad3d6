"""Checking raw YAML against the schema: every key is checked against dataclasses (unknown
keys and wrong types are errors that name the full key path); a section whose `type`
selects a registered class (model, loss, scheduler) is checked by that class's own
Config dataclass; then the generic sections' values. Assembling a whole config for a
task (which sections, whose optimizer defaults, the task's own checks) is
toolkit.config.resolve's, through the hooks of the task contract (toolkit.task.Task)."""
import copy
import dataclasses
import typing
from typing import Any, Dict, List, Optional, Tuple

from toolkit.config.compose import merge
from toolkit.config.ramps import Ramp
from toolkit.config.schema import Config, DatasetConfig, OptimConfig, OptimizerConfigs, Section
from toolkit.config.secrets import is_secret_key, secret_text
from toolkit.errors import ConfigError
from toolkit.registry import Registry


def type_name(tp) -> str:
    return getattr(tp, "__name__", str(tp))


def coerce(value, tp, path: str):
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
        return coerce(value, args[0], path)
    if dataclasses.is_dataclass(tp):
        return build_dataclass(tp, value, path)
    if origin in (list, List):
        (item_tp,) = typing.get_args(tp) or (Any,)
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{path}: expected a list, got {value!r}")
        return [coerce(v, item_tp, f"{path}[{i}]") for i, v in enumerate(value)]
    if origin in (dict, Dict):
        if not isinstance(value, dict):
            raise ConfigError(f"{path}: expected a mapping, got {value!r}")
        args = typing.get_args(tp)
        if len(args) == 2 and args[1] is not Any:
            return {str(k): coerce(v, args[1], f"{path}.{k}") for k, v in value.items()}
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
        if is_secret_key(path.rsplit(".", 1)[-1]):
            return secret_text(value, path)
        raise ConfigError(f"{path}: expected a string, got {value!r}")
    raise ConfigError(f"{path}: unsupported schema type {type_name(tp)}")


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
            kwargs[name] = coerce(raw[name], hints[name], f"{path}.{name}" if path else name)
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


def build_section(raw, section: Section, path: str):
    """A task-owned section (toolkit.task.Task.sections) from its raw mapping."""
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


def build_optim(raw, names: Tuple[str, ...],
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


def _check_range_pair(value: List[float], path: str) -> None:
    if value and (len(value) != 2 or value[0] > value[1]):
        raise ConfigError(f"{path}: expected [low, high], got {value}")


def check_generic(cfg: Config) -> None:
    """Value checks of the generic sections (training, optim, dataset) of a built config."""
    t = cfg.training
    if t.amp_dtype not in ("float16", "bfloat16"):
        raise ConfigError(f"training.amp_dtype: expected float16 or bfloat16, got {t.amp_dtype!r}")
    if t.accum_grad < 1:
        raise ConfigError("training.accum_grad must be >= 1")
    if t.grad_clip <= 0:
        raise ConfigError("training.grad_clip must be > 0")
    if t.max_epoch < 0 or t.max_steps < 0:
        raise ConfigError("training.max_epoch and training.max_steps must be >= 0 (0: not given)")
    if t.log_interval < 1:
        raise ConfigError(f"training.log_interval must be >= 1, got {t.log_interval}")
    if t.keep_last < 1:
        raise ConfigError(f"training.keep_last must be >= 1 (the newest checkpoint is what a "
                          f"rerun resumes from), got {t.keep_last}")
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
    check_dataset(cfg.dataset)


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


def check_dataset(d: DatasetConfig) -> None:
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
    # Here, not at the top: the feature types import numpy and kaldi-native-fbank, which
    # loading a config for the stages before training does not need otherwise.
    from toolkit.data.features import FEATURES
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
    _check_range_pair(d.posterior_temperature, "dataset.posterior_temperature")
    if d.posterior_temperature:
        if not 1.0 <= d.posterior_temperature[0] <= d.posterior_temperature[1] <= 4.0:
            raise ConfigError("dataset.posterior_temperature: temperatures must lie in "
                              f"[1.0, 4.0], got {d.posterior_temperature}")
        if (d.feature.type, d.feature.frontend_output) != ("phone_frontend", "posteriors"):
            raise ConfigError("dataset.posterior_temperature flattens log phone posteriors: it "
                              "needs dataset.feature.type phone_frontend with frontend_output "
                              f"posteriors, got {d.feature.type}"
                              + (f" ({d.feature.frontend_output})"
                                 if d.feature.type == "phone_frontend" else ""))
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
    wh = d.whisper
    if not 0.0 <= wh.prob <= 1.0:
        raise ConfigError(f"dataset.whisper.prob must be in [0, 1], got {wh.prob}")
    if len(wh.breath) != 2 or not 0.0 < wh.breath[0] <= wh.breath[1] <= 1.0:
        raise ConfigError(f"dataset.whisper.breath: expected [low, high] in (0, 1], "
                          f"got {wh.breath}")
    if len(d.noise.snr_db) != 2:
        raise ConfigError("dataset.noise.snr_db: expected [low, high]")
    for kind, pair in d.noise.snr_db_by_kind.items():
        if len(pair) != 2 or pair[0] > pair[1]:
            raise ConfigError(f"dataset.noise.snr_db_by_kind.{kind}: expected [low, high]")
    for name, ramp in (("noise.prob", d.noise.prob), ("reverb.prob", d.reverb.prob)):
        if not (0.0 <= ramp.initial <= 1.0 and 0.0 <= ramp.final <= 1.0):
            raise ConfigError(f"dataset.{name}: probabilities lie in [0, 1]")
