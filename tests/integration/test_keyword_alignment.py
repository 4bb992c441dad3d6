"""Keyword end times: Kaldi dir `kw_times` -> data list `kw_end` -> batch frames -> the
max-pooling loss's end window, and a training run that uses them."""
import json
import os

import numpy as np
import pytest

from kws_data import make_datalist, make_kaldi_dir, write_keywords
from in_process import run_main
from train_utils import Corpus, run_train
from toolkit.config import DatasetConfig
from toolkit.data.datalist import DataList
from toolkit.data.pipeline import FeaturePipeline
from toolkit.data.sources import BatchDataset
from toolkit.tasks.kws.data import keyword_end_frame
from pipeline_utils import kws_builder, plan_batches


def make_list(data_dir, out, inventory):
    # The binary's real main(argv), in this process: no interpreter per call.
    from toolkit.bin import make_datalist
    return run_main(make_datalist.main, [data_dir, out, "--inventory", inventory])


def test_make_datalist_carries_kw_times_and_names_bad_lines(tmp_path):
    data_dir = make_kaldi_dir(str(tmp_path), "d", 3, 4, seed=3)
    inventory = write_keywords(str(tmp_path), ["hey chirp"])
    out = str(tmp_path / "d.list")
    done = make_list(data_dir, out, inventory)
    assert done.returncode == 0, done.stderr
    entries = [json.loads(line) for line in open(out)]
    times = {line.split()[0]: tuple(map(float, line.split()[1:]))
             for line in open(os.path.join(data_dir, "kw_times"))}
    assert len(times) == 3
    for e in entries:
        if e["label"] >= 0:
            assert (e["kw_start"], e["kw_end"]) == times[e["key"]]
            assert 0 < e["kw_start"] < e["kw_end"] <= e["duration"]
        else:
            assert "kw_end" not in e
    kw_times = os.path.join(data_dir, "kw_times")
    lines = open(kw_times).read().splitlines()
    # An expected error: one line naming file and line, exit status 2.
    with open(kw_times, "w") as f:
        f.write("\n".join(lines + ["pos-d-00003 0.9 0.2"]) + "\n")
    bad = make_list(data_dir, out, inventory)
    assert bad.returncode == 2
    assert f"{kw_times}:4: expected '<utt> <start> <end>'" in bad.stderr
    with open(kw_times, "w") as f:
        f.write("\n".join(lines + ["pos-d-00001 0.9 1.0"]) + "\n")
    bad = make_list(data_dir, out, inventory)
    assert bad.returncode == 2
    assert f"{kw_times}:4: duplicate key pos-d-00001" in bad.stderr


def test_batches_carry_keyword_end_frames_through_speed_perturbation(tmp_path):
    path = make_datalist(str(tmp_path), "s", 4, 4, seed=4)
    dl = DataList.load(path, num_classes=1)
    for speeds in ([1.0], [0.9, 1.1]):
        cfg = DatasetConfig(batch_size=100, speed_perturb=speeds)
        batches = plan_batches(dl, cfg, seed=1, epoch=0, train=True)
        batch = BatchDataset(dl, batches, kws_builder(FeaturePipeline(cfg, seed=1, train=True)),
                             0)[0]
        by_key = {json.loads(line)["key"]: json.loads(line) for line in open(path)}
        for i, key in enumerate(batch.keys):
            entry, frames, end = by_key[key], int(batch.lengths[i]), int(batch.keyword_end[i])
            if entry["label"] < 0:
                assert end == -1
                continue
            assert end == keyword_end_frame(entry, frames)
            # the same fraction of the utterance, whatever the speed
            assert abs(end / frames - entry["kw_end"] / entry["duration"]) < 0.02
    assert keyword_end_frame({"duration": 2.0}, 100) == -1
    assert keyword_end_frame({"duration": 2.0, "kw_end": 2.0}, 100) == 99


def test_training_with_end_window(tmp_path):
    """A model trained with the end window waits for the whole chirp: on dev positives its
    first frame above 0.5 is never more than 5 frames before the chirp's end (the same
    run without the window fired early on 1 of 6)."""
    corpus = Corpus(str(tmp_path), num_train=60, num_dev=12)
    exp = str(tmp_path / "exp")
    # Loading in the trainer process: the loader is not under test here.
    result = run_train(corpus.train_args(exp, "loss.end_window=[0,20]", "training.max_epoch=6",
                                         "task.spec_aug_positives=false",
                                         "dataset.num_workers=0"))
    assert result.returncode == 0, result.stderr[-3000:]
    import torch
    from toolkit.config import FeatureConfig
    from toolkit.tasks.kws.export import model_from_checkpoint
    ckpts = sorted(f for f in os.listdir(exp) if f.startswith("ckpt-") and f.endswith(".pt"))
    model = model_from_checkpoint(os.path.join(exp, ckpts[-1]))
    proc = FeaturePipeline(DatasetConfig(feature=FeatureConfig(num_mel_bins=20)), seed=0,
                           train=False)
    early = late = 0
    for line in open(corpus.dev):
        entry = json.loads(line)
        if entry["label"] < 0:
            continue
        feats = torch.from_numpy(proc(entry, 0))[None]
        with torch.no_grad():
            probs = torch.sigmoid(model(feats)[0])[0, :, 0].numpy()
        fired = np.flatnonzero(probs > 0.5)
        if len(fired):
            end = keyword_end_frame(entry, len(probs))
            early += int(fired[0] < end - 5)
            late += int(fired[0] >= end - 5)
    assert late > 0 and early == 0, (early, late)
