"""Data pipeline at scale and under bad input: flat worker memory on a 200k-entry list,
exactly-once partitioning over 2 ranks x 2 workers, bad entries in training (counted,
max_bad_fraction stop, one rank's bad batch never blocks the other)."""
import json
import os

import numpy as np
import pytest
import soundfile as sf
from torch.utils.data import DataLoader, Dataset

from toolkit.config import DatasetConfig
from toolkit.data.datalist import DataList
from toolkit.data.loader import make_loader
from toolkit.data.pipeline import FeaturePipeline
from toolkit.data.plan import rank_batches
from toolkit.data.sources import BatchDataset
from pipeline_utils import kws_builder, plan_batches
from train_utils import Corpus, latest_payload, run_train


def _rss_kib() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS")


class TouchEverything(Dataset):
    """Each item reads every entry of its share of the list (as batches do over an
    epoch) and reports the worker's RSS before and after."""

    def __init__(self, datalist, parts):
        self.datalist = datalist
        self.parts = parts

    def __len__(self):
        return self.parts

    def __getitem__(self, part):
        before = _rss_kib()
        n = len(self.datalist)
        total = 0.0
        for i in range(part * n // self.parts, (part + 1) * n // self.parts):
            total += len(self.datalist.entry(i)["key"]) + float(self.datalist.durations[i])
        return before, _rss_kib(), total


def test_worker_memory_stays_flat_on_200k_entries(tmp_path):
    path = tmp_path / "big.list"
    with open(path, "w") as f:
        for i in range(200_000):
            f.write(json.dumps({"key": f"spk{i % 977:04d}-utt{i:07d}",
                                "wav": f"/corpus/audio/spk{i % 977:04d}/utt{i:07d}.wav",
                                "duration": 1.0 + (i % 300) / 100.0, "label": i % 3 - 1,
                                "txt": "some transcript words here"}) + "\n")
    datalist = DataList.load(str(path))
    assert len(datalist) == 200_000
    # The whole list is one bytes blob plus three arrays, not 200k dicts.
    held = len(datalist.blob) + datalist.offsets.nbytes + datalist.durations.nbytes + \
        datalist.labels.nbytes
    assert held < 40 * 1024 * 1024
    loader = DataLoader(TouchEverything(datalist, 4), batch_size=None, num_workers=2,
                        multiprocessing_context="fork")
    growth = [after - before for before, after, _ in loader]
    # Reading every entry must not copy the list into each worker (copy-on-write of
    # refcounted objects would add tens of MB per worker).
    assert max(growth) < 8 * 1024, f"worker RSS grew by {max(growth)} KiB"


def test_each_utterance_once_across_2_ranks_x_2_workers(tmp_path):
    from kws_data import make_datalist
    path = make_datalist(str(tmp_path), "part", 9, 14, seed=5)
    datalist = DataList.load(path)
    cfg = DatasetConfig(batch_size=3, sort_window=5)
    cfg.feature.num_mel_bins = 20
    seen = []
    steps = []
    for rank in range(2):
        batches = rank_batches(plan_batches(datalist, cfg, 3, 1, True), rank, 2)
        steps.append(len(batches))
        builder = kws_builder(FeaturePipeline(cfg, seed=3, train=True))
        loader = make_loader(BatchDataset(datalist, batches, builder, 1), 0, 2, 2, 3)
        for batch in loader:
            seen.extend(batch.keys)
    assert steps[0] == steps[1]
    assert sorted(seen) == sorted(datalist.entry(i)["key"] for i in range(len(datalist)))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return Corpus(str(tmp_path_factory.mktemp("robust")), num_train=24, num_dev=6)


def _write_list_with_bad(corpus, root, bad_entries):
    good = open(corpus.train).read()
    path = os.path.join(root, "with_bad.list")
    with open(path, "w") as f:
        f.write(good)
        for entry in bad_entries:
            f.write((entry if isinstance(entry, str) else json.dumps(entry)) + "\n")
    return path


def _bad_entries(root):
    truncated = os.path.join(root, "truncated.wav")
    sf.write(truncated, np.random.default_rng(0).standard_normal(16000).astype(np.float32) * 0.1,
             16000, subtype="PCM_16")
    with open(truncated, "r+b") as f:
        f.truncate(20000)
    silent = os.path.join(root, "silent.wav")
    sf.write(silent, np.zeros(16000, np.float32), 16000, subtype="PCM_16")
    nan = os.path.join(root, "nan.wav")
    sf.write(nan, np.full(16000, np.nan, np.float32), 16000, subtype="FLOAT")
    return [
        {"key": "bad-missing", "wav": os.path.join(root, "nope.wav"), "duration": 1.0, "label": 0},
        {"key": "bad-truncated", "wav": truncated, "duration": 1.0, "label": -1},
        {"key": "bad-silent", "wav": silent, "duration": 1.0, "label": -1},
        {"key": "bad-nan", "wav": nan, "duration": 1.0, "label": 0},
        {"key": "bad-label", "wav": silent, "duration": 1.0, "label": 7},
        {"key": "bad-duration", "wav": silent, "duration": -3, "label": 0},
        "{not json",
    ]


def test_bad_entries_above_max_fraction_stop_the_run(corpus, tmp_path):
    path = _write_list_with_bad(corpus, str(tmp_path), _bad_entries(str(tmp_path)))
    exp = str(tmp_path / "exp")
    result = run_train(corpus.train_args(exp, "training.max_epoch=1", train=path))
    assert result.returncode != 0
    for reason in ("malformed_json", "label_not_in_inventory", "absurd_duration"):
        assert reason in result.stderr, reason
    assert "max_bad_fraction" in result.stderr


def test_bad_entries_below_limit_are_skipped_and_counted(corpus, tmp_path):
    path = _write_list_with_bad(corpus, str(tmp_path), _bad_entries(str(tmp_path)))
    exp = str(tmp_path / "exp")
    result = run_train(corpus.train_args(exp, "training.max_epoch=1",
                                         "dataset.max_bad_fraction=0.5", train=path), nproc=2)
    assert result.returncode == 0, result.stderr[-3000:]
    logs = "".join(open(os.path.join(exp, "log", f"train.rank{r}.log")).read() for r in (0, 1))
    for key, reason in (("bad-missing", "missing_file"), ("bad-truncated", "truncated_audio"),
                        ("bad-silent", "silent_audio"), ("bad-nan", "nonfinite_samples")):
        assert f"skip {key}: {reason}" in logs, (key, reason)
    assert "4 skipped" in logs                  # the epoch summary counts them over ranks
    from tensorboard_reader import scalars
    import glob
    values = scalars(glob.glob(os.path.join(exp, "tensorboard", "events.*")))
    assert values["bad_input/missing_file"][-1][1] == 1


def test_a_rank_whose_batch_is_all_bad_does_not_block(corpus, tmp_path):
    root = str(tmp_path)
    bad = _bad_entries(root)[:4]
    good = [json.loads(line) for line in open(corpus.train)][:3]
    path = os.path.join(root, "mixed.list")
    with open(path, "w") as f:
        # batch_size 4 without shuffling or sorting: batch 0 (rank 0) good, batch 1 (rank 1) bad.
        for entry in good + [dict(good[0], key="zz-dup")] + bad:
            f.write(json.dumps(entry) + "\n")
    exp = str(tmp_path / "exp")
    result = run_train(corpus.train_args(exp, "training.max_epoch=1", "dataset.batch_size=4",
                                         "dataset.shuffle=false", "dataset.sort_window=1",
                                         "dataset.max_bad_fraction=0.9", train=path),
                       nproc=2, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert latest_payload(exp)["epoch"] == 1


def test_training_straight_from_kaldi_feats_scp(corpus, tmp_path):
    """A Kaldi feats.scp (written with kaldiio, as Kaldi would) becomes a list with `feat`
    entries; training reads it and says waveform augmentation is off."""
    import kaldiio
    from kws_data import make_kaldi_dir, write_keywords
    from toolkit.data.features import compute_fbank, fbank_options
    data_dir = make_kaldi_dir(str(tmp_path), "fdir", 6, 10, seed=9)
    opts = fbank_options(num_mel_bins=20)
    with kaldiio.WriteHelper(f"ark,scp:{tmp_path}/feats.ark,{data_dir}/feats.scp") as writer:
        for line in open(os.path.join(data_dir, "wav.scp")):
            key, path = line.split()
            wave, _ = sf.read(path, dtype="float32")
            writer(key, compute_fbank(wave, opts))
    inv = write_keywords(str(tmp_path), ["hey chirp"])
    out = str(tmp_path / "feats.list")
    done = run_train(["-m", "toolkit.bin.make_datalist", data_dir, out, "--inventory", inv,
                      "--feats-scp", os.path.join(data_dir, "feats.scp")])
    assert done.returncode == 0, done.stderr
    entries = [json.loads(line) for line in open(out)]
    assert len(entries) == 16 and all(".ark:" in e["feat"] for e in entries)
    exp = str(tmp_path / "exp")
    result = run_train(corpus.train_args(exp, "training.max_epoch=1", train=out))
    assert result.returncode == 0, result.stderr[-2000:]
    assert "waveform augmentations speed_perturb, volume_range are off" in result.stderr
