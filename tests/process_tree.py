"""A command and everything it starts, to completion or to its deadline: `run_tree` is
subprocess.run(capture_output=True, text=True) whose timeout kills the whole process
tree. subprocess.run kills the direct child alone, so a recipe killed at its deadline left
its torchrun, trainers and synthesis workers running, orphaned, taking the cores of every
test after it."""
import os
import signal
import subprocess
from typing import Sequence


def run_tree(cmd: Sequence, timeout: float, **popen) -> subprocess.CompletedProcess:
    """Runs `cmd` in a session of its own; at `timeout` seconds (or on any exception while
    waiting, Ctrl-C included) SIGKILL goes to every process of that session, then
    subprocess.TimeoutExpired is raised (or the exception passes on) with the output so
    far. A process that makes a session of its own escapes (setsid), as it would anyway."""
    cmd = [str(c) for c in cmd]
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          start_new_session=True, **popen) as proc:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_session(proc.pid)
            out, err = proc.communicate()
            raise subprocess.TimeoutExpired(cmd, timeout, out, err) from None
        except BaseException:
            _kill_session(proc.pid)
            raise
        # A background process the command left behind dies with it.
        _kill_session(proc.pid)
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def _kill_session(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:          # every process of the session has exited
        pass
