"""Deterministic parallel rendering: each task runs in a freshly forked child.

Some TTS libraries keep state from one utterance to the next (libespeak-ng does, and
nothing resets it), so a process's output depends on everything it rendered before. Give
each task a fixed group of utterances whose composition does not depend on the number of
jobs and load the engine only inside the task: every group then starts from the same
state, and the output is byte-identical for any `nj`. The parent must not load such an
engine itself (its children would inherit the state).
"""
import ctypes
import os
import pickle
import signal
import sys
import time
import traceback
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from toolkit.errors import UserError
from toolkit.voicebank import SynthError


def run_forked(fn: Callable, tasks: Sequence, nj: int, tmp_dir: str,
               progress: Optional[Callable[[int, int], None]] = None) -> List:
    """fn(task) for each task, each in a freshly forked child (at most nj at once), so
    no child inherits TTS state from another. `fn` reaches the children by fork (a
    closure is fine); the results come back pickled, in task order. A failure in any
    child stops the others and is raised as SynthError (the message alone for a
    UserError, else the child's traceback)."""
    results: List = [None] * len(tasks)
    running: Dict[int, Tuple[int, str]] = {}
    nxt, done = 0, 0
    try:
        while nxt < len(tasks) or running:
            while nxt < len(tasks) and len(running) < max(1, nj):
                path = os.path.join(tmp_dir, f"task{nxt}.pkl")
                sys.stdout.flush()
                sys.stderr.flush()
                pid = os.fork()
                if pid == 0:   # child: never returns into the caller's code
                    code = 0
                    try:
                        res = ("ok", fn(tasks[nxt]))
                    except BaseException as err:  # report everything, incl. Ctrl-C
                        code = 1
                        res = ("err", str(err) if isinstance(err, UserError)
                               else traceback.format_exc())
                    try:
                        with open(path, "wb") as f:
                            pickle.dump(res, f)
                    finally:
                        os._exit(code)
                running[pid] = (nxt, path)
                nxt += 1
            finished = []
            for pid in list(running):
                wpid, status = os.waitpid(pid, os.WNOHANG)
                if wpid:
                    finished.append((pid, status))
            if not finished:
                time.sleep(0.005)
                continue
            for pid, status in finished:
                idx, path = running.pop(pid)
                try:
                    with open(path, "rb") as f:
                        kind, value = pickle.load(f)
                    os.unlink(path)
                except (OSError, EOFError, pickle.UnpicklingError):
                    kind, value = "err", f"worker died (wait status {status})"
                if kind != "ok":
                    raise SynthError(value)
                results[idx] = value
                done += 1
                if progress:
                    progress(done, len(tasks))
    finally:
        for pid in running:       # only our own children
            try:
                os.kill(pid, signal.SIGTERM)
                os.waitpid(pid, 0)
            except OSError:
                pass
    return results


def single_thread_blas() -> None:
    """Best effort: one OpenBLAS thread per child. nj children already fill the cores, and
    idle BLAS threads spinning beside them doubled the CPU time of the resampler matmul."""
    try:
        with open("/proc/self/maps", encoding="utf-8") as f:
            libs = sorted({line.split()[-1] for line in f
                           if "openblas" in line.lower() and ".so" in line.split()[-1]})
    except OSError:
        return
    names = ("openblas_set_num_threads", "openblas_set_num_threads64_",
             "scipy_openblas_set_num_threads64_", "scipy_openblas_set_num_threads")
    for path in libs:
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for name in names:
            fn = getattr(lib, name, None)
            if fn is not None:
                fn(1)
                break
