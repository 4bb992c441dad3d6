"""Optional packages of codec evaluation (the `codec` extra of setup.py, installed by
tools/install.sh): a missing one is an expected error that names what needs it and the fix,
so an evaluation table is refused rather than filled with gaps."""
import importlib
import re
from types import ModuleType

from toolkit.errors import UserError


class MissingPackageError(UserError, ImportError):
    """A metric or baseline whose package is not installed."""


def import_optional(module: str, requirement: str, what: str) -> ModuleType:
    """Imports `module`; when it cannot be imported, raises MissingPackageError naming
    `what` needs it and how to install `requirement`."""
    try:
        return importlib.import_module(module)
    except ImportError as err:
        shell = requirement if re.fullmatch(r"[\w.-]+", requirement) else f"'{requirement}'"
        raise MissingPackageError(
            f"{what} needs the {requirement} package, which cannot be imported ({err}): "
            f"rerun bash tools/install.sh (the codec extra), or pip install {shell}"
        ) from None
