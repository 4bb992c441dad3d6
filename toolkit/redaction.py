"""What counts as a secret, shared by the configuration (config.yaml, error messages) and
the logs: values under secret-named keys, the values of secret-named environment
variables, and config values registered when training starts. It imports nothing of the
toolkit, so that both sides can use it."""
import os
import re

SECRET_KEY = re.compile(r"(token|password|passwd|secret|api_?key|credential)", re.IGNORECASE)
REDACTED = "<redacted>"

_EXTRA_SECRETS: set = set()


def is_secret_key(key: str) -> bool:
    return bool(SECRET_KEY.search(str(key)))


def secret_env_values() -> set:
    """Values of environment variables whose names look secret (tokens, passwords...)."""
    return {v for k, v in os.environ.items() if SECRET_KEY.search(k) and len(v) >= 4}


def register_secrets(values) -> None:
    """Secret values from the configuration (e.g. dataset.auth_token) that no log line
    may show, next to the secret-named environment variables."""
    _EXTRA_SECRETS.update(v for v in values if isinstance(v, str) and len(v) >= 4)


def known_secrets() -> set:
    return secret_env_values() | _EXTRA_SECRETS
