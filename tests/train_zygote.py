"""A Python process that has imported torch (and torch._dynamo, which the first optimizer
imports) once and forks one child per training run: each run is still its own process
(own pid, environment, working directory, stdout/stderr files, exit status), without the
~4 s of imports a fresh interpreter pays. Used by train_utils.run_train and start_train.

Protocol, one JSON object per line: request on stdin
  {"module": ..., "argv": [...], "env": {...}, "cwd": ..., "stdout": path, "stderr": path,
   "nproc": N, "session": bool}
answered on the original stdout by {"pid": N} when the child starts and {"rc": N} when it
has exited (negative: killed by that signal, as subprocess reports it).

nproc 0 runs `python -m module argv` in the child. nproc N > 0 makes the child a stand-in
for `torchrun --standalone --nproc-per-node=N`: it forks N ranks with the environment
torchrun gives its workers, hosts the store they rendezvous on (as torchrun's agent does,
so no port is guessed), and, when a rank fails, stops the others and exits 1 naming it.
Only tests of the launcher itself (restarts, rendezvous of several launchers, workers
orphaned or killed with torchrun) need the real one.

The zygote starts with a long padding argument: each child writes its own command line
(`python -m module argv`) into that room, so that ps, and the tests that look for a run's
processes by their command line (train_utils.processes_naming), see what they would see
for a fresh interpreter; a run's data-loader workers, forked from it, show it too.
"""
import ctypes
import datetime
import gc
import json
import os
import runpy
import signal
import sys
import time
import uuid

import numpy  # noqa: F401
import torch
import torch._dynamo  # noqa: F401
import torch.distributed as dist
import yaml  # noqa: F401

# torch's thread pools took this process's OMP_NUM_THREADS; a run asking for another
# value gets it set explicitly, as a fresh interpreter would have started with it.
_OWN_THREADS = os.environ.get("OMP_NUM_THREADS")
# A failed rank's peers get SIGTERM and this long to exit before SIGKILL (torchrun: 30 s).
_STOP_GRACE_S = 30.0


def _set_cmdline(argv) -> None:
    """Writes `argv` over this process's argv area (/proc/self/cmdline), truncated to the
    room the zygote's padding argument left."""
    try:
        with open("/proc/self/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        start, end = int(fields[45]), int(fields[46])       # arg_start, arg_end
    except (OSError, IndexError, ValueError):
        return
    data = "\0".join(argv).encode(errors="replace")[:end - start - 1]
    ctypes.memmove(start, data + b"\0" * (end - start - len(data)), end - start)


def _redirect(stdout: str, stderr: str, append: bool = False) -> None:
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | (os.O_APPEND if append else 0)
    for fd, path in ((1, stdout), (2, stderr)):
        out = os.open(path, flags, 0o644)
        os.dup2(out, fd)
        os.close(out)


def _run_module(request: dict, extra_env: dict) -> None:
    """Becomes `python -m module argv` in the environment of the request (plus
    `extra_env`); never returns."""
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    os.environ.update(extra_env)
    threads = os.environ.get("OMP_NUM_THREADS")
    if threads != _OWN_THREADS and threads and threads.isdigit() and int(threads) > 0:
        torch.set_num_threads(int(threads))
    _set_cmdline([sys.executable, "-m", request["module"], *request["argv"]])
    sys.path[0] = os.getcwd()                    # what `python -m` puts first
    sys.argv = [request["module"], *request["argv"]]
    # SystemExit from the binary leaves through the interpreter's normal exit: threads
    # joined, atexit handlers run, streams flushed, the exit status as `python -m` gives.
    runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
    raise SystemExit(0)


def _die_with(parent: int) -> None:
    """A rank dies with its launcher (torchrun's are stopped by it): a test that kills the
    launcher on a timeout leaves nothing behind."""
    ctypes.CDLL(None).prctl(1, signal.SIGKILL, 0, 0, 0)     # PR_SET_PDEATHSIG
    if os.getppid() != parent:
        os._exit(1)


def _launch(request: dict) -> dict:
    """torchrun --standalone --nproc-per-node=N in miniature: the launcher never returns;
    in each rank it returns the variables torchrun gives that rank."""
    nproc = request["nproc"]
    os.chdir(request["cwd"])
    _set_cmdline([sys.executable, os.path.abspath(__file__), f"--nproc-per-node={nproc}",
                  "-m", request["module"], *request["argv"]])
    # torchrun's workers inherit its stdout/stderr: both ranks write to the same files.
    _redirect(request["stdout"], request["stderr"], append=True)
    run_id = uuid.uuid4().hex
    me = os.getpid()
    ranks, port_pipes = {}, []
    for rank in range(nproc):
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:
            for w in port_pipes + [write_end]:
                os.close(w)
            _die_with(me)
            os.setsid()                          # torchrun starts each worker so
            port = os.read(read_end, 32)         # the store's port, once it listens
            if not port:
                os._exit(1)
            os.close(read_end)
            return {
                "RANK": str(rank), "LOCAL_RANK": str(rank), "GROUP_RANK": "0",
                "ROLE_RANK": str(rank), "ROLE_NAME": "default",
                "WORLD_SIZE": str(nproc), "LOCAL_WORLD_SIZE": str(nproc),
                "ROLE_WORLD_SIZE": str(nproc), "GROUP_WORLD_SIZE": "1",
                "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port.decode(),
                "TORCHELASTIC_USE_AGENT_STORE": "True", "TORCHELASTIC_RESTART_COUNT": "0",
                "TORCHELASTIC_MAX_RESTARTS": "0", "TORCHELASTIC_RUN_ID": run_id,
                "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"}
        os.close(read_end)
        port_pipes.append(write_end)
        ranks[pid] = rank
    # The store starts after the last fork (its threads are not forked into a rank).
    store = dist.TCPStore("127.0.0.1", 0, None, True, datetime.timedelta(seconds=600),
                          wait_for_workers=False, multi_tenant=True)
    for w in port_pipes:
        os.write(w, str(store.port).encode())
        os.close(w)
    failed, deadline = None, None
    while ranks:
        pid, status = os.waitpid(-1, os.WNOHANG if deadline else 0)
        if pid == 0:
            if time.time() > deadline:
                for p in ranks:
                    os.kill(p, signal.SIGKILL)
                deadline = float("inf")
            time.sleep(0.02)
            continue
        rank, rc = ranks.pop(pid), os.waitstatus_to_exitcode(status)
        if rc != 0 and failed is None:
            failed = f"rank: {rank} (local_rank: {rank}) exitcode: {rc} (pid: {pid})"
            for p in ranks:
                os.kill(p, signal.SIGTERM)
            deadline = time.time() + _STOP_GRACE_S
    if failed:
        os.write(2, f"zygote launcher: a rank failed, the others were stopped: "
                    f"{failed}\n".encode())
    os._exit(1 if failed else 0)


def child(request: dict, replies: int) -> None:
    os.close(replies)
    sys.stdin = open(os.devnull)
    if request.get("session"):
        os.setsid()                              # as Popen(start_new_session=True)
    extra = {}
    if request.get("nproc", 0) > 0:
        try:
            extra = _launch(request)             # returns in a rank only
        except BaseException:                    # the launcher (or a rank's set-up) failed
            import traceback
            traceback.print_exc()
            os._exit(1)
    else:
        _redirect(request["stdout"], request["stderr"])
    _run_module(request, extra)


def main() -> None:
    # The imported modules' objects go to the permanent generation: a run's collections
    # (and its exit) no longer walk them, and touching none of them copies none of their
    # pages. An exit cost 0.8 s of CPU without it, 0.25 s with it.
    gc.freeze()
    replies = os.dup(1)
    os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
    send = os.fdopen(replies, "w", buffering=1)
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            child(request, replies)
        send.write(json.dumps({"pid": pid}) + "\n")
        _, status = os.waitpid(pid, 0)
        rc = os.waitstatus_to_exitcode(status)
        send.write(json.dumps({"rc": rc}) + "\n")


if __name__ == "__main__":
    main()
