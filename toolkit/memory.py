"""Host memory of a training process: which allocator it runs on, and its RSS.

Training on CPU allocates a few hundred MB of activations per step, in tensors whose sizes
follow the batch's padded length. glibc's malloc serves them from its heap once its mmap
threshold has risen to the largest block freed so far; requests of ever-changing sizes
then no longer fit the holes that small long-lived objects leave, and RSS climbs to several
times the live peak. Pinning the threshold (every block from 4 MiB gets its own mapping,
returned when freed) keeps RSS near the live tensors but pays a page fault per 4 KiB (or a
zeroed huge page) for every large activation of every step: a quarter of the trainer's
CPU went to system time. mimalloc (a wheel on PyPI, a dependency of this package) keeps
freed pages in size-segregated spans, reuses them for the next step's activations and
returns idle ones to the OS after a short delay: the same peak as the pinned threshold at
a fraction of the system time, and faster steps than glibc's defaults
(docs/performance.md, "Host allocator").

A process cannot change its allocator once started, so the training binary re-executes
itself once with the environment `allocator_environment` returns (LD_PRELOAD of the
wheel's library, or glibc's tunables where mimalloc is absent) and logs the allocator it
runs on (`allocator_in_use`). A user who sets GLIBC_TUNABLES (even to nothing) or preloads
an allocator of their own keeps it.
"""
import ctypes
import ctypes.util
import os
import sys
from typing import Dict, List, Optional

_LIBC = None
# Blocks from 4 MiB up get their own mapping: the activations of a batch (a 256 x 64 x 64
# float tensor is 4 MiB) but not the many small tensors, Python objects and buffers.
MMAP_THRESHOLD = 4 << 20
_THP_SETTING = "/sys/kernel/mm/transparent_hugepage/enabled"
# Allocators a user may preload instead of ours (file name stems).
_ALLOCATORS = ("mimalloc", "jemalloc", "tcmalloc")


def mimalloc_library() -> Optional[str]:
    """The shared library of the installed cmeel-mimalloc wheel, or None."""
    try:
        from importlib.metadata import PackageNotFoundError, files
        listed = files("cmeel-mimalloc") or []
    except (ImportError, PackageNotFoundError):
        return None
    candidates = sorted(str(f.locate()) for f in listed
                        if os.path.basename(str(f)).startswith("libmimalloc.so"))
    found = [c for c in candidates if os.path.isfile(c)]
    return os.path.realpath(found[0]) if found else None


def _preloads_an_allocator(preload: str) -> bool:
    return any(name in os.path.basename(entry) for entry in preload.replace(":", " ").split()
               for name in _ALLOCATORS)


def _is_glibc() -> bool:
    try:
        return os.confstr("CS_GNU_LIBC_VERSION").startswith("glibc")
    except (ValueError, OSError):
        return False


def allocator_environment(environ=None, thp_setting: str = _THP_SETTING,
                          mimalloc: Optional[str] = "find") -> Dict[str, str]:
    """The variables a training process should start with; {} when it should keep its
    environment: the user set GLIBC_TUNABLES (even to nothing) or preloads an allocator,
    or the process already runs on ours. mimalloc (the wheel's library; `mimalloc` names
    another path, None means absent) when there is one; otherwise glibc's pinned mmap
    threshold with huge pages, when the C library is glibc and the kernel gives
    transparent huge pages (without them the threshold's page faults cost more than the
    memory it saves)."""
    environ = os.environ if environ is None else environ
    preload = environ.get("LD_PRELOAD", "")
    if "GLIBC_TUNABLES" in environ or _preloads_an_allocator(preload):
        return {}
    library = mimalloc_library() if mimalloc == "find" else mimalloc
    if library:
        return {"LD_PRELOAD": library + (":" + preload if preload.strip() else "")}
    if not _is_glibc():
        return {}
    try:
        with open(thp_setting) as f:
            if "[never]" in f.read():
                return {}
    except OSError:
        return {}
    return {"GLIBC_TUNABLES":
            f"glibc.malloc.hugetlb=1:glibc.malloc.mmap_threshold={MMAP_THRESHOLD}"}


def reexec_with_allocator() -> None:
    """Replaces this process (same PID, arguments and environment) with one started with
    `allocator_environment()`; returns without doing anything when there is nothing to
    change. Call it first thing in a binary's `__main__`, before any work."""
    changes = allocator_environment()
    command = _own_command_line()
    if not changes or command is None:
        return
    env = dict(os.environ, **changes)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable] + command[1:], env)


def _loaded_allocator() -> Optional[str]:
    """Path of a preloaded allocator mapped into this process, or None."""
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                fields = line.split(None, 5)
                path = fields[5].strip() if len(fields) == 6 else ""
                if any(f"lib{name}" in os.path.basename(path) for name in _ALLOCATORS):
                    return path
    except OSError:
        pass
    return None


def allocator_in_use() -> str:
    """What serves this process's malloc, for the training log: a preloaded allocator's
    library, or glibc with its tunables."""
    loaded = _loaded_allocator()
    if loaded:
        return f"{os.path.basename(loaded).split('.so')[0][3:]} ({loaded})"
    tunables = os.environ.get("GLIBC_TUNABLES")
    return f"glibc malloc, GLIBC_TUNABLES={'(unset)' if tunables is None else tunables}"


def _own_command_line() -> Optional[List[str]]:
    """The interpreter's command line when it started the running binary itself (`python
    [flags] -m module args` or `python [flags] path args`); None when the binary runs
    inside another program (runpy from a test harness's forked interpreter, an embedding),
    whose command line would start that program again instead."""
    orig = list(getattr(sys, "orig_argv", None) or [])
    args = sys.argv[1:]
    if len(orig) < len(args) + 2 or orig[len(orig) - len(args):] != args:
        return None
    program = orig[len(orig) - len(args) - 1]
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if spec is not None:
        before = orig[len(orig) - len(args) - 2]
        return orig if before == "-m" and program == spec.name else None
    return orig if os.path.realpath(program) == os.path.realpath(sys.argv[0]) else None


def _libc():
    global _LIBC
    if _LIBC is None:
        try:
            _LIBC = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            _LIBC.malloc_trim.argtypes = [ctypes.c_size_t]
        except (OSError, AttributeError):
            _LIBC = False       # not glibc: its defaults stay
    return _LIBC


def release_free_memory() -> None:
    """Returns glibc's freed heap pages to the OS (malloc_trim); a no-op without glibc or
    under a preloaded allocator, which returns idle pages on its own."""
    libc = _libc()
    if libc and _loaded_allocator() is None:
        libc.malloc_trim(0)


def rss_bytes(pid: Optional[int] = None) -> int:
    """Resident set size of a process (this one by default); 0 when unknown."""
    try:
        with open(f"/proc/{pid or 'self'}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0
