"""Host memory of a training process: glibc's allocator settings and the process's RSS.

Training on CPU allocates a few hundred MB of activations per step, in tensors whose sizes
follow the batch's padded length. glibc serves requests below its mmap threshold from its
heap, and that threshold rises to the largest block freed so far (up to 32 MB): after the
first steps nearly every activation comes from the heap, where small long-lived objects
split the freed blocks and requests of ever-changing sizes no longer fit the holes, so RSS
climbs to several times the live peak (egs/wake_word/s0/RESULTS.md, "Training memory").

A fixed threshold gives every block of at least that size its own mapping, returned to the
OS when freed: RSS follows the live tensors. Each new mapping is faulted in again, which
costs about 0.5 s per GB in 4 KiB pages on the 2-core machines here (a training step
allocates about 1 GB) but a tenth of that in transparent huge pages. glibc asks for huge
pages (madvise) only with its `glibc.malloc.hugetlb` tunable, read at start-up, so the
training binary re-executes itself once with `GLIBC_TUNABLES` set (`allocator_tunables`).
"""
import ctypes
import ctypes.util
import os
import sys
from typing import List, Optional

_LIBC = None
# Blocks from 4 MiB up get their own mapping: the activations of a batch (a 256 x 64 x 64
# float tensor is 4 MiB) but not the many small tensors, Python objects and buffers.
MMAP_THRESHOLD = 4 << 20
_THP_SETTING = "/sys/kernel/mm/transparent_hugepage/enabled"


def allocator_tunables(environ=None, thp_setting: str = _THP_SETTING) -> str:
    """The GLIBC_TUNABLES a training process should start with; "" when it should keep
    its environment: the user set GLIBC_TUNABLES (even to nothing), the C library is not
    glibc, or the kernel gives no transparent huge pages (without them the fixed
    threshold's page faults would cost more than the memory it saves)."""
    environ = os.environ if environ is None else environ
    if "GLIBC_TUNABLES" in environ:
        return ""
    try:
        if not os.confstr("CS_GNU_LIBC_VERSION").startswith("glibc"):
            return ""
    except (ValueError, OSError):
        return ""
    try:
        with open(thp_setting) as f:
            if "[never]" in f.read():
                return ""
    except OSError:
        return ""
    return f"glibc.malloc.hugetlb=1:glibc.malloc.mmap_threshold={MMAP_THRESHOLD}"


def reexec_with_allocator_tunables() -> None:
    """Replaces this process (same PID, arguments and environment) with one started with
    `allocator_tunables()`; returns without doing anything when there are none. Call it
    first thing in a binary's `__main__`, before any work."""
    tunables = allocator_tunables()
    command = _own_command_line()
    if not tunables or command is None:
        return
    env = dict(os.environ, GLIBC_TUNABLES=tunables)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable] + command[1:], env)


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
    """Returns freed heap pages to the OS (glibc malloc_trim); a no-op without it."""
    libc = _libc()
    if libc:
        libc.malloc_trim(0)


def rss_bytes(pid: Optional[int] = None) -> int:
    """Resident set size of a process (this one by default); 0 when unknown."""
    try:
        with open(f"/proc/{pid or 'self'}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0
