"""Every binary answers `python -m toolkit.bin.NAME --help` with a usage text."""
import os
import subprocess
import sys

import pytest

BIN_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "toolkit", "bin")
BINARIES = sorted(name[:-3] for name in os.listdir(BIN_DIR)
                  if name.endswith(".py") and name != "__init__.py")


def test_there_are_binaries():
    assert {"train", "make_datalist", "export_model", "kws", "score_kws"} <= set(BINARIES)


@pytest.mark.parametrize("name", BINARIES)
def test_help(name):
    result = subprocess.run([sys.executable, "-m", f"toolkit.bin.{name}", "--help"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-1000:]
    assert "usage:" in result.stdout and len(result.stdout) > 200
