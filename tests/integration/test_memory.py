"""Host memory of training: the training binary starts on mimalloc (the wheel setup.py
requires; glibc's pinned mmap threshold where it is absent) unless the user chose an
allocator or GLIBC_TUNABLES (toolkit/memory.py), and logs what it runs on; forked loader
workers leave the parent's garbage collector as it was."""
import gc
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from torch.utils.data import Dataset

from toolkit.data.loader import build_loader
from toolkit.memory import (allocator_environment, mimalloc_library, release_free_memory,
                            rss_bytes)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OURS = "glibc.malloc.hugetlb=1:glibc.malloc.mmap_threshold=4194304"


def test_the_allocator_wheel_is_installed():
    library = mimalloc_library()
    assert library and os.path.isfile(library), "cmeel-mimalloc (setup.py) is not installed"
    assert os.path.basename(library).startswith("libmimalloc.so")


def test_environment_keeps_the_users_choice_and_falls_back_to_glibc(tmp_path):
    """Every branch on every host: the library path and the kernel's huge-page setting are
    given, the setting written in the kernel's own format (the selected value in brackets)."""
    thp = {}
    for name, text in {"madvise": "always [madvise] never\n", "always": "[always] madvise never\n",
                       "never": "always madvise [never]\n"}.items():
        thp[name] = tmp_path / name
        thp[name].write_text(text)
    lib = "/opt/x/libmimalloc.so"
    assert allocator_environment({}, str(thp["never"]), lib) == {"LD_PRELOAD": lib}
    # Another preload stays, after ours; an allocator of the user's own is kept as it is.
    assert allocator_environment({"LD_PRELOAD": "/usr/lib/libfoo.so"}, str(thp["madvise"]),
                                 lib) == {"LD_PRELOAD": lib + ":/usr/lib/libfoo.so"}
    for theirs in ("/usr/lib/x86_64-linux-gnu/libjemalloc.so.2", "libtcmalloc_minimal.so.4",
                   "/a/libfoo.so /b/libmimalloc.so"):
        assert allocator_environment({"LD_PRELOAD": theirs}, str(thp["madvise"]), lib) == {}
    for users in ("", "glibc.malloc.arena_max=1"):
        assert allocator_environment({"GLIBC_TUNABLES": users}, str(thp["madvise"]), lib) == {}
    # Without mimalloc: glibc's pinned threshold, only with transparent huge pages.
    assert allocator_environment({}, str(thp["madvise"]), None) == {"GLIBC_TUNABLES": OURS}
    assert allocator_environment({}, str(thp["always"]), None) == {"GLIBC_TUNABLES": OURS}
    assert allocator_environment({}, str(thp["never"]), None) == {}
    assert allocator_environment({}, str(tmp_path / "no-such-file"), None) == {}


def logged_allocator(tmp_path, env_update):
    """The allocator lines of a training run that stops at its (missing) config: what the
    trainer found mapped into its own process."""
    env = {k: v for k, v in os.environ.items() if k not in ("GLIBC_TUNABLES", "LD_PRELOAD")}
    env.update(env_update)
    exp = tmp_path / f"exp{len(os.listdir(tmp_path))}"
    proc = subprocess.run([sys.executable, "-m", "toolkit.bin.train", "--config",
                           str(tmp_path / "missing.yaml"), "--exp-dir", str(exp)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and proc.stderr.startswith("error:"), proc.stderr
    log = (exp / "log" / "train.rank0.log").read_text()
    return [line.split("allocator: ", 1)[1] for line in log.splitlines()
            if "allocator: " in line]


def test_training_binary_runs_on_mimalloc_unless_the_user_chose(tmp_path):
    library = mimalloc_library()
    assert logged_allocator(tmp_path, {}) == [f"mimalloc ({library})"]
    assert logged_allocator(tmp_path, {"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}) == \
        ["glibc malloc, GLIBC_TUNABLES=glibc.malloc.arena_max=2"]


def test_binary_run_inside_another_program_does_not_start_that_program_again(tmp_path):
    """A harness that runs the binary with runpy in its own interpreter (the tests' zygote)
    has a command line of its own: re-executing it would run the harness, not training."""
    env = {k: v for k, v in os.environ.items() if k not in ("GLIBC_TUNABLES", "LD_PRELOAD")}
    exp = tmp_path / "exp"
    harness = ("import runpy, sys; sys.argv = ['train', '--config', sys.argv[1], '--exp-dir', "
               "sys.argv[2]]; runpy.run_module('toolkit.bin.train', run_name='__main__', "
               "alter_sys=True)")
    proc = subprocess.run([sys.executable, "-c", harness, str(tmp_path / "missing.yaml"),
                           str(exp)], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 2 and proc.stderr.startswith("error:"), proc.stderr
    log = (exp / "log" / "train.rank0.log").read_text()
    assert "allocator: glibc malloc, GLIBC_TUNABLES=(unset)" in log


def test_rss_and_trim():
    # A long-lived worker's heap may hold a free chunk as large as the block, resident:
    # trimmed first, the block's pages are fresh whichever chunk serves it.
    release_free_memory()
    before = rss_bytes()
    block = np.ones(64 << 20, dtype=np.uint8)         # 64 MiB, touched
    assert rss_bytes() >= before + (48 << 20)
    del block
    release_free_memory()
    assert rss_bytes() < before + (48 << 20)
    assert rss_bytes(os.getpid()) > 0
    assert rss_bytes(2 ** 30) == 0                     # no such process


class Squares(Dataset):
    def __len__(self):
        return 6

    def __getitem__(self, i):
        return torch.tensor([i * i])


@pytest.mark.parametrize("workers", [0, 2])
def test_forked_workers_leave_the_parents_collector_as_it_was(workers):
    assert gc.get_freeze_count() == 0
    loader = build_loader(Squares(), workers, 2, seed=0, sampler=range(6))
    assert [int(x) for x in loader] == [0, 1, 4, 9, 16, 25]
    assert gc.get_freeze_count() == 0
    gc.freeze()                 # someone else's freeze is theirs to undo
    try:
        frozen = gc.get_freeze_count()
        assert [int(x) for x in loader] == [0, 1, 4, 9, 16, 25]
        # An unfreeze would empty the permanent generation; frozen objects that die on
        # their own (refcount) leave it one by one, so the count may fall a little.
        assert gc.get_freeze_count() > frozen // 2
    finally:
        gc.unfreeze()
