"""Host memory of training: the training binary starts on mimalloc (the wheel setup.py
requires; glibc's pinned mmap threshold where it is absent) unless the user chose an
allocator or GLIBC_TUNABLES (toolkit/memory.py), and logs what it runs on; forked loader
workers leave the parent's garbage collector as it was."""
import gc
import json
import os
import shutil
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


def _thp_settings(tmp_path) -> dict:
    """The kernel's huge-page setting in its own format (the selected value in brackets)."""
    thp = {}
    for name, text in {"madvise": "always [madvise] never\n", "always": "[always] madvise never\n",
                       "never": "always madvise [never]\n"}.items():
        thp[name] = str(tmp_path / name)
        (tmp_path / name).write_text(text)
    return thp


def _copy_of_mimalloc(folder, name: str) -> str:
    """mimalloc's library under another name or in another folder: a real allocator."""
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, name)
    shutil.copy(mimalloc_library(), path)
    return path


def test_environment_keeps_the_users_choice_and_falls_back_to_glibc(tmp_path):
    """Every branch on every host: the library path and the kernel's huge-page setting are
    given; libraries are real, tried in a child as the trainer would be started."""
    thp = _thp_settings(tmp_path)
    lib = mimalloc_library()
    assert allocator_environment({}, thp["never"], lib) == {"LD_PRELOAD": lib}
    # A preload of the user's that does not serve malloc stays first, ours after it.
    assert allocator_environment({"LD_PRELOAD": "libm.so.6"}, thp["madvise"], lib) == \
        {"LD_PRELOAD": "libm.so.6:" + lib}
    for theirs in ("/usr/lib/x86_64-linux-gnu/libjemalloc.so.2", "libtcmalloc_minimal.so.4",
                   "/a/libfoo.so /b/libmimalloc.so"):
        assert allocator_environment({"LD_PRELOAD": theirs}, thp["madvise"], lib) == {}
    for users in ("", "glibc.malloc.arena_max=1"):
        assert allocator_environment({"GLIBC_TUNABLES": users}, thp["madvise"], lib) == {}
    # Without mimalloc: glibc's pinned threshold, only with transparent huge pages.
    assert allocator_environment({}, thp["madvise"], None) == {"GLIBC_TUNABLES": OURS}
    assert allocator_environment({}, thp["always"], None) == {"GLIBC_TUNABLES": OURS}
    assert allocator_environment({}, thp["never"], None) == {}
    assert allocator_environment({}, str(tmp_path / "no-such-file"), None) == {}


def test_a_library_that_cannot_be_preloaded_falls_back_to_the_tunables(tmp_path):
    """LD_PRELOAD splits on spaces and colons and ld.so skips a library it cannot load
    (with an error from every process): such a mimalloc is not preloaded."""
    thp = _thp_settings(tmp_path)
    spaced = _copy_of_mimalloc(tmp_path / "my venv", "libmimalloc.so")
    coloned = _copy_of_mimalloc(tmp_path / "a:b", "libmimalloc.so")
    broken = tmp_path / "libmimalloc.so.3"
    broken.write_bytes(b"\x7fELF not a library" * 64)
    for library in (spaced, coloned, str(broken)):
        assert allocator_environment({}, thp["madvise"], library) == \
            {"GLIBC_TUNABLES": OURS}, library
        assert allocator_environment({}, thp["never"], library) == {}, library
        assert allocator_environment({"LD_PRELOAD": "libm.so.6"}, thp["madvise"],
                                     library) == {"GLIBC_TUNABLES": OURS}, library


def test_a_users_allocator_or_sanitizer_keeps_its_place(tmp_path):
    """An allocator the user preloads is kept whatever its name (it serves malloc in a
    child started with it), and a sanitizer's runtime, which must come first, stays
    first: the user's LD_PRELOAD is left as it is."""
    thp = _thp_settings(tmp_path)
    lib = mimalloc_library()
    theirs = _copy_of_mimalloc(tmp_path, "libmyalloc.so")
    asan = _copy_of_mimalloc(tmp_path / "asan", "libasan.so.8")
    for preload in (theirs, f"libm.so.6 {theirs}", asan, f"{asan}:libm.so.6"):
        assert allocator_environment({"LD_PRELOAD": preload}, thp["madvise"], lib) == {}, \
            preload


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


def _venv_under_a_space(tmp_path) -> str:
    """A venv in a folder whose name has a space, holding its own copy of the
    cmeel-mimalloc wheel and seeing this interpreter's other packages; returns its python
    (the toolkit itself comes from the working directory, ROOT)."""
    import sysconfig
    venv = tmp_path / "my venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                   timeout=60)
    python = str(venv / "bin" / "python")
    purelib = subprocess.run([python, "-c", "import sysconfig; "
                                            "print(sysconfig.get_paths()['purelib'])"],
                             check=True, capture_output=True, text=True).stdout.strip()
    ours = sysconfig.get_paths()["purelib"]
    dist = next(n for n in os.listdir(ours) if n.startswith("cmeel_mimalloc-"))
    shutil.copytree(os.path.join(ours, dist), os.path.join(purelib, dist))
    _copy_of_mimalloc(os.path.join(purelib, "cmeel.prefix", "lib"), "libmimalloc.so")
    with open(os.path.join(purelib, "this-interpreters-packages.pth"), "w") as f:
        f.write(ours + "\n")
    return python


def test_training_in_a_venv_under_a_path_with_a_space(tmp_path):
    """LD_PRELOAD cannot name that venv's mimalloc: the trainer runs on glibc's tunables
    (where huge pages allow), and no ld.so error is printed."""
    python = _venv_under_a_space(tmp_path)
    found = subprocess.run([python, "-c", "from toolkit.memory import mimalloc_library; "
                                          "print(mimalloc_library())"], cwd=ROOT, check=True,
                           capture_output=True, text=True).stdout.strip()
    assert " " in found and found.startswith(str(tmp_path))
    env = {k: v for k, v in os.environ.items() if k not in ("GLIBC_TUNABLES", "LD_PRELOAD")}
    exp = tmp_path / "exp"
    proc = subprocess.run([python, "-m", "toolkit.bin.train", "--config",
                           str(tmp_path / "missing.yaml"), "--exp-dir", str(exp)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and proc.stderr.startswith("error:"), proc.stderr
    assert "ld.so" not in proc.stderr and "LD_PRELOAD" not in proc.stderr, proc.stderr
    expected = allocator_environment({}, mimalloc=found).get("GLIBC_TUNABLES", "(unset)")
    log = (exp / "log" / "train.rank0.log").read_text()
    assert f"allocator: glibc malloc, GLIBC_TUNABLES={expected}" in log, log


# A binary's __main__ as toolkit.bin.train's: re-executed on the allocator, it reports what
# serves its malloc, then what a program it starts gets (its environment, its malloc).
_TRAINER_AND_CHILD = """
import json, subprocess, sys
from toolkit.memory import allocator_in_use, reexec_with_allocator
reexec_with_allocator()
child = subprocess.run([sys.executable, "-c", "import json, os; from toolkit.memory import "
                        "allocator_in_use; print(json.dumps([dict(os.environ), "
                        "allocator_in_use()]))"], capture_output=True, text=True, check=True)
environ, allocator = json.loads(child.stdout)
print(json.dumps({"trainer": allocator_in_use(), "child": allocator, "child_env": environ,
                  "child_stderr": child.stderr}))
"""


def test_programs_the_trainer_starts_do_not_inherit_its_allocator(tmp_path):
    """The trainer runs on mimalloc; what it starts (TTS engines, git, W&B) gets the
    environment the user gave, their own preload included, and glibc's malloc."""
    script = tmp_path / "trainer.py"
    script.write_text(_TRAINER_AND_CHILD)
    env = {k: v for k, v in os.environ.items() if k not in ("GLIBC_TUNABLES", "LD_PRELOAD")}
    for users in ({}, {"LD_PRELOAD": "libm.so.6"}):
        proc = subprocess.run([sys.executable, str(script)], cwd=ROOT, env=dict(env, **users),
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        report = json.loads(proc.stdout)
        assert report["trainer"] == f"mimalloc ({mimalloc_library()})"
        assert report["child"] == "glibc malloc, GLIBC_TUNABLES=(unset)"
        assert {k: v for k, v in report["child_env"].items()
                if k in ("LD_PRELOAD", "GLIBC_TUNABLES") or k.startswith("TOOLKIT_ALLOC")} \
            == users
        assert "ld.so" not in proc.stderr + report["child_stderr"]


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
