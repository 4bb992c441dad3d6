"""A Python process that has imported torch (and torch._dynamo, which the first optimizer
imports) once and forks one child per training run: each run is still its own process
(own pid, environment, working directory, stdout/stderr files, exit status), without the
~4 s of imports a fresh interpreter pays. Used by train_utils.run_train for one-process
runs; torchrun launches keep their own interpreters.

Protocol, one JSON object per line: request on stdin
  {"module": ..., "argv": [...], "env": {...}, "cwd": ..., "stdout": path, "stderr": path}
answered on the original stdout by {"pid": N} when the child starts and {"rc": N} when it
has exited (negative: killed by that signal, as subprocess reports it).
"""
import json
import os
import runpy
import sys

import numpy  # noqa: F401
import torch  # noqa: F401
import torch._dynamo  # noqa: F401
import torch.distributed  # noqa: F401
import yaml  # noqa: F401


def child(request: dict, replies: int) -> None:
    os.close(replies)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
        out = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(out, fd)
        os.close(out)
    sys.path[0] = os.getcwd()                    # what `python -m` puts first
    sys.argv = [request["module"], *request["argv"]]
    # SystemExit from the binary leaves through the interpreter's normal exit: threads
    # joined, atexit handlers run, streams flushed, the exit status as `python -m` gives.
    runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
    raise SystemExit(0)


def main() -> None:
    replies = os.dup(1)
    os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
    send = os.fdopen(replies, "w", buffering=1)
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            sys.stdin = open(os.devnull)
            child(request, replies)
        send.write(json.dumps({"pid": pid}) + "\n")
        _, status = os.waitpid(pid, 0)
        rc = os.waitstatus_to_exitcode(status)
        send.write(json.dumps({"rc": rc}) + "\n")


if __name__ == "__main__":
    main()
