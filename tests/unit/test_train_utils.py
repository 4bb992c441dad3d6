"""The suite's own process handling (tests/train_utils.py): killing a training run kills
all of it, torchrun's workers in their own sessions and the processes they fork included,
so that a kill-and-resume test leaves nothing running behind it; the zygote's stand-in for
torchrun gives its ranks what torchrun would (environment, a store to meet at, a failed
rank stopping the others) and its runs show their command lines."""
import os
import signal
import subprocess
import sys
import time

from train_utils import (assert_none_alive, descendants, kill_tree, processes_naming, run_train,
                         start_train)

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


# Run as `python -m ranks_probe [fail] [marker]` from the zygote: without torchrun's
# variables it only waits (to be found and killed); as ranks, they meet through the
# launcher's store, sum their ranks and report, and with `fail` rank 1 exits 3 while
# rank 0 would wait two minutes.
RANKS_PROBE = """
import os, sys, time
if "WORLD_SIZE" not in os.environ:
    time.sleep(120)
import torch, torch.distributed as dist
dist.init_process_group("gloo")
total = torch.tensor([dist.get_rank() + 1.0])
dist.all_reduce(total)
env = {k: os.environ[k] for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")}
# One write per line: the ranks share one unbuffered stdout, and print() writes the line
# and its newline apart, so two ranks' lines could interleave.
sys.stdout.write(f"{env} sum {int(total.item())}\\n")
sys.stdout.flush()
if sys.argv[1:2] == ["fail"]:
    if dist.get_rank() == 1:
        sys.exit(3)
    time.sleep(120)
dist.destroy_process_group()
"""


def test_zygote_ranks_meet_and_a_failed_rank_stops_the_others(tmp_path, monkeypatch):
    (tmp_path / "ranks_probe.py").write_text(RANKS_PROBE)
    ok = run_train(["-m", "ranks_probe"], nproc=2, cwd=str(tmp_path), timeout=120)
    assert ok.returncode == 0, ok.stderr[-2000:]
    assert sorted(ok.stdout.splitlines()) == [
        f"{{'RANK': '{r}', 'LOCAL_RANK': '{r}', 'WORLD_SIZE': '2', 'LOCAL_WORLD_SIZE': '2'}} sum 3"
        for r in (0, 1)]
    started = time.time()
    failed = run_train(["-m", "ranks_probe", "fail"], nproc=2, cwd=str(tmp_path), timeout=120)
    assert failed.returncode == 1, failed.stderr[-2000:]
    assert "rank: 1 (local_rank: 1) exitcode: 3" in failed.stderr
    assert time.time() - started < 60, "rank 0 was not stopped when rank 1 failed"
    # A run forked from the zygote shows its own command line, and kill_tree kills it.
    monkeypatch.chdir(tmp_path)
    marker = str(tmp_path / "named-run")
    proc = start_train(["-m", "ranks_probe", "wait", marker])
    deadline = time.time() + 30
    while not processes_naming(marker) and time.time() < deadline:
        time.sleep(0.01)
    assert processes_naming(marker) == [proc.pid]
    kill_tree(proc)
    assert proc.returncode == -signal.SIGKILL
    assert_none_alive(naming=marker)
