"""Data lists (bad-line accounting, compact layout), batch planning and rank sharding,
batch assembly over real WAVs, and augmentation determinism / SNR / reverb alignment."""
import json
import math
import os

import numpy as np
import pytest
import soundfile as sf
import torch

from toolkit.config import DatasetConfig, Ramp, SpecAugConfig
from toolkit.data import augment
from toolkit.data.audio import BadEntry
from toolkit.data.augment import load_mono, tilt_spectrum, utterance_rng, warp_frequency
from toolkit.data.datalist import DataList
from toolkit.data.features import compute_fbank, options_from_config
from toolkit.data.loader import make_loader
from toolkit.data.pipeline import FeaturePipeline
from toolkit.data.plan import estimated_frames, rank_batches
from toolkit.data.sources import BatchDataset
from pipeline_utils import kws_builder, plan_batches
from train_utils import descendants

RATE = 16000


def write_lines(path, lines):
    with open(path, "wb") as f:
        for line in lines:
            f.write((line if isinstance(line, bytes) else line.encode("utf-8")) + b"\n")
    return str(path)


def snr_db(clean, mixed):
    clean = clean.astype(np.float64)
    noise = mixed.astype(np.float64) - clean
    return 10 * np.log10(np.mean(clean ** 2) / np.mean(noise ** 2))


# ----------------------------------------------------------------------------- data list

GOOD = [
    {"key": "g1", "wav": "/a/1.wav", "duration": 1.5, "label": 0, "txt": "hey snips"},
    {"key": "g2", "wav": "/a/2.wav", "duration": 0.8, "label": -1},
    {"key": "g3", "feat": "/f.ark:12", "duration": 2, "label": 1, "txt": "ünïcode ✓"},
    {"key": "g4", "wav": "/a/4.wav", "duration": 3599.0, "label": 1, "start": 0.5, "end": 3599.5},
]
BAD = {
    "malformed_json": ['{"key": "m1", "wav": "/x.wav", ', '[1, 2, 3]', b'{"key": "\xff\xfe"}'],
    "missing_field": ['{"wav": "/x.wav", "duration": 1, "label": 0}',
                      '{"key": "nf1", "duration": 1, "label": 0}',
                      '{"key": "", "wav": "/x.wav", "duration": 1, "label": 0}'],
    "missing_label": ['{"key": "nl1", "wav": "/x.wav", "duration": 1}',
                      '{"key": "nl2", "wav": "/x.wav", "duration": 1, "label": "1"}',
                      '{"key": "nl3", "wav": "/x.wav", "duration": 1, "label": true}'],
    "label_not_in_inventory": ['{"key": "li1", "wav": "/x.wav", "duration": 1, "label": 2}',
                               '{"key": "li2", "wav": "/x.wav", "duration": 1, "label": -2}'],
    "absurd_duration": ['{"key": "d1", "wav": "/x.wav", "duration": -1, "label": 0}',
                        '{"key": "d2", "wav": "/x.wav", "duration": 0, "label": 0}',
                        '{"key": "d3", "wav": "/x.wav", "duration": 1e9, "label": 0}',
                        '{"key": "d4", "wav": "/x.wav", "duration": NaN, "label": 0}',
                        '{"key": "d5", "wav": "/x.wav", "duration": Infinity, "label": 0}',
                        '{"key": "d6", "wav": "/x.wav", "duration": "NaN", "label": 0}',
                        '{"key": "d7", "wav": "/x.wav", "label": 0}'],
}


@pytest.fixture
def mixed_list(tmp_path):
    lines = []
    bad = [line for group in BAD.values() for line in group]
    for i, entry in enumerate(GOOD):
        lines.append(json.dumps(entry, ensure_ascii=False))
        lines.extend(bad[i::len(GOOD)])
        lines.append("   ")                       # blank lines are not entries
    return write_lines(tmp_path / "data.list", lines)


def test_datalist_skips_and_counts_bad_lines(mixed_list):
    dl = DataList.load(mixed_list, num_classes=2)
    assert len(dl) == len(GOOD)
    assert [dl.key(i) for i in range(len(dl))] == [e["key"] for e in GOOD]
    assert dict(dl.bad.counts) == {reason: len(lines) for reason, lines in BAD.items()}
    assert dl.bad.total() == sum(len(v) for v in BAD.values())
    assert "nl1" in dl.bad.examples["missing_label"]
    np.testing.assert_array_equal(dl.labels, [e["label"] for e in GOOD])
    np.testing.assert_allclose(dl.durations, [e["duration"] for e in GOOD])
    assert dl.total_hours() == pytest.approx(sum(e["duration"] for e in GOOD) / 3600, rel=1e-6)


def test_datalist_rejects_boolean_duration(tmp_path):
    path = write_lines(tmp_path / "b.list",
                       ['{"key": "b1", "wav": "/x.wav", "duration": true, "label": 0}'])
    dl = DataList.load(path, num_classes=2)
    assert len(dl) == 0
    assert dict(dl.bad.counts) == {"absurd_duration": 1}


def test_datalist_without_inventory_or_labels(mixed_list):
    # Without num_classes any label >= -1 is fine; without require_label none is needed.
    dl = DataList.load(mixed_list)
    assert "li1" in [dl.key(i) for i in range(len(dl))]
    dl = DataList.load(mixed_list, require_label=False)
    keys = [dl.key(i) for i in range(len(dl))]
    assert {"nl1", "nl2", "nl3", "li1", "li2"} <= set(keys)
    assert dl.labels[keys.index("nl1")] == -1
    assert "missing_label" not in dl.bad.counts


def test_datalist_compact_layout_round_trip(mixed_list):
    dl = DataList.load(mixed_list, num_classes=2)
    assert isinstance(dl.blob, bytes)
    assert dl.offsets.dtype == np.int64 and len(dl.offsets) == len(dl) + 1
    assert dl.offsets[0] == 0 and dl.offsets[-1] == len(dl.blob)
    assert np.all(np.diff(dl.offsets) > 0)
    assert dl.durations.dtype == np.float32 and dl.labels.dtype == np.int32
    for i, entry in enumerate(GOOD):
        assert dl.entry(i) == entry
    assert dl.has_features() is False     # the first entry has a wav


# ----------------------------------------------------------------------------- planning

@pytest.fixture(scope="module")
def plan_list(tmp_path_factory):
    rng = np.random.default_rng(0)
    durations = np.round(rng.uniform(0.01, 3.0, 300), 3)
    path = tmp_path_factory.mktemp("plan") / "plan.list"
    write_lines(path, [json.dumps({"key": f"u{i:03d}", "wav": f"/w/{i}.wav",
                                   "duration": float(d), "label": int(i % 3) - 1})
                       for i, d in enumerate(durations)])
    return DataList.load(str(path), num_classes=2)


def plan_cfg(**kw):
    cfg = DatasetConfig(min_duration=0.2, max_duration=2.5, sort_window=50, batch_size=16)
    for k, v in kw.items():
        setattr(cfg, k, v)
    return cfg


def kept(dl, cfg):
    return set(np.nonzero((dl.durations >= cfg.min_duration)
                          & (dl.durations <= cfg.max_duration))[0].tolist())


@pytest.mark.parametrize("frames_limit", [0, 1500])
def test_plan_deterministic_complete_and_filtered(plan_list, frames_limit):
    cfg = plan_cfg(max_frames_in_batch=frames_limit)
    a = plan_batches(plan_list, cfg, seed=5, epoch=3, train=True)
    b = plan_batches(plan_list, cfg, seed=5, epoch=3, train=True)
    assert [x.tolist() for x in a] == [x.tolist() for x in b]
    flat = np.concatenate(a).tolist()
    assert len(flat) == len(set(flat))                 # each kept index exactly once
    assert set(flat) == kept(plan_list, cfg)
    assert 0 < len(set(flat)) < len(plan_list)         # the filter removed some
    other = plan_batches(plan_list, cfg, seed=5, epoch=4, train=True)
    assert [x.tolist() for x in other] != [x.tolist() for x in a]
    assert sorted(np.concatenate(other).tolist()) == sorted(flat)
    seed2 = plan_batches(plan_list, cfg, seed=6, epoch=3, train=True)
    assert [x.tolist() for x in seed2] != [x.tolist() for x in a]
    # Not training: the same plan every epoch.
    e0 = plan_batches(plan_list, cfg, seed=5, epoch=0, train=False)
    e1 = plan_batches(plan_list, cfg, seed=5, epoch=1, train=False)
    assert [x.tolist() for x in e0] == [x.tolist() for x in e1]


def test_plan_fixed_batch_size(plan_list):
    cfg = plan_cfg()
    batches = plan_batches(plan_list, cfg, seed=1, epoch=0, train=True)
    sizes = sorted(len(b) for b in batches)
    assert sizes[-1] == cfg.batch_size
    assert sum(1 for s in sizes if s < cfg.batch_size) <= 1


@pytest.mark.parametrize("batch_size", [0, 8])
@pytest.mark.parametrize("train", [True, False])
def test_dynamic_batches_respect_frame_budget(plan_list, batch_size, train):
    limit = 1200
    cfg = plan_cfg(max_frames_in_batch=limit, batch_size=batch_size)
    # Independent frame estimate: snip_edges framing of round(duration * rate) samples.
    est = np.array([max(0, 1 + (int(round(float(d) * RATE)) - 400) // 160)
                    for d in plan_list.durations])
    np.testing.assert_array_equal(estimated_frames(plan_list.durations, cfg), est)
    batches = plan_batches(plan_list, cfg, seed=2, epoch=1, train=train)
    assert any(len(b) > 1 for b in batches)
    for b in batches:
        assert len(b) >= 1
        padded = len(b) * int(est[b].max())
        assert padded <= limit or len(b) == 1
        if batch_size:
            assert len(b) <= batch_size
    if not train:
        # Unshuffled plan: batches are greedy, the next entry would not have fitted.
        for cur, nxt in zip(batches, batches[1:]):
            longest = max(int(est[cur].max()), int(est[nxt[0]]))
            assert longest * (len(cur) + 1) > limit or (batch_size and len(cur) + 1 > batch_size)


def test_oversize_entry_gets_its_own_batch(plan_list):
    cfg = plan_cfg(max_frames_in_batch=100, batch_size=0)   # < frames of most entries
    batches = plan_batches(plan_list, cfg, seed=0, epoch=0, train=False)
    est = estimated_frames(plan_list.durations, cfg)
    for b in batches:
        if est[b].max() > 100:
            assert len(b) == 1


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_rank_batches_partition(plan_list, world_size):
    cfg = plan_cfg()
    batches = plan_batches(plan_list, cfg, seed=0, epoch=0, train=True)
    if world_size == 3:
        batches = batches[:-1] if len(batches) % 3 == 0 else batches   # force padding
        assert len(batches) % 3 != 0
    shares = [rank_batches(batches, r, world_size) for r in range(world_size)]
    steps = {len(s) for s in shares}
    assert steps == {math.ceil(len(batches) / world_size)}
    got = sorted(tuple(b.tolist()) for s in shares for b in s if len(b))
    assert got == sorted(tuple(b.tolist()) for b in batches)
    empties = sum(1 for s in shares for b in s if len(b) == 0)
    assert empties == world_size * steps.pop() - len(batches)
    # Step i of every rank comes from the same global group of batches (round robin).
    for r, share in enumerate(shares):
        for i, b in enumerate(share):
            if len(b):
                assert b is batches[i * world_size + r] or np.array_equal(
                    b, batches[i * world_size + r])
    assert rank_batches([], 0, 2) == []


# ----------------------------------------------------------------------------- real audio

@pytest.fixture(scope="module")
def wav_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("wavs")
    rng = np.random.default_rng(1)
    entries = []
    for i, seconds in enumerate([0.5, 0.7, 0.35, 0.9, 0.6]):
        n = int(seconds * RATE)
        t = np.arange(n) / RATE
        x = 0.3 * np.sin(2 * np.pi * (300 + 100 * i) * t) + 0.05 * rng.standard_normal(n)
        path = str(root / f"g{i}.wav")
        sf.write(path, x.astype(np.float32), RATE, subtype="PCM_16")
        entries.append({"key": f"g{i}", "wav": path, "duration": seconds, "label": i % 2})
    # Broken entries: a missing file and a truncated one.
    trunc = root / "trunc.wav"
    full = open(entries[0]["wav"], "rb").read()
    trunc.write_bytes(full[:len(full) // 2])
    entries.insert(1, {"key": "missing", "wav": str(root / "nope.wav"), "duration": 0.5,
                       "label": 0})
    entries.insert(4, {"key": "trunc", "wav": str(trunc), "duration": 0.5, "label": 1})
    noise = []
    for i in range(2):
        path = str(root / f"noise{i}.wav")
        sf.write(path, (0.2 * rng.standard_normal(int(0.3 * RATE))).astype(np.float32), RATE)
        noise.append({"key": f"n{i}", "wav": path, "duration": 0.3})
    rir = np.zeros(800, dtype=np.float32)
    rir[40] = 1.0
    rir[41:] = 0.3 * rng.standard_normal(759) * np.exp(-np.arange(759) / 120.0)
    sf.write(str(root / "rir.wav"), rir, RATE, subtype="FLOAT")
    return {
        "list": write_lines(root / "data.list", [json.dumps(e) for e in entries]),
        "noise": write_lines(root / "noise.list", [json.dumps(e) for e in noise]),
        "rir": write_lines(root / "rir.list", [json.dumps({"key": "r", "wav": str(root / "rir.wav"),
                                                           "duration": 0.05})]),
        "good": [e for e in entries if e["key"].startswith("g")],
    }


def test_batch_dataset_yields_good_and_counts_bad(wav_dir):
    dl = DataList.load(wav_dir["list"], num_classes=2)
    cfg = DatasetConfig(batch_size=100)
    batches = plan_batches(dl, cfg, seed=0, epoch=0, train=False)
    assert len(batches) == 1
    ds = BatchDataset(dl, batches, kws_builder(FeaturePipeline(cfg, seed=0, train=False)), epoch=0)
    batch = ds[0]
    good = {e["key"]: e for e in wav_dir["good"]}
    assert sorted(batch.keys) == sorted(good)
    assert dict(batch.bad.counts) == {"missing_file": 1, "truncated_audio": 1}
    assert batch.bad.examples["truncated_audio"] == ["trunc"]
    opts = options_from_config(cfg.feature, cfg.sample_rate)
    assert batch.feats.shape == (len(good), int(batch.lengths.max()), 40)
    assert batch.audio_seconds == pytest.approx(sum(e["duration"] for e in good.values()))
    for i, key in enumerate(batch.keys):
        ref = compute_fbank(load_mono(good[key]["wav"], RATE), opts)
        n = int(batch.lengths[i])
        assert n == len(ref)
        np.testing.assert_array_equal(batch.feats[i, :n].numpy(), ref)
        assert torch.all(batch.feats[i, n:] == 0)
        assert int(batch.labels[i]) == good[key]["label"]


def test_relative_paths_resolve_against_the_list_not_the_cwd(wav_dir, tmp_path, monkeypatch):
    """A list names its audio, feature archives and noise relative to its own directory;
    read from another working directory, every reader (batches, features, noise, the
    data fingerprint's file list) finds them there. Absolute paths, URLs and pipes are
    kept as written."""
    import kaldiio
    import shutil
    lists = tmp_path / "lists"
    (lists / "audio").mkdir(parents=True)
    (lists / "feats").mkdir()
    entries = []
    for e in wav_dir["good"][:3]:
        name = os.path.basename(e["wav"])
        shutil.copy(e["wav"], lists / "audio" / name)
        entries.append(dict(e, wav=f"audio/{name}"))
    matrix = np.arange(24, dtype=np.float32).reshape(6, 4)
    ark, scp = lists / "feats" / "f.ark", lists / "feats" / "f.scp"
    with kaldiio.WriteHelper(f"ark,scp:{ark},{scp}") as w:
        w("f0", matrix)
    offset = open(scp).read().split(":")[-1].strip()
    kept = [{"key": "abs", "wav": wav_dir["good"][3]["wav"], "duration": 0.9, "label": 1},
            {"key": "url", "wav": "http://127.0.0.1:9/u.wav", "duration": 0.5, "label": 0},
            {"key": "pipe", "wav": "sox audio/x.wav -t wav - |", "duration": 0.5, "label": 0}]
    path = write_lines(lists / "data.list", [json.dumps(e) for e in entries + kept] + [
        json.dumps({"key": "f0", "feat": f"feats/f.ark:{offset}", "duration": 0.1, "label": 0})])
    noise = write_lines(lists / "noise.list", [json.dumps(
        {"key": "n0", "wav": "audio/" + os.path.basename(wav_dir["good"][0]["wav"]),
         "duration": 0.5})])
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    dl = DataList.load(os.path.relpath(path), num_classes=2)
    by_key = {dl.key(i): dl.entry(i) for i in range(len(dl))}
    for e in entries:
        assert by_key[e["key"]]["wav"] == str(lists / e["wav"])
    for e in kept:
        assert by_key[e["key"]]["wav"] == e["wav"]
    assert by_key["f0"]["feat"] == f"{ark}:{offset}"
    assert set(dl.referenced_files()) >= {str(lists / e["wav"]) for e in entries} | {
        str(ark)}
    cfg = DatasetConfig(batch_size=100)
    pipeline = FeaturePipeline(cfg, seed=0, train=False)
    rows = np.array([i for i in range(len(dl)) if dl.key(i).startswith("g")])
    batch = BatchDataset(dl, [rows], kws_builder(pipeline), epoch=0)[0]
    assert sorted(batch.keys) == sorted(e["key"] for e in entries) and not batch.bad.total()
    np.testing.assert_array_equal(pipeline.read_features(by_key["f0"]), matrix)
    noise_list = DataList.load(noise, require_label=False)
    assert os.path.isfile(noise_list.entry(0)["wav"])
    assert augment.pick_and_load(noise_list, np.random.default_rng(0), RATE) is not None


def test_kaldi_relative_paths_stay_right_in_a_list_written_elsewhere(wav_dir, tmp_path,
                                                                     monkeypatch):
    """wav.scp paths are Kaldi's, relative to the working directory; the data list made
    from it names them absolutely, so it reads the same files from anywhere."""
    import shutil
    from toolkit.data.datalist import write_datalist
    from toolkit.data.kaldi import load_data_dir, write_table
    recipe = tmp_path / "recipe"
    (recipe / "wavs").mkdir(parents=True)
    names = [os.path.basename(e["wav"]) for e in wav_dir["good"][:2]]
    for e, name in zip(wav_dir["good"], names):
        shutil.copy(e["wav"], recipe / "wavs" / name)
    (recipe / "data" / "train").mkdir(parents=True)
    write_table(str(recipe / "data" / "train" / "wav.scp"),
                {f"u{i}": f"wavs/{name}" for i, name in enumerate(names)})
    monkeypatch.chdir(recipe)
    write_datalist(str(recipe / "data" / "train" / "data.list"),
                   load_data_dir("data/train", nj=1))
    monkeypatch.chdir(tmp_path)
    dl = DataList.load(str(recipe / "data" / "train" / "data.list"), require_label=False)
    assert [dl.entry(i)["wav"] for i in range(len(dl))] == [
        str(recipe / "wavs" / name) for name in names]


def aug_cfg(**kw):
    cfg = DatasetConfig(speed_perturb=[0.9, 1.0, 1.1], volume_range=[0.5, 1.5],
                        vtlp_range=[0.9, 1.1], batch_size=2)
    cfg.spec_aug.enabled = True
    for k, v in kw.items():
        setattr(cfg, k, v)
    return cfg


def test_augmentation_deterministic_per_seed_epoch_key(wav_dir):
    cfg = aug_cfg()
    entries = wav_dir["good"]
    first = FeaturePipeline(cfg, seed=11, train=True)
    forward = {e["key"]: first(e, 2) for e in entries}
    second = FeaturePipeline(cfg, seed=11, train=True)
    backward = {e["key"]: second(e, 2) for e in reversed(entries)}
    for key in forward:
        np.testing.assert_array_equal(forward[key], backward[key])
    other_epoch = {e["key"]: first(e, 3) for e in entries}
    other_seed = FeaturePipeline(cfg, seed=12, train=True)
    for e in entries:
        assert not np.array_equal(other_epoch[e["key"]], forward[e["key"]])
        assert not np.array_equal(other_seed(e, 2), forward[e["key"]])
    # Augmentation really happened: not the clean features.
    clean = FeaturePipeline(cfg, seed=11, train=False)
    assert any(not np.array_equal(clean(e, 2), forward[e["key"]]) for e in entries)
    assert all(np.array_equal(clean(e, 2), clean(e, 3)) for e in entries)


def test_voice_perturb_off_draws_nothing_and_on_changes_the_spectrum(wav_dir):
    """prob 0 leaves the random stream (so every older config's features) untouched;
    prob 1 perturbs every training utterance, deterministically per seed, epoch and key,
    and never the evaluation features."""
    entries = wav_dir["good"]
    base = FeaturePipeline(aug_cfg(), seed=3, train=True)
    off_cfg = aug_cfg()
    off_cfg.voice_perturb.low_range = [0.7, 0.8]      # ranges set, but prob 0: off
    off = FeaturePipeline(off_cfg, seed=3, train=True)
    for e in entries:
        np.testing.assert_array_equal(off(e, 1), base(e, 1))
    on_cfg = DatasetConfig(batch_size=2)
    on_cfg.voice_perturb.prob = 1.0
    on_cfg.voice_perturb.low_range = [0.75, 0.8]
    on_cfg.voice_perturb.high_range = [0.85, 0.9]
    on_cfg.voice_perturb.tilt_db = [4.0, 6.0]
    on = FeaturePipeline(on_cfg, seed=3, train=True)
    clean = FeaturePipeline(on_cfg, seed=3, train=False)
    again = FeaturePipeline(on_cfg, seed=3, train=True)
    fixed_cfg = DatasetConfig(batch_size=2)            # one-point ranges: a known result
    fixed_cfg.voice_perturb.prob = 1.0
    fixed_cfg.voice_perturb.low_range = [0.8, 0.8]
    fixed_cfg.voice_perturb.high_range = [0.9, 0.9]
    fixed_cfg.voice_perturb.tilt_db = [6.0, 6.0]
    fixed = FeaturePipeline(fixed_cfg, seed=3, train=True)
    for e in entries:
        got, ref = on(e, 1), clean(e, 1)
        assert got.shape == ref.shape and not np.array_equal(got, ref)
        np.testing.assert_array_equal(got, again(e, 1))
        np.testing.assert_array_equal(clean(e, 1), clean(e, 2))
        want = tilt_spectrum(warp_frequency(ref, 0.8, fixed.mel_centers, 0.9, 1000.0), 6.0)
        np.testing.assert_array_equal(fixed(e, 1), want)


def test_whisper_off_draws_nothing_and_on_whispers_training_audio_only(wav_dir):
    """dataset.whisper: prob 0 leaves the random stream untouched; prob 1 whispers every
    training utterance (deterministic per seed, epoch and key), never an evaluation one."""
    entries = wav_dir["good"]
    base = FeaturePipeline(aug_cfg(), seed=3, train=True)
    off_cfg = aug_cfg()
    off_cfg.whisper.breath = [0.9, 1.0]                # a range set, but prob 0: off
    off = FeaturePipeline(off_cfg, seed=3, train=True)
    on_cfg = DatasetConfig(batch_size=2)
    on_cfg.whisper.prob = 1.0
    on, again = (FeaturePipeline(on_cfg, seed=3, train=True) for _ in range(2))
    clean = FeaturePipeline(on_cfg, seed=3, train=False)
    plain = FeaturePipeline(DatasetConfig(batch_size=2), seed=3, train=False)
    for e in entries:
        np.testing.assert_array_equal(off(e, 1), base(e, 1))
        got = on(e, 1)
        assert got.shape == clean(e, 1).shape and not np.array_equal(got, clean(e, 1))
        np.testing.assert_array_equal(got, again(e, 1))
        assert not np.array_equal(got, on(e, 2))
        np.testing.assert_array_equal(clean(e, 1), plain(e, 1))


def test_spec_augment_can_spare_keyword_utterances(wav_dir):
    """The kws task's spec_aug_positives=false: fillers (label -1) are masked, keyword
    utterances keep every frame and band (a mask could turn "hey snips" into "hey snip")."""
    entries = [dict(e, label=-1 if i % 2 else 0) for i, e in enumerate(wav_dir["good"])]
    cfg = DatasetConfig(batch_size=2)
    cfg.spec_aug = SpecAugConfig(enabled=True, num_time_masks=2, max_time_width=10,
                                 num_freq_masks=2, max_freq_width=6)
    clean = FeaturePipeline(cfg, seed=5, train=False)
    pipeline = FeaturePipeline(cfg, seed=5, train=True)
    everyone = kws_builder(FeaturePipeline(cfg, seed=5, train=True), spec_aug_positives=True)
    fillers_only = kws_builder(FeaturePipeline(cfg, seed=5, train=True),
                               spec_aug_positives=False)
    for e in entries:
        ref = clean(e, 1)
        masked = everyone(e, 1)[0]
        assert not np.array_equal(masked, ref), e["key"]
        # The pipeline alone knows no labels: it masks every training utterance.
        np.testing.assert_array_equal(pipeline(e, 1), masked)
        feats, label, _, tokens = fillers_only(e, 1)
        assert label == e["label"] and tokens is None
        if e["label"] >= 0:
            np.testing.assert_array_equal(feats, ref)
        else:
            np.testing.assert_array_equal(feats, masked)


def test_dither_comes_from_the_utterance_stream(wav_dir):
    """feature.dither is drawn by the pipeline from (seed, epoch, key), never by
    kaldi-native-fbank's process-global generator: the same features in any process
    and order, and the other augmentation draws (here the speed factor) stay put."""
    entries = wav_dir["good"]
    plain_cfg = aug_cfg(speed_perturb=[0.8, 1.0, 1.25])
    cfg = aug_cfg(speed_perturb=[0.8, 1.0, 1.25])
    cfg.feature.dither = 1.0
    first = FeaturePipeline(cfg, seed=4, train=True)
    assert first.opts.frame_opts.dither == 0.0
    forward = {e["key"]: first(e, 1) for e in entries}
    second = FeaturePipeline(cfg, seed=4, train=True)
    plain = FeaturePipeline(plain_cfg, seed=4, train=True)
    for e in reversed(entries):
        np.testing.assert_array_equal(second(e, 1), forward[e["key"]])
        undithered = plain(e, 1)
        assert undithered.shape == forward[e["key"]].shape        # same speed drawn
        assert not np.array_equal(undithered, forward[e["key"]])
        assert not np.array_equal(first(e, 2), forward[e["key"]])
    # Evaluation dithers too (as Kaldi does), reproducibly.
    dev_a = FeaturePipeline(cfg, seed=4, train=False)
    dev_b = FeaturePipeline(cfg, seed=4, train=False)
    for e in entries:
        np.testing.assert_array_equal(dev_a(e, 0), dev_b(e, 0))


def test_loader_workers_do_not_change_batches(wav_dir):
    dl = DataList.load(wav_dir["list"], num_classes=2)
    cfg = aug_cfg()
    batches = plan_batches(dl, cfg, seed=3, epoch=1, train=True)
    ds = BatchDataset(dl, batches, kws_builder(FeaturePipeline(cfg, seed=3, train=True)), epoch=1)
    serial = list(make_loader(ds, 0, num_workers=0, prefetch_factor=2, seed=3))
    parallel = list(make_loader(ds, 0, num_workers=2, prefetch_factor=2, seed=3))
    assert len(serial) == len(parallel) == len(batches)
    for a, b in zip(serial, parallel):
        assert a.keys == b.keys
        assert torch.equal(a.feats, b.feats) and torch.equal(a.lengths, b.lengths)
    resumed = list(make_loader(ds, 1, num_workers=0, prefetch_factor=2, seed=3))
    assert [b.keys for b in resumed] == [b.keys for b in serial[1:]]


@pytest.mark.parametrize("noise_len", [1000, 20000])
def test_add_noise_snr(noise_len):
    rng = np.random.default_rng(4)
    t = np.arange(8000) / RATE
    wave = (0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)
    noise = rng.standard_normal(noise_len).astype(np.float32) * 0.05
    for target in (0.0, 10.0, 20.0):
        mixed = augment.add_noise(wave, noise, target, np.random.default_rng(5))
        assert len(mixed) == len(wave) and mixed.dtype == np.float32
        assert abs(snr_db(wave, mixed) - target) < 0.5


def test_pipeline_noise_at_configured_snr(wav_dir):
    cfg = DatasetConfig()
    cfg.noise.noise_list = wav_dir["noise"]
    cfg.noise.prob = Ramp.constant(1.0)
    cfg.noise.snr_db = [10.0, 10.0]
    noise = DataList.load(wav_dir["noise"], require_label=False)
    proc = FeaturePipeline(cfg, seed=0, train=True, noise=noise)
    for e in wav_dir["good"]:
        clean = load_mono(e["wav"], RATE)
        mixed = proc.augment_waveform(proc.load(e), utterance_rng(0, 0, e["key"]))
        assert len(mixed) == len(clean)
        assert abs(snr_db(clean, mixed) - 10.0) < 0.5


def test_reverb_keeps_length_and_alignment(wav_dir):
    rng = np.random.default_rng(6)
    wave = rng.standard_normal(5000).astype(np.float32) * 0.1
    # A pure delayed impulse: aligned on its direct path, the output is the input.
    delta = np.zeros(300, dtype=np.float32)
    delta[123] = 0.7
    np.testing.assert_allclose(augment.add_reverb(wave, delta), wave, atol=1e-5)
    rir = load_mono(json.loads(open(wav_dir["rir"]).readline())["wav"], RATE)
    wet = augment.add_reverb(wave, rir)
    assert len(wet) == len(wave)
    assert np.mean(wet.astype(np.float64) ** 2) == pytest.approx(np.mean(wave.astype(np.float64) ** 2),
                                                                  rel=1e-3)
    # The direct path stays at lag 0: the cross-correlation peaks there, not at the
    # RIR's 40-sample delay.
    lags = range(-60, 61)
    xcorr = [float(np.dot(wet[max(0, l):len(wet) + min(0, l)],
                          wave[max(0, -l):len(wave) - max(0, l)])) for l in lags]
    assert list(lags)[int(np.argmax(xcorr))] == 0
    # Through the pipeline with reverb always on.
    cfg = DatasetConfig()
    cfg.reverb.rir_list = wav_dir["rir"]
    cfg.reverb.prob = Ramp.constant(1.0)
    proc = FeaturePipeline(cfg, seed=0, train=True,
                           rirs=DataList.load(wav_dir["rir"], require_label=False))
    e = wav_dir["good"][0]
    clean = load_mono(e["wav"], RATE)
    out = proc.augment_waveform(proc.load(e), utterance_rng(0, 0, e["key"]))
    assert len(out) == len(clean) and not np.allclose(out, clean)


def test_processor_raises_bad_entry_for_broken_audio(wav_dir):
    dl = DataList.load(wav_dir["list"], num_classes=2)
    proc = FeaturePipeline(DatasetConfig(), seed=0, train=False)
    reasons = {}
    for i in range(len(dl)):
        try:
            proc(dl.entry(i), 0)
        except BadEntry as err:
            reasons[dl.key(i)] = err.reason
    assert reasons == {"missing": "missing_file", "trunc": "truncated_audio"}


class _Numbers(torch.utils.data.Dataset):
    def __len__(self):
        return 6

    def __getitem__(self, i):
        return torch.full((3,), i)


def _os_threads():
    return set(os.listdir("/proc/self/task"))


@pytest.mark.parametrize("batches,stop_after", [(6, None), (6, 2), (1, 1)],
                         ids=["exhausted", "abandoned", "abandoned-before-every-worker-had-work"])
def test_loader_threads_are_gone_before_the_next_fork(batches, stop_after):
    # A plain DataLoader returns while its queue-feeder threads are still exiting (about
    # half the time here); forking the next loader then can deadlock the child on
    # CPython 3.11. The pipeline's loader returns only once they are gone, including the
    # feeder that shutdown itself starts for a worker that never got an index (1 batch,
    # 2 workers).
    import gc
    import threading
    import time
    from toolkit.data.loader import build_loader
    # One pass first: threads a library starts lazily on its first use in this process and
    # keeps (it ran other tests' files before) are not the loader's. A loader that left its
    # own behind would still show new ones in every pass below. Garbage of earlier tests
    # goes now: an abandoned loader collected mid-pass would shut down its own workers.
    list(build_loader(_Numbers(), 2, 2, 0, sampler=range(6)))
    gc.collect()
    for _ in range(10):
        before = _os_threads()
        seen = []
        for i, batch in enumerate(build_loader(_Numbers(), 2, 2, 0, sampler=range(batches))):
            seen.append(int(batch[0]))
            if stop_after is not None and i + 1 == stop_after:
                break
        assert seen == list(range(batches))[:stop_after]
        assert _os_threads() <= before
    # A thread that starts mid-epoch and lives on (TensorBoard's writer does) is not
    # waited for: the loop ends well inside the 30 s thread-exit timeout.
    stop = threading.Event()
    started = time.monotonic()
    for i, batch in enumerate(build_loader(_Numbers(), 2, 2, 0, sampler=range(6))):
        if i == 0:
            threading.Thread(target=stop.wait, daemon=True).start()
    stop.set()
    assert time.monotonic() - started < 20


def test_worker_stuck_in_fork_is_replaced(caplog):
    # Simulates CPython 3.11's fork deadlock: the next forked child blocks inside fork's
    # after-fork hooks and never runs the worker loop.
    import multiprocessing
    import time
    from toolkit.data.loader import build_loader
    hang_next = multiprocessing.get_context("fork").Value("i", 0)

    def block_in_child():
        if hang_next.value > 0:
            hang_next.value -= 1
            time.sleep(3600)

    # Processes this test process had already (a pre-imported training interpreter that
    # an earlier test of this pytest worker started) are not the loader's.
    before = set(descendants(os.getpid()))
    os.register_at_fork(after_in_child=block_in_child)
    try:
        loader = build_loader(_Numbers(), 2, 2, 0, sampler=range(6))
        loader.startup_timeout = 1.0
        hang_next.value = 1
        with caplog.at_level("WARNING"):
            seen = [int(batch[0]) for batch in loader]
    finally:
        hang_next.value = 0
    assert seen == list(range(6))      # nothing skipped or repeated
    assert "1 of 2 data-loader workers did not start" in caplog.text
    left = set(descendants(os.getpid())) - before
    assert not left, f"the stuck worker was left behind: {sorted(left)}"



def test_a_worker_whose_trainer_died_before_it_started_ends():
    """A trainer SIGKILLed between forking a loader worker and the worker's start: the
    worker sees init as its parent (torch's watchdog would take that for the trainer) and
    must end instead of waiting forever."""
    import multiprocessing
    import signal
    import time
    from toolkit.data.loader import _ReportStarted
    read, write = os.pipe()
    trainer = os.fork()
    if trainer == 0:                               # the "trainer"
        report = _ReportStarted(multiprocessing.get_context("fork").Value("i", 0))
        worker = os.fork()
        if worker == 0:                            # its worker, slow to start
            time.sleep(0.5)
            report(0)
            time.sleep(60)                         # a worker waiting for indices
            os._exit(0)
        os.write(write, f"{worker}\n".encode())
        time.sleep(60)
        os._exit(0)
    worker = int(os.read(read, 64).decode())
    os.kill(trainer, signal.SIGKILL)
    os.waitpid(trainer, 0)
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline and os.path.exists(f"/proc/{worker}"):
        with open(f"/proc/{worker}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                break                              # a zombie has ended
        time.sleep(0.05)
    alive = os.path.exists(f"/proc/{worker}") and open(f"/proc/{worker}/stat").read().rsplit(
        ")", 1)[1].split()[0] != "Z"
    if alive:
        os.kill(worker, signal.SIGKILL)
    assert not alive, "the orphaned loader worker outlived its trainer by 5 s"


def test_posterior_temperature_flattens_training_posteriors_only():
    """Log phone posteriors at temperature T > 1 stay log posteriors (each frame sums to
    1), keep each frame's ranking and grow flatter; the pipeline draws T per utterance
    for training only, and draws nothing when the option is off."""
    rng = np.random.default_rng(0)
    logits = rng.normal(0, 3, (50, 53))
    log_post = (logits - np.log(np.exp(logits).sum(1, keepdims=True))).astype(np.float32)

    def entropy(lp):
        return float(-(np.exp(lp) * lp).sum(1).mean())

    flat = augment.flatten_log_posteriors(log_post, 1.5)
    np.testing.assert_allclose(np.exp(flat).sum(1), 1.0, atol=1e-5)
    np.testing.assert_array_equal(flat.argmax(1), log_post.argmax(1))
    assert entropy(flat) > entropy(log_post) + 0.2
    assert augment.flatten_log_posteriors(log_post, 1.0) is log_post

    on = DatasetConfig(posterior_temperature=[1.2, 2.0])
    train = FeaturePipeline(on, seed=5, train=True)
    out = train.augment_features(log_post, np.random.default_rng(1))
    np.testing.assert_allclose(np.exp(out).sum(1), 1.0, atol=1e-5)
    assert entropy(out) > entropy(augment.flatten_log_posteriors(log_post, 1.2)) - 1e-6
    dev = FeaturePipeline(on, seed=5, train=False)
    np.testing.assert_array_equal(dev.augment_features(log_post, np.random.default_rng(1)),
                                  log_post)
    # Off: the generator is left where it was (older configs' random streams unchanged).
    gen = np.random.default_rng(2)
    FeaturePipeline(DatasetConfig(), seed=5, train=True).augment_features(log_post, gen)
    assert gen.random() == np.random.default_rng(2).random()


def test_a_temp_dir_too_long_for_worker_sockets_is_named_not_a_hang(tmp_path):
    """Workers pass tensors back through a Unix socket under TMPDIR; a path longer than a
    socket address takes made torch's workers wait forever. The loader names TMPDIR in
    one line instead, and works under the same depth with a shorter name."""
    import subprocess
    import sys
    script = ("import torch\nfrom toolkit.data.loader import ForkSafeLoader\n"
              "from torch.utils.data import DataLoader\n"
              "data = [torch.zeros(1000)] * 4\n"
              "for _ in ForkSafeLoader(DataLoader(data, batch_size=2, num_workers=1)): pass\n"
              "print('ok')\n")
    import shutil
    import tempfile
    short = tempfile.mkdtemp(prefix="sock", dir="/tmp")
    long = tmp_path / ("d" * max(1, 90 - len(str(tmp_path)) - 1))
    long.mkdir()
    try:
        for tmp, works in ((short, True), (str(long), False)):
            env = dict(os.environ, TMPDIR=tmp)
            out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                                 text=True, timeout=60)
            if works:
                assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]
            else:
                assert out.returncode != 0
                assert "set TMPDIR to a shorter directory" in out.stderr and tmp in out.stderr
    finally:
        shutil.rmtree(short, ignore_errors=True)
