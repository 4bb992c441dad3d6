"""Every binary answers `python -m toolkit.bin.NAME --help` with a usage text."""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN_DIR = os.path.join(ROOT, "toolkit", "bin")
BINARIES = sorted(name[:-3] for name in os.listdir(BIN_DIR)
                  if name.endswith(".py") and name != "__init__.py")

# One fresh interpreter runs every command: it imports torch once (three binaries import it
# for --help) and forks a child per command, which runs the module as `python -m` does
# (runpy as __main__, its own argv, stdout/stderr and exit status) and leaves with
# os._exit once its streams are flushed (a normal exit of a child that has torch loaded
# costs ~1 s of CPU). The parent imports no toolkit module: each binary's imports are its own.
_RUNNER = r"""
import json, os, runpy, sys, traceback
import torch  # noqa: F401
results = []
for i, argv in enumerate(json.loads(sys.argv[1])):
    out, err = (os.path.join(sys.argv[2], f"{i}.{n}") for n in ("out", "err"))
    pid = os.fork()
    if pid == 0:
        for fd, path in ((1, out), (2, err)):
            os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
        sys.argv = list(argv)
        code = 0
        try:
            runpy.run_module(argv[0], run_name="__main__", alter_sys=True)
        except SystemExit as e:
            if e.code is None or isinstance(e.code, int):
                code = e.code or 0
            else:
                print(e.code, file=sys.stderr)
                code = 1
        except BaseException:
            traceback.print_exc()
            code = 1
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    results.append([os.waitstatus_to_exitcode(status), open(out).read(), open(err).read()])
print(json.dumps(results))
"""


def run_binaries(commands, tmp):
    """[(exit status, stdout, stderr)] of each [module, *args] in `commands`."""
    proc = subprocess.run([sys.executable, "-c", _RUNNER, json.dumps(commands), str(tmp)],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.splitlines()[-1])


@pytest.fixture(scope="module")
def helps(tmp_path_factory):
    results = run_binaries([[f"toolkit.bin.{n}", "--help"] for n in BINARIES],
                           tmp_path_factory.mktemp("help"))
    return dict(zip(BINARIES, results))


def test_there_are_binaries():
    assert {"train", "make_datalist", "export_model", "kws", "score_kws"} <= set(BINARIES)


@pytest.mark.parametrize("name", BINARIES)
def test_help(helps, name):
    returncode, stdout, stderr = helps[name]
    assert returncode == 0, stderr[-1000:]
    assert "usage:" in stdout and len(stdout) > 200


ODD_PAIRS = [("make_datalist", "DATA_DIR OUTPUT"), ("compute_feats", "DATA_LIST OUT_DIR")]


@pytest.fixture(scope="module")
def odd_pairs(tmp_path_factory):
    """Both binaries given three paths, run together: {name: (result, its folder)}."""
    tmp = tmp_path_factory.mktemp("odd_pairs")
    commands = []
    for name, _ in ODD_PAIRS:
        args = [str(tmp / name / "a"), str(tmp / name / "b"), str(tmp / name / "c")]
        if name == "make_datalist":
            args += ["--inventory", str(tmp / "keywords.txt")]
        commands.append([f"toolkit.bin.{name}", *args])
    (tmp / "out").mkdir()
    return {name: (result, tmp / name) for (name, _), result in
            zip(ODD_PAIRS, run_binaries(commands, tmp / "out"))}


@pytest.mark.parametrize("name,names", ODD_PAIRS)
def test_odd_path_pairs_are_a_usage_error(odd_pairs, name, names):
    (returncode, _, stderr), folder = odd_pairs[name]
    assert returncode == 2, stderr
    assert f"expected {names} pairs, got an odd number of paths (3)" in stderr
    assert not any((folder / p).exists() for p in ("b", "c"))
