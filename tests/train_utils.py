"""Helpers for tests that run the real training binary: forked from a pre-imported
interpreter (the zygote, tests/train_zygote.py), one process or several ranks as torchrun
would start them, or through the real torchrun where the launcher is under test."""
import atexit
import copy
import glob
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Dict, List, Optional, Tuple

import torch
import yaml

from kws_data import make_datalist, write_keywords
from process_tree import run_tree

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TORCHRUN = os.path.join(os.path.dirname(sys.executable), "torchrun")

TINY_CONFIG = {
    "task": {"type": "kws"},
    "dataset": {
        "feature": {"num_mel_bins": 20},
        "spec_aug": {"enabled": True, "num_time_masks": 1, "max_time_width": 5,
                     "num_freq_masks": 1, "max_freq_width": 3},
        "volume_range": [0.7, 1.3],
        "vtlp_range": [0.9, 1.1],
        "speed_perturb": [0.9, 1.0, 1.1],
        "batch_size": 6,
        "sort_window": 20,
        "num_workers": 2,
    },
    "model": {"type": "ds_tcn", "hidden_dim": 12, "num_layers": 2, "kernel_size": 3,
              "dilations": [1, 2], "dropout": 0.1},
    "loss": {"type": "max_pooling", "min_duration": 5},
    "optim": {"type": "adam", "lr": 0.01,
              "scheduler": {"type": "warmup_cosine", "warmup_steps": 2}},
    "training": {"seed": 11, "max_epoch": 3, "log_interval": 2, "save_interval_steps": 2,
                 "keep_last": 2, "keep_best": 2},
}


class Corpus:
    """Train/dev lists of real WAVs, an inventory and a config file in `root`."""

    def __init__(self, root: str, num_train: int = 30, num_dev: int = 8,
                 config: Optional[dict] = None, workers: Optional[int] = None):
        """`workers`: dataset.num_workers of the config file (0 where the data loader is
        not under test: no worker processes to fork and feed)."""
        self.root = root
        self.train = make_datalist(root, "train", num_train // 3, num_train - num_train // 3, 1)
        self.dev = make_datalist(root, "dev", num_dev // 2, num_dev - num_dev // 2, 2)
        self.inventory = write_keywords(root, ["hey chirp"])
        config = copy.deepcopy(config or TINY_CONFIG)
        if workers is not None:
            config["dataset"]["num_workers"] = workers
        self.config = self.write_config(config)

    def write_config(self, config: dict, name: str = "conf.yaml") -> str:
        path = os.path.join(self.root, name)
        with open(path, "w") as f:
            yaml.safe_dump(config, f)
        return path

    def train_args(self, exp: str, *overrides: str, config: Optional[str] = None,
                   train: Optional[str] = None, inventory: Optional[str] = None) -> List[str]:
        return ["-m", "toolkit.bin.train", "--config", config or self.config, "--exp-dir", exp,
                "--train-data", train or self.train, "--dev-data", self.dev,
                "--inventory", inventory or self.inventory, *overrides]


TESTS = os.path.dirname(os.path.abspath(__file__))


def env(**extra) -> Dict[str, str]:
    """The training subprocesses' environment; tests/ is importable, so that
    TOOLKIT_PLUGINS finds the test plugins (paused_task, slow_fingerprint)."""
    e = dict(os.environ)
    e.update({"PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"})
    e["PYTHONPATH"] = os.pathsep.join(p for p in (TESTS, e.get("PYTHONPATH", "")) if p)
    e.update(extra)
    return e


def run_train(args: List[str], nproc: int = 0, timeout: float = 300,
              extra_env: Optional[Dict[str, str]] = None, torchrun: bool = False,
              **popen) -> subprocess.CompletedProcess:
    """The binary in `args` (["-m", module, ...]) to completion, forked from the zygote
    (tests/train_zygote.py): one process for nproc=0, otherwise `nproc` ranks with the
    environment, store and failure handling torchrun gives them. torchrun=True (or other
    Popen arguments) runs the real launcher in fresh interpreters instead: for tests of
    the launcher itself."""
    if not torchrun and args[:1] == ["-m"] and set(popen) <= {"cwd"}:
        return _ZYGOTE.start(args, env(**(extra_env or {})), popen.get("cwd") or os.getcwd(),
                             nproc).result(timeout)
    return run_tree(launcher(nproc) + args, timeout, env=env(**(extra_env or {})), **popen)


def start_train(args: List[str], nproc: int = 0,
                extra_env: Optional[Dict[str, str]] = None, torchrun: Optional[bool] = None):
    """The binary in `args` started in a session of its own (as Popen(start_new_session=
    True)), output discarded, for tests that kill it (kill_tree): forked from the zygote,
    except that a run of several ranks goes through the real torchrun unless torchrun=False
    (killing torchrun and its workers is part of what those tests cover)."""
    if torchrun is None:
        torchrun = nproc > 0
    if torchrun or args[:1] != ["-m"]:
        return subprocess.Popen(launcher(nproc) + args, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, env=env(**(extra_env or {})),
                                start_new_session=True)
    return _ZYGOTE.start(args, env(**(extra_env or {})), os.getcwd(), nproc, session=True,
                         capture=False)


class _ZygoteRun:
    """A run forked by the zygote: pid, poll(), wait(), kill() and returncode as a Popen
    has (so kill_tree takes it); result() for its output."""

    def __init__(self, zygote: "_Zygote", cmd: List[str], pid: int, tmp):
        self.zygote, self.args, self.pid, self.tmp = zygote, cmd, pid, tmp
        self.returncode: Optional[int] = None

    def _finish(self, timeout: float) -> int:
        if self.returncode is None:
            self.returncode = self.zygote._reply(timeout)["rc"]      # TimeoutError if not yet
        return self.returncode

    def poll(self) -> Optional[int]:
        try:
            return self._finish(0)
        except TimeoutError:
            return None

    def wait(self, timeout: Optional[float] = None) -> int:
        try:
            return self._finish(3600 if timeout is None else timeout)
        except TimeoutError:
            raise subprocess.TimeoutExpired(self.args, timeout) from None

    def kill(self) -> None:
        if self.returncode is None:
            _signal(self.pid, signal.SIGKILL)    # a launcher's ranks die with it

    def result(self, timeout: float) -> subprocess.CompletedProcess:
        """Waits (SIGKILL at `timeout`, as subprocess.run does) and returns the output."""
        try:
            try:
                rc = self.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
                self.wait(60)
                raise
            out = []
            for name in ("stdout", "stderr"):
                with open(os.path.join(self.tmp.name, name), errors="replace") as f:
                    out.append(f.read())
            return subprocess.CompletedProcess(self.args, rc, *out)
        finally:
            self.tmp.cleanup()


class _Zygote:
    """One pre-imported interpreter per pytest worker, started on first use and waited
    for at exit (so that /usr/bin/time counts the CPU of its runs). It serves one run at a
    time: a run left unwaited (a test that failed before its kill) is killed by the next."""

    # Room for a run's command line in the zygote's argv (train_zygote._set_cmdline).
    CMDLINE_ROOM = 32 * 1024

    def __init__(self):
        self.proc: Optional[subprocess.Popen] = None
        self.lock = threading.Lock()
        self.pending = b""
        self.current: Optional[_ZygoteRun] = None

    def _reply(self, timeout: float) -> dict:
        """The next reply line; own buffering, so that select() sees every unread byte."""
        deadline = time.time() + timeout
        while b"\n" not in self.pending:
            ready, _, _ = select.select([self.proc.stdout], [], [], max(0.0, deadline - time.time()))
            if not ready:
                raise TimeoutError
            chunk = os.read(self.proc.stdout.fileno(), 4096)
            if not chunk:
                self.errors.seek(0)
                raise RuntimeError("the training zygote exited: " + self.errors.read().decode())
            self.pending += chunk
        line, self.pending = self.pending.split(b"\n", 1)
        return json.loads(line)

    def start(self, cmd: List[str], environ: Dict[str, str], cwd: str, nproc: int = 0,
              session: bool = False, capture: bool = True) -> _ZygoteRun:
        with self.lock:
            if self.current is not None and self.current.returncode is None:
                self.current.kill()
                try:
                    self.current.wait(60)
                except (RuntimeError, subprocess.TimeoutExpired):   # the zygote is gone
                    self.proc.kill()
                    self.proc.wait()
            if self.proc is None or self.proc.poll() is not None:
                self.errors = tempfile.TemporaryFile()
                self.proc = subprocess.Popen(
                    [sys.executable, os.path.join(TESTS, "train_zygote.py"),
                     " " * self.CMDLINE_ROOM],
                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.errors,
                    bufsize=0, env=env())
                self.pending = b""
            tmp = tempfile.TemporaryDirectory(prefix="zygote-") if capture else None
            out, err = ((os.path.join(tmp.name, "stdout"), os.path.join(tmp.name, "stderr"))
                        if capture else (os.devnull, os.devnull))
            request = {"module": cmd[1], "argv": cmd[2:], "env": environ,
                       "cwd": os.path.abspath(cwd), "stdout": out, "stderr": err,
                       "nproc": max(0, nproc), "session": session}
            self.proc.stdin.write((json.dumps(request) + "\n").encode())
            self.current = _ZygoteRun(self, [sys.executable] + cmd, self._reply(60)["pid"], tmp)
            return self.current

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            if self.current is not None and self.current.returncode is None:
                self.current.kill()
            self.proc.stdin.close()              # the zygote ends at EOF
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


_ZYGOTE = _Zygote()
atexit.register(_ZYGOTE.close)


def launcher(nproc: int) -> List[str]:
    """Plain python for 0, torchrun with `nproc` gloo ranks otherwise."""
    if nproc <= 0:
        return [sys.executable]
    return [TORCHRUN, "--standalone", "--nnodes=1", f"--nproc-per-node={nproc}"]


def _stat(pid: int) -> Optional[Tuple[str, int, int]]:
    """(state, parent pid, session id) of a process; None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return fields[0], int(fields[1]), int(fields[3])
    except (OSError, IndexError, ValueError):
        return None


def _all_stats() -> Dict[int, Tuple[str, int, int]]:
    out = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            stat = _stat(int(name))
            if stat is not None:
                out[int(name)] = stat
    return out


def descendants(pid: int) -> List[int]:
    """All descendant pids via /proc (torchrun's workers sit in their own sessions)."""
    children: Dict[int, List[int]] = {}
    for child, (_, parent, _) in _all_stats().items():
        children.setdefault(parent, []).append(child)
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        for c in children.get(p, []):
            out.append(c)
            todo.append(c)
    return out


def rank_process(launcher_pid: int, rank: int, timeout: float = 60) -> int:
    """The pid of torchrun's worker with global RANK=`rank` (a direct child of the launcher,
    so never one of its data-loader processes, which inherit the same environment)."""
    wanted = f"RANK={rank}".encode()
    deadline = time.time() + timeout
    while time.time() < deadline:
        for pid in descendants(launcher_pid):
            try:
                with open(f"/proc/{pid}/stat") as f:
                    parent = int(f.read().rsplit(")", 1)[1].split()[1])
                with open(f"/proc/{pid}/environ", "rb") as f:
                    environ = f.read().split(b"\0")
            except (OSError, IndexError, ValueError):
                continue
            if parent == launcher_pid and wanted in environ:
                return pid
        time.sleep(0.05)
    raise AssertionError(f"no worker with RANK={rank} under pid {launcher_pid}")


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _alive(pid: int) -> bool:
    """Running or stopped; a zombie holds nothing and its reaper is not ours to wait for."""
    stat = _stat(pid)
    return stat is not None and stat[0] not in "ZX"


def _stop_tree(root: int, timeout: float = 10) -> List[int]:
    """SIGSTOP `root`, then its descendants, until a scan finds no new one while every
    process found is stopped: a stopped process forks no more, and the children of forks
    it had begun are then visible (and stopped in turn)."""
    stopped: List[int] = []
    todo = [root]
    deadline = time.time() + timeout
    while todo:
        for pid in todo:
            _signal(pid, signal.SIGSTOP)
        stopped += todo
        while time.time() < deadline and any(
                (_stat(p) or ("T",))[0] not in "TtZX" for p in stopped):
            time.sleep(0.001)
        todo = [p for p in descendants(root) if p not in stopped]
    return stopped


def processes_in_sessions(sessions) -> List[int]:
    """Live processes (zombies aside) in any of the session ids `sessions`."""
    return [pid for pid, (state, _, sid) in _all_stats().items()
            if sid in sessions and state not in "ZX"]


def processes_naming(text: str) -> List[int]:
    """Live processes (zombies aside, this one too) whose command line contains `text`:
    for a test, its exp dir names every training process and loader worker it started."""
    found = []
    for pid in _all_stats():
        if pid == os.getpid() or not _alive(pid):
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmdline:
            found.append(pid)
    return found


def _describe(pids: List[int]) -> str:
    lines = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")[:160]
        except OSError:
            cmdline = "?"
        lines.append(f"pid {pid} (parent {(_stat(pid) or ('', '?'))[1]}): {cmdline}")
    return "; ".join(lines)


def assert_none_alive(pids: List[int] = (), sessions=(), naming: str = "",
                      timeout: float = 15) -> None:
    """Waits until none of `pids`, no process in `sessions` and none whose command line
    names `naming` is alive; fails naming those left (and SIGKILLs them, so that one
    failure does not leave them running for the rest of the suite)."""
    def left() -> List[int]:
        out = [p for p in pids if _alive(p)]
        if sessions:
            out += [p for p in processes_in_sessions(set(sessions)) if p not in out]
        if naming:
            out += [p for p in processes_naming(naming) if p not in out]
        return out
    deadline = time.time() + timeout
    remaining = left()
    while remaining and time.time() < deadline:
        time.sleep(0.05)
        remaining = left()
    if remaining:
        described = _describe(remaining)
        for pid in remaining:
            _signal(pid, signal.SIGKILL)
        raise AssertionError(f"processes outlived their run ({timeout:.0f} s after): {described}")


def kill_tree(proc: subprocess.Popen, launcher_only: bool = False) -> List[int]:
    """SIGKILL the launcher and (unless launcher_only) everything it started, and fail if
    any of it lives on; returns the pids killed besides the launcher.

    A snapshot of the descendants killed together is not enough: torchrun starts each
    worker in a session of its own (setsid), so nothing reaches a worker or its loader
    processes but their pids, and a process forked after the snapshot is orphaned (ppid
    1). Such a data-loader worker, forked just before its trainer died, reads pid 1 as its
    parent and so never sees it die: it waited forever, about 300 MB each. So the whole
    tree is stopped first (nothing forks any more), then killed, and every process of the
    sessions it ran in (the launcher's own with start_new_session, each worker's) must be
    gone."""
    if launcher_only:
        _signal(proc.pid, signal.SIGKILL)
        proc.wait()
        return []
    stopped = _stop_tree(proc.pid)
    own_session = os.getsid(0)
    sessions = {stat[2] for stat in map(_stat, stopped) if stat is not None} - {own_session}
    for pid in stopped:
        _signal(pid, signal.SIGKILL)
    for pid in processes_in_sessions(sessions):
        _signal(pid, signal.SIGKILL)
    proc.wait()
    assert_none_alive(stopped, sessions)
    return [p for p in stopped if p != proc.pid]


def wait_gone(pids: List[int], timeout: float = 30) -> None:
    """Waits until every process in `pids` has exited; fails naming those still alive
    when `timeout` passes."""
    deadline = time.time() + timeout
    for pid in pids:
        while True:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            # Reap zombies that are our own children.
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass
            if time.time() >= deadline:
                alive = [p for p in pids if os.path.exists(f"/proc/{p}")]
                raise AssertionError(f"processes {alive} still running {timeout:.0f} s later")
            time.sleep(0.05)


def wait_for_checkpoint(exp: str, proc: subprocess.Popen, timeout: float = 90) -> None:
    """Waits for the first checkpoint of a run in `exp`; fails when `timeout` passes or
    the run ends before writing one."""
    deadline = time.time() + timeout
    while not glob.glob(os.path.join(exp, "ckpt-*.json")):
        assert time.time() < deadline, f"no checkpoint in {exp} after {timeout:.0f} s"
        assert proc.poll() is None, f"the run ended (status {proc.returncode}) before a checkpoint"
        time.sleep(0.1)


def latest_payload(exp: str) -> dict:
    from toolkit.trainer.checkpoint import latest_valid, load_payload
    info = latest_valid(exp)
    assert info is not None, f"no checkpoint in {exp}"
    return load_payload(info.path)


def assert_states_identical(a: dict, b: dict, what: str = "") -> None:
    assert a.keys() == b.keys(), what
    for key in a:
        va, vb = a[key], b[key]
        if isinstance(va, dict):
            assert_states_identical(va, vb, f"{what}.{key}")
        elif isinstance(va, torch.Tensor):
            assert va.dtype == vb.dtype and torch.equal(va, vb), f"{what}.{key} differs"
        elif isinstance(va, (list, tuple)):
            assert len(va) == len(vb), f"{what}.{key}"
            for i, (x, y) in enumerate(zip(va, vb)):
                if isinstance(x, (dict, torch.Tensor, list, tuple)):
                    assert_states_identical({"v": x}, {"v": y}, f"{what}.{key}[{i}]")
                else:
                    assert x == y, f"{what}.{key}[{i}]: {x} != {y}"
        else:
            assert va == vb, f"{what}.{key}: {va} != {vb}"
