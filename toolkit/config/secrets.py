"""Secrets: values under secret-named keys (tokens, passwords...) of a config, values of
environment variables that hold credentials, and values registered at run time never reach
a file, a log line or a tracking service: config.yaml holds a salted hash of each (a rerun
can tell whether it changed), logs and error lines replace them, and what goes to W&B holds
the fixed `<redacted>`. Both the config writer and the log filter (toolkit.logging_utils)
use this module; it imports neither."""
import hashlib
import os
import re
from secrets import token_hex
from typing import Iterable, List, Optional

import yaml

from toolkit.config.schema import Config, to_dict
from toolkit.errors import ConfigError

SECRET_KEY = re.compile(r"(token|password|passwd|secret|api_?key|credential)", re.IGNORECASE)
# Environment variables that hold credentials: names that END in a credential word. The
# ones the toolkit and its libraries read (HF_TOKEN, HUGGING_FACE_HUB_TOKEN, WANDB_API_KEY,
# TOOLKIT_DATA_TOKEN) are of this form, as are AWS_SECRET_ACCESS_KEY, GITHUB_TOKEN or
# PGPASSWORD; a credential word elsewhere in a name says nothing about its value
# (TOKENIZERS_PARALLELISM=false, MAX_TOKENS_PER_BATCH, AWS_ACCESS_KEY_ID is an identifier).
CREDENTIAL_ENV_NAME = re.compile(
    r"(TOKEN|PASSWORD|PASSWD|SECRET|API_?KEY|(SECRET|ACCESS|PRIVATE)_?KEY)$", re.IGNORECASE)
# A value is hidden inside other text only from this length on: every credential the toolkit
# handles is far longer (hub tokens 37 characters, W&B keys 40), while the flags, numbers
# and words such variables hold when they are no secret (false, 1, none, offline) are
# shorter, and replacing those wherever they occur mangled unrelated text
# (/data/false_positives). A shorter secret is still hidden where it stands as a whole value.
MIN_SECRET_CHARS = 8
REDACTED = "<redacted>"
_REDACTED_HASH = re.compile(r"^<redacted:([0-9a-f]{16}):([0-9a-f]{16})>$")


def is_credential_env(name: str) -> bool:
    return bool(CREDENTIAL_ENV_NAME.search(name))


def hideable(value) -> bool:
    """Whether a secret value can be replaced wherever it occurs in text without mangling
    text that merely contains it."""
    return isinstance(value, str) and len(value) >= MIN_SECRET_CHARS


def secret_env_values() -> set:
    """Values of the environment variables that hold credentials (see CREDENTIAL_ENV_NAME),
    long enough to be one (see MIN_SECRET_CHARS)."""
    return {v for k, v in os.environ.items() if is_credential_env(k) and hideable(v)}


def is_secret_key(key: str) -> bool:
    return bool(SECRET_KEY.search(str(key)))


# ----------------------------------------------------------------- values as written

_YAML_STR = "tag:yaml.org,2002:str"
_YAML_NULL = "tag:yaml.org,2002:null"


def secret_text(value, path: str) -> str:
    """The string a value under a secret-named key stands for: any scalar is a valid
    secret (a numeric token), kept as text. An error names the key, never the value."""
    if isinstance(value, str):
        return value
    if isinstance(value, (int, float, bool)):
        return str(value)
    raise ConfigError(f"{path}: expected a string, got a {type(value).__name__}")


def _as_text(node) -> None:
    """A scalar YAML would read as a number, date or boolean stays the text written (a
    numeric token keeps its leading zeros and every digit)."""
    if isinstance(node, yaml.ScalarNode) and node.tag not in (_YAML_STR, _YAML_NULL):
        node.tag = _YAML_STR


class SecretTextLoader(yaml.SafeLoader):
    """yaml.safe_load, except that values under secret-named keys stay the text written."""

    def construct_mapping(self, node, deep=False):
        for key_node, value_node in node.value:
            if isinstance(key_node, yaml.ScalarNode) and is_secret_key(key_node.value):
                _as_text(value_node)
        return super().construct_mapping(node, deep)


def secret_override_value(text: str):
    """The value of a `key=text` override whose key is secret-named: a scalar is the text
    itself (no YAML typing), anything else is parsed as usual. Raises yaml.YAMLError."""
    node = yaml.compose(text, Loader=yaml.SafeLoader)
    if isinstance(node, yaml.ScalarNode):
        return "" if node.tag == _YAML_NULL else node.value
    return yaml.load(text, Loader=SecretTextLoader)


def _digest(salt: str, value: str) -> str:
    return hashlib.sha256((salt + value).encode("utf-8")).hexdigest()[:16]


def _redact_tree(obj, hide, text):
    """Copy of a nested mapping: `hide(value)` for each non-empty value under a secret-named
    key, `text(string)` for every other string."""
    def walk(node):
        if isinstance(node, dict):
            return {k: (hide(v) if is_secret_key(k) and v not in (None, "") else walk(v))
                    for k, v in node.items()}
        if isinstance(node, list):
            return [walk(v) for v in node]
        return text(node) if isinstance(node, str) else node
    return walk(obj)


def redact(obj, salt: Optional[str] = None):
    """Copy of a nested mapping fit for writing to a file the toolkit reads back: values
    under secret-named keys, and values that equal a credential environment variable's
    value as a whole, become `<redacted:salt:digest>` (a salted hash: a rerun can tell
    whether the value changed). Nothing else changes, so later stages read the same paths."""
    env_secrets = secret_env_values()
    salt = salt or token_hex(8)

    def hide(value):
        return value if is_redacted(value) else f"<redacted:{salt}:{_digest(salt, str(value))}>"
    return _redact_tree(obj, hide, lambda s: hide(s) if s in env_secrets else s)


def redact_shared(obj):
    """Copy of a nested mapping for a service outside this machine (W&B): values under
    secret-named keys become the fixed `<redacted>`, and every known secret inside any other
    string is replaced as in logs. No hash: a weak secret falls to a guess against a salted
    digest shown with its salt, and nothing reads this copy back."""
    return _redact_tree(obj, lambda value: REDACTED, scrub_text)


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


_REGISTERED: set = set()


def register_secrets(values) -> None:
    """Secret values from the configuration (e.g. dataset.auth_token) that no log line
    may show, next to the credential environment variables."""
    _REGISTERED.update(v for v in values if hideable(v))


def known_secrets() -> set:
    """Every value to hide inside text: credential environment variables and registered
    values, each long enough to be hidden without mangling other text."""
    return secret_env_values() | _REGISTERED


def scrub_text(text: str, extra: Iterable[str] = ()) -> str:
    """`text` with every known secret (environment, registered config secrets, `extra`)
    replaced."""
    for secret in known_secrets() | {s for s in extra if hideable(s)}:
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
