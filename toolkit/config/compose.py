"""Composing a config: a YAML file may start from others, `defaults: [../../conf/model/
ecapa.yaml, ...]` (paths relative to the file), merged in order with the file's own keys
on top; then the command-line overrides (`training.max_epoch=5`) and the values a task
derives from its data go on top; the result is validated once
(toolkit.config.resolve.validate) and recorded in the experiment's `config.yaml` (dump_config)."""
import copy
import os
import re
from typing import Any, Dict, List, Tuple

import yaml

from toolkit.config.schema import Config, to_dict
from toolkit.config.secrets import (REDACTED, SecretTextLoader, is_secret_key, redact,
                                    secret_override_value)
from toolkit.errors import ConfigError
from toolkit.fileio import atomic_write_text


def parse_override(text: str):
    """`a.b.c=value` -> (['a','b','c'], parsed value). Values are YAML scalars/lists;
    under a secret-named key the text itself, never shown in an error."""
    if "=" not in text:
        raise ConfigError(f"override '{text}': expected key.path=value")
    key, value = text.split("=", 1)
    secret = is_secret_key(key.rsplit(".", 1)[-1])
    shown = f"{key}={REDACTED}" if secret else text
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*", key):
        raise ConfigError(f"override '{shown}': bad key path '{key}'")
    try:
        if value == "":
            parsed = ""
        elif secret:
            parsed = secret_override_value(value)
        else:
            parsed = yaml.load(value, Loader=SecretTextLoader)
    except yaml.YAMLError as err:
        raise ConfigError(f"override '{shown}': cannot parse value"
                          + ("" if secret else f": {err}")) from None
    return key.split("."), parsed


def apply_overrides(raw: Dict[str, Any], overrides: List[str]) -> Dict[str, Any]:
    """A copy of `raw` with `key.path=value` texts (YAML values) set."""
    raw = copy.deepcopy(raw)
    for text in overrides:
        keys, value = parse_override(text)
        shown = f"{'.'.join(keys)}={REDACTED}" if is_secret_key(keys[-1]) else text
        _set(raw, keys, value, f"override '{shown}'")
    return raw


def set_values(raw: Dict[str, Any], values: Dict[str, Any], what: str = "") -> Dict[str, Any]:
    """A copy of `raw` with each `key.path` of `values` set to its value as it is (no YAML
    parsing: a file path stays the string it is). `what` names the source in errors."""
    raw = copy.deepcopy(raw)
    for key, value in values.items():
        _set(raw, key.split("."), copy.deepcopy(value), f"{what or 'value'} {key}")
    return raw


def _set(raw: Dict[str, Any], keys: List[str], value, where: str) -> None:
    node = raw
    for k in keys[:-1]:
        child = node.get(k)
        if child is None:
            child = node[k] = {}
        if not isinstance(child, dict):
            raise ConfigError(f"{where}: '{k}' is not a section")
        node = child
    node[keys[-1]] = value


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


def read_yaml(path: str) -> Dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as f:
            raw = yaml.load(f, Loader=SecretTextLoader)
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
    raw = read_yaml(path)
    defaults = raw.pop("defaults", None) or []
    if not isinstance(defaults, list) or not all(isinstance(d, str) for d in defaults):
        raise ConfigError(f"{path}: defaults: expected a list of file paths")
    base: Dict[str, Any] = {}
    for name in defaults:
        sub = name if os.path.isabs(name) else os.path.join(os.path.dirname(path), name)
        base = merge(base, load_yaml(sub, _chain + (real,)))
    return merge(base, raw)


def dump_config(cfg: Config, path: str) -> None:
    """config.yaml of an experiment: the validated config, secrets redacted."""
    atomic_write_text(path, yaml.safe_dump(redact(to_dict(cfg)), sort_keys=False))
