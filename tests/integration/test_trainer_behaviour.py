"""Experiment-dir rules, locking, init_checkpoint, AMP, uneven ranks, rank death,
secrets, TensorBoard — each with the real training binary. Runs of several ranks are
forked from the test zygote (train_utils.run_train), except where torchrun itself is part
of the test: a rank's death seen by its launcher, workers orphaned by a killed launcher.
Two launchers meeting at a c10d rendezvous: tests/integration/test_trainer_restarts.py."""
import glob
import json
import os
import subprocess
import time

import pytest
import torch

from train_utils import (Corpus, descendants, env, kill_tree, latest_payload,
                         launcher, rank_process, run_train, wait_for_checkpoint,
                         wait_gone)

FAST = ["training.max_epoch=1"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    # No loader workers: the loader is not under test here (the torchrun kill tests ask
    # for them, so that the processes they check include loader workers).
    return Corpus(str(tmp_path_factory.mktemp("behaviour")), num_train=24, num_dev=6,
                  workers=0)


# Loader workers for the tests that kill torchrun or one of its ranks.
LOADER_WORKERS = "dataset.num_workers=2"


@pytest.fixture(scope="module")
def trained(corpus, tmp_path_factory):
    exp = str(tmp_path_factory.mktemp("trained") / "exp")
    result = run_train(corpus.train_args(exp, *FAST))
    assert result.returncode == 0, result.stderr[-3000:]
    return exp


def test_exp_dir_contents(trained):
    assert os.path.exists(os.path.join(trained, "config.yaml"))
    assert open(os.path.join(trained, "inventory.txt")).read() == "hey chirp\n"
    assert os.path.exists(os.path.join(trained, "log", "train.rank0.log"))
    events = glob.glob(os.path.join(trained, "tensorboard", "events.out.tfevents.*"))
    assert events
    from tensorboard_reader import scalar_tags
    tags = scalar_tags(events)
    for tag in ("train/loss", "train/lr", "train/grad_norm", "train/utts_per_s",
                "train/audio_s_per_s", "train/loader_wait_s", "train/skipped_steps", "dev/loss"):
        assert tag in tags, f"{tag} missing from TensorBoard events ({sorted(tags)})"


@pytest.mark.parametrize("override,needle", [
    ("model.hidden_dim=16", "model.hidden_dim"),
    ("optim.type=sgd", "optim.type"),
    ("loss.min_duration=9", "loss.min_duration"),
])
def test_incompatible_change_refused(corpus, trained, override, needle):
    result = run_train(corpus.train_args(trained, *FAST, override))
    assert result.returncode != 0
    assert "incompatible" in result.stderr and needle in result.stderr


def test_changed_inventory_and_data_refused(corpus, trained, tmp_path):
    inv = tmp_path / "inv.txt"
    inv.write_text("hey chirp\nsecond\n")
    other_train = tmp_path / "train.list"
    lines = open(corpus.train).read().splitlines()
    other_train.write_text("\n".join(lines[:-1]) + "\n")
    result = run_train(corpus.train_args(trained, *FAST, inventory=str(inv),
                                         train=str(other_train)))
    assert result.returncode != 0
    assert "class inventory" in result.stderr
    assert "dataset.train_data" in result.stderr     # path and content both named


def test_allowed_change_is_logged_and_resumes(corpus, trained, tmp_path):
    exp = tmp_path / "exp"
    import shutil
    shutil.copytree(trained, exp)
    result = run_train(corpus.train_args(str(exp), "training.max_epoch=2", "optim.lr=0.005"))
    assert result.returncode == 0, result.stderr[-2000:]
    assert "allowed configuration change on resume: optim.lr" in result.stderr
    assert "resumed from" in result.stderr
    assert latest_payload(str(exp))["epoch"] == 2


def test_init_checkpoint_strict_and_weights_only(corpus, trained, tmp_path):
    src = latest_payload(trained)
    ckpt = sorted(glob.glob(os.path.join(trained, "ckpt-*.pt")))[-1]
    exp = str(tmp_path / "init")
    result = run_train(corpus.train_args(exp, *FAST, "optim.lr=0") + ["--init-checkpoint", ckpt])
    assert result.returncode == 0, result.stderr[-2000:]
    payload = latest_payload(exp)
    # lr 0: weights stay those of the init checkpoint; the step counter starts from zero.
    for key, value in src["modules"]["model"].items():
        if value.is_floating_point() and "running" not in key:
            assert torch.equal(value, payload["modules"]["model"][key]), key
    assert payload["step"] < src["step"] + 1 and "initialised model from" in result.stderr

    # A different architecture is refused (strict), naming missing/unexpected keys.
    exp2 = str(tmp_path / "init2")
    bad = run_train(corpus.train_args(exp2, *FAST, "model.num_layers=3") + ["--init-checkpoint", ckpt])
    assert bad.returncode != 0 and "missing keys" in bad.stderr


def test_init_from_safetensors_export(corpus, trained, tmp_path):
    from toolkit.tasks.kws.export import build_metadata, export_safetensors, model_from_checkpoint
    ckpt = sorted(glob.glob(os.path.join(trained, "ckpt-*.pt")))[-1]
    model = model_from_checkpoint(ckpt)
    path = str(tmp_path / "model.safetensors")
    export_safetensors(model, path, build_metadata(model, {}, ["hey chirp"], None))
    exp = str(tmp_path / "from_st")
    result = run_train(corpus.train_args(exp, *FAST, "optim.lr=0") + ["--init-checkpoint", path])
    assert result.returncode == 0, result.stderr[-2000:]
    payload = latest_payload(exp)
    assert torch.equal(payload["modules"]["model"]["classifier.weight"],
                       model.state_dict()["classifier.weight"])


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_amp_state_round_trip(corpus, tmp_path, dtype):
    exp = str(tmp_path / dtype)
    args = corpus.train_args(exp, *FAST, "training.use_amp=true", f"training.amp_dtype={dtype}")
    result = run_train(args)
    assert result.returncode == 0, result.stderr[-2000:]
    payload = latest_payload(exp)
    if dtype == "float16":
        saved = payload["scalers"]["model"]
        assert saved["scale"] > 0 and saved["_growth_tracker"] > 0
        # The rerun resumes the scaler: its growth tracker keeps counting from the saved
        # value (a fresh scaler would restart at 0), one per successful step.
        again = run_train(corpus.train_args(exp, "training.max_epoch=2", "training.use_amp=true",
                                            f"training.amp_dtype={dtype}"))
        assert again.returncode == 0, again.stderr[-2000:]
        later = latest_payload(exp)
        assert later["scalers"]["model"]["scale"] == saved["scale"]
        assert later["scalers"]["model"]["_growth_tracker"] == \
            saved["_growth_tracker"] + later["step"] - payload["step"]
    else:
        assert payload["scalers"] == {}
    assert all(torch.isfinite(v).all() for v in payload["modules"]["model"].values()
               if v.is_floating_point())


def test_uneven_batches_do_not_hang(corpus, tmp_path):
    # 5 utterances in batches of 2 -> 3 batches over 2 ranks: rank 1 gets an empty step.
    root = tmp_path
    lines = open(corpus.train).read().splitlines()[:5]
    small = root / "small.list"
    small.write_text("\n".join(lines) + "\n")
    exp = str(root / "exp")
    result = run_train(corpus.train_args(exp, "training.max_epoch=2", "dataset.batch_size=2",
                                         "dataset.sort_window=1", train=str(small)), nproc=2,
                       timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert latest_payload(exp)["epoch"] == 2


def test_rank_death_stops_others_quickly(corpus, tmp_path):
    exp = str(tmp_path / "exp")
    args = corpus.train_args(exp, "training.max_epoch=50", LOADER_WORKERS)
    proc = subprocess.Popen(launcher(2) + args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=env(), start_new_session=True)
    wait_for_checkpoint(exp, proc)
    workers = descendants(proc.pid)
    rank1 = rank_process(proc.pid, 1)
    os.kill(rank1, 9)
    killed_at = time.time()
    out, _ = proc.communicate(timeout=90)
    assert time.time() - killed_at < 60
    assert proc.returncode != 0
    assert "rank: 1" in out or "rank 1" in out, out[-3000:]
    wait_gone(workers)


def test_orphaned_workers_hold_the_exp_dir(corpus, tmp_path):
    exp = str(tmp_path / "exp")
    args = corpus.train_args(exp, "training.max_epoch=50", LOADER_WORKERS)
    proc = subprocess.Popen(launcher(2) + args, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env=env(), start_new_session=True)
    wait_for_checkpoint(exp, proc)
    workers = [p for p in descendants(proc.pid)]
    kill_tree(proc, launcher_only=True)          # like `kill -9 <torchrun>`
    alive = [p for p in workers if os.path.exists(f"/proc/{p}")]
    assert alive, "torchrun workers should outlive their launcher"
    try:
        result = run_train(args, timeout=60)
        assert result.returncode != 0
        assert "in use by a live run" in result.stderr
        assert any(f"pid {p}" in result.stderr for p in alive), result.stderr[-2000:]
    finally:
        for pid in alive:
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass
        wait_gone(alive)
    # The dead run's lock is stale now: a rerun takes over and resumes.
    again = run_train(corpus.train_args(exp, "training.max_epoch=2", LOADER_WORKERS))
    assert again.returncode == 0, again.stderr[-2000:]


def test_num_gpus_mismatch_is_an_error_before_work(corpus, tmp_path):
    exp = str(tmp_path / "exp")
    result = run_train(corpus.train_args(exp, *FAST) + ["--num-gpus", "2"])
    assert result.returncode != 0
    assert "--num-gpus 2" in result.stderr or "CUDA is not available" in result.stderr
    assert not glob.glob(os.path.join(exp, "ckpt-*"))


def test_secrets_never_written(corpus, tmp_path):
    """A dataset token given in the config (dataset.auth_token, on the command line) and in
    the environment reaches no file of the exp dir (config copy, checkpoints, logs, lock
    records, TensorBoard) and not the console."""
    secret, env_secret = "s3cr3t-T0KEN-value", "envtok-XYZ-123456"
    exp = str(tmp_path / "exp")
    args = corpus.train_args(exp, *FAST, f"dataset.auth_token={secret}")
    result = run_train(args, extra_env={"TOOLKIT_DATA_TOKEN": env_secret,
                                        "MY_API_TOKEN": env_secret})
    assert result.returncode == 0, result.stderr[-2000:]
    files = [p for p in glob.glob(os.path.join(exp, "**", "*"), recursive=True)
             + glob.glob(os.path.join(exp, ".*", "*")) if os.path.isfile(p)]
    assert any("events.out.tfevents" in p for p in files) and any(p.endswith(".pt") for p in files)
    for text in (secret, env_secret):
        assert text not in result.stderr and text not in result.stdout
        for path in files:
            assert text.encode() not in open(path, "rb").read(), f"secret found in {path}"


def test_non_finite_gradients_stop_after_limit(corpus, tmp_path):
    exp = str(tmp_path / "exp")
    # An absurd learning rate blows the weights up; the following gradients are not finite.
    result = run_train(corpus.train_args(exp, *FAST, "optim.lr=1e30", "optim.type=sgd",
                                         "optim.momentum=0", "training.max_nonfinite_steps=2",
                                         "optim.scheduler.warmup_steps=0"))
    assert result.returncode != 0
    assert "non-finite gradient norm" in result.stderr
    assert "2 consecutive non-finite gradient norms" in result.stderr


def test_accumulation_with_ddp_and_step_validation(corpus, tmp_path):
    exp = str(tmp_path / "exp")
    result = run_train(corpus.train_args(exp, *FAST, "training.accum_grad=2",
                                         "training.val_interval_steps=1",
                                         "training.save_interval_steps=100"), nproc=2)
    assert result.returncode == 0, result.stderr[-3000:]
    # 24 utterances / batch 6 = 4 batches -> 2 per rank -> 1 optimizer step with accum 2.
    assert latest_payload(exp)["step"] == 1
    from toolkit.trainer.checkpoint import list_checkpoints
    assert all(c.dev_metric is not None for c in list_checkpoints(exp))



def test_safetensors_init_needs_a_model_description(corpus, trained, tmp_path):
    """A config.json beside the weights that describes no model cannot be checked against
    the config: refused, or with init_allow_missing loaded with a warning; an architecture
    difference under init_allow_missing is named in the log too."""
    from toolkit.tasks.kws.export import build_metadata, export_safetensors, model_from_checkpoint
    ckpt = sorted(glob.glob(os.path.join(trained, "ckpt-*.pt")))[-1]
    model = model_from_checkpoint(ckpt)
    path = str(tmp_path / "model.safetensors")
    export_safetensors(model, path, build_metadata(model, {}, ["hey chirp"], None))
    side = tmp_path / "config.json"
    described = json.loads(side.read_text())
    side.write_text(json.dumps({"task": "codec"}))
    refused = run_train(corpus.train_args(str(tmp_path / "a"), *FAST) + ["--init-checkpoint", path])
    assert refused.returncode == 2, refused.stderr[-2000:]
    assert "config.json describes no model" in refused.stderr
    allowed = run_train(corpus.train_args(str(tmp_path / "b"), *FAST,
                                          "training.init_allow_missing=true")
                        + ["--init-checkpoint", path])
    assert allowed.returncode == 0, allowed.stderr[-2000:]
    assert "config.json describes no model" in allowed.stderr
    described["model"]["dropout"] = 0.5
    side.write_text(json.dumps(described))
    other = run_train(corpus.train_args(str(tmp_path / "c"), *FAST,
                                        "training.init_allow_missing=true")
                      + ["--init-checkpoint", path])
    assert other.returncode == 0, other.stderr[-2000:]
    assert "describes another architecture (dropout: 0.5 vs" in other.stderr


def test_other_ranks_wait_for_a_slow_data_fingerprint(corpus, tmp_path):
    """Rank 0 fingerprints the data (here made 12 s slower, as a large corpus on network
    storage is) while rank 1 waits: that wait is not bound by the 5 s collective timeout
    that stops training when a rank dies."""
    exp = str(tmp_path / "exp")
    result = run_train(corpus.train_args(exp, *FAST, "training.rank_failure_timeout_s=5"),
                       nproc=2, timeout=240,
                       extra_env={"TOOLKIT_PLUGINS": "slow_fingerprint",
                                  "SLOW_FINGERPRINT_S": "12"})
    assert result.returncode == 0, result.stderr[-3000:]
    assert latest_payload(exp)["epoch"] == 1


def test_the_waits_of_these_tests_can_fail(tmp_path):
    """wait_gone and wait_for_checkpoint fail at their deadline instead of carrying on."""
    proc = subprocess.Popen(["sleep", "30"])
    try:
        with pytest.raises(AssertionError, match=f"processes \\[{proc.pid}\\] still running"):
            wait_gone([proc.pid], timeout=0.5)
        with pytest.raises(AssertionError, match="no checkpoint in"):
            wait_for_checkpoint(str(tmp_path), proc, timeout=0.5)
    finally:
        proc.kill()
    wait_gone([proc.pid], timeout=10)
    with pytest.raises(AssertionError, match="the run ended"):
        wait_for_checkpoint(str(tmp_path), proc, timeout=5)
