"""tests/process_tree.py: a test's deadline kills what the command started, not only it."""
import os
import subprocess
import sys
import time

import pytest

from process_tree import run_tree


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is dead too: its state is Z in /proc
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] != "Z"


def _gone_within(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not _alive(pid):
            return True
        time.sleep(0.05)
    return False


def test_a_timeout_kills_the_grandchildren(tmp_path):
    pid_file = tmp_path / "pid"
    # bash starts a python grandchild that would sleep 60 s and waits for it
    script = (f"{sys.executable} -c 'import time; time.sleep(60)' & echo $! > {pid_file}; "
              "echo started; wait")
    t0 = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired) as err:
        run_tree(["bash", "-c", script], timeout=2)
    assert time.monotonic() - t0 < 10
    assert "started" in err.value.output
    grandchild = int(pid_file.read_text())
    assert _gone_within(grandchild, 5.0)
    # what plain subprocess.run leaves behind: the grandchild outlives the deadline
    with pytest.raises(subprocess.TimeoutExpired):
        subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=2)
    orphan = int(pid_file.read_text())
    try:
        assert not _gone_within(orphan, 1.0)
    finally:
        os.kill(orphan, 9)


def test_a_command_that_finishes_gives_its_output_and_status():
    result = run_tree(["bash", "-c", "echo out; echo err >&2; exit 3"], timeout=30)
    assert (result.returncode, result.stdout, result.stderr) == (3, "out\n", "err\n")
