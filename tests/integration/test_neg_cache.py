"""The wake-word negatives cache (toolkit.tasks.kws.negatives and neg_feats on
toolkit.entry_cache) on real espeak-ng speech and the pretrained phone front end: a second
keyword reuses the general negatives and their features (the same bytes and features as
without the cache), a negative that holds the new keyword is dropped and counted, a damaged
entry is named and rebuilt, and two runs at once build each entry once."""
import json
import logging
import os
import shutil
import subprocess
import sys

import kaldiio
import numpy as np
import pytest

from toolkit.bin import make_datalist
from toolkit.tasks.kws import corpus as S, corpus_text as T, negatives as N
from file_tree import file_digests

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIG = os.path.join(ROOT, "egs", "wake_word", "s0", "conf", "phone_ds_tcn.yaml")
SIZES = S.Sizes(train_pos=4, train_neg=20, dev_pos=2, dev_neg=8, test_pos=2, test_neg=10)
FEATS = "phone_frontend"
LISTED = ("train", "test")          # the splits featurized here


@pytest.fixture
def cache(tmp_path, monkeypatch):
    path = tmp_path / "neg_cache"
    monkeypatch.setenv(N.CACHE_ENV, str(path))
    return path


class _Log(logging.Handler):
    def __init__(self):
        super().__init__(logging.INFO)
        self.text = ""

    def emit(self, record):
        self.text += self.format(record) + "\n"


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """Built once for the module (the expensive part: TTS corpora and the front end):
    `cache` whose entries the first corpus `a` ("hey snips") built, with its log, and the
    features of `a` (their entries built into `cache` too), with their stderr; `c`: the
    "alexa" corpus and its features without the cache, the reference the cached ones must
    equal. Tests that only read `cache` use it (the hard links of `a` point into it); a
    test that damages an entry works on a copy."""
    root = tmp_path_factory.mktemp("neg_cache_shared")
    cache = root / "neg_cache"
    log, logger = _Log(), logging.getLogger()
    level = logger.level
    logger.addHandler(log)
    logger.setLevel(logging.INFO)
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv(N.CACHE_ENV, str(cache))
            _corpus(root / "a", "hey snips")
            a_log = log.text
            _corpus(root / "c", "alexa", neg_cache=False)
            a_features = _features(root / "a")
            _features(root / "c", neg_cache=False)
    finally:
        logger.removeHandler(log)
        logger.setLevel(level)
    return dict(cache=cache, a=root / "a", c=root / "c", a_log=a_log, a_features=a_features)


@pytest.fixture
def shared_cache(built, monkeypatch):
    """The module's cache as this test's, read only."""
    monkeypatch.setenv(N.CACHE_ENV, str(built["cache"]))
    return built["cache"]


def _corpus(path, keyword, neg_cache=True, sizes=SIZES):
    return S.generate_corpus([keyword], str(path), seed=777, sizes=sizes, nj=2,
                             engines=("espeak",), neg_cache=neg_cache)


def _table(path):
    with open(path, encoding="utf-8") as f:
        return dict(line.rstrip("\n").split(" ", 1) for line in f)


def _digest(out_dir):
    """sha256 of every corpus file but the cache record, features and data lists (absolute
    paths in wav.scp made relative)."""
    return file_digests(out_dir, relative_in=("wav.scp",), skip=lambda rel: FEATS in rel or (
        os.path.basename(rel) in (N.RECORD_NAME, "data.list")))


def _features(data, neg_cache=True):
    """Data lists of LISTED and their phone front end features (a process of its own:
    its feature jobs fork from a parent that has not run torch); its stderr."""
    for split in LISTED:
        d = os.path.join(str(data), split)
        assert make_datalist.main([d, os.path.join(d, "data.list"), "--inventory",
                                   os.path.join(str(data), "dict", "keywords.txt"),
                                   "--nj", "1"]) == 0
    pairs = [p for split in LISTED for p in (os.path.join(str(data), split, "data.list"),
                                              os.path.join(str(data), split, FEATS))]
    proc = subprocess.run([sys.executable, "-m", "toolkit.bin.compute_feats", *pairs,
                           "--config", CONFIG, "--nj", "2"] + (["--neg-cache"] * neg_cache),
                          capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stderr


def _same_features(a, b):
    """The feature lists of corpora `a` and `b` hold the same entries, fields and matrices."""
    for split in LISTED:
        la = [json.loads(x) for x in open(os.path.join(str(a), split, FEATS, "data.list"))]
        lb = [json.loads(x) for x in open(os.path.join(str(b), split, FEATS, "data.list"))]
        strip = lambda e: [(k, v) for k, v in e.items() if k not in ("wav", "feat")]
        assert [strip(e) for e in la] == [strip(e) for e in lb]
        for ea, eb in zip(la, lb):
            assert np.array_equal(kaldiio.load_mat(ea["feat"]), kaldiio.load_mat(eb["feat"]))
        scp = [[line.split()[0] for line in open(os.path.join(str(c), split, FEATS, "feats.scp"))]
               for c in (a, b)]
        assert scp[0] == scp[1] == sorted(scp[0])


def _general(data, split="train"):
    kinds = _table(os.path.join(str(data), split, "utt2kind"))
    return sorted(u for u, k in kinds.items() if k in N.GENERAL_KINDS)


def test_a_second_keyword_reuses_the_negatives_and_their_features(built, shared_cache, tmp_path,
                                                                  caplog):
    a, c = built["a"], built["c"]
    assert "(built now)" in built["a_log"]
    caplog.set_level(logging.INFO)
    _corpus(tmp_path / "b", "alexa")
    assert "(cached)" in caplog.text and "building" not in caplog.text
    # the same corpus with and without the cache; the negatives are the cache's files
    assert _digest(tmp_path / "b") == _digest(c)
    assert not os.path.exists(c / "train" / N.RECORD_NAME)
    record = N.read_record(str(tmp_path / "b" / "train"))
    assert record["utts"] == _general(tmp_path / "b") == _general(a)
    for utt in record["utts"]:
        a_wav, b_wav = (os.stat(x / "wavs" / "train" / f"{utt}.wav") for x in (a, tmp_path / "b"))
        cached = os.stat(N.wav_path(record["entry"], "train", utt))
        assert a_wav.st_ino == b_wav.st_ino == cached.st_ino      # hard links: no copy
    # features: the first corpus builds the features entry, the second reuses it
    first = built["a_features"]
    assert "negatives features cache entry" in first and "(built now)" in first
    second = _features(tmp_path / "b")
    assert "(cached)" in second and "building" not in second
    n = len(record["utts"])
    assert f"{n} general negatives from the cache (cached), " in second
    _same_features(tmp_path / "b", c)
    # another output of the front end misses: the key is the features, not the corpus
    import copy
    import toolkit.tasks  # noqa: F401
    from toolkit.config import load_dataset_config
    from toolkit.tasks.kws.neg_feats import feature_fingerprint
    cfg = load_dataset_config(CONFIG)
    other = copy.deepcopy(cfg)
    other.feature.frontend_output = "hidden"
    base, hidden = feature_fingerprint(cfg), feature_fingerprint(other)
    assert base["model_files"] == hidden["model_files"] and base != hidden
    assert [name for name, _ in base["model_files"]] == ["model.safetensors", "config.json"]


def test_a_negative_that_holds_the_new_keyword_is_dropped_and_counted(built, shared_cache,
                                                                      tmp_path, caplog):
    a = built["a"]
    text = _table(os.path.join(a, "train", "text"))
    kinds = _table(os.path.join(a, "train", "utt2kind"))
    # the longest word of the general negatives: the new keyword
    word = max((w for u in _general(a) if kinds[u] == "neg"
                for w in text[u].split()), key=lambda w: (len(w), w))
    holding = sorted(u for u in _general(a)
                     if kinds[u] == "neg" and word in text[u].split())
    assert holding
    caplog.set_level(logging.INFO)
    summary = _corpus(tmp_path / "d", word)
    record = N.read_record(str(tmp_path / "d" / "train"))
    assert {u: record["dropped"][u] for u in holding} == {u: "words" for u in holding}
    assert summary["train"]["dropped_negatives"] == len(record["dropped"]) >= len(holding)
    assert f"train: {len(record['dropped'])} of {len(_general(a))} general " \
           f"negatives dropped: they hold {word!r}" in caplog.text
    left = _table(os.path.join(tmp_path, "d", "train", "text"))
    assert not set(record["dropped"]) & set(left)
    assert not any(os.path.exists(tmp_path / "d" / "wavs" / "train" / f"{u}.wav")
                   for u in record["dropped"])
    assert all(os.path.exists(N.wav_path(record["entry"], "train", u)) for u in holding)
    left_kinds = _table(os.path.join(tmp_path, "d", "train", "utt2kind"))
    assert not any(T.contains_phrase(left[u].split(), [word]) for u in left
                   if left_kinds[u] == "neg")
    # without the cache the same ones are dropped: the same corpus
    caplog.clear()
    summary_e = _corpus(tmp_path / "e", word, neg_cache=False)
    assert summary_e["train"]["dropped_negatives"] == summary["train"]["dropped_negatives"]
    assert _digest(tmp_path / "d") == _digest(tmp_path / "e")


def test_spelling_and_case_count_as_the_keyword():
    filt = T.TextFilter(["alexa", "hey jarvis"], {})
    assert filt.keyword_in("okay Alexa play") == "words"
    assert filt.keyword_in("say a lexa now") == "spelling"
    assert filt.keyword_in("hey jar vis") == "spelling"
    assert filt.keyword_in("they jar vis") == filt.keyword_in("a lex") == ""
    assert filt.keyword_in("ale xa") == "spelling" and filt.keyword_in("alexander") == ""


def test_a_damaged_entry_is_named_and_rebuilt(built, cache, tmp_path, caplog):
    shutil.copytree(built["cache"], cache)      # a copy of its own: this test damages it
    record = N.read_record(str(built["a"] / "train"))
    assert os.path.dirname(record["entry"]) == str(built["cache"] / "audio")
    entry = os.path.join(cache, "audio", os.path.basename(record["entry"]))
    victim = N.wav_path(entry, "train", record["utts"][0])
    good = open(victim, "rb").read()
    os.chmod(victim, 0o644)                    # entries are read-only
    with open(victim, "r+b") as f:             # one byte changed in place, same size
        f.seek(len(good) // 2)
        f.write(bytes([good[len(good) // 2] ^ 0xFF]))
    caplog.set_level(logging.INFO)
    _corpus(tmp_path / "b", "alexa")
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(victim in w and "damaged" in w and "building it again" in w for w in warnings)
    assert "(built now)" in caplog.text
    assert open(victim, "rb").read() == good               # rebuilt, byte for byte
    assert _digest(tmp_path / "b") == _digest(built["c"])
    # a damaged features entry (built by corpus `a`; the rebuilt negatives are the same
    # bytes, so the same key): named, rebuilt, the same features
    feats_root = os.path.join(str(cache), "feats")
    entry = next(os.path.join(feats_root, d) for d in os.listdir(feats_root)
                 if not d.startswith(".") and
                 json.load(open(os.path.join(feats_root, d, "key.json")))
                 ["negatives"]["split"] == "train")
    ark = os.path.join(entry, sorted(n for n in os.listdir(entry) if n.endswith(".ark"))[0])
    os.chmod(ark, 0o644)
    os.truncate(ark, os.path.getsize(ark) - 8)
    err = _features(tmp_path / "b")
    assert f"{ark}: " in err and "damaged" in err and "building it again" in err
    _same_features(tmp_path / "b", built["c"])


RUN = """set -e
python -m toolkit.bin.synth_kws_data --keyword "$KW" --out-dir "$OUT" --seed 777 --nj 1 \
  --num-train-pos 4 --num-train-neg 40 --num-dev-pos 2 --num-dev-neg 8 --num-test-pos 2 \
  --num-test-neg 10 --neg-cache
for s in train test; do
  python -m toolkit.bin.make_datalist "$OUT/$s" "$OUT/$s/data.list" \
    --inventory "$OUT/dict/keywords.txt" --nj 1
done
python -m toolkit.bin.compute_feats "$OUT/train/data.list" "$OUT/train/phone_frontend" \
  "$OUT/test/data.list" "$OUT/test/phone_frontend" --config "$CONFIG" --nj 2 --neg-cache
"""


def test_two_runs_at_once_build_each_entry_once(cache, tmp_path):
    procs = []
    for name, keyword in (("a", "hey snips"), ("b", "alexa")):
        env = dict(os.environ, KW=keyword, OUT=str(tmp_path / name), CONFIG=CONFIG,
                   PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
        procs.append(subprocess.Popen(["bash", "-c", RUN], env=env, cwd=ROOT, text=True,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    logs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], "\n".join(x[-3000:] for x in logs)
    text = "\n".join(logs)
    assert text.count("negatives cache entry") and \
        sum("negatives cache entry" in line and line.endswith(": building")
            for line in text.splitlines()) == 1
    assert sum("negatives features cache entry" in line and line.endswith(": building")
               for line in text.splitlines()) == len(LISTED)       # one per split
    for split in LISTED:
        utts = N.read_record(str(tmp_path / "a" / split))["utts"]
        assert utts == N.read_record(str(tmp_path / "b" / split))["utts"]
        for utt in utts:
            a, b = (open(tmp_path / x / "wavs" / split / f"{utt}.wav", "rb").read() for x in "ab")
            assert a == b
        lists = [{e["key"]: e for e in map(json.loads, open(tmp_path / x / split / FEATS /
                                                              "data.list"))} for x in "ab"]
        for utt in utts:
            assert np.array_equal(kaldiio.load_mat(lists[0][utt]["feat"]),
                                  kaldiio.load_mat(lists[1][utt]["feat"]))
