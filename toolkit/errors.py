"""Expected errors: a problem with the user's input, data or machine, reported by every
binary as one `error:` line with what to do, and exit status 2. Anything else is a bug
and keeps its traceback."""
import functools
import importlib
import logging
import re
import sys
from types import ModuleType


class UserError(Exception):
    """Base of expected errors. The message names the file, line or key at fault and,
    where it helps, what to do."""


class ConfigError(UserError, ValueError):
    """A configuration problem; the message names the key path (and file when known)."""


class DataError(UserError, ValueError):
    """A malformed data dir, data list, inventory or other input file."""


class MissingInputError(UserError, FileNotFoundError):
    """An input a stage needs does not exist (usually: an earlier stage has not run)."""


class DeviceError(UserError, RuntimeError):
    """The requested device or launch setup is not available."""


class MissingPackageError(UserError, ImportError):
    """An optional package (an extra of setup.py) that a metric, codec or channel needs is
    not installed."""


def import_optional(module: str, requirement: str, what: str,
                    extra: str = "codec") -> ModuleType:
    """Imports `module`; when it cannot be imported, raises MissingPackageError naming
    `what` needs it and how to install `requirement` (tools/install.sh installs `extra`)."""
    try:
        return importlib.import_module(module)
    except ImportError as err:
        shell = requirement if re.fullmatch(r"[\w.-]+", requirement) else f"'{requirement}'"
        raise MissingPackageError(
            f"{what} needs the {requirement} package, which cannot be imported ({err}): "
            f"rerun bash tools/install.sh (it installs the {extra} extra: pip install -e "
            f"'.[{extra}]'), or pip install {shell}"
        ) from None


def report(err: BaseException) -> int:
    """Prints `err` as one line (also into the log, when logging is set up); returns 2."""
    text = str(err)
    logging.getLogger("toolkit").debug("expected error", exc_info=err)
    print(f"error: {text}", file=sys.stderr, flush=True)
    return 2


def cli(main):
    """Decorates a binary's main(argv=None): UserError (and a missing file opened by the
    user's path) become one line and exit status 2."""
    @functools.wraps(main)
    def run(argv=None):
        try:
            return main(argv)
        except UserError as err:
            return report(err)
        except FileNotFoundError as err:
            if err.filename is None:
                raise
            return report(MissingInputError(f"{err.filename}: {err.strerror}"))
        except KeyboardInterrupt:
            print("interrupted", file=sys.stderr)
            return 130
    return run
