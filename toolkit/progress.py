"""Progress of long stages: a tqdm bar on a terminal, plain periodic lines in logs."""
import logging
import math
import sys
import time
from typing import Iterable, Iterator, Optional, TypeVar

T = TypeVar("T")
logger = logging.getLogger("toolkit.progress")


def format_duration(seconds: float) -> str:
    """h:mm:ss (or -:--:-- when unknown)."""
    if seconds is None or not math.isfinite(seconds) or seconds < 0:
        return "-:--:--"
    s = int(round(seconds))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


class Progress:
    """Counts work units; shows a bar when stderr is a terminal, else logs a line with
    rate and ETA at most every `interval_s` seconds (and at the end)."""

    def __init__(self, total: Optional[int], desc: str, unit: str = "it",
                 interval_s: float = 30.0, log: Optional[logging.Logger] = None):
        self.total = total
        self.desc = desc
        self.unit = unit
        self.interval = interval_s
        self.log = log or logger
        self.done = 0
        self.start = time.time()
        self.last = self.start
        self.bar = None
        if sys.stderr.isatty():
            try:
                from tqdm import tqdm
                self.bar = tqdm(total=total, desc=desc, unit=unit, leave=False)
            except ImportError:
                self.bar = None

    def update(self, n: int = 1) -> None:
        self.done += n
        if self.bar is not None:
            self.bar.update(n)
            return
        now = time.time()
        if now - self.last >= self.interval:
            self.last = now
            self.log.info("%s", self.line(now))

    def line(self, now: Optional[float] = None) -> str:
        elapsed = (now or time.time()) - self.start
        rate = self.done / elapsed if elapsed > 0 else 0.0
        if self.total:
            eta = (self.total - self.done) / rate if rate > 0 else float("nan")
            return (f"{self.desc}: {self.done}/{self.total} {self.unit} "
                    f"({100.0 * self.done / self.total:.0f}%, {rate:.1f} {self.unit}/s, "
                    f"elapsed {format_duration(elapsed)}, ETA {format_duration(eta)})")
        return (f"{self.desc}: {self.done} {self.unit} ({rate:.1f} {self.unit}/s, "
                f"elapsed {format_duration(elapsed)})")

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        self.log.info("%s", self.line())

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def track(items: Iterable[T], total: Optional[int], desc: str, unit: str = "it",
          interval_s: float = 30.0) -> Iterator[T]:
    with Progress(total, desc, unit, interval_s) as p:
        for item in items:
            yield item
            p.update()


# --------------------------------------------------------------------------- parallel jobs

_SHARED = None      # a counter forked workers add to (set by parallel_map in the parent)
_LOCAL = None       # the Progress of an in-process run


def tick(n: int = 1) -> None:
    """Called by a job for each unit of work done (an utterance)."""
    if _LOCAL is not None:
        _LOCAL.update(n)
    elif _SHARED is not None:
        with _SHARED.get_lock():
            _SHARED.value += n


def parallel_map(fn, jobs, nj: int, total: Optional[int], desc: str, unit: str = "utt",
                 interval_s: float = 30.0) -> list:
    """`[fn(job) for job in jobs]` in up to `nj` forked processes, with one progress bar
    (or periodic log line) over the `tick`s the jobs report."""
    import multiprocessing as mp
    global _SHARED, _LOCAL
    bar = Progress(total, desc, unit, interval_s)
    try:
        if nj <= 1 or len(jobs) <= 1:
            _LOCAL = bar
            return [fn(job) for job in jobs]
        context = mp.get_context("fork")
        _SHARED = context.Value("l", 0)
        with context.Pool(min(nj, len(jobs))) as pool:
            pending = pool.map_async(fn, jobs)
            while not pending.ready():
                pending.wait(1.0)
                bar.update(_SHARED.value - bar.done)
            results = pending.get()
        bar.update(_SHARED.value - bar.done)
        return results
    finally:
        _SHARED = _LOCAL = None
        bar.close()
