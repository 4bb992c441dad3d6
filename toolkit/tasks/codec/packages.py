"""Optional packages of codec evaluation (the `codec` extra of setup.py, installed by
tools/install.sh): a missing one is an expected error that names what needs it and the fix,
so an evaluation table is refused rather than filled with gaps. The error and the import
live in toolkit.errors, where generic code (toolkit.data.speech_codecs) reaches them too."""
from toolkit.errors import MissingPackageError, import_optional

__all__ = ["MissingPackageError", "import_optional"]
