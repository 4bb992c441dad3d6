"""One writer per experiment directory.

Every training process holds a shared POSIX record lock (fcntl.lockf) on
`<exp>/.train.lock` for its whole life. Record locks belong to the process and are not
inherited by forked children, so data-loader workers never keep a dead run's lock alive.
Rank 0 of a new run first asks for an exclusive lock without waiting: it fails while any
process of an earlier run is alive, including torchrun workers orphaned by a SIGKILL of
their launcher (torchrun starts them in their own session, so they outlive it). Locks of
dead processes vanish with them, so a stale lock is taken over without ceremony.
"""
import fcntl
import json
import os
import socket
import time
from typing import List


class ExpDirBusy(RuntimeError):
    pass


def _holders(exp_dir: str) -> List[dict]:
    holders = []
    folder = os.path.join(exp_dir, ".holders")
    for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
        try:
            with open(os.path.join(folder, name), encoding="utf-8") as f:
                info = json.load(f)
        except (OSError, ValueError):
            continue
        if info.get("host") == socket.gethostname():
            try:
                os.kill(int(info["pid"]), 0)
            except (ProcessLookupError, ValueError):  # EPERM means alive
                continue
        holders.append(info)
    return holders


class ExpDirLock:
    def __init__(self, exp_dir: str, rank: int):
        self.exp_dir = exp_dir
        self.rank = rank
        self.fd = None

    def acquire_exclusive_check(self) -> None:
        """Rank 0: fail with the holders' pids if another run lives, then share the lock."""
        os.makedirs(self.exp_dir, exist_ok=True)
        self.fd = os.open(os.path.join(self.exp_dir, ".train.lock"), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.lockf(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except (BlockingIOError, PermissionError):
            holders = _holders(self.exp_dir)
            who = "; ".join(f"pid {h['pid']} (rank {h.get('rank')}, host {h.get('host')}, "
                            f"started {h.get('started')}: {h.get('cmd', '')[:120]})"
                            for h in holders) or "an unknown process (another host?)"
            os.close(self.fd)
            self.fd = None
            raise ExpDirBusy(f"experiment dir {self.exp_dir} is in use by a live run: {who}. "
                             "Stop it (kill those pids) or use another exp dir.") from None
        # Nobody else lives: clear the old holder records, then downgrade to shared so
        # this run's other ranks can join (an atomic conversion for record locks).
        folder = os.path.join(self.exp_dir, ".holders")
        os.makedirs(folder, exist_ok=True)
        for name in os.listdir(folder):
            os.unlink(os.path.join(folder, name))
        self._register()
        fcntl.lockf(self.fd, fcntl.LOCK_SH)

    def acquire_shared(self) -> None:
        """Other ranks: join after rank 0 checked (they never see a foreign holder)."""
        self.fd = os.open(os.path.join(self.exp_dir, ".train.lock"), os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.lockf(self.fd, fcntl.LOCK_SH)
        self._register()

    def _register(self) -> None:
        folder = os.path.join(self.exp_dir, ".holders")
        os.makedirs(folder, exist_ok=True)
        try:
            with open(f"/proc/{os.getpid()}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            cmd = ""
        from toolkit.config import REDACTED, secret_env_values
        for secret in secret_env_values():
            cmd = cmd.replace(secret, REDACTED)
        info = {"pid": os.getpid(), "rank": self.rank, "host": socket.gethostname(),
                "started": time.strftime("%Y-%m-%d %H:%M:%S"), "cmd": cmd}
        with open(os.path.join(folder, f"{socket.gethostname()}-{os.getpid()}.json"), "w") as f:
            json.dump(info, f)

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
