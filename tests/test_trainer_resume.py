"""Exact resume: SIGKILL at arbitrary moments, rerun, end bitwise identical to an
uninterrupted run (one process, and two gloo ranks through torchrun)."""
import os
import random
import subprocess
import time

import pytest

from train_utils import (Corpus, assert_states_identical, env, kill_tree, latest_payload,
                         launcher, run_train)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return Corpus(str(tmp_path_factory.mktemp("resume")), num_train=48, num_dev=8)


def newest_step(exp):
    from toolkit.trainer.checkpoint import list_checkpoints
    infos = list_checkpoints(exp) if os.path.isdir(exp) else []
    return infos[-1].step if infos else -1


def train_with_kills(args, nproc, kill_points, exp, rng):
    """Starts training and SIGKILLs it (launcher and workers together) once a checkpoint
    at or past each step exists, plus a random delay so kills also land inside steps,
    loader start-up and checkpoint writes; then lets a final rerun finish.
    Returns how many kills hit a live run."""
    hits = 0
    for target in kill_points:
        proc = subprocess.Popen(launcher(nproc) + args, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, env=env(), start_new_session=True)
        deadline = time.time() + 120
        while proc.poll() is None and newest_step(exp) < target and time.time() < deadline:
            time.sleep(0.02)
        time.sleep(rng.uniform(0.0, 0.4))
        if proc.poll() is None:
            kill_tree(proc)
            hits += 1
    result = run_train(args, nproc)
    assert result.returncode == 0, result.stderr[-3000:]
    return hits


@pytest.mark.parametrize("nproc", [0, 2], ids=["one-process", "torchrun-2-ranks"])
def test_killed_runs_end_bitwise_identical(corpus, tmp_path, nproc):
    ref_exp = str(tmp_path / "reference")
    result = run_train(corpus.train_args(ref_exp), nproc)
    assert result.returncode == 0, result.stderr[-3000:]
    reference = latest_payload(ref_exp)

    exp = str(tmp_path / "killed")
    rng = random.Random(1234 + nproc)
    total = reference["step"]
    # Kill points stay in the first two thirds of the run: a kill aimed at the last
    # steps can arrive after a loaded machine has already finished the whole run.
    points = sorted(rng.sample(range(1, max(4, total * 2 // 3)), 3))
    hits = train_with_kills(corpus.train_args(exp), nproc, points, exp, rng)
    assert hits == 3, "every kill should land while the run is alive"
    resumed = latest_payload(exp)

    assert resumed["step"] == reference["step"] and resumed["epoch"] == reference["epoch"]
    assert_states_identical(reference["model"], resumed["model"], "model")
    assert_states_identical(reference["optimizer"], resumed["optimizer"], "optimizer")
    assert reference["schedule"] == resumed["schedule"]
    # The resumed run really resumed (not restarted from scratch): its logs say so.
    log = open(os.path.join(exp, "log", "train.rank0.log")).read()
    assert "resumed from" in log


def test_corrupt_newest_checkpoint_falls_back(corpus, tmp_path):
    exp = str(tmp_path / "exp")
    first = run_train(corpus.train_args(exp, "training.max_epoch=1"))
    assert first.returncode == 0, first.stderr[-2000:]
    from toolkit.trainer.checkpoint import list_checkpoints
    infos = list_checkpoints(exp)
    assert len(infos) >= 2
    newest = infos[-1]
    with open(newest.path, "r+b") as f:     # truncate the newest checkpoint
        f.truncate(os.path.getsize(newest.path) // 2)
    again = run_train(corpus.train_args(exp, "training.max_epoch=2"))
    assert again.returncode == 0, again.stderr[-2000:]
    assert "unusable" in again.stderr and os.path.basename(newest.path) in again.stderr
    assert f"step {infos[-2].step}" in again.stderr   # resumed from the previous one
