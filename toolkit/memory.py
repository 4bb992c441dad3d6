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
itself once with the environment `allocator_environment` returns and logs the allocator it
runs on (`allocator_in_use`). The wheel's library is preloaded only when a trial child
started with that LD_PRELOAD gets its malloc from it: a path with a space or a colon
(LD_PRELOAD splits on both) or a library that does not load falls back to glibc's
tunables, so that no process prints ld.so's errors. A user who sets GLIBC_TUNABLES (even
to nothing) or preloads a library that serves malloc (any allocator, or a sanitizer such
as ASan, which must stay first) keeps their environment; their other preloads stay first,
ours after them. The re-executed trainer puts the variables back as they were before
anything else runs, so the programs it starts (TTS engines, git, W&B's service) do not
inherit them; forked loader workers share the trainer's allocator anyway.
"""
import ctypes
import ctypes.util
import json
import os
import subprocess
import sys
from typing import Dict, List, Mapping, Optional

_LIBC = None
# Blocks from 4 MiB up get their own mapping: the activations of a batch (a 256 x 64 x 64
# float tensor is 4 MiB) but not the many small tensors, Python objects and buffers.
MMAP_THRESHOLD = 4 << 20
_THP_SETTING = "/sys/kernel/mm/transparent_hugepage/enabled"
# Preloads known to serve malloc (file name parts): kept without a trial child.
_MALLOC_LIBRARIES = ("mimalloc", "jemalloc", "tcmalloc", "asan", "hwasan", "tsan", "msan")
# Set only for the re-executed process: JSON {variable: its value before, or null}.
_RESTORE_VARIABLE = "TOOLKIT_ALLOCATOR_RESTORE"
# What the re-executed process started with, of the variables it put back (for the log).
_STARTED_WITH: Dict[str, Optional[str]] = {}


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


def _preload_entries(preload: str) -> List[str]:
    return preload.replace(":", " ").split()     # ld.so's separators


def _names_a_malloc_library(preload: str) -> bool:
    return any(name in os.path.basename(entry) for entry in _preload_entries(preload)
               for name in _MALLOC_LIBRARIES)


def _is_libc(path: str) -> bool:
    name = os.path.basename(path)
    return name.startswith(("libc.so", "libc-"))


def _is_glibc() -> bool:
    try:
        return os.confstr("CS_GNU_LIBC_VERSION").startswith("glibc")
    except (ValueError, OSError):
        return False


def malloc_provider(preload: str, environ: Mapping[str, str]) -> Optional[str]:
    """The real path of the library that serves malloc in a child started with
    LD_PRELOAD=`preload` (libc's when nothing preloaded does, or the preload failed to
    load); None when the child cannot tell (it failed, or the platform has no dladdr)."""
    env = dict(environ, LD_PRELOAD=preload)
    env.pop(_RESTORE_VARIABLE, None)
    try:
        # This file as a script (isolated: no site, no script folder on sys.path).
        res = subprocess.run([sys.executable, "-I", "-S", os.path.abspath(__file__)],
                             env=env, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = res.stdout.split("\n")
    return lines[0] if res.returncode == 0 and lines[0] else None


def allocator_environment(environ=None, thp_setting: str = _THP_SETTING,
                          mimalloc: Optional[str] = "find") -> Dict[str, str]:
    """The variables a training process should start with; {} when it should keep its
    environment: the user set GLIBC_TUNABLES (even to nothing) or preloads a library
    that serves malloc, or the process already runs on ours. mimalloc (the wheel's
    library; `mimalloc` names another path, None means absent) after the user's own
    preloads, when a trial child gets its malloc from it; otherwise glibc's pinned mmap
    threshold with huge pages, when the C library is glibc and the kernel gives
    transparent huge pages (without them the threshold's page faults cost more than the
    memory it saves)."""
    environ = os.environ if environ is None else environ
    preload = environ.get("LD_PRELOAD", "").strip()
    if "GLIBC_TUNABLES" in environ or _names_a_malloc_library(preload):
        return {}
    if preload:
        provider = malloc_provider(preload, environ)
        if provider and not _is_libc(provider):
            return {}        # an allocator of the user's by another name
    library = mimalloc_library() if mimalloc == "find" else mimalloc
    # LD_PRELOAD cannot quote: a space or colon in the path splits it into names that
    # do not exist, and every process started with it would print ld.so's errors.
    if library and not any(c in library for c in " \t\n:"):
        # The user's entries first: one that must come first (as ASan) stays first.
        candidate = f"{preload}:{library}" if preload else library
        if malloc_provider(candidate, environ) == os.path.realpath(library):
            return {"LD_PRELOAD": candidate}
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
    change. In the process so started, puts the variables back as they were, so that
    what it runs in turn starts as it would have. Call it first thing in a binary's
    `__main__`, before any work."""
    if _RESTORE_VARIABLE in os.environ:
        _restore_environment()
        return
    command = _own_command_line()
    changes = allocator_environment() if command is not None else {}
    if not changes:
        return
    before = {name: os.environ.get(name) for name in changes}
    env = dict(os.environ, **changes, **{_RESTORE_VARIABLE: json.dumps(before)})
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable] + command[1:], env)


def _restore_environment() -> None:
    try:
        before = json.loads(os.environ.pop(_RESTORE_VARIABLE))
    except ValueError:
        return
    if not isinstance(before, dict):
        return
    for name, value in before.items():
        _STARTED_WITH[name] = os.environ.get(name)
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = str(value)


class _DlInfo(ctypes.Structure):
    _fields_ = [("fname", ctypes.c_char_p), ("fbase", ctypes.c_void_p),
                ("sname", ctypes.c_char_p), ("saddr", ctypes.c_void_p)]


_MALLOC_FILE: List[Optional[str]] = []     # this process's, once known (it cannot change)


def malloc_file() -> Optional[str]:
    """The real path of the library whose malloc this process calls (dladdr of the
    symbol as the program resolves it: a preload's, else libc's); None when unknown."""
    if not _MALLOC_FILE:
        found = None
        for lib in (None, "libdl.so.2"):       # glibc < 2.34 keeps dladdr in libdl
            try:
                dladdr, info = ctypes.CDLL(lib).dladdr, _DlInfo()
                if dladdr(ctypes.cast(ctypes.CDLL(None).malloc, ctypes.c_void_p),
                          ctypes.byref(info)) and info.fname:
                    found = os.path.realpath(os.fsdecode(info.fname))
                break
            except (OSError, AttributeError):
                pass
        _MALLOC_FILE.append(found)
    return _MALLOC_FILE[0]


def _loaded_allocator() -> Optional[str]:
    """Path of the preloaded library that serves this process's malloc, or None."""
    path = malloc_file()
    return None if path is None or _is_libc(path) else path


def allocator_in_use() -> str:
    """What serves this process's malloc, for the training log: a preloaded library, or
    glibc with the tunables it started with."""
    loaded = _loaded_allocator()
    if loaded:
        return f"{os.path.basename(loaded).split('.so')[0][3:]} ({loaded})"
    tunables = _STARTED_WITH["GLIBC_TUNABLES"] if "GLIBC_TUNABLES" in _STARTED_WITH \
        else os.environ.get("GLIBC_TUNABLES")
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


if __name__ == "__main__":          # malloc_provider's trial child
    print(malloc_file() or "")
