"""Every binary answers `python -m toolkit.bin.NAME --help` with a usage text."""
import os
import subprocess
import sys

import pytest

BIN_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "toolkit", "bin")
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


@pytest.mark.parametrize("name,names", [("make_datalist", "DATA_DIR OUTPUT"),
                                        ("compute_feats", "DATA_LIST OUT_DIR")])
def test_odd_path_pairs_are_a_usage_error(tmp_path, name, names):
    args = [str(tmp_path / "a"), str(tmp_path / "b"), str(tmp_path / "c")]
    if name == "make_datalist":
        args += ["--inventory", str(tmp_path / "keywords.txt")]
    result = subprocess.run([sys.executable, "-m", f"toolkit.bin.{name}", *args],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert f"expected {names} pairs, got an odd number of paths (3)" in result.stderr
    assert not any(p.exists() for p in (tmp_path / "b", tmp_path / "c"))
