"""One configuration schema for every recipe and every task.

A YAML file has the sections `task` (its `type` picks a registered task: kws, speaker,
codec), `dataset`, `optim`, `training`, plus the sections that task owns (`model`,
`loss`, `head`, `discriminator`, ...). Every key is checked against dataclasses: unknown
keys and wrong types are errors that name the full key path.

The modules, by concern (each imports only those above it; none imports a task):

- `ramps`: `Ramp`, a value over training progress (a number, or initial/final/start/end);
- `schema`: the generic sections' dataclasses, the validated `Config`, `Section` (how a
  task declares the sections it owns);
- `secrets`: redaction of secret values in files and logs;
- `compose`: YAML files with `defaults:` lists, `key.path=value` overrides, config.yaml;
- `validate`: raw mappings checked against the schema, the generic value checks;
- `resolve`: a whole config through the task its `task.type` names (TASKS): `validate`,
  `load_config`, `resolve_config` (with the values the task derives from its data),
  `config_from_dict`, `load_dataset_config`;
- `reference`: docs/config_reference.md.

Which sections a config has, the task's optimizer defaults and checks, and the values it
derives from its data are hooks of the task contract (toolkit.task.Task); `resolve` calls
them. This package re-exports the names other modules use."""
from toolkit.config.compose import (apply_overrides, dump_config, load_yaml, merge,
                                    parse_override, read_yaml, set_values)
from toolkit.config.ramps import RAMP_SHAPES, RAMP_UNITS, Ramp
from toolkit.config.reference import config_reference, field_docs, reference_rows
from toolkit.config.schema import (GENERIC_SECTIONS, Config, DatasetConfig, FeatureConfig,
                                   NoiseConfig, OptimConfig, OptimizerConfigs, ReverbConfig,
                                   SamplerConfig, SchedulerConfig, Section, SpecAugConfig,
                                   TaskConfigBase, TrainingConfig, VoicePerturbConfig,
                                   dataset_config_from_metadata, to_dict)
from toolkit.config.resolve import (TASKS, config_from_dict, load_config, load_dataset_config,
                                    resolve_config, task_class, validate)
from toolkit.config.secrets import (REDACTED, config_secrets, is_redacted, is_secret_key,
                                    known_secrets, redact, register_secrets, same_value,
                                    scrub_text, secret_env_values)
from toolkit.config.validate import (build_dataclass, build_optim, build_poly, build_section,
                                     check_dataset, check_generic, coerce)
from toolkit.errors import ConfigError

__all__ = [
    "ConfigError", "Ramp", "RAMP_SHAPES", "RAMP_UNITS",
    "Config", "OptimizerConfigs", "GENERIC_SECTIONS", "Section", "TaskConfigBase",
    "DatasetConfig", "FeatureConfig", "NoiseConfig", "ReverbConfig", "SamplerConfig",
    "SpecAugConfig", "VoicePerturbConfig", "OptimConfig", "SchedulerConfig", "TrainingConfig",
    "to_dict", "dataset_config_from_metadata",
    "apply_overrides", "set_values", "parse_override", "merge", "read_yaml", "load_yaml",
    "dump_config",
    "REDACTED", "redact", "is_redacted", "same_value", "is_secret_key", "secret_env_values",
    "register_secrets", "known_secrets", "scrub_text", "config_secrets",
    "build_dataclass", "build_poly", "build_section", "build_optim", "coerce",
    "check_generic", "check_dataset",
    "config_reference", "field_docs", "reference_rows",
    "TASKS", "task_class", "validate", "resolve_config", "load_config", "config_from_dict",
    "load_dataset_config",
]
