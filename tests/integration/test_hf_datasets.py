"""Hugging Face datasets as training input and Weights & Biases beside TensorBoard, through
the real training binary on datasets the test writes: a parquet directory in the hub's
layout (24 kHz, with an id column and three broken rows) mixed with a `save_to_disk`
dataset (16 kHz, a duration column) and an audiofolder (22.05 kHz WAV files), a dev split
from the parquet one; the codec task at 16 kHz decodes and resamples every row on the fly.
Checked: the mixed input, bad-row accounting at indexing and batch time, bitwise SIGKILL
resume, two gloo ranks on a fresh cache, a per-dataset token and HF_TOKEN absent from
every written file (W&B's included), the offline W&B run's metrics and config read back,
the run continued after a resume, online W&B without a login falling back to offline;
a resume with HF_HOME moved to a copy of the cache; configuration errors (an unreachable
hub dataset and a split an unsplit saved dataset lacks among them) as one `error:` line.
In process: split names of a saved Dataset, damaged duration indexes rebuilt, keys of
datasets that share a name, and repeated-key errors that name their cause."""
import copy
import glob
import os
import random

import numpy as np
import pytest
import yaml

from hf_data import rows, write_audio_folder, write_parquet_dataset, write_saved_dataset
from toolkit.config import ConfigError, DatasetConfig
from toolkit.config.schema import HFDatasetConfig
from tensorboard_reader import scalars
from test_trainer_resume import assert_same_run, train_with_kills
from train_utils import latest_payload, run_train
from wandb_reader import read_run

DATASET_TOKEN, ENV_TOKEN = "hf_dataSET_t0ken_5ecret", "hf_ENV_t0ken_5ecret_42"
PHASE = {"initial": 0.0, "start": 0.5, "end": 0.5, "shape": "step"}
CONFIG = {
    "task": {"type": "codec", "segment_seconds": 0.25, "eval_seconds": 0.5},
    "dataset": {"sample_rate": 16000, "volume_range": [0.6, 1.0], "batch_size": 3,
                "sort_window": 20, "num_workers": 1, "max_bad_fraction": 0.2},
    "model": {"channels": 4, "strides": [2, 4, 5], "dilations": [1, 3], "n_codebooks": 2,
              "codebook_size": 16, "codebook_dim": 4, "causal": True},
    "discriminator": {"mpd": {"periods": [2, 3], "channels": [4, 8, 8], "max_channels": 8},
                      "mrsd": {"n_ffts": [128], "filters": 4, "dilations": [1],
                               "kernel_size": [3, 5]}},
    "loss": {"mel_window_lengths": [64, 256, 1024], "mel_n_mels": [10, 40, 80],
             "adversarial": dict(PHASE, final=1.0), "feature_matching": dict(PHASE, final=2.0)},
    "optim": {"generator": {"lr": 0.002}, "discriminator": {"lr": 0.002, "start_fraction": 0.5}},
    "training": {"seed": 5, "max_steps": 8, "log_interval": 1,
                 "save_interval_steps": 1, "keep_last": 10, "keep_best": 1,
                 "trace_keys": True},
}
BROKEN = ["garbage", "truncated", "silent"]


class Data:
    def __init__(self, root):
        self.root = root
        self.parquet = write_parquet_dataset(os.path.join(root, "libri_like"), {
            "train": rows("a", 12, 24000, 1, BROKEN), "dev": rows("d", 3, 24000, 2)})
        self.saved = write_saved_dataset(os.path.join(root, "saved"), rows("b", 8, 16000, 3))
        self.folder = write_audio_folder(os.path.join(root, "folder"), "train",
                                         rows("c", 3, 22050, 4))
        self.hf_home = os.path.join(root, "hf_home")
        config = copy.deepcopy(CONFIG)
        config["dataset"]["hf"] = {
            "train": [{"path": self.parquet, "split": "train", "id_column": "id",
                       "token": DATASET_TOKEN},
                      {"path": self.saved, "split": "train", "duration_column": "seconds"},
                      {"path": self.folder, "split": "train"}],
            "dev": [{"path": self.parquet, "split": "dev", "id_column": "id"}]}
        self.config = self.write_config(config)

    def write_config(self, config, name="hf.yaml"):
        path = os.path.join(self.root, name)
        with open(path, "w") as f:
            yaml.safe_dump(config, f)
        return path

    def env(self, **extra):
        return dict({"HF_HOME": self.hf_home, "HF_HUB_OFFLINE": "1"}, **extra)

    def args(self, exp, *overrides, config=None):
        return ["-m", "toolkit.bin.train", "--config", config or self.config, "--exp-dir", exp,
                *overrides]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return Data(str(tmp_path_factory.mktemp("hf_data")))


@pytest.fixture(scope="module")
def reference(data, tmp_path_factory):
    """The uninterrupted run, logging to W&B offline; HF_TOKEN set in its environment."""
    exp = str(tmp_path_factory.mktemp("hf_reference") / "exp")
    result = run_train(data.args(exp, "training.wandb.mode=offline",
                                 "training.wandb.project=codec-hf", "training.wandb.tags=[t1]"),
                       extra_env=data.env(HF_TOKEN=ENV_TOKEN))
    assert result.returncode == 0, result.stderr[-4000:]
    return exp, result


def test_mixed_datasets_are_indexed_decoded_and_accounted(data, reference):
    exp, result = reference
    log = open(os.path.join(exp, "log", "train.rank0.log")).read()
    # Indexing left out the two unreadable rows; the silent one fails when its batch is built.
    assert "dataset.hf.train[0]: 2 of 12 rows left out: " in log
    assert "unreadable_audio=1 (e.g. libri_like:train/a000)" in log
    assert "truncated_audio=1 (e.g. libri_like:train/a001)" in log
    assert "21 train utterances" in log
    assert "skipped (silent_audio=1 (e.g. libri_like:train/a002)" in log
    # Both datasets were trained on (24 kHz rows resampled to the codec's 16 kHz).
    trained = open(os.path.join(exp, "log", "keys.rank0.txt")).read().split()
    assert any(k.startswith("libri_like:train/a0") for k in trained)
    assert any(k.startswith("saved:train/000000") for k in trained)
    assert any(k.startswith("folder:train/000000") for k in trained)
    # Durations were read once and cached; a second opening reads no header.
    assert glob.glob(os.path.join(data.hf_home, "datasets", "toolkit_index", "*.npz"))
    assert "audio headers read" in log
    events = scalars(glob.glob(os.path.join(exp, "tensorboard", "events.out.tfevents*")))
    assert [s for s, _ in events["train/mel"]] == list(range(1, 9))
    assert events["dev/mel_distance"]


def test_killed_run_resumes_bitwise(data, reference, tmp_path):
    ref_exp, _ = reference
    expected = latest_payload(ref_exp)
    exp = str(tmp_path / "killed")
    rng = random.Random(26)
    hits = train_with_kills(data.args(exp), 0, sorted(rng.sample(range(1, 6), 2)), exp, rng,
                            data.env())
    assert hits == 2
    assert_same_run(expected, latest_payload(exp))
    log = open(os.path.join(exp, "log", "train.rank0.log")).read()
    assert "resumed from" in log and "audio headers read" not in log     # the cached index


def test_tokens_are_in_no_written_file(data, reference):
    exp, result = reference
    files = [p for p in glob.glob(os.path.join(exp, "**", "*"), recursive=True)
             if os.path.isfile(p)]
    assert any("/wandb/" in p and p.endswith(".wandb") for p in files)
    assert any(p.endswith(".pt") for p in files) and any("tfevents" in p for p in files)
    for secret in (DATASET_TOKEN, ENV_TOKEN):
        assert secret not in result.stderr + result.stdout
        for path in files:
            assert secret.encode() not in open(path, "rb").read(), f"{secret} in {path}"
    config = yaml.safe_load(open(os.path.join(exp, "config.yaml")))
    assert config["dataset"]["hf"]["train"][0]["token"].startswith("<redacted:")


def test_wandb_offline_run_holds_metrics_and_continues_on_resume(data, reference):
    exp, _ = reference
    (run_file,) = glob.glob(os.path.join(exp, "wandb", "offline-run-*", "run-*.wandb"))
    history, config, run_id = read_run(run_file)
    assert run_id == yaml.safe_load(open(os.path.join(exp, "wandb_run.json")))["id"]
    steps = [row["trainer/step"] for row in history]
    assert steps == list(range(1, 9))
    assert all("train/mel" in row for row in history)
    assert "dev/mel_distance" in history[-1]
    tb = scalars(glob.glob(os.path.join(exp, "tensorboard", "events.out.tfevents*")))
    assert [row["train/mel"] for row in history] == pytest.approx([v for _, v in tb["train/mel"]])
    assert config["dataset"]["hf"]["train"][0]["token"] == "<redacted>"     # no salted hash
    assert config["training"]["wandb"]["project"] == "codec-hf"
    # Two more steps in the same exp dir: the same W&B run goes on from step 9.
    more = run_train(data.args(exp, "training.wandb.mode=offline",
                               "training.wandb.project=codec-hf", "training.max_steps=10"),
                     extra_env=data.env())
    assert more.returncode == 0, more.stderr[-3000:]
    runs = sorted(glob.glob(os.path.join(exp, "wandb", "offline-run-*", "run-*.wandb")))
    assert len(runs) == 2 and all(r.endswith(f"run-{run_id}.wandb") for r in runs)
    later = [f for f in runs if f != run_file][0]
    assert [row["trainer/step"] for row in read_run(later)[0]] == [9, 10]


def test_resume_with_the_cache_somewhere_else(data, tmp_path):
    """HF_HOME pointed at a copy of the cache: the same data in another place. The data
    fingerprint is the data's, not its cache location's, so the run resumes."""
    import shutil
    exp = str(tmp_path / "exp")
    home = str(tmp_path / "home")
    first = run_train(data.args(exp, "training.max_steps=2"), extra_env=data.env(HF_HOME=home))
    assert first.returncode == 0, first.stderr[-3000:]
    moved = str(tmp_path / "moved_home")
    shutil.copytree(home, moved)
    shutil.rmtree(home)
    again = run_train(data.args(exp, "training.max_steps=3"), extra_env=data.env(HF_HOME=moved))
    assert again.returncode == 0, again.stderr[-3000:]
    assert "resumed from" in again.stderr and "training finished: 3 steps" in again.stderr
    assert home not in open(os.path.join(exp, "data_fingerprint.json")).read()


@pytest.mark.parametrize("case", ["missing_column", "missing_dir", "both_inputs", "no_labels",
                                  "hub_unreachable", "repeated_ids", "unsplit_dev"])
def test_configuration_errors_are_one_line(data, tmp_path, case):
    config = yaml.safe_load(open(data.config))
    entry = config["dataset"]["hf"]["train"][0]
    extra, expected = [], ""
    if case == "missing_column":
        entry["audio_column"] = "speech"
        expected = ("error: dataset.hf.train[0].audio_column: "
                    f"{data.parquet} split 'train' has no column 'speech' (columns: audio, id,")
    elif case == "missing_dir":
        entry["path"] = str(tmp_path / "nowhere" / "ds")
        expected = f"error: dataset.hf.train[0].path: {entry['path']} not found"
    elif case == "both_inputs":
        extra = [f"dataset.train_data={data.config}"]
        expected = "error: " + data.write_config(config, f"{case}.yaml") + \
            ": dataset.train_data and dataset.hf.train both name the train input"
    elif case == "repeated_ids":       # ids must name utterances, not speakers
        entry["id_column"] = "speaker"
        expected = ("error: dataset.hf.train: utterance keys repeat (e.g. libri_like:train/0, "
                    "libri_like:train/1, libri_like:train/2)")
    elif case == "unsplit_dev":         # dev must not silently be the whole train table
        config["dataset"]["hf"]["dev"] = [{"path": data.saved, "split": "validation"}]
        expected = (f"error: dataset.hf.dev[0].split: {data.saved} is one unsplit dataset "
                    "(save_to_disk of a Dataset), it has no split 'validation'")
    elif case == "hub_unreachable":     # no network here: the token must not leak either
        entry["path"] = "some-org/private-speech"
        expected = "error: dataset.hf.train[0]: cannot open some-org/private-speech split 'train'"
    else:                  # a labelled task without a label column
        config["task"] = {"type": "speaker"}
        for section in ("discriminator", "loss", "optim"):
            config.pop(section)
        config["model"] = {"type": "tdnn_xvector"}
        expected = "error: dataset.hf.train[0].label_column: this task needs a label"
        extra = ["--inventory", data.write_config({}, "inventory.txt")]
    path = data.write_config(config, f"{case}.yaml")
    result = run_train(data.args(str(tmp_path / "exp"), *extra, config=path), extra_env=data.env())
    assert result.returncode == 2, result.stderr[-2000:]
    lines = [l for l in result.stderr.splitlines() if l.startswith("error:")]
    assert len(lines) == 1 and lines[0].startswith(expected), result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    assert DATASET_TOKEN not in result.stderr + result.stdout
    for log in glob.glob(str(tmp_path / "exp" / "log" / "*")):
        assert DATASET_TOKEN not in open(log).read()


def test_two_ranks_on_a_fresh_cache_and_wandb_online_without_login(data, tmp_path):
    """Both gloo ranks open the datasets at once into an empty cache: `datasets` builds the
    Arrow files under its lock, each rank indexes the durations, and they agree on the plan.
    W&B is asked for online with no login and no server: rank 0 logs offline instead."""
    exp = str(tmp_path / "exp")
    result = run_train(
        data.args(exp, "training.max_steps=2", "training.wandb.mode=online"), nproc=2,
        extra_env=data.env(HF_HOME=str(tmp_path / "fresh_cache"), WANDB_API_KEY="",
                           NETRC=str(tmp_path / "no_netrc"),
                           WANDB_CONFIG_DIR=str(tmp_path / "wandb_config"),
                           WANDB_BASE_URL="http://127.0.0.1:9"))
    assert result.returncode == 0, result.stderr[-4000:]
    assert "W&B online run could not start" in result.stderr and "logging offline" in result.stderr
    (run_file,) = glob.glob(os.path.join(exp, "wandb", "offline-run-*", "run-*.wandb"))
    assert [row["trainer/step"] for row in read_run(run_file)[0]] == [1, 2]
    logs = [open(os.path.join(exp, "log", f"train.rank{r}.log")).read() for r in (0, 1)]
    assert "21 train utterances" in logs[0]
    # The ranks stayed in step: the same parameters at the end.
    sums = {log.split("final parameter checksum ")[1].split()[0] for log in logs}
    assert len(sums) == 1
    assert "training finished: 2 steps" in result.stderr



# --------------------------------------------------------------------------- in process

@pytest.fixture
def hf_cache(tmp_path, monkeypatch):
    """`datasets`' cache (and so the duration index) in a directory of this test."""
    import datasets
    cache = str(tmp_path / "datasets_cache")
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", cache)
    return cache


def test_an_unsplit_saved_dataset_has_no_other_split(data, tmp_path):
    """A `save_to_disk` Dataset has no split names: the default split reads it whole, any
    other name is a one-line error (never the whole table as dev)."""
    from toolkit.data.hf_source import open_table
    assert len(open_table(HFDatasetConfig(path=data.saved), "w")) == 8
    for split in ("validation", "no_such_split"):
        with pytest.raises(ConfigError) as err:
            open_table(HFDatasetConfig(path=data.saved, split=split), "dataset.hf.dev[0]")
        text = str(err.value)
        assert text.startswith(f"dataset.hf.dev[0].split: {data.saved} is one unsplit "
                               f"dataset (save_to_disk of a Dataset), it has no split "
                               f"{split!r}"), text
        assert "omit split (or set split: train) to read it whole" in text and "\n" not in text
    # A Dataset saved with the name of the split it was cut from answers to that name only.
    test_only = write_saved_dataset(str(tmp_path / "test_only"), rows("t", 2, 16000, 9), "test")
    assert len(open_table(HFDatasetConfig(path=test_only, split="test"), "w")) == 2
    with pytest.raises(ConfigError, match=r"^w.split: \S+test_only holds the one split "
                                          r"'test', not 'train'"):
        open_table(HFDatasetConfig(path=test_only), "w")


@pytest.mark.parametrize("damage", ["truncated", "empty", "garbage", "other_rows"])
def test_a_damaged_duration_index_is_rebuilt(data, hf_cache, caplog, damage):
    """However the cached index is damaged, it is logged, read again from the audio and
    written whole (temporary file + rename) in place of the damaged one."""
    import glob
    import logging
    from toolkit.data.hf_source import load_index, open_table
    entry = HFDatasetConfig(path=data.saved)
    ds = open_table(entry, "w")
    first = load_index(ds, entry, "w")
    (path,) = glob.glob(os.path.join(hf_cache, "toolkit_index", "*.npz"))
    blob = open(path, "rb").read()
    with open(path, "wb") as f:
        if damage == "truncated":
            f.write(blob[:len(blob) // 2])
        elif damage == "garbage":
            f.write(b"not an index" * 10)
        elif damage == "other_rows":      # readable, but of another table's length
            np.savez(f, ids=np.asarray(["x"]), labels=np.zeros(1, np.int64),
                     durations=np.ones(1), problems=np.asarray([""]))
    with caplog.at_level(logging.INFO, logger="toolkit.data.hf_source"):
        again = load_index(ds, entry, "w")
    assert again["ids"] == first["ids"] and again["problems"] == first["problems"]
    np.testing.assert_array_equal(again["durations"], first["durations"])
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and path in warnings[0] and "rebuilding it" in warnings[0]
    assert any("audio headers read" in r.getMessage() for r in caplog.records)
    assert os.listdir(os.path.dirname(path)) == [os.path.basename(path)]
    with np.load(path) as z:
        assert len(z["ids"]) == len(ds)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="toolkit.data.hf_source"):
        load_index(ds, entry, "w")                   # whole again: read, not rebuilt
    assert not any("audio headers read" in r.getMessage() for r in caplog.records)


def _source(entries, split="train"):
    from toolkit.data.hf_source import HFSource
    from toolkit.task import DataRequirements
    cfg = DatasetConfig()
    getattr(cfg.hf, split).extend(entries)
    return HFSource(split, DataRequirements(require_label=False), cfg,
                    lambda durations: (durations * 100).astype(np.int64))


def test_datasets_with_one_basename_get_distinct_keys(data, hf_cache, tmp_path):
    """Two datasets named alike in different directories keep apart by as much of their
    path as it takes; a dataset whose name is unique keeps its short keys."""
    a = write_saved_dataset(str(tmp_path / "a" / "speech"), rows("a", 2, 16000, 5))
    b = write_saved_dataset(str(tmp_path / "b" / "speech"), rows("b", 2, 16000, 6))
    source = _source([HFDatasetConfig(path=a), HFDatasetConfig(path=b),
                      HFDatasetConfig(path=data.saved)])
    keys = [source.key(i) for i in range(len(source))]
    assert keys[:4] == ["a/speech:train/00000000", "a/speech:train/00000001",
                        "b/speech:train/00000000", "b/speech:train/00000001"]
    assert keys[4:] == [f"saved:train/{i:08d}" for i in range(8)]


@pytest.mark.parametrize("case", ["same_dataset_twice", "repeated_ids"])
def test_repeated_keys_name_their_cause(data, hf_cache, case):
    """The error says what to change: the entry listed twice, or the id column that does
    not name utterances."""
    if case == "same_dataset_twice":
        entries = [HFDatasetConfig(path=data.saved),
                   HFDatasetConfig(path=data.saved + "/", duration_column="seconds")]
        expected = (r"^dataset.hf.train: utterance keys repeat \(e.g. saved:train/00000000, "
                    r"saved:train/00000001, saved:train/00000002\): dataset.hf.train\[0\] and "
                    r"\[1\] read the same split of \S+saved; list it once")
    else:
        entries = [HFDatasetConfig(path=data.saved, id_column="speaker")]
        expected = (r"^dataset.hf.train: utterance keys repeat \(e.g. saved:train/0, "
                    r"saved:train/1, saved:train/2\): dataset.hf.train\[0\].id_column "
                    r"'speaker' repeats values; name a column of unique utterance ids, or "
                    r"set id_column: '' to key rows by their number")
    with pytest.raises(ConfigError, match=expected):
        _source(entries)
