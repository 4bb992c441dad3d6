"""Where a training run's scalars and secrets go, through the real training binary on the
tiny keyword corpus (kept under a directory named `false_positives`): log lines keep text
that merely equals a flag value of a credential-looking variable (TOKENIZERS_PARALLELISM=
false), a real token is redacted in the log and sent to W&B as the fixed `<redacted>`
(never a salted hash); a run SIGKILLed right after a checkpoint and resumed leaves every
step in W&B's offline files and in TensorBoard's view exactly once."""
import copy
import glob
import os
import time
from typing import Dict, List

import pytest
import yaml

from tensorboard_reader import read_events
from train_utils import TINY_CONFIG, Corpus, kill_tree, run_train, start_train
from wandb_reader import read_run

HF_TOKEN = "hf_abcdef123456789"
AUTH_TOKEN = "tok-7e3a91c0d2"


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("tracking") / "false_positives"
    root.mkdir()
    return Corpus(str(root), num_train=30, num_dev=6)


def wandb_files(exp: str) -> List[str]:
    """The run's offline files, oldest attempt first (the directory names carry the time)."""
    return sorted(glob.glob(os.path.join(exp, "wandb", "offline-run-*", "run-*.wandb")))


def wandb_steps(path: str) -> List[int]:
    return [row["trainer/step"] for row in read_run(path)[0]]


def tensorboard_view(exp: str) -> Dict[str, List[int]]:
    """The steps of each scalar as TensorBoard shows them: event files in name order, and a
    restart marker (SessionLog START at step s) hides every earlier event at a step >= s."""
    from tensorboardX.proto.event_pb2 import SessionLog
    shown: Dict[str, List[int]] = {}
    for path in sorted(glob.glob(os.path.join(exp, "tensorboard", "events.out.tfevents*"))):
        for event in read_events(path):
            if event.session_log.status == SessionLog.START:
                shown = {tag: [s for s in steps if s < event.step] for tag, steps in shown.items()}
            for value in event.summary.value:
                shown.setdefault(value.tag, []).append(event.step)
    return shown


def test_only_real_credentials_are_redacted_and_wandb_gets_no_hash(corpus, tmp_path):
    """TOKENIZERS_PARALLELISM=false used to make every `false` in the log a secret (a path
    became `.../<redacted>_positives/...`), and W&B received secrets as a salted sha256 with
    the salt beside it. HF_TOKEN here is a real token: it is part of the W&B directory
    (logged, and a config value) and the W&B notes (a config value and run metadata)."""
    exp = str(tmp_path / "exp")
    wandb_dir = str(tmp_path / "false_positives" / HF_TOKEN)
    shown_dir = os.path.join(str(tmp_path), "false_positives", "<redacted>")
    result = run_train(corpus.train_args(
        exp, "training.max_steps=2", "training.wandb.mode=offline",
        f"training.wandb.dir={wandb_dir}", f"training.wandb.notes={HF_TOKEN}",
        f"dataset.auth_token={AUTH_TOKEN}"),
        extra_env={"TOKENIZERS_PARALLELISM": "false", "HF_TOKEN": HF_TOKEN})
    assert result.returncode == 0, result.stderr[-3000:]
    log = open(os.path.join(exp, "log", "train.rank0.log")).read()
    assert "W&B run " in log and f"in {shown_dir}\n" in log
    assert "<redacted>_positives" not in log
    (run_file,) = glob.glob(os.path.join(wandb_dir, "wandb", "offline-run-*", "run-*.wandb"))
    _, config, _ = read_run(run_file)
    assert config["dataset"]["auth_token"] == "<redacted>"
    assert config["training"]["wandb"]["notes"] == "<redacted>"
    assert config["training"]["wandb"]["dir"] == shown_dir
    assert config["dataset"]["train_data"] == corpus.train          # `false` kept
    raw = open(run_file, "rb").read()
    assert b"<redacted:" not in raw                     # neither a digest nor its salt
    # W&B's own console lines name its directory, which holds the token here: not ours.
    ours = [line for line in (result.stderr + result.stdout).splitlines()
            if not line.startswith("wandb:")]
    for secret in (HF_TOKEN, AUTH_TOKEN):
        assert not [line for line in ours + log.splitlines() if secret in line]
        assert secret.encode() not in raw
    # config.yaml, which a rerun compares against, keeps its salted digest.
    saved = yaml.safe_load(open(os.path.join(exp, "config.yaml")))
    assert saved["dataset"]["auth_token"].startswith("<redacted:")


def test_sigkill_right_after_a_checkpoint_loses_and_repeats_no_step(corpus, tmp_path):
    """The run stops for good at the start of step 4, right after the checkpoint of step 3,
    and is SIGKILLed with every process it started (W&B's core among them). W&B's offline
    file then holds steps 1-3 (it held none: step 3 waited for step 4, and the core had
    written nothing of its buffer); the resumed run adds 4-8, and TensorBoard shows 1-8
    once each (it lost the unwritten events and hid step 3 on resume)."""
    config = copy.deepcopy(TINY_CONFIG)
    config["task"]["type"] = "kws_paused"
    conf = corpus.write_config(config, "paused.yaml")
    exp = str(tmp_path / "exp")
    args = corpus.train_args(exp, "training.max_steps=8", "training.log_interval=1",
                             "training.save_interval_steps=3", "training.wandb.mode=offline",
                             config=conf)
    plugin = {"TOOLKIT_PLUGINS": "paused_task"}
    marker = str(tmp_path / "paused")
    proc = start_train(args, extra_env=dict(PAUSE_AT_STEP="4", PAUSE_MARKER=marker, **plugin))
    try:
        deadline = time.time() + 120
        while not os.path.exists(marker):
            assert proc.poll() is None, f"the run ended (status {proc.returncode}) before step 4"
            assert time.time() < deadline, "the run did not reach step 4 within 120 s"
            time.sleep(0.05)
    finally:
        kill_tree(proc)
    assert sorted(os.path.basename(p) for p in glob.glob(os.path.join(exp, "ckpt-*.json"))) \
        == ["ckpt-000000003.json"]
    (killed,) = wandb_files(exp)
    assert wandb_steps(killed) == [1, 2, 3]

    result = run_train(args, extra_env=plugin)
    assert result.returncode == 0, result.stderr[-3000:]
    log = open(os.path.join(exp, "log", "train.rank0.log")).read()
    assert "resumed from" in log and "W&B's core has not written" not in log
    runs = wandb_files(exp)
    assert len(runs) == 2 and runs[0] == killed
    assert [s for path in runs for s in wandb_steps(path)] == list(range(1, 9))
    shown = tensorboard_view(exp)
    assert shown["train/lr"] == list(range(1, 9))
    assert shown["train/loss"] == list(range(1, 9))
