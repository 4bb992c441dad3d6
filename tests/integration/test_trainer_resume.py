"""Exact resume: SIGKILL at arbitrary moments, rerun, end bitwise identical to an
uninterrupted run — modules, every optimizer, schedule and GradScaler, position, and each
rank's random streams. Covered: the keyword task on one process (raw WAVs with dither,
accumulation, bf16 autocast, two loader workers) and on two gloo ranks (fp16 with a
GradScaler); and the two-optimizer test task (phase switch, ramped loss weight) on one
process."""
import copy
import os
import random

import pytest

from train_utils import (TINY_CONFIG, Corpus, assert_none_alive, assert_states_identical,
                         kill_tree, latest_payload, run_train, start_train)

TWO_OPTIMIZER = {
    "task": {"type": "example"},
    "dataset": {"feature": {"num_mel_bins": 20, "dither": 1.0}, "volume_range": [0.7, 1.3],
                "batch_size": 6, "sort_window": 20, "num_workers": 2},
    "model": {"hidden": 16, "crop_frames": 12, "dropout": 0.1},
    "optim": {"generator": {"type": "adamw", "lr": 0.003, "grad_clip": 1.0,
                            "scheduler": {"type": "warmup_linear", "warmup_steps": 2}},
              "critic": {"type": "adamw", "lr": 0.001, "start_fraction": 0.3,
                         "scheduler": {"type": "exponential", "gamma": 0.98}}},
    "training": {"seed": 5, "max_epoch": 3, "log_interval": 2, "save_interval_steps": 2,
                 "keep_last": 2, "keep_best": 2},
}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return Corpus(str(tmp_path_factory.mktemp("resume")), num_train=48, num_dev=8)


def newest_step(exp):
    from toolkit.trainer.checkpoint import list_checkpoints
    infos = list_checkpoints(exp) if os.path.isdir(exp) else []
    return infos[-1].step if infos else -1


def train_with_kills(args, nproc, kill_points, exp, rng, extra_env=None, torchrun=None):
    """Starts training and SIGKILLs it (launcher and workers together) once a checkpoint
    at or past each step exists, plus a random delay so kills also land inside steps,
    loader start-up and checkpoint writes; then lets a final rerun finish. Each kill, and
    the end, checks that no process of the run (launcher, ranks, loader workers) lives on.
    Returns how many kills hit a live run. A one-process run is forked from the test
    zygote, in a session of its own; a run of several ranks is a real torchrun, whose
    whole tree is killed, unless torchrun=False (ranks forked from the zygote: where the
    launcher is not what a test is about); the final rerun is forked from the zygote."""
    hits = 0
    for target in kill_points:
        proc = start_train(args, nproc, extra_env, torchrun=torchrun)
        import time
        deadline = time.time() + 180
        while proc.poll() is None and newest_step(exp) < target and time.time() < deadline:
            time.sleep(0.02)
        time.sleep(rng.uniform(0.0, 0.4))
        if proc.poll() is None:
            kill_tree(proc)
            hits += 1
    result = run_train(args, nproc, timeout=600, extra_env=extra_env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert_none_alive(naming=exp)
    return hits


def assert_same_run(reference: dict, resumed: dict) -> None:
    assert resumed["step"] == reference["step"] and resumed["epoch"] == reference["epoch"]
    for part in ("modules", "optimizers", "schedules", "scalers", "task_state"):
        assert set(reference[part]) == set(resumed[part]), part
        assert_states_identical(reference[part], resumed[part], part)
    assert reference["global_batch_pos"] == resumed["global_batch_pos"]
    # Every rank's random streams (Python, NumPy, torch) end where they would have.
    assert_states_identical({"r": reference["per_rank"]}, {"r": resumed["per_rank"]}, "per_rank")


CASES = {
    "kws-1proc-dither-accum-bf16": (0, None, ["dataset.feature.dither=1.0",
                                              "training.accum_grad=2", "training.use_amp=true",
                                              "training.amp_dtype=bfloat16"]),
    "kws-2ranks-dither-fp16-scaler": (2, None, ["dataset.feature.dither=1.0", "training.use_amp=true",
                                                "training.amp_dtype=float16"]),
    # Two optimizers on two ranks (with fp16 GradScalers) is the codec family's resume test
    # (test_codec_task.py): here the test task's phase switch and ramped weight, on one process.
    "two-optimizers-1proc": (0, TWO_OPTIMIZER, []),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_killed_runs_end_bitwise_identical(corpus, tmp_path, case):
    nproc, config, overrides = CASES[case]
    conf = None
    if config is not None:
        conf = corpus.write_config(copy.deepcopy(config), name=f"{case}.yaml")
    ref_exp = str(tmp_path / "reference")
    result = run_train(corpus.train_args(ref_exp, *overrides, config=conf), nproc)
    assert result.returncode == 0, result.stderr[-3000:]
    reference = latest_payload(ref_exp)

    exp = str(tmp_path / "killed")
    rng = random.Random(1234 + nproc + len(case))
    total = reference["step"]
    # Kill points stay in the first two thirds of the run: a kill aimed at the last
    # steps can arrive after a loaded machine has already finished the whole run.
    points = sorted(rng.sample(range(1, max(4, total * 2 // 3)), 3))
    # Ranks forked from the zygote: killing a real torchrun's tree (launcher, ranks in their
    # own sessions, loader workers) and resuming bitwise is test_speaker_task's torchrun case.
    hits = train_with_kills(corpus.train_args(exp, *overrides, config=conf), nproc, points, exp,
                            rng, torchrun=False)
    assert hits == 3, "every kill should land while the run is alive"
    resumed = latest_payload(exp)
    assert_same_run(reference, resumed)
    # The resumed run really resumed (not restarted from scratch): its logs say so.
    log = open(os.path.join(exp, "log", "train.rank0.log")).read()
    assert "resumed from" in log
    if "scaler" in case:
        scaler = resumed["scalers"]["model"]
        assert scaler["_growth_tracker"] > 0 and scaler["scale"] > 0
    if config is not None:
        # Both optimizers by name; the critic's phase began at 30 % of the steps.
        assert set(resumed["optimizers"]) == {"generator", "critic"}
        assert resumed["schedules"]["critic"]["step_count"] < resumed["step"]
        assert resumed["schedules"]["generator"]["step_count"] == resumed["step"]


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
