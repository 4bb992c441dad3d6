"""Logging: one file per rank under <exp>/log/, and the console for rank 0."""
import logging
import os
import sys

from toolkit.config.secrets import REDACTED, known_secrets


class RedactSecrets(logging.Filter):
    """Replaces secret values (secret-named environment variables and registered config
    secrets) anywhere in every log record, so a token inside a URL or a message never
    reaches a log file. Logs are never read back, so redacting inside values is safe
    here, unlike in config.yaml."""

    def filter(self, record: logging.LogRecord) -> bool:
        secrets = known_secrets()
        if secrets:
            message = record.getMessage()
            for secret in secrets:
                message = message.replace(secret, REDACTED)
            record.msg, record.args = message, None
        return True


class NotOnConsole(logging.Filter):
    """Drops records logged with extra={"console": False} (already printed plainly)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return getattr(record, "console", True)


def setup_logging(log_file: str = "", console: bool = True, rank: int = 0) -> None:
    fmt = logging.Formatter(f"%(asctime)s [rank {rank}] %(levelname)s %(name)s: %(message)s",
                            "%Y-%m-%d %H:%M:%S")
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    root.setLevel(logging.INFO)
    redactor = RedactSecrets()
    if log_file:
        os.makedirs(os.path.dirname(os.path.abspath(log_file)), exist_ok=True)
        fh = logging.FileHandler(log_file)
        fh.setFormatter(fmt)
        fh.addFilter(redactor)
        root.addHandler(fh)
    # Every rank writes its own file; only rank 0 talks on the console, except for errors,
    # so that a failing rank is visible in the launcher's output too.
    sh = logging.StreamHandler(sys.stderr)
    if not console:
        sh.setLevel(logging.ERROR)
    sh.setFormatter(fmt)
    sh.addFilter(redactor)
    sh.addFilter(NotOnConsole())
    root.addHandler(sh)
