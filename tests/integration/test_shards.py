"""Sharded data: make_shards output (tars, index, determinism, bad entries), the shard batch
plan, reading back through DataLoader workers and ranks, exact resume, http and fsspec
sources, and corrupt / truncated tars. All on real files."""
import contextlib
import functools
import http.server
import json
import logging
import os
import shutil
import subprocess
import sys
import tarfile
import threading
from collections import Counter

import numpy as np
import pytest
import soundfile as sf

from toolkit.config import (DatasetConfig, FeatureConfig, NoiseConfig, Ramp, ReverbConfig,
                            SpecAugConfig)
from toolkit.data.datalist import BAD_REASONS, BadCounter, DataList
from toolkit.data.pipeline import FeaturePipeline
from toolkit.data.plan import rank_batches
from toolkit.data.shard_tar import decode_wav, iterate_shard, make_shards
from toolkit.data.shards import (ShardBatchDataset, ShardIndex, make_shard_loader,
                                 plan_shard_batches)
from toolkit.data.transport import open_shard
from pipeline_utils import kws_builder

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RATE = 16000
PER_SHARD = 4
SEED = 7


def counted(bad: BadCounter, reason: str) -> int:
    # Shard reasons file under "other" until datalist.BAD_REASONS lists them.
    return bad.counts.get(reason if reason in BAD_REASONS else "other", 0)


def write_wav(path, seconds, rng, rate=RATE, channels=1):
    n = int(seconds * rate)
    t = np.arange(n) / rate
    tone = 0.3 * np.sin(2 * np.pi * rng.uniform(200, 1500) * t)
    wave = (tone[:, None] + 0.05 * rng.standard_normal((n, channels))).astype(np.float32)
    sf.write(path, wave if channels > 1 else wave[:, 0], rate, subtype="PCM_16")
    return path


class Corpus:
    def __init__(self, root):
        rng = np.random.default_rng(3)
        wavs = os.path.join(root, "wavs")
        os.makedirs(wavs)
        self.entries = []
        for i in range(26):
            key = f"utt{i:03d}"
            entry = {"key": key, "duration": 0.0, "label": i % 3 - 1, "txt": f"text {i}"}
            if i == 5:                                  # 8 kHz: kept in the tar, resampled on read
                seconds = 0.6
                entry["wav"] = write_wav(os.path.join(wavs, key + ".wav"), seconds, rng, rate=8000)
            elif i == 9:                                # stereo
                seconds = 0.5
                entry["wav"] = write_wav(os.path.join(wavs, key + ".wav"), seconds, rng, channels=2)
            elif i == 13:                               # a segment of a longer recording
                write_wav(os.path.join(wavs, "rec.wav"), 2.0, rng)
                entry.update(wav=os.path.join(wavs, "rec.wav"), start=0.5, end=1.3)
                seconds = 0.8
            elif i == 17:                               # missing file: skipped and reported
                seconds = 0.4
                entry["wav"] = os.path.join(wavs, "missing.wav")
            else:
                seconds = float(np.round(rng.uniform(0.25, 1.0), 3))
                entry["wav"] = write_wav(os.path.join(wavs, key + ".wav"), seconds, rng)
            entry["duration"] = seconds
            self.entries.append(entry)
        self.list = os.path.join(root, "data.list")
        with open(self.list, "w") as f:
            f.writelines(json.dumps(e) + "\n" for e in self.entries)
        self.noise = self._aux_list(root, "noise", [write_wav(os.path.join(wavs, f"n{i}.wav"), 1.5, rng)
                                                     for i in range(2)])
        rir = np.zeros(800, dtype=np.float32)
        rir[40], rir[200], rir[500] = 0.9, 0.3, -0.1
        sf.write(os.path.join(wavs, "rir.wav"), rir, RATE, subtype="FLOAT")
        self.rirs = self._aux_list(root, "rir", [os.path.join(wavs, "rir.wav")])
        self.out = os.path.join(root, "shards")
        self.paths, self.bad = make_shards(self.list, self.out, PER_SHARD, nj=2, prefix="train")
        self.index = ShardIndex.load(os.path.join(self.out, "shards.list"))
        self.good = [e for e in self.entries if e["key"] != "utt017"]
        self.cfg = DatasetConfig(
            feature=FeatureConfig(num_mel_bins=20), batch_size=3, sort_window=8,
            speed_perturb=[0.9, 1.0, 1.1], volume_range=[0.7, 1.3],
            noise=NoiseConfig(prob=Ramp.constant(0.5)),
            reverb=ReverbConfig(prob=Ramp.constant(0.5)),
            spec_aug=SpecAugConfig(enabled=True, max_time_width=5, max_freq_width=3))

    @staticmethod
    def _aux_list(root, name, paths):
        path = os.path.join(root, name + ".list")
        with open(path, "w") as f:
            f.writelines(json.dumps({"key": os.path.basename(p), "wav": p, "duration": 1.0}) + "\n"
                         for p in paths)
        return path

    def pipeline(self, cls=FeaturePipeline, train=True):
        return cls(self.cfg, seed=SEED, train=train,
                   noise=DataList.load(self.noise, require_label=False),
                   rirs=DataList.load(self.rirs, require_label=False))

    def builder(self, cls=FeaturePipeline, train=True, spec_aug_positives=True, num_units=None):
        """The keyword-spotting example builder over this corpus's pipeline."""
        return kws_builder(self.pipeline(cls, train), spec_aug_positives, num_units)

    def copy_shards(self, dest):
        """The shard dir copied to `dest`, with a list naming the copies."""
        os.makedirs(dest)
        for name in os.listdir(self.out):
            if name.endswith(".tar") or name == "shards.index.json":
                shutil.copy(os.path.join(self.out, name), dest)
        paths = [os.path.join(dest, os.path.basename(p)) for p in self.paths]
        with open(os.path.join(dest, "shards.list"), "w") as f:
            f.writelines(p + "\n" for p in paths)
        return paths


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return Corpus(str(tmp_path_factory.mktemp("shards")))


class CountingPipeline(FeaturePipeline):
    """Spy: records every utterance that reaches the featurizing step."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.calls = []

    def features(self, entry, epoch, audio=None, spec_aug=True, rng=None):
        assert audio is not None, "shard utterances arrive decoded"
        self.calls.append(entry["key"])
        return super().features(entry, epoch, audio, spec_aug, rng)


def run(index, batches, builder, epoch, start=0, workers=0):
    dataset = ShardBatchDataset(index, batches, builder, epoch, start=start,
                                channel=builder.pipeline.cfg.channel)
    return list(make_shard_loader(dataset, workers, 2, seed=1))


def plan_keys(index, batch):
    return [index.key(index.flat(s, m)) for s, m in np.asarray(batch).reshape(-1, 2)]


def assert_same_batches(got, want):
    assert len(got) == len(want)
    for a, b in zip(got, want):
        assert a.keys == b.keys
        assert a.feats.dtype == b.feats.dtype and np.array_equal(a.feats.numpy(), b.feats.numpy())
        assert a.lengths.tolist() == b.lengths.tolist() and a.labels.tolist() == b.labels.tolist()


# ------------------------------------------------------------------------------ writing

def test_make_shards_writes_wav_json_pairs_and_matching_index(corpus):
    assert dict(corpus.bad.counts) == {"missing_file": 1}
    assert corpus.bad.examples["missing_file"] == ["utt017"]
    listed = open(os.path.join(corpus.out, "shards.list")).read().split()
    assert listed == corpus.paths and all(os.path.isabs(p) and os.path.exists(p) for p in listed)
    assert [os.path.basename(p) for p in listed] == [f"train-{i:06d}.tar" for i in range(7)]
    by_key = {e["key"]: e for e in corpus.good}
    index = corpus.index
    assert index.num_shards == 7 and len(index) == len(corpus.good)
    seen = []
    for shard, path in enumerate(listed):
        keys = index.shard_keys(shard)
        with tarfile.open(path) as tar:
            members = tar.getmembers()
            assert [m.name for m in members] == [k + ext for k in keys for ext in (".wav", ".json")]
            assert all(m.mtime == 0 and m.uid == 0 and m.gid == 0 and m.uname == "" for m in members)
            for key in keys:
                entry = by_key[key]
                meta = json.loads(tar.extractfile(key + ".json").read())
                assert meta == {k: v for k, v in entry.items() if k != "wav"}
                got, rate = sf.read(tar.extractfile(key + ".wav"), dtype="int16", always_2d=True)
                info = sf.info(entry["wav"])
                want, _ = sf.read(entry["wav"], dtype="int16", always_2d=True)
                if "start" in entry:
                    want = want[int(entry["start"] * rate):int(entry["end"] * rate)]
                assert rate == info.samplerate and np.array_equal(got, want)
        lo, hi = index.shard_range(shard)
        assert index.durations[lo:hi].tolist() == pytest.approx([by_key[k]["duration"] for k in keys])
        assert index.labels[lo:hi].tolist() == [by_key[k]["label"] for k in keys]
        seen.extend(keys)
    assert seen == [e["key"] for e in corpus.good]          # list order kept
    assert index.shard_keys(4) == ["utt016", "utt018", "utt019"]   # the bad one left out


def test_make_shards_cli_is_deterministic(corpus, tmp_path):
    out = str(tmp_path / "again")
    proc = subprocess.run([sys.executable, "-m", "toolkit.bin.make_shards", corpus.list, out,
                           "--utts-per-shard", str(PER_SHARD), "--nj", "1", "--prefix", "train"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "missing_file" in proc.stderr and "utt017" in proc.stderr
    for path in corpus.paths + [os.path.join(corpus.out, "shards.index.json")]:
        with open(path, "rb") as a, open(os.path.join(out, os.path.basename(path)), "rb") as b:
            assert a.read() == b.read(), path
    again = open(os.path.join(out, "shards.list")).read().split()
    assert [os.path.basename(p) for p in again] == [os.path.basename(p) for p in corpus.paths]


# ------------------------------------------------------------------------------ plan

def test_plan_depends_only_on_seed_and_epoch_and_stays_in_shard_windows(corpus):
    index, cfg = corpus.index, corpus.cfg
    plan = plan_shard_batches(index, cfg, SEED, 0, True)
    again = plan_shard_batches(ShardIndex.load(os.path.join(corpus.out, "shards.list")),
                               cfg, SEED, 0, True)
    assert [b.tolist() for b in plan] == [b.tolist() for b in again]
    other = plan_shard_batches(index, cfg, SEED, 1, True)
    assert [b.tolist() for b in plan] != [b.tolist() for b in other]
    for p in (plan, other):
        rows = [tuple(r) for b in p for r in b.tolist()]
        assert sorted(rows) == [(s, m) for s in range(index.num_shards)
                                for m in range(int(np.diff(index.shard_range(s))[0]))]
        assert all(1 <= len(b) <= cfg.batch_size and b.shape[1] == 2 for b in p)
        # Windows of 2 shards: pair shards by first appearance; every batch stays in one
        # pair and the pairs come one after another.
        first = list(dict.fromkeys(r[0] for r in rows))
        window = {s: i // 2 for i, s in enumerate(first)}
        per_batch = [{window[s] for s in b[:, 0].tolist()} for b in p]
        assert all(len(w) == 1 for w in per_batch)
        sequence = [w.pop() for w in per_batch]
        assert sequence == sorted(sequence)
    assert first != sorted(first)                           # shard order is shuffled
    dev = plan_shard_batches(index, cfg, SEED, 0, False)
    assert [b.tolist() for b in dev] == [b.tolist() for b in plan_shard_batches(index, cfg, 99, 5, False)]
    assert set(dev[0][:, 0].tolist()) <= {0, 1}


# ------------------------------------------------------------------------------ reading

def test_two_ranks_two_workers_each_utterance_once_in_plan_order(corpus):
    index, proc = corpus.index, corpus.builder()
    plan = plan_shard_batches(index, corpus.cfg, SEED, 1, True)
    seen = Counter()
    steps = set()
    for rank in range(2):
        mine = rank_batches(plan, rank, 2)
        steps.add(len(mine))
        parallel = run(index, mine, proc, epoch=1, workers=2)
        assert [b.keys for b in parallel] == [plan_keys(index, b) for b in mine]
        assert_same_batches(parallel, run(index, mine, proc, epoch=1, workers=0))
        for batch in parallel:
            assert batch.bad.total() == 0
            seen.update(batch.keys)
    assert len(steps) == 1
    assert seen == Counter(e["key"] for e in corpus.good)


def test_shard_features_equal_datalist_pipeline(corpus):
    """Same audio, same (seed, epoch, key) -> bitwise the same features as the
    FeaturePipeline on the data list, with every augmentation on; the kws builder too
    (spec_aug_positives=false, so the label decides about masking)."""
    by_key = {e["key"]: e for e in corpus.good}
    for train in (True, False):
        proc = corpus.pipeline(train=train)
        builder = kws_builder(proc, spec_aug_positives=False)
        n = 0
        for path in corpus.paths:
            with open_shard(path) as f:
                for key, data, meta in iterate_shard(f, path):
                    wave, rate = decode_wav(data, key, corpus.cfg.channel)
                    # What ShardBatchDataset hands the builder: the JSON entry + audio.
                    entry = dict(meta, key=key, label=by_key[key]["label"])
                    got = proc.features(entry, 4, audio=(wave, rate))
                    want = proc(by_key[key], 4)
                    assert got.dtype == want.dtype and np.array_equal(got, want), key
                    got_feats, got_label, got_end, _ = builder(entry, 4, (wave, rate))
                    want_feats, want_label, want_end, _ = builder(by_key[key], 4)
                    assert np.array_equal(got_feats, want_feats), key
                    assert (got_label, got_end) == (want_label, want_end), key
                    n += 1
        assert n == len(corpus.good)


def test_shards_carry_ctc_tokens_and_keyword_end(corpus, tmp_path):
    """`tokens` and `kw_end` travel in each utterance's JSON: batches built from shards
    carry them as the data-list pipeline does, and an utterance whose tokens a CTC loss
    cannot use is skipped and counted under the data list's reasons."""
    from toolkit.tasks.kws.data import keyword_end_frame
    entries = []
    for i, e in enumerate(corpus.good):
        e = dict(e, tokens=[1 + i % 4, 1 + (i + 1) % 4])
        if e["label"] >= 0:
            e["kw_end"] = round(0.6 * e["duration"], 3)
        entries.append(e)
    entries[2]["tokens"] = [1, 9]                      # outside 5 units
    del entries[3]["tokens"]
    listed = tmp_path / "tokens.list"
    listed.write_text("".join(json.dumps(e) + "\n" for e in entries))
    make_shards(str(listed), str(tmp_path / "sh"), PER_SHARD)
    index = ShardIndex.load(str(tmp_path / "sh" / "shards.list"))
    by_key = {e["key"]: e for e in entries}
    batches = plan_shard_batches(index, corpus.cfg, SEED, 0, train=False)
    ctc = corpus.builder(train=False, num_units=5)
    got = list(make_shard_loader(ShardBatchDataset(index, batches, ctc, 0), 0, 2, 1))
    seen, bad = [], Counter()
    for batch in got:
        bad.update(batch.bad.counts)
        for i, key in enumerate(batch.keys):
            entry, frames = by_key[key], int(batch.lengths[i])
            assert batch.tokens[i, :batch.token_lengths[i]].tolist() == entry["tokens"]
            want = keyword_end_frame(entry, frames) if entry["label"] >= 0 else -1
            assert int(batch.keyword_end[i]) == want
            seen.append(key)
    assert dict(bad) == {"token_not_in_units": 1, "missing_tokens": 1}
    assert sorted(seen) == sorted(e["key"] for e in entries[:2] + entries[4:])
    assert sum(1 for e in entries if "kw_end" in e and e["key"] in seen) > 3
    # Without a CTC loss tokens are not needed: every utterance is used, none counted.
    plain = list(make_shard_loader(ShardBatchDataset(index, batches, corpus.builder(train=False),
                                                     0), 0, 2, 1))
    assert sum(len(b.keys) for b in plain) == len(entries)
    assert all(b.get("tokens") is None and b.get("token_lengths") is None
               and not b.bad.total() for b in plain)


def test_resume_matches_full_pass_without_processing_skipped_batches(corpus, tmp_path, caplog):
    index = corpus.index
    plan = rank_batches(plan_shard_batches(index, corpus.cfg, SEED, 2, True), 0, 1)
    spy = corpus.pipeline(CountingPipeline)
    full = run(index, plan, kws_builder(spy), epoch=2)
    assert len(spy.calls) == len(index)
    # k = end of the first shard window: its shards hold only already-trained utterances.
    shards_of = [set(b[:, 0].tolist()) for b in plan]
    k = next(k for k in range(1, len(plan))
             if not set().union(*shards_of[:k]) & set().union(*shards_of[k:]))
    done = set().union(*shards_of[:k])
    # Garbage in place of the finished shards: a resumed reader must never open them.
    copies = corpus.copy_shards(str(tmp_path / "copy"))
    for s in done:
        with open(copies[s], "wb") as f:
            f.write(os.urandom(2000))
    resumed_index = ShardIndex.load(os.path.join(str(tmp_path / "copy"), "shards.list"))
    resumed_plan = rank_batches(plan_shard_batches(resumed_index, corpus.cfg, SEED, 2, True), 0, 1)
    assert [b.tolist() for b in resumed_plan] == [b.tolist() for b in plan]
    spy = corpus.pipeline(CountingPipeline)
    with caplog.at_level(logging.WARNING, logger="toolkit.data"):
        resumed = run(resumed_index, resumed_plan, kws_builder(spy), epoch=2, start=k)
    assert not caplog.records
    assert_same_batches(resumed, full[k:])
    assert sorted(spy.calls) == sorted(key for b in plan[k:] for key in plan_keys(index, b))
    # Mid-window resume, two workers.
    assert_same_batches(run(index, plan, corpus.builder(), epoch=2, start=k + 1, workers=2),
                        full[k + 1:])


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


def test_http_shards_same_batches_as_local(corpus):
    handler = functools.partial(_QuietHandler, directory=corpus.out)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}"
        with open(os.path.join(corpus.out, "http.list"), "w") as f:
            f.writelines(f"{base}/{os.path.basename(p)}\n" for p in corpus.paths)
        remote = ShardIndex.load(f"{base}/http.list")           # index fetched beside the list
        assert remote.sources[0].startswith(base) and len(remote) == len(corpus.index)
        plan = plan_shard_batches(remote, corpus.cfg, SEED, 0, True)
        proc = corpus.builder()
        assert_same_batches(run(remote, plan, proc, 0, workers=2), run(corpus.index, plan, proc, 0))
        with pytest.raises(OSError, match=f"{base}/nope.tar.*404"):
            open_shard(f"{base}/nope.tar")
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
    with pytest.raises(OSError, match="cannot open shard http://127.0.0.1:"):
        open_shard(f"{base}/train-000000.tar", timeout=5)       # server gone


def test_fsspec_urls_same_batches_as_local_and_unknown_scheme_error(corpus, tmp_path):
    listing = tmp_path / "fs.list"
    listing.write_text("".join(f"file://{p}\n" for p in corpus.paths))
    index = ShardIndex.load(str(listing), os.path.join(corpus.out, "shards.index.json"))
    assert index.sources[0].startswith("file://")
    plan = plan_shard_batches(index, corpus.cfg, SEED, 3, True)
    proc = corpus.builder()
    assert_same_batches(run(index, plan, proc, 3), run(corpus.index, plan, proc, 3))
    with pytest.raises(ValueError, match="nosuchscheme://.*fsspec"):
        open_shard("nosuchscheme://bucket/train-000000.tar")


# ------------------------------------------------------------------------------ damage

def test_corrupt_shard_skipped_logged_once_and_counted(corpus, tmp_path, caplog):
    copies = corpus.copy_shards(str(tmp_path / "copy"))
    with open(copies[2], "wb") as f:
        f.write(np.random.default_rng(0).bytes(3000))
    bad = BadCounter()
    with caplog.at_level(logging.WARNING, logger="toolkit.data"):
        with open_shard(copies[2]) as f:
            assert list(iterate_shard(f, copies[2], bad)) == []
    assert [r for r in caplog.records if copies[2] in r.getMessage()] and len(caplog.records) == 1
    assert "corrupt_shard" in caplog.records[0].getMessage()
    assert counted(bad, "corrupt_shard") == 1
    caplog.clear()
    index = ShardIndex.load(os.path.join(str(tmp_path / "copy"), "shards.list"))
    plan = plan_shard_batches(index, corpus.cfg, SEED, 0, True)
    with caplog.at_level(logging.WARNING, logger="toolkit.data"):
        batches = run(index, plan, corpus.builder(), 0)
    assert len(caplog.records) == 1 and copies[2] in caplog.records[0].getMessage()
    lost = set(index.shard_keys(2))
    assert sorted(k for b in batches for k in b.keys) == \
        sorted(e["key"] for e in corpus.good if e["key"] not in lost)
    total = BadCounter()
    for b in batches:
        total.merge(b.bad)
    assert total.total() == len(lost) == counted(total, "corrupt_shard")


def _members(path):
    with tarfile.open(path) as tar:
        return tar.getmembers()


@pytest.mark.parametrize("where,complete", [
    ("wav_data", 2),      # cut inside the 3rd utterance's audio
    ("header", 2),        # cut exactly on the 3rd utterance's header: tarfile alone misses it
    ("json_data", 1),     # cut inside the 2nd utterance's json
])
def test_truncated_shard_yields_complete_entries_before_damage(corpus, tmp_path, caplog,
                                                               where, complete):
    copies = corpus.copy_shards(str(tmp_path / "copy"))
    members = _members(copies[0])
    cut = {"wav_data": members[4].offset_data + 100, "header": members[4].offset,
           "json_data": members[3].offset_data + 10}[where]
    with open(copies[0], "rb") as f:
        data = f.read(cut)
    with open(copies[0], "wb") as f:
        f.write(data)
    keys = corpus.index.shard_keys(0)
    bad = BadCounter()
    with caplog.at_level(logging.WARNING, logger="toolkit.data"):
        with open_shard(copies[0]) as f:
            got = [(k, meta["key"]) for k, _, meta in iterate_shard(f, copies[0], bad)]
    assert got == [(k, k) for k in keys[:complete]]
    assert len(caplog.records) == 1 and copies[0] in caplog.records[0].getMessage()
    assert "truncated_shard" in caplog.records[0].getMessage()
    assert counted(bad, "truncated_shard") == 1
    # Through the dataset: the utterances after the damage are counted, the rest served.
    index = ShardIndex.load(os.path.join(str(tmp_path / "copy"), "shards.list"))
    batches = run(index, plan_shard_batches(index, corpus.cfg, SEED, 0, True), corpus.builder(), 0)
    served = {k for b in batches for k in b.keys}
    assert served == {e["key"] for e in corpus.good} - set(keys[complete:])
    total = BadCounter()
    for b in batches:
        total.merge(b.bad)
    assert total.total() == len(keys) - complete == counted(total, "truncated_shard")


def test_intact_shard_reports_nothing(corpus, caplog):
    bad = BadCounter()
    with caplog.at_level(logging.WARNING, logger="toolkit.data"):
        with open_shard(corpus.paths[-1]) as f:
            assert [k for k, _, _ in iterate_shard(f, corpus.paths[-1], bad)] == \
                corpus.index.shard_keys(corpus.index.num_shards - 1)
    assert bad.total() == 0 and not caplog.records


def test_index_rejects_a_shard_it_does_not_know(corpus, tmp_path):
    listing = tmp_path / "bad.list"
    listing.write_text(corpus.paths[0] + "\n" + str(tmp_path / "other.tar") + "\n")
    with pytest.raises(ValueError, match="other.tar is not in"):
        ShardIndex.load(str(listing), os.path.join(corpus.out, "shards.index.json"))


@pytest.fixture(scope="module")
def shard_corpus(tmp_path_factory):
    """The training tests' data, written once: a KWS corpus (train_utils.Corpus, 24 train
    utterances) whose train list is made into shards of 6 (the library call the make_shards
    binary makes; the binary itself is tested above)."""
    from train_utils import Corpus
    root = tmp_path_factory.mktemp("train_shards")
    corpus = Corpus(str(root / "corpus"), num_train=24, num_dev=6)
    make_shards(corpus.train, str(root / "shards"), 6)
    return corpus, root / "shards"


def test_training_from_shards_end_to_end(shard_corpus, tmp_path):
    """The trainer reads a shard list and resumes from it."""
    from train_utils import latest_payload, run_train
    corpus, out = shard_corpus
    exp = str(tmp_path / "exp")
    # dataset.data_type defaults to auto: shard list for train, JSON data list for dev.
    args = corpus.train_args(exp, "training.max_epoch=1", train=str(out / "shards.list"))
    first = run_train(args)
    assert first.returncode == 0, first.stderr[-3000:]
    assert "24 utterances used" in first.stderr
    again = run_train(corpus.train_args(exp, "training.max_epoch=2",
                                         train=str(out / "shards.list")))
    assert again.returncode == 0, again.stderr[-3000:]
    assert latest_payload(exp)["epoch"] == 2 and "resumed from" in again.stderr


# ------------------------------------------------------------------------------ tokens

@contextlib.contextmanager
def _server(handler_class, directory):
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(handler_class, directory=directory))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def _recording_handler(token=None, redirect_to=None):
    """A handler class that records (path, Authorization) of every GET, refuses requests
    without `token` (401) when given one, and answers /moved/... with a 302 to
    `redirect_to()` + the rest of the path."""
    class Handler(_QuietHandler):
        seen = []

        def do_GET(self):
            auth = self.headers.get("Authorization")
            Handler.seen.append((self.path, auth))
            if self.path.startswith("/moved/") and redirect_to is not None:
                self.send_response(302)
                self.send_header("Location", redirect_to() + self.path[len("/moved"):])
                self.end_headers()
                return
            if token is not None and auth != f"Bearer {token}":
                self.send_error(401, "token required")
                return
            super().do_GET()
    return Handler


def test_bearer_token_is_not_sent_to_another_host_on_redirect(corpus):
    """A shard server that redirects to another host (a CDN; here another port) must not
    hand it the token; a redirect on the same host keeps it."""
    token = "shard-T0KEN-123"
    name = os.path.basename(corpus.paths[0])
    other = _recording_handler()
    with _server(other, corpus.out) as cdn:
        first = _recording_handler(redirect_to=lambda: cdn)
        with _server(first, corpus.out) as origin:
            with open_shard(f"{origin}/moved/{name}", token=token) as f:
                data = f.read()
            assert data == open(corpus.paths[0], "rb").read()
            assert first.seen == [(f"/moved/{name}", f"Bearer {token}")]
            assert other.seen == [(f"/{name}", None)]
    loop = {}
    handler = _recording_handler(redirect_to=lambda: loop["base"])
    with _server(handler, corpus.out) as base:
        loop["base"] = base
        with open_shard(f"{base}/moved/{name}", token=token) as f:
            f.read()
    assert handler.seen == [(f"/moved/{name}", f"Bearer {token}"), (f"/{name}", f"Bearer {token}")]


def test_keeps_credentials_like_requests():
    from toolkit.data.transport import keeps_credentials
    assert keeps_credentials("https://a.org/x", "https://a.org/y")
    assert keeps_credentials("http://a.org/x", "https://a.org/y")        # upgrade, default ports
    assert keeps_credentials("http://a.org:8080/x", "http://A.org:8080/y")
    assert not keeps_credentials("https://a.org/x", "https://cdn.a.org/x")
    assert not keeps_credentials("http://a.org:8080/x", "http://a.org:9090/x")
    assert not keeps_credentials("https://a.org/x", "http://a.org/x")       # downgrade


def _own_copy(shards, dest):
    """The shard dir copied to `dest`, its list naming the copies: a test may change it."""
    shutil.copytree(shards, dest)
    names = [os.path.basename(p) for p in (dest / "shards.list").read_text().split()]
    (dest / "shards.list").write_text("".join(f"{dest / n}\n" for n in names))
    return dest


def test_training_from_an_authenticated_list_with_the_config_token_only(shard_corpus, tmp_path):
    """dataset.auth_token alone (no TOOLKIT_DATA_TOKEN): the data fingerprint reads the
    remote list and index with it too, instead of failing with HTTP 401."""
    from train_utils import latest_payload, run_train
    corpus, out = shard_corpus
    token = "only-in-C0NFIG-42"
    handler = _recording_handler(token=token)
    with _server(handler, str(out)) as base:
        names = sorted(p.name for p in out.glob("*.tar"))
        (out / "remote.list").write_text("".join(f"{base}/{n}\n" for n in names))
        exp = str(tmp_path / "exp")
        result = run_train(corpus.train_args(exp, "training.max_epoch=1", "dataset.num_workers=0",
                                             f"dataset.auth_token={token}",
                                             train=f"{base}/remote.list"),
                           extra_env={"TOOLKIT_DATA_TOKEN": ""})
    assert result.returncode == 0, result.stderr[-3000:]
    assert "24 utterances used" in result.stderr
    assert latest_payload(exp)["epoch"] == 1
    assert handler.seen and all(auth == f"Bearer {token}" for _, auth in handler.seen)
    fingerprint = json.load(open(os.path.join(exp, "data_fingerprint.json")))
    assert fingerprint["lists"]["train_data_index"]
    assert token not in open(os.path.join(exp, "log", "train.rank0.log")).read()


def test_relabelled_shard_index_is_refused_on_resume(shard_corpus, tmp_path):
    from train_utils import run_train
    corpus, shards = shard_corpus
    out = _own_copy(shards, tmp_path / "shards")             # its index is changed below
    exp = str(tmp_path / "exp")
    args = corpus.train_args(exp, "training.max_epoch=1", "dataset.num_workers=0",
                             train=str(out / "shards.list"))
    first = run_train(args)
    assert first.returncode == 0, first.stderr[-3000:]
    index_path = out / "shards.index.json"
    original = index_path.read_text()
    index = json.loads(original)
    labels = index["shards"][0]["labels"]
    labels[0] = -1 if labels[0] == 0 else 0            # relabelled (keyword <-> filler)
    index_path.write_text(json.dumps(index))
    again = run_train(args)
    assert again.returncode == 2, again.stderr[-3000:]
    assert "the shard index (labels, durations) of dataset.train_data content changed" \
        in again.stderr
    index = json.loads(original)
    index["shards"][1]["durations"][0] += 0.5                                  # re-timed
    index_path.write_text(json.dumps(index))
    assert run_train(args).returncode == 2
    index_path.write_text(original)
    assert run_train(args).returncode == 0
