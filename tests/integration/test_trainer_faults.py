"""Trainer faults a user could hit around the exact-resume path, each with the real
training binary: world-size changes on resume, allowed changes applied, init vs resume,
init onto another inventory size, environment-independent secret redaction, per-rank
bad-input counters, data fingerprints of what training reads, duration-filtered
utterances named, Python's RNG seeded, checkpoint housekeeping, the exp-dir lock, and
gradient weighting on uneven data and accumulation. Runs of several ranks are forked
from the test zygote (train_utils.run_train) with torchrun's environment; the SIGKILL of a
two-rank run kills a real torchrun and its workers."""
import errno
import glob
import json
import os
import shutil

import pytest
import torch

from train_utils import Corpus, assert_states_identical, latest_payload, run_train

FAST = ["training.max_epoch=1"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    # No loader workers (the loader is not under test), except where a run is killed.
    return Corpus(str(tmp_path_factory.mktemp("faults")), num_train=42, num_dev=6, workers=0)


@pytest.fixture(scope="module")
def fast_run(corpus, tmp_path_factory):
    """One finished FAST run (one process, OMP_NUM_THREADS=1): tests that only need a
    finished run or its checkpoint start from a copy of it instead of training again."""
    exp = str(tmp_path_factory.mktemp("fast_run") / "exp")
    result = run_train(corpus.train_args(exp, *FAST))
    assert result.returncode == 0, result.stderr[-2000:]
    return exp


def copy_of(fast_run, exp):
    shutil.copytree(fast_run, exp)
    return exp


def keys_of(corpus):
    return sorted(json.loads(line)["key"] for line in open(corpus.train))


def traced(exp, up_to_step=None):
    """(epoch, step, keys) of every traced micro-batch of every rank."""
    rows = []
    for path in glob.glob(os.path.join(exp, "log", "keys.rank*.txt")):
        for line in open(path):
            epoch, step, *keys = line.split()
            if up_to_step is None or int(step) <= up_to_step:
                rows.append((int(epoch), int(step), keys))
    return rows


@pytest.mark.parametrize("first,second", [(2, 0), (0, 2)], ids=["2-to-1", "1-to-2"])
def test_world_size_change_trains_every_utterance_once(corpus, tmp_path, first, second):
    """Stopped mid-epoch on one world size, continued on another: each epoch still sees
    every utterance exactly once (the rest of the epoch is dealt to the new ranks)."""
    exp = str(tmp_path / "exp")
    common = ["training.max_epoch=2", "training.trace_keys=true", "training.save_interval_steps=1"]
    stop = 2      # 7 batches of 6: stopped after 2 steps, mid-epoch on either world size
    result = run_train(corpus.train_args(exp, *common, f"training.max_steps={stop}"), first)
    assert result.returncode == 0, result.stderr[-3000:]
    assert latest_payload(exp)["epoch"] == 0 and latest_payload(exp)["global_batch_pos"] > 0
    first_rows = traced(exp)
    for path in glob.glob(os.path.join(exp, "log", "keys.rank*.txt")):
        os.remove(path)
    again = run_train(corpus.train_args(exp, *common), second)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "world size changed" in again.stderr
    rows = first_rows + traced(exp)
    expected = keys_of(corpus)
    for epoch in (0, 1):
        seen = sorted(k for e, _, keys in rows if e == epoch for k in keys)
        assert seen == expected, f"epoch {epoch}: {len(seen)} keys vs {len(expected)}"
    assert latest_payload(exp)["epoch"] == 2


def test_sigkilled_two_ranks_resume_on_one(corpus, tmp_path):
    """SIGKILL of a 2-rank run mid-epoch, rerun as one process: what the checkpoint
    recorded plus the rerun trains every utterance once per epoch."""
    import random
    import time

    from test_trainer_resume import newest_step
    from train_utils import kill_tree, start_train
    exp = str(tmp_path / "exp")
    # Loader workers too: the kill must leave none of them (kill_tree checks).
    args = corpus.train_args(exp, "training.max_epoch=2", "training.trace_keys=true",
                             "training.save_interval_steps=1", "dataset.feature.dither=1.0",
                             "dataset.num_workers=2")
    proc = start_train(args, 2)          # real torchrun: its whole tree is killed
    deadline = time.time() + 180
    while proc.poll() is None and newest_step(exp) < 2 and time.time() < deadline:
        time.sleep(0.02)
    time.sleep(random.Random(3).uniform(0.0, 0.3))
    assert proc.poll() is None, "the run ended before the kill"
    kill_tree(proc)
    saved = latest_payload(exp)
    committed = traced(exp, up_to_step=saved["step"])
    for path in glob.glob(os.path.join(exp, "log", "keys.rank*.txt")):
        os.remove(path)
    again = run_train(args)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "world size changed (2 -> 1)" in again.stderr
    rows = committed + traced(exp)
    expected = keys_of(corpus)
    for epoch in (0, 1):
        assert sorted(k for e, _, keys in rows if e == epoch for k in keys) == expected, epoch


def test_allowed_optimizer_change_is_applied(corpus, fast_run, tmp_path):
    exp = copy_of(fast_run, str(tmp_path / "exp"))
    result = run_train(corpus.train_args(exp, "training.max_epoch=2", "optim.weight_decay=0.1"))
    assert result.returncode == 0, result.stderr[-2000:]
    assert "allowed configuration change on resume: optim.weight_decay: 0.0 -> 0.1" in result.stderr
    groups = latest_payload(exp)["optimizers"]["model"]["param_groups"]
    assert all(g["weight_decay"] == 0.1 for g in groups)


def test_resume_only_from_a_valid_checkpoint_else_init(corpus, fast_run, tmp_path):
    """Checkpoint files that are all unusable (a kill between .pt and .json, a corrupt
    file) are not a resume: init_checkpoint is used, and the log says so."""
    init = sorted(glob.glob(os.path.join(fast_run, "ckpt-*.pt")))[-1]
    exp = tmp_path / "exp"
    exp.mkdir()
    (exp / "ckpt-000000004.pt").write_bytes(b"killed before its .json")
    (exp / "ckpt-000000002.pt").write_bytes(b"corrupt")
    (exp / "ckpt-000000002.json").write_text(json.dumps({"step": 2, "size": 7,
                                                         "sha256": "0" * 64}))
    result = run_train(corpus.train_args(str(exp), *FAST, "optim.lr=0",
                                         f"training.init_checkpoint={init}"))
    assert result.returncode == 0, result.stderr[-2000:]
    assert "none is usable: not resuming" in result.stderr
    assert f"initialised model from {init}" in result.stderr
    assert "resumed from" not in result.stderr
    start = latest_payload(str(exp))["modules"]["model"]
    src_state = torch.load(init, weights_only=True)["modules"]["model"]
    assert torch.equal(start["classifier.weight"], src_state["classifier.weight"])


def test_init_onto_another_inventory_size(corpus, fast_run, tmp_path):
    init = sorted(glob.glob(os.path.join(fast_run, "ckpt-*.pt")))[-1]
    inv = tmp_path / "two.txt"
    inv.write_text("hey chirp\nsecond word\n")
    strict = run_train(corpus.train_args(str(tmp_path / "a"), *FAST, inventory=str(inv))
                       + ["--init-checkpoint", init])
    assert strict.returncode == 2 and "Traceback" not in strict.stderr
    assert "shape mismatch" in strict.stderr and "classifier.weight (1, " in strict.stderr
    loose = run_train(corpus.train_args(str(tmp_path / "b"), *FAST, "optim.lr=0",
                                        "training.init_allow_missing=true", inventory=str(inv))
                      + ["--init-checkpoint", init])
    assert loose.returncode == 0, loose.stderr[-2000:]
    assert "classifier.weight" in loose.stderr and "keep their fresh" in loose.stderr
    src_state = torch.load(init, weights_only=True)["modules"]["model"]
    new = latest_payload(str(tmp_path / "b"))["modules"]["model"]
    assert new["classifier.weight"].shape[0] == 2
    name = next(k for k in src_state if k.endswith("depthwise.conv.weight"))
    assert torch.equal(new[name], src_state[name])      # the rest came from the init


def test_redaction_does_not_depend_on_the_environment(corpus, tmp_path):
    exp = str(tmp_path / "exp")
    # (a) a secret-named variable whose value is exactly the train list path: redacted in
    # config.yaml, yet a rerun without the variable resumes (hash comparison).
    first = run_train(corpus.train_args(exp, *FAST), extra_env={"SOME_API_TOKEN": corpus.train})
    assert first.returncode == 0, first.stderr[-2000:]
    assert corpus.train not in open(os.path.join(exp, "config.yaml")).read()
    again = run_train(corpus.train_args(exp, "training.max_epoch=2"))
    assert again.returncode == 0, again.stderr[-2000:]
    assert "resumed from" in again.stderr
    # (b) a credentials variable that is a prefix of ordinary paths does not hide them:
    # later stages read back exactly the paths training used.
    exp2 = str(tmp_path / "exp2")
    prefix = os.path.dirname(corpus.train)
    run = run_train(corpus.train_args(exp2, *FAST),
                    extra_env={"GOOGLE_APPLICATION_CREDENTIALS": prefix})
    assert run.returncode == 0, run.stderr[-2000:]
    from toolkit.trainer.experiment import load_exp_config
    import toolkit.tasks  # noqa: F401
    cfg = load_exp_config(exp2)
    assert cfg.dataset.train_data == corpus.train and cfg.dataset.dev_data == corpus.dev


def test_bad_input_counters_per_rank_after_resume(corpus, tmp_path):
    """Unreadable entries on different ranks: after a mid-epoch resume the epoch's
    reported counts equal those of an uninterrupted run (each rank restores its own)."""
    lines = open(corpus.train).read().splitlines()
    broken = []
    for i, line in enumerate(lines):
        entry = json.loads(line)
        if i % 4 == 1:
            entry["wav"] = f"/nonexistent/{entry['key']}.wav"
        broken.append(json.dumps(entry))
    train = tmp_path / "broken.list"
    train.write_text("\n".join(broken) + "\n")
    args = ["dataset.max_bad_fraction=0.5", "training.save_interval_steps=1", "training.max_epoch=1"]
    ref = str(tmp_path / "ref")
    full = run_train(corpus.train_args(ref, *args, train=str(train)), 2)
    assert full.returncode == 0, full.stderr[-3000:]
    exp = str(tmp_path / "exp")
    part = run_train(corpus.train_args(exp, *args, "training.max_steps=2", train=str(train)), 2)
    assert part.returncode == 0, part.stderr[-3000:]
    rest = run_train(corpus.train_args(exp, *args, train=str(train)), 2)
    assert rest.returncode == 0, rest.stderr[-3000:]

    def counts(text):
        return [line.split("input: ")[1] for line in text.splitlines() if "epoch 0 input:" in line]
    assert counts(rest.stderr) and counts(rest.stderr) == counts(full.stderr)


def test_feature_archive_change_under_the_same_path_is_refused(corpus, tmp_path):
    feats_dir = tmp_path / "fbank"
    feats = run_train(["-m", "toolkit.bin.compute_feats", corpus.train, str(feats_dir),
                       "--config", corpus.config, "--nj", "1"])
    assert feats.returncode == 0, feats.stderr[-2000:]
    train = str(feats_dir / "data.list")
    exp = str(tmp_path / "exp")
    assert run_train(corpus.train_args(exp, *FAST, train=train)).returncode == 0
    ark = glob.glob(str(feats_dir / "feats.*.ark"))[0]
    data = bytearray(open(ark, "rb").read())
    data[-5] ^= 0x40                      # content changes, size and list stay the same
    open(ark, "wb").write(bytes(data))
    result = run_train(corpus.train_args(exp, "training.max_epoch=2", train=train))
    assert result.returncode == 2
    assert "files referenced by dataset.train_data changed" in result.stderr


def test_list_content_change_alone_is_refused(corpus, tmp_path):
    train = tmp_path / "train.list"
    shutil.copy(corpus.train, train)
    exp = str(tmp_path / "exp")
    assert run_train(corpus.train_args(exp, *FAST, train=str(train))).returncode == 0
    lines = train.read_text().splitlines()
    train.write_text("\n".join(lines[:-1]) + "\n")        # same path, one entry fewer
    result = run_train(corpus.train_args(exp, "training.max_epoch=2", train=str(train)))
    assert result.returncode == 2
    assert "dataset.train_data content changed" in result.stderr


def test_utterances_outside_duration_limits_are_named(corpus, tmp_path):
    lines = open(corpus.train).read().splitlines()
    long_ones = []
    for i in (0, 1):
        entry = json.loads(lines[i])
        entry["duration"] = 120.0
        long_ones.append(entry["key"])
        lines[i] = json.dumps(entry)
    train = tmp_path / "long.list"
    train.write_text("\n".join(lines) + "\n")
    result = run_train(corpus.train_args(str(tmp_path / "exp"), *FAST, train=str(train)))
    assert result.returncode == 0, result.stderr[-2000:]
    assert "2 utterances outside dataset.min_duration/max_duration" in result.stderr
    assert all(f"{k} (120.00 s)" in result.stderr for k in long_ones)
    assert "2 outside the duration limits" in result.stderr


def test_identical_runs_save_identical_random_states(corpus, fast_run, tmp_path):
    a, b = fast_run, str(tmp_path / "b")
    assert run_train(corpus.train_args(b, *FAST)).returncode == 0
    pa, pb = latest_payload(a), latest_payload(b)
    # Python's generator too (the trainer seeds it): all three streams are equal.
    assert_states_identical({"r": pa["per_rank"]}, {"r": pb["per_rank"]}, "per_rank")


def test_uneven_data_and_accumulation_weight_real_batches(corpus, tmp_path):
    """Two ranks with accumulation 1 make the same optimizer steps from the same global
    batches as one process with accumulation 2, including an odd last batch that only
    rank 0 holds; likewise 2 ranks x 2 with 1 x 4. Every rank ends with the same weights."""
    lines = open(corpus.train).read().splitlines()[:27]   # 5 batches of 6: uneven
    train = tmp_path / "odd.list"
    train.write_text("\n".join(lines) + "\n")
    common = ["training.max_epoch=2", "model.dropout=0.0", "dataset.spec_aug.enabled=false",
              "dataset.speed_perturb=[]", "dataset.volume_range=[]", "dataset.vtlp_range=[]",
              "optim.type=sgd", "optim.momentum=0", "optim.lr=0.05",
              "optim.scheduler.type=constant", "optim.scheduler.warmup_steps=0",
              "dataset.sort_window=1", "dataset.shuffle=false"]
    for ranks_accum, single_accum in ((1, 2), (2, 4)):
        two = str(tmp_path / f"two{ranks_accum}")
        one = str(tmp_path / f"one{single_accum}")
        r2 = run_train(corpus.train_args(two, *common, f"training.accum_grad={ranks_accum}",
                                         train=str(train)), 2)
        assert r2.returncode == 0, r2.stderr[-3000:]
        r1 = run_train(corpus.train_args(one, *common, f"training.accum_grad={single_accum}",
                                         train=str(train)))
        assert r1.returncode == 0, r1.stderr[-3000:]
        p2, p1 = latest_payload(two), latest_payload(one)
        assert p2["step"] == p1["step"]
        for key, value in p1["modules"]["model"].items():
            if value.is_floating_point() and "running" not in key:
                assert torch.allclose(value, p2["modules"]["model"][key], atol=1e-6), key
        logs = [open(os.path.join(two, "log", f"train.rank{r}.log")).read() for r in (0, 1)]
        sums = [[line.split("parameter checksum ")[1] for line in log.splitlines()
                 if "parameter checksum" in line][-1] for log in logs]
        assert sums[0] == sums[1]


def test_lock_records_removed_and_reused_pid_not_live(corpus, fast_run, tmp_path):
    from toolkit.trainer.lock import ExpDirLock, _holders
    exp = copy_of(fast_run, str(tmp_path / "exp"))
    assert os.listdir(os.path.join(exp, ".holders")) == []       # removed on exit
    # A record naming a live pid whose start time differs is a dead run's reused pid.
    import socket
    folder = os.path.join(exp, ".holders")
    with open(os.path.join(folder, "stale.json"), "w") as f:
        json.dump({"pid": os.getpid(), "host": socket.gethostname(), "start_ticks": 1}, f)
    assert _holders(exp) == []
    lock = ExpDirLock(exp, 0)
    lock.acquire_exclusive_check()
    lock.release()


def test_lock_unsupported_file_system_is_a_clear_error(tmp_path, monkeypatch):
    import fcntl

    from toolkit.trainer import lock as lock_module

    def no_locks(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")
    monkeypatch.setattr(fcntl, "lockf", no_locks)
    with pytest.raises(lock_module.LockUnsupported, match="does not support POSIX record locks"):
        lock_module.ExpDirLock(str(tmp_path), 0).acquire_exclusive_check()
    with pytest.raises(lock_module.LockUnsupported):
        lock_module.ExpDirLock(str(tmp_path), 1).acquire_shared()


def test_checkpoint_housekeeping(tmp_path):
    from toolkit.trainer import checkpoint as ckpt

    def save(step, dev=None):
        return ckpt.save_checkpoint(str(tmp_path), step, {"w": torch.full((2,), float(step))},
                                    {"epoch": 0, "dev_metric": dev})
    for step in (1, 2, 3, 4):
        save(step)
    # The newest two by step are corrupt: they must not take keep_last places.
    for step in (3, 4):
        path = tmp_path / f"ckpt-{step:09d}.pt"
        path.write_bytes(path.read_bytes()[:-3] + b"bad")
    save(5)
    (tmp_path / "ckpt-000000000.pt").write_bytes(b"orphan")        # .json never written
    removed = ckpt.prune(str(tmp_path), keep_last=2, keep_best=0)
    left = sorted(os.listdir(tmp_path))
    assert left == ["ckpt-000000002.json", "ckpt-000000002.pt", "ckpt-000000005.json",
                    "ckpt-000000005.pt"], left
    assert any(p.endswith("ckpt-000000000.pt") for p in removed)
    # Removal order: the .json first, so a kill in between leaves an orphan .pt only.
    calls = []
    real_unlink = os.unlink
    def record(path):
        calls.append(os.path.basename(path))
        real_unlink(path)
    os.unlink = record
    try:
        ckpt.remove_checkpoint(str(tmp_path / "ckpt-000000002.pt"))
    finally:
        os.unlink = real_unlink
    assert calls == ["ckpt-000000002.json", "ckpt-000000002.pt"]


def test_resume_with_another_thread_count_is_said(corpus, fast_run, tmp_path):
    """The CPU thread count is part of exactness: recorded, and a resume with another warns."""
    exp = copy_of(fast_run, str(tmp_path / "exp"))    # trained with OMP_NUM_THREADS=1
    assert latest_payload(exp)["num_threads"] == 1
    # Forked from the zygote, the run takes OMP_NUM_THREADS=2 as a fresh interpreter does.
    second = run_train(corpus.train_args(exp, "training.max_epoch=2"),
                       extra_env={"OMP_NUM_THREADS": "2"})
    assert second.returncode == 0, second.stderr[-2000:]
    assert "this run uses 2 CPU threads per process, the checkpoint's run 1" in second.stderr


def test_prune_always_keeps_the_newest_checkpoint(tmp_path):
    """keep_last=0 (refused by the config, but prune is a library function too) used to
    delete a checkpoint right after it was written unless it was among the best."""
    from toolkit.trainer import checkpoint as ckpt
    for step, dev in ((1, 0.5), (2, 0.9)):
        ckpt.save_checkpoint(str(tmp_path), step, {"w": torch.zeros(1)},
                             {"epoch": 0, "dev_metric": dev})
    ckpt.prune(str(tmp_path), keep_last=0, keep_best=1)
    assert [c.step for c in ckpt.list_checkpoints(str(tmp_path))] == [1, 2]
