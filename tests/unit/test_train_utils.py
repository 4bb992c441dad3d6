"""The suite's own process handling (tests/train_utils.py): killing a training run kills
all of it, torchrun's workers in their own sessions and the processes they fork included,
so that a kill-and-resume test leaves nothing running behind it."""
import os
import signal
import subprocess
import sys
import time

from train_utils import descendants, kill_tree

# A launcher like torchrun: its worker runs in a session of its own (setsid) and forks a
# child every few milliseconds, as ranks fork data-loader workers. Every process sleeps
# at most a minute, so even a failed test leaves nothing for long.
TREE = """
import os, sys, time
if os.fork() == 0:
    os.setsid()
    while True:
        if os.fork() == 0:
            time.sleep(60)
            os._exit(0)
        time.sleep(0.002)
time.sleep(60)
"""


def _naming(text):
    """Live processes (zombies aside) whose command line contains `text`."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
            with open(f"/proc/{name}/cmdline", "rb") as f:
                cmdline = f.read().decode(errors="replace")
        except (OSError, IndexError):
            continue
        if state not in "ZX" and text in cmdline:
            found.append(int(name))
    return found


def test_kill_tree_leaves_nothing_of_a_tree_that_keeps_forking(tmp_path):
    """d486171 killed a snapshot of the descendants: what forked after it was orphaned."""
    marker = str(tmp_path / "forking-tree")
    for _ in range(5):
        proc = subprocess.Popen([sys.executable, "-c", TREE, marker], start_new_session=True)
        deadline = time.time() + 30
        while len(descendants(proc.pid)) < 20 and time.time() < deadline:
            time.sleep(0.01)
        try:
            kill_tree(proc)
            time.sleep(0.2)                 # SIGKILLed processes are gone by now
            left = _naming(marker)
            assert not left, f"{len(left)} processes outlived kill_tree"
        finally:
            for pid in _naming(marker):
                os.kill(pid, signal.SIGKILL)
