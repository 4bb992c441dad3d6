"""How a raw configuration becomes the validated Config every binary uses: the task its
`task.type` names (the TASKS registry), its sections built and checked, and for training
the values the task derives from its data. The hooks called here (`Config`, `sections`,
`optimizers`, `optim_defaults`, `check_config`, `inputs`, `needs_inventory`,
`derived_values`) are declared, with their meaning, on toolkit.task.Task; this module only
reads them off the registered class, so it needs no import of the contract."""
import copy
from typing import Any, Dict, List, Optional, Tuple

from toolkit.config.compose import apply_overrides, load_yaml, set_values
from toolkit.config.schema import GENERIC_SECTIONS, Config, DatasetConfig, Section, TrainingConfig
from toolkit.config.validate import (build_dataclass, build_optim, build_section,
                                     check_dataset, check_generic)
from toolkit.data.inventory import read_inventory
from toolkit.errors import ConfigError
from toolkit.registry import Registry

__all__ = ["TASKS", "task_class", "validate", "resolve_config", "load_config",
           "config_from_dict", "load_dataset_config"]

# Task classes by `task.type`, filled when task modules are imported (toolkit.tasks,
# TOOLKIT_PLUGINS; `@TASKS.register` of toolkit.task); generic code only looks names up.
TASKS: Registry = Registry("task")


def task_class(raw: Dict[str, Any]) -> type:
    """The registered task a raw config's `task.type` names."""
    task_raw = raw.get("task") if isinstance(raw, dict) else None
    if not isinstance(task_raw, dict) or not task_raw.get("type"):
        raise ConfigError("task.type is required (one of: " + (", ".join(TASKS.names()) or
                          "no task registered: import toolkit.tasks") + ")")
    if task_raw["type"] not in TASKS:
        raise ConfigError(f"task.type: unknown '{task_raw['type']}' (one of: "
                          f"{', '.join(TASKS.names())})")
    return TASKS.get(task_raw["type"])


def validate(raw: Dict[str, Any]) -> Config:
    """A raw config (defaults and overrides applied) -> the validated Config: the task's
    `task` section, the generic sections, the task's own sections, its optimizers over
    `optim_defaults`; then the generic value checks and the task's `check_config`."""
    if not isinstance(raw, dict):
        raise ConfigError("the configuration must be a mapping with sections task, dataset, "
                          "optim, training and the task's own")
    raw = dict(raw)
    raw.pop("defaults", None)
    task_cls = task_class(raw)
    task_raw = raw.pop("task")
    sections: Dict[str, Any] = {"task": build_dataclass(task_cls.Config, task_raw, "task")}
    own: Dict[str, Section] = dict(task_cls.sections)
    allowed = set(GENERIC_SECTIONS) | set(own)
    unknown = sorted(set(raw) - allowed)
    if unknown:
        raise ConfigError(f"unknown section(s): {', '.join(unknown)} (task {task_cls.name} "
                          f"has: {', '.join(sorted(allowed))})")
    sections["dataset"] = build_dataclass(DatasetConfig, raw.get("dataset"), "dataset")
    for name, section in own.items():
        if name not in raw and not section.required:
            sections[name] = None
            continue
        sections[name] = build_section(raw.get(name), section, name)
    sections["optim"] = build_optim(raw.get("optim"), tuple(task_cls.optimizers),
                                    task_cls.optim_defaults)
    sections["training"] = build_dataclass(TrainingConfig, raw.get("training"), "training")
    cfg = Config(sections)
    check_generic(cfg)
    task_cls.check_config(cfg)
    return cfg


def resolve_config(raw: Dict[str, Any], inputs: Optional[Dict[str, str]] = None,
                   source: str = "", inventory: Optional[List[str]] = None
                   ) -> Tuple[Config, Optional[List[str]]]:
    """The config training uses, and the class inventory: `raw` (file, defaults and
    overrides) plus the values the task derives from its data (`Task.derived_values`),
    validated once with them. The draft it derives from is validated first, so a mistake
    in the file is reported as such. `inputs`: the paths given on the command line, the
    task's declared inputs by name and `inventory` (required when `needs_inventory`); an
    input the task does not declare is an error. `source` (the file) prefixes validation
    errors. `inventory`: the class list itself, instead of inputs["inventory"]'s file."""
    inputs = {k: v for k, v in (inputs or {}).items() if v}
    task_cls = _with_source(source, task_class, raw)
    declared = {i.name for i in task_cls.inputs} | {"inventory"}
    for name in sorted(set(inputs) - declared):
        takes = ", ".join(f"--{i.name}" for i in task_cls.inputs) or "none"
        raise ConfigError(f"--{name}: task {task_cls.name} takes no such input (its inputs: "
                          f"{takes})")
    draft = _with_source(source, validate, raw)
    if inventory is None and inputs.get("inventory"):
        try:
            inventory = read_inventory(inputs["inventory"])
        except ValueError as err:
            raise ConfigError(f"--inventory: {err}") from None
    if inventory is None and task_cls.needs_inventory:
        raise ConfigError(f"--inventory is required for task {task_cls.name} (the class list, "
                          "one name per line)")
    values = task_cls.derived_values(draft, inventory, inputs)
    if not values:
        return draft, inventory
    return _with_source(source, validate, set_values(raw, values, "derived value")), inventory


def _with_source(source: str, function, *args):
    try:
        return function(*args)
    except ConfigError as err:
        raise ConfigError(f"{source}: {err}" if source else str(err)) from None


def load_config(path: str, overrides: Optional[List[str]] = None) -> Config:
    """A config file (with its defaults) and `key.path=value` overrides, validated (no
    derived values: for reading a recipe's config, not for training)."""
    return _with_source(path, validate, apply_overrides(load_yaml(path), overrides or []))


def config_from_dict(raw: Dict[str, Any]) -> Config:
    """A Config from the mapping an experiment recorded (config.yaml, derived values
    included), validated as it was."""
    return validate(copy.deepcopy(raw))


def load_dataset_config(path: str, overrides: Optional[List[str]] = None) -> DatasetConfig:
    """The `dataset` section of a training config, checked as training checks it (unknown
    keys are errors), without importing the task's modules (torch): for the stages before
    training (fbank, CMVN). The task's own sections are checked when training starts."""
    raw = apply_overrides(load_yaml(path), overrides or [])
    try:
        task_raw = raw.get("task") if isinstance(raw, dict) else None
        named = task_raw.get("type") if isinstance(task_raw, dict) else None
        if named not in TASKS:
            raise ConfigError(f"task.type: expected one of {', '.join(TASKS.names())}, got "
                              f"{named!r}")
        dataset = build_dataclass(DatasetConfig, raw.get("dataset"), "dataset")
        check_dataset(dataset)
    except ConfigError as err:
        raise ConfigError(f"{path}: {err}") from None
    return dataset
