"""Where a training run's scalars and secrets go, through the real training binary on the
tiny keyword corpus (kept under a directory named `false_positives`): log lines keep text
that merely equals a flag value of a credential-looking variable (TOKENIZERS_PARALLELISM=
false), a real token is redacted in the log and sent to W&B as the fixed `<redacted>`
(never a salted hash)."""
import glob
import os

import pytest
import yaml

from train_utils import Corpus, run_train
from wandb_reader import read_run

HF_TOKEN = "hf_abcdef123456789"
AUTH_TOKEN = "tok-7e3a91c0d2"


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("tracking") / "false_positives"
    root.mkdir()
    return Corpus(str(root), num_train=30, num_dev=6)


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
