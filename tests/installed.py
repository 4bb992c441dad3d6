"""What the suite needs installed beyond the toolkit: the real TTS engines, Resemblyzer and
openWakeWord's front end. `bash tools/test.sh` installs all of them, so a test that needs one
fails (never skips) when it is missing: a skip would hide that the real engine never ran.
Only hardware (a GPU) may be skipped for."""
import importlib.util
import os

import pytest

INSTALL_HINT = "bash tools/test.sh installs it (or: {})"


def engine_missing(name: str) -> str:
    """Why the voice-bank engine `name` cannot speak here, "" when it can."""
    from toolkit.voicebank.engines import engine_class
    return engine_class(name).unavailable_reason() or ""


ENGINE_INSTALL = {"kokoro": "bash tools/install_voices.sh kokoro",
                  "festival": "bash tools/install_voices.sh festival",
                  "flite": "bash tools/install_voices.sh flite",
                  "rhvoice": "bash tools/install_voices.sh --enable-nonfree rhvoice",
                  "pico": "bash tools/install_voices.sh --enable-nonfree pico",
                  "mbrola": "bash tools/install_voices.sh --enable-nonfree mbrola",
                  "mbrola_accent": "bash tools/install_voices.sh --enable-nonfree mbrola_accent"}


def require_engine(name: str) -> None:
    why = engine_missing(name)
    if why:
        pytest.fail(f"{name} is not installed ({why}); "
                    + INSTALL_HINT.format(ENGINE_INSTALL[name]), pytrace=False)


def require_module(module: str, install: str) -> None:
    if importlib.util.find_spec(module) is None:
        pytest.fail(f"{module} is not installed; " + INSTALL_HINT.format(install),
                    pytrace=False)


def require_root_and_unshare() -> None:
    import shutil
    if os.geteuid() != 0 or not shutil.which("unshare"):
        pytest.fail("this test hides an installed binary with `unshare -m` and a bind mount: "
                    "it needs root and util-linux's unshare (CI runs as root)", pytrace=False)
