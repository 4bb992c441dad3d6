"""The one DataLoader recipe of the pipeline: forked workers that are checked to have
started, and iteration that ends only once the helper threads it started are gone."""
import gc
import logging
import multiprocessing
import os
import signal
import threading
import time
from typing import List, Optional, Sequence

import torch
from torch.utils.data import DataLoader, Dataset

logger = logging.getLogger(__name__)


def _identity(x):
    return x


# Workers hand tensors over through a Unix socket that multiprocessing binds at
# <temp dir>/pymp-XXXXXXXX/listener-XXXXXXXX; a path past the socket address's 107 bytes
# fails in a helper thread and the workers wait forever.
_SUN_PATH_MAX = 107


def check_socket_dir() -> None:
    """UserError (naming TMPDIR) where worker processes could not pass tensors back."""
    from multiprocessing import util
    from toolkit.errors import UserError
    sockets = util.get_temp_dir()
    size = len(os.fsencode(os.path.join(sockets, "listener-xxxxxxxx")))
    if size > _SUN_PATH_MAX:
        raise UserError(
            f"data-loader workers pass tensors through Unix sockets under the temporary "
            f"directory {os.path.dirname(sockets)} (TMPDIR), whose socket path would be "
            f"{size} bytes, over the {_SUN_PATH_MAX} a socket takes: set TMPDIR to a shorter "
            f"directory (e.g. /tmp), or dataset.num_workers=0")


class ForkSafeLoader:
    """A DataLoader whose forked workers are checked to have started, and whose iteration
    ends only once the helper threads it started are gone.

    Workers are forked (copy-on-write data lists), but CPython 3.11 forks unsafely while
    another thread holds the interpreter's thread-list lock: a thread exiting, or a C++
    thread (gloo's run loops) briefly entering Python. The child then waits forever inside
    fork and the rank hangs (seen about once per thousand forks with two gloo ranks).
    Two defences:
    - the previous loader's queue-feeder threads exit just as the next loader forks
      (train epoch -> dev -> next epoch), so iteration waits until they are gone;
    - each worker reports in from `worker_init_fn`; a worker that has not reported within
      `startup_timeout_s` is stuck in fork, so the workers are replaced (the batches they
      would have served are asked for again: nothing is skipped or repeated)."""

    def __init__(self, loader: DataLoader, ready=None, startup_timeout_s: float = 10.0,
                 attempts: int = 3, thread_exit_timeout_s: float = 30.0):
        self.loader = loader
        self.ready = ready
        self.startup_timeout = startup_timeout_s
        self.attempts = attempts
        self.thread_timeout = thread_exit_timeout_s

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self):
        iterator = self._start()
        try:
            yield from iterator
        finally:
            self._finish(iterator)
            del iterator

    def _start(self):
        workers = self.loader.num_workers
        patience = self.startup_timeout
        for attempt in range(1, self.attempts + 1):
            if self.ready is not None:
                self.ready.value = 0
            iterator = self._fork_workers()
            if self.ready is None or workers == 0:
                return iterator
            deadline = time.monotonic() + patience
            while self.ready.value < workers and time.monotonic() < deadline:
                time.sleep(0.002)
            if self.ready.value >= workers:
                return iterator
            logger.warning("%d of %d data-loader workers did not start within %.0f s (stuck in "
                           "fork); replacing them (attempt %d of %d)",
                           workers - self.ready.value, workers, patience, attempt, self.attempts)
            self._finish(iterator, stuck=True)
            del iterator
            patience *= 2
        raise RuntimeError(f"data-loader workers failed to start {self.attempts} times in a row; "
                           "set dataset.num_workers=0 to load in the training process")

    def _fork_workers(self):
        """iter(loader), which forks the workers. The parent's objects are frozen out of
        the garbage collector across the fork: a child's collections then leave them (and
        the copy-on-write pages they live in) alone, while the parent collects them again
        once the workers exist."""
        if self.loader.num_workers == 0:
            return iter(self.loader)
        check_socket_dir()
        frozen_before = gc.get_freeze_count() > 0      # someone else's freeze stays
        gc.freeze()
        try:
            return iter(self.loader)
        finally:
            if not frozen_before:
                gc.unfreeze()

    def _finish(self, iterator, stuck: bool = False) -> None:
        feeders = _queue_feeder_threads(iterator)
        shutdown = getattr(iterator, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()      # idempotent; already done when the iterator was exhausted
        # Shutdown's stop message starts the feeder of a worker queue that had no index
        # yet (fewer batches than workers times prefetch); that thread is waited for too.
        feeders += [t for t in _queue_feeder_threads(iterator) if t not in feeders]
        if stuck:
            # A worker stuck in fork ignores the shutdown request and may have inherited a
            # SIGTERM handler it can never run; it is off the loader's watch list now.
            for worker in getattr(iterator, "_workers", []):
                if worker.is_alive():
                    worker.kill()
                    worker.join(self.thread_timeout)
        wait_for_threads_gone(feeders, self.thread_timeout)


def _die_with_parent(parent: int) -> None:
    """Ends a forked worker whose parent is gone, now or later. torch's own watchdog
    remembers the parent pid the worker sees first: a trainer killed between the fork and
    that moment leaves a worker that takes init (pid 1) for its parent and waits forever,
    holding hundreds of MB."""
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)     # PR_SET_PDEATHSIG: killed with the parent
    except (OSError, AttributeError):
        pass                                        # not Linux: the check below still runs
    if os.getppid() != parent:                      # died before the signal was armed
        os._exit(1)


class _ReportStarted:
    """worker_init_fn: counts workers that made it through fork; a worker dies with its
    trainer."""

    def __init__(self, counter):
        self.counter = counter
        self.parent = os.getpid()

    def __call__(self, worker_id: int) -> None:
        _die_with_parent(self.parent)
        with self.counter.get_lock():
            self.counter.value += 1


def _queue_feeder_threads(iterator) -> List[threading.Thread]:
    """The threads that feed a multi-process DataLoader iterator's queues (none for an
    in-process loader). Other threads, such as TensorBoard's writer, live on and are left
    alone."""
    queues = list(getattr(iterator, "_index_queues", None) or [])
    queues.append(getattr(iterator, "_worker_result_queue", None))
    threads = [getattr(q, "_thread", None) for q in queues]
    return [t for t in threads if isinstance(t, threading.Thread)]


def wait_for_threads_gone(threads, timeout_s: float) -> None:
    """Join `threads`, then wait until the OS has removed them too: join returns before a
    Python thread has finished unregistering itself."""
    deadline = time.monotonic() + timeout_s
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
        task = f"/proc/self/task/{t.native_id}"
        while t.native_id is not None and os.path.exists(task) and time.monotonic() < deadline:
            time.sleep(0.001)
        if t.is_alive() or (t.native_id is not None and os.path.exists(task)):
            logger.warning("data-loader thread %s still running after %.0f s; forking the next "
                           "loader anyway", t.name, timeout_s)


def build_loader(dataset: Dataset, num_workers: int, prefetch_factor: int, seed: int,
                 sampler: Optional[Sequence[int]] = None) -> ForkSafeLoader:
    """The one DataLoader recipe for map-style (with `sampler`) and iterable datasets. Its
    own generator keeps DataLoader from drawing on the global torch RNG, which the training
    step's RNG state must not depend on."""
    kwargs = {}
    ready = None
    if num_workers > 0:
        context = multiprocessing.get_context("fork")
        ready = context.Value("i", 0)
        kwargs = dict(prefetch_factor=prefetch_factor, persistent_workers=False,
                      multiprocessing_context=context, worker_init_fn=_ReportStarted(ready))
    if sampler is not None:
        kwargs["sampler"] = sampler
    loader = DataLoader(dataset, batch_size=None, num_workers=num_workers,
                        collate_fn=_identity, pin_memory=False,
                        generator=torch.Generator().manual_seed(seed), **kwargs)
    return ForkSafeLoader(loader, ready)


def make_loader(dataset: Dataset, start: int, num_workers: int, prefetch_factor: int,
                seed: int) -> ForkSafeLoader:
    """Loader over batches [start:]."""
    return build_loader(dataset, num_workers, prefetch_factor, seed,
                        sampler=range(start, len(dataset)))
