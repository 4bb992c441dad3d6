"""One writer per experiment directory.

Every training process holds a shared POSIX record lock (fcntl.lockf) on
`<exp>/.train.lock` for its whole life. Record locks belong to the process and are not
inherited by forked children, so data-loader workers never keep a dead run's lock alive.
Rank 0 of a new run first asks for an exclusive lock without waiting: it fails while any
process of an earlier run is alive, including torchrun workers orphaned by a SIGKILL of
their launcher (torchrun starts them in their own session, so they outlive it). Locks of
dead processes vanish with them, so a stale lock is taken over without ceremony.

`<exp>/.holders/` names the holders for the error message: host, pid and the process's
start time (so a reused pid is not taken for a live holder). Each process removes its
own record when it releases the lock.
"""
import errno
import fcntl
import json
import os
import socket
import time
from typing import List, Optional

from toolkit.errors import UserError


class ExpDirBusy(UserError, RuntimeError):
    pass


class LockUnsupported(UserError, OSError):
    pass


def process_start_time(pid: int) -> Optional[int]:
    """Start time of `pid` in clock ticks since boot (/proc/<pid>/stat field 22)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def _alive(info: dict) -> bool:
    if info.get("host") != socket.gethostname():
        return True                      # another host's process: cannot tell, assume alive
    try:
        pid = int(info["pid"])
        os.kill(pid, 0)
    except (ProcessLookupError, ValueError, KeyError):
        return False
    except PermissionError:
        pass                             # EPERM: it exists
    started = info.get("start_ticks")
    return started is None or process_start_time(pid) == started


def _holders(exp_dir: str) -> List[dict]:
    holders = []
    folder = os.path.join(exp_dir, ".holders")
    for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
        try:
            with open(os.path.join(folder, name), encoding="utf-8") as f:
                info = json.load(f)
        except (OSError, ValueError):
            continue
        if _alive(info):
            holders.append(info)
    return holders


def _lock_error(exp_dir: str, err: OSError) -> LockUnsupported:
    return LockUnsupported(
        f"cannot lock {exp_dir}/.train.lock ({os.strerror(err.errno)}): the file system does "
        "not support POSIX record locks (NFS without lockd?). Put the exp dir on a local or "
        "lock-capable file system")


class ExpDirLock:
    def __init__(self, exp_dir: str, rank: int):
        self.exp_dir = exp_dir
        self.rank = rank
        self.fd = None
        self.record = None

    def _open(self) -> None:
        os.makedirs(self.exp_dir, exist_ok=True)
        self.fd = os.open(os.path.join(self.exp_dir, ".train.lock"), os.O_RDWR | os.O_CREAT, 0o644)

    def acquire_exclusive_check(self) -> None:
        """Rank 0: fail with the holders' pids if another run lives, then share the lock."""
        self._open()
        try:
            fcntl.lockf(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except (BlockingIOError, PermissionError):
            holders = _holders(self.exp_dir)
            who = "; ".join(f"pid {h['pid']} (rank {h.get('rank')}, host {h.get('host')}, "
                            f"started {h.get('started')}: {h.get('cmd', '')[:120]})"
                            for h in holders) or "an unknown process (another host?)"
            self._close()
            raise ExpDirBusy(f"experiment dir {self.exp_dir} is in use by a live run: {who}. "
                             "Stop it (kill those pids) or use another exp dir.") from None
        except OSError as err:
            self._close()
            if err.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
                raise _lock_error(self.exp_dir, err) from None
            raise
        # Nobody else lives: clear the old holder records, then downgrade to shared so
        # this run's other ranks can join (an atomic conversion for record locks).
        folder = os.path.join(self.exp_dir, ".holders")
        os.makedirs(folder, exist_ok=True)
        for name in os.listdir(folder):
            try:
                os.unlink(os.path.join(folder, name))
            except FileNotFoundError:
                pass
        self._register()
        fcntl.lockf(self.fd, fcntl.LOCK_SH)

    def acquire_shared(self) -> None:
        """Other ranks: join after rank 0 checked (they never see a foreign holder)."""
        self._open()
        try:
            fcntl.lockf(self.fd, fcntl.LOCK_SH)
        except OSError as err:
            self._close()
            if err.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
                raise _lock_error(self.exp_dir, err) from None
            raise
        self._register()

    def _register(self) -> None:
        folder = os.path.join(self.exp_dir, ".holders")
        os.makedirs(folder, exist_ok=True)
        try:
            with open(f"/proc/{os.getpid()}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            cmd = ""
        from toolkit.config import scrub_text
        info = {"pid": os.getpid(), "rank": self.rank, "host": socket.gethostname(),
                "start_ticks": process_start_time(os.getpid()),
                "started": time.strftime("%Y-%m-%d %H:%M:%S"), "cmd": scrub_text(cmd)}
        self.record = os.path.join(folder, f"{socket.gethostname()}-{os.getpid()}.json")
        with open(self.record, "w") as f:
            json.dump(info, f)

    def _close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def release(self) -> None:
        if self.record is not None:
            try:
                os.unlink(self.record)
            except FileNotFoundError:
                pass
            self.record = None
        self._close()
