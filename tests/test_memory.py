"""Host memory of training: the training binary starts with glibc settings that keep RSS
near the live tensors (toolkit/memory.py) unless the user chose GLIBC_TUNABLES; forked
loader workers leave the parent's garbage collector as it was."""
import gc
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from torch.utils.data import Dataset

from toolkit.data.loader import build_loader
from toolkit.memory import allocator_tunables, release_free_memory, rss_bytes

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_tunables_respect_the_users_setting_and_the_kernels(tmp_path):
    """Both kernel answers are checked on every host: the setting file is read from a path,
    here written in the kernel's own format (the selected value in brackets)."""
    thp = {}
    for name, text in {"madvise": "always [madvise] never\n", "always": "[always] madvise never\n",
                       "never": "always madvise [never]\n"}.items():
        thp[name] = tmp_path / name
        thp[name].write_text(text)
    ours = "glibc.malloc.hugetlb=1:glibc.malloc.mmap_threshold=4194304"
    assert allocator_tunables({}, str(thp["madvise"])) == ours
    assert allocator_tunables({}, str(thp["always"])) == ours
    assert allocator_tunables({}, str(thp["never"])) == ""
    assert allocator_tunables({}, str(tmp_path / "no-such-file")) == ""
    for users in ("", "glibc.malloc.arena_max=1"):
        assert allocator_tunables({"GLIBC_TUNABLES": users}, str(thp["madvise"])) == ""


def logged_tunables(tmp_path, env_update):
    """The allocator line of a training run that stops at its (missing) config."""
    env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}
    env.update(env_update)
    exp = tmp_path / f"exp{len(env_update)}"
    proc = subprocess.run([sys.executable, "-m", "toolkit.bin.train", "--config",
                           str(tmp_path / "missing.yaml"), "--exp-dir", str(exp)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and proc.stderr.startswith("error:"), proc.stderr
    log = (exp / "log" / "train.rank0.log").read_text()
    return [line.split("GLIBC_TUNABLES=", 1)[1] for line in log.splitlines()
            if "allocator: GLIBC_TUNABLES=" in line]


def test_training_binary_starts_with_the_allocator_settings(tmp_path):
    expected = allocator_tunables({}) or "(unset)"
    assert logged_tunables(tmp_path, {}) == [expected]
    assert logged_tunables(tmp_path, {"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}) == \
        ["glibc.malloc.arena_max=2"]


def test_binary_run_inside_another_program_does_not_start_that_program_again(tmp_path):
    """A harness that runs the binary with runpy in its own interpreter (the tests' zygote)
    has a command line of its own: re-executing it would run the harness, not training."""
    env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}
    exp = tmp_path / "exp"
    harness = ("import runpy, sys; sys.argv = ['train', '--config', sys.argv[1], '--exp-dir', "
               "sys.argv[2]]; runpy.run_module('toolkit.bin.train', run_name='__main__', "
               "alter_sys=True)")
    proc = subprocess.run([sys.executable, "-c", harness, str(tmp_path / "missing.yaml"),
                           str(exp)], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 2 and proc.stderr.startswith("error:"), proc.stderr
    log = (exp / "log" / "train.rank0.log").read_text()
    assert "allocator: GLIBC_TUNABLES=(unset)" in log


def test_rss_and_trim():
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
