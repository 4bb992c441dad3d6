"""The corpus recipes end to end on miniature copies of their corpora (tests/corpora.py),
laid out exactly like the real ones: egs/speech_commands, egs/hey_snips and
egs/hi_xiaowen, each through its real run.sh (stage -1 to 6) with tiny sizes, data and
exp dirs in tmp. Also the corpus-specific parts: the 12-class Speech Commands mapping
and official split lists, the download/checksum stage, and the presence checks of
the corpora that cannot be downloaded."""
import hashlib
import json
import math
import os
import re
import subprocess
import tarfile

import numpy as np
import pytest
import soundfile as sf

from corpora import (COMMANDS, SPEECH_COMMANDS_WORDS, build_hey_snips, build_mobvoi_hotwords,
                     build_speech_commands, speech_commands_archive)
from process_tree import run_tree

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Short, but long enough for each miniature corpus to be learned (the floors below): a
# higher learning rate than the full-size configs, and Adam for BC-ResNet (SGD at 0.1 does
# not move it in a few dozen steps).
TINY_TRAIN = {
    "speech_commands": "training.max_epoch=5 dataset.batch_size=8 optim.type=adam "
                       "optim.lr=0.01 optim.scheduler.warmup_steps=2 training.log_interval=4",
    "hey_snips": "training.max_epoch=4 dataset.batch_size=8 optim.lr=0.005 "
                 "optim.scheduler.warmup_steps=2 training.log_interval=2",
    "hi_xiaowen": "training.max_epoch=4 dataset.batch_size=8 optim.lr=0.005 "
                  "optim.scheduler.warmup_steps=2 training.log_interval=2",
}
SNIPS_DIR = "hey_snips_research_6k_en_train_eval_clean_ter"


# One intra-op thread per process: the models are tiny, and on a busy machine OpenMP
# threads spinning against each other make the per-frame parity check of the export
# stage (thousands of one-frame calls) several times slower.
ENV = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")


def run_recipe(recipe, *args, timeout=300):
    cmd = ["bash", os.path.join(ROOT, "egs", recipe, "s0", "run.sh"), *map(str, args)]
    return run_tree(cmd, timeout, env=ENV)


def full_run(recipe, tmp, corpus, *extra):
    data, exp = tmp / "data", tmp / "exp"
    result = run_recipe(recipe, "--corpus-dir", corpus, "--data", data, "--exp", exp,
                        "--average-num", 2, "--train-overrides", TINY_TRAIN[recipe], *extra,
                        timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    return data, exp, result


def read_table(path):
    with open(path, encoding="utf-8") as f:
        return dict(line.rstrip("\n").split(" ", 1) for line in f if line.strip())


def command_clips(rels):
    return [r for r in rels if r.split("/")[0] in COMMANDS]


def read_list(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def logged(log_path, what):
    """Values of `metric` in the training log's dev lines (what="dev loss") or step lines
    (what="train loss"), in order."""
    where, metric = what.split()
    pattern = r" dev: .*?\b" if where == "dev" else r" step \d+/\d+ .*?\b"
    return [float(v) for v in re.findall(pattern + metric + r" ([-0-9.]+)",
                                         open(log_path).read())]


def assert_dev_loss_fell(exp, factor=0.9):
    """The floor of a detector recipe: an untrained model keeps its dev loss (a model that
    learns only the filler prior raises it)."""
    losses = logged(exp / "log" / "train.rank0.log", "dev loss")
    assert len(losses) >= 3 and losses[-1] < factor * losses[0], losses


def check_shared_stages(data, exp, result):
    """Outputs of stages 1-5, alike in every keyword recipe (stage 6 differs per task
    type); every stage from -1 to 6 ran, in order."""
    for split in ("train", "dev", "test"):
        for name in ("wav.scp", "text", "utt2spk", "spk2utt", "utt2dur", "data.list",
                     "fbank/feats.scp", "fbank/data.list"):
            assert (data / split / name).exists(), f"{split}/{name}"
        texts = read_table(data / split / "text")
        entries = read_list(data / split / "data.list")
        assert sorted(e["key"] for e in entries) == sorted(texts)
        assert all(isinstance(e["label"], int) and e["duration"] > 0 for e in entries)
    assert (data / "train" / "global_cmvn.json").exists()
    assert (data / "train" / "global_cmvn.ark").exists()
    assert sorted(exp.glob("ckpt-*.pt")), "no checkpoint"
    assert (exp / "avg_2.pt").exists()
    for name in ("model.onnx", "model.zip", "model.safetensors", "config.json"):
        assert (exp / "export" / name).exists(), name
    assert "parity onnx vs PyTorch: max abs diff" in result.stderr
    stages = re.findall(r"^stage (-?\d+):", result.stdout, flags=re.M)
    assert stages == [str(s) for s in range(-1, 7)], stages


# ============================================================================ Speech Commands

@pytest.fixture(scope="module")
def speech_commands(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("speech_commands")
    corpus = tmp / "speech_commands_v0.02"
    splits = build_speech_commands(str(corpus))
    data, exp, result = full_run("speech_commands", tmp, corpus)
    return corpus, splits, data, exp, result


def test_speech_commands_all_stages(speech_commands):
    corpus, _, data, exp, result = speech_commands
    check_shared_stages(data, exp, result)
    classes = (data / "dict" / "classes.txt").read_text().split()
    assert classes == COMMANDS + ["_silence_", "_unknown_"]
    # Class labels: the list label is the line of the class in classes.txt.
    for split in ("train", "dev", "test"):
        texts = read_table(data / split / "text")
        for e in read_list(data / split / "data.list"):
            assert classes[e["label"]] == texts[e["key"]]
    assert (exp / "inventory.txt").read_text().split() == classes
    score = exp / "score"
    for name in ("accuracy.txt", "confusion.txt", "confusion.json", "predictions.txt"):
        assert (score / name).exists(), name
    assert (score / "confusion.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    n_test = len(read_table(data / "test" / "text"))
    line = re.search(r"^accuracy \d+\.\d\d% \((\d+)/(\d+)\) over 12 classes$", result.stdout,
                     flags=re.M)
    assert line, result.stdout[-2000:]
    assert int(line.group(2)) == n_test
    assert line.group(0) in (score / "accuracy.txt").read_text()
    confusion = json.loads((score / "confusion.json").read_text())
    assert confusion["classes"] == classes and confusion["total"] == n_test
    # The floor: the classifier fits its training clips (the training loss falls; with
    # the learning rate at 0 it stays at ln 12 within batch noise). The dev and test
    # speakers are not learned at this size: their accuracy stays near chance.
    losses = logged(exp / "log" / "train.rank0.log", "train loss")
    assert len(losses) >= 8 and np.mean(losses[-2:]) < 0.95 * np.mean(losses[:2]), losses
    from toolkit.export import read_metadata
    assert read_metadata(str(exp / "export" / "model.onnx"))["keywords"] == classes


def test_speech_commands_12_class_mapping(speech_commands):
    corpus, splits, data, _, _ = speech_commands
    valid = set((corpus / "validation_list.txt").read_text().split())
    test = set((corpus / "testing_list.txt").read_text().split())
    seen_rel = {}
    for split in ("train", "dev", "test"):
        d = data / split
        texts, words = read_table(d / "text"), read_table(d / "utt2word")
        wavs, utt2spk = read_table(d / "wav.scp"), read_table(d / "utt2spk")
        assert set(texts) == set(words) == set(wavs) == set(utt2spk)
        known = sum(1 for w in words.values() if w in COMMANDS)
        assert known == len(command_clips(splits[split]))
        for utt, text in texts.items():
            word = words[utt]
            if word in COMMANDS:
                assert text == word
            elif word == "silence":
                assert text == "_silence_"
            else:
                assert word in SPEECH_COMMANDS_WORDS and text == "_unknown_", (utt, word, text)
            assert utt.startswith(utt2spk[utt])
            path = wavs[utt]
            if word != "silence":
                rel = os.path.relpath(path, corpus).replace(os.sep, "/")
                assert rel.split("/")[0] == word
                seen_rel[rel] = split
        # Unknown and silence: ceil(10 % of the split's command-word clips) each.
        counts = {c: sum(1 for t in texts.values() if t == c) for c in ("_silence_", "_unknown_")}
        assert counts["_silence_"] == math.ceil(0.1 * known) > 0
        assert counts["_unknown_"] == math.ceil(0.1 * known) > 0
        # Silence clips: 1 s of (scaled) background noise, written under data/local/silence.
        for utt in (u for u, t in texts.items() if t == "_silence_"):
            audio, rate = sf.read(wavs[utt])
            assert rate == 16000 and len(audio) == 16000 and np.abs(audio).max() > 0
            assert wavs[utt].startswith(str(data / "local" / "silence" / split))
    # The official lists decide the split: testing_list.txt only in test, validation only dev.
    for rel, split in seen_rel.items():
        assert split == ("test" if rel in test else "dev" if rel in valid else "train"), rel
    for rel in command_clips(test):
        assert seen_rel[rel] == "test"
    for rel in command_clips(valid):
        assert seen_rel[rel] == "dev"
    # Every command-word clip of the corpus is used (unknown words are sampled).
    assert set(command_clips(seen_rel)) == {r for s in splits.values() for r in command_clips(s)}


def test_speech_commands_stage0_is_deterministic(speech_commands, tmp_path):
    corpus, _, data, _, _ = speech_commands
    again = tmp_path / "data"
    result = run_recipe("speech_commands", "--corpus-dir", corpus, "--data", again,
                        "--stage", 0, "--stop-stage", 0)
    assert result.returncode == 0, result.stderr[-3000:]
    for split in ("train", "dev", "test"):
        assert read_table(again / split / "text") == read_table(data / split / "text")
        assert read_table(again / split / "utt2word") == read_table(data / split / "utt2word")
    first = sorted((data / "local" / "silence" / "train").glob("*.wav"))
    second = sorted((again / "local" / "silence" / "train").glob("*.wav"))
    assert [p.name for p in first] == [p.name for p in second]
    assert first[0].read_bytes() == second[0].read_bytes()


def test_speech_commands_35_classes_and_all_unknowns(speech_commands, tmp_path):
    corpus, splits, _, _, _ = speech_commands
    d35 = tmp_path / "data35"
    result = run_recipe("speech_commands", "--corpus-dir", corpus, "--data", d35, "--task", 35,
                        "--stage", 0, "--stop-stage", 0)
    assert result.returncode == 0, result.stderr[-3000:]
    assert (d35 / "dict" / "classes.txt").read_text().split() == SPEECH_COMMANDS_WORDS
    for split in ("train", "dev", "test"):
        texts, words = read_table(d35 / split / "text"), read_table(d35 / split / "utt2word")
        assert all(texts[u] == words[u] for u in texts)          # the word is the class
        assert len(texts) == len(splits[split])                  # every clip, no silence
    assert not (d35 / "local" / "silence").exists()
    # --unknown-fraction -1 keeps every clip of the other words as _unknown_.
    dall = tmp_path / "data_all"
    result = run_recipe("speech_commands", "--corpus-dir", corpus, "--data", dall,
                        "--unknown-fraction", -1, "--silence-fraction", 0,
                        "--stage", 0, "--stop-stage", 0)
    assert result.returncode == 0, result.stderr[-3000:]
    for split in ("train", "dev", "test"):
        texts = read_table(dall / split / "text")
        others = [r for r in splits[split] if r.split("/")[0] not in COMMANDS]
        assert sum(1 for t in texts.values() if t == "_unknown_") == len(others)
        assert "_silence_" not in texts.values()


def test_speech_commands_35_needs_every_word(tmp_path):
    corpus = tmp_path / "v1like"
    build_speech_commands(str(corpus), words=COMMANDS + ["bed", "cat"], train_speakers=1)
    result = run_recipe("speech_commands", "--corpus-dir", corpus, "--data", tmp_path / "d",
                        "--task", 35, "--stage", 0, "--stop-stage", 0)
    assert result.returncode != 0
    assert "task 35 needs word directories" in result.stderr and "backward" in result.stderr


def test_speech_commands_not_a_corpus(tmp_path):
    (tmp_path / "empty").mkdir()
    result = run_recipe("speech_commands", "--corpus-dir", tmp_path / "empty",
                        "--data", tmp_path / "d", "--stage", 0, "--stop-stage", 0)
    assert result.returncode != 0 and "validation_list.txt" in result.stderr


def download_stage(tmp_path, *extra):
    return run_recipe("speech_commands", "--stage", -1, "--stop-stage", -1,
                      "--data", tmp_path / "data", "--corpus-dir", tmp_path / "corpus",
                      "--download-dir", tmp_path / "dl", *extra, timeout=120)


def test_speech_commands_download_offline(tmp_path):
    # Nothing listens on port 9 of the loopback: the download fails at once, as offline.
    result = download_stage(tmp_path, "--download-url",
                            "http://127.0.0.1:9/speech_commands_v0.02.tar.gz")
    assert result.returncode != 0
    err = result.stderr
    assert "cannot download http://127.0.0.1:9/speech_commands_v0.02.tar.gz" in err
    assert str(tmp_path / "dl" / "speech_commands_v0.02.tar.gz") in err    # where to put it
    assert "--corpus-dir" in err
    assert not (tmp_path / "dl" / "speech_commands_v0.02.tar.gz").exists()
    assert "stage 0:" not in result.stdout


@pytest.fixture(scope="module")
def sc_archive(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sc_archive")
    build_speech_commands(str(tmp / "src"), words=COMMANDS + ["bed"], train_speakers=1,
                          noise_seconds=11.0)
    archive = speech_commands_archive(str(tmp / "src"), str(tmp / "speech_commands_v0.02.tar.gz"))
    with open(archive, "rb") as f:
        return archive, hashlib.sha256(f.read()).hexdigest()


def place_archive(tmp_path, sc_archive):
    archive, digest = sc_archive
    (tmp_path / "dl").mkdir()
    os.symlink(archive, tmp_path / "dl" / "speech_commands_v0.02.tar.gz")
    return digest


def test_speech_commands_unknown_checksum_stops(tmp_path, sc_archive):
    digest = place_archive(tmp_path, sc_archive)
    unknown = tmp_path / "unknown.sha256"
    unknown.write_text("UNKNOWN  speech_commands_v0.02.tar.gz\n")
    result = download_stage(tmp_path, "--checksum-file", unknown)
    assert result.returncode != 0
    assert "no known sha256 for speech_commands_v0.02.tar.gz" in result.stderr
    assert digest in result.stderr                          # the value to check and fill in
    assert "--verify-checksum false" in result.stderr
    assert not (tmp_path / "corpus" / "validation_list.txt").exists()
    # Going on unverified is possible, and says so.
    result = download_stage(tmp_path, "--checksum-file", unknown, "--verify-checksum", "false")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "unverified" in result.stderr
    assert (tmp_path / "corpus" / "validation_list.txt").exists()


def test_speech_commands_shipped_checksum_rejects_other_archives(tmp_path, sc_archive):
    # The recipe records the real archive's digest: the miniature stand-in must fail it.
    place_archive(tmp_path, sc_archive)
    result = download_stage(tmp_path)
    assert result.returncode != 0
    assert "af14739ee7dc311471de98f5f9d2c9191b18aedfe957f4a6ff791c709868ff58" in result.stderr
    assert not (tmp_path / "corpus" / "validation_list.txt").exists()


def test_speech_commands_checksum_verified_then_extracted(tmp_path, sc_archive):
    digest = place_archive(tmp_path, sc_archive)
    bad = tmp_path / "bad.sha256"
    bad.write_text("0" * 64 + "  speech_commands_v0.02.tar.gz\n")
    result = download_stage(tmp_path, "--checksum-file", bad)
    assert result.returncode != 0 and "sha256 mismatch" in result.stderr
    assert not (tmp_path / "corpus" / "validation_list.txt").exists()
    good = tmp_path / "good.sha256"
    good.write_text(f"# comment\n{digest}  speech_commands_v0.02.tar.gz\n")
    result = download_stage(tmp_path, "--checksum-file", good)
    assert result.returncode == 0, result.stderr[-2000:]
    assert f"sha256 verified: {digest}" in result.stderr
    assert (tmp_path / "corpus" / "yes").is_dir()
    assert (tmp_path / "corpus" / "_background_noise_").is_dir()
    # Present now: a rerun neither downloads nor extracts again.
    result = download_stage(tmp_path, "--checksum-file", good, "--download-url", "http://127.0.0.1:9/x")
    assert result.returncode == 0 and "corpus present" in result.stderr


# ============================================================================ Hey Snips

@pytest.fixture(scope="module")
def hey_snips(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("hey_snips")
    corpus = tmp / SNIPS_DIR
    meta = build_hey_snips(str(corpus))
    # Two gloo ranks through torchrun.
    data, exp, result = full_run("hey_snips", tmp, corpus, "--num-procs", 2)
    return corpus, meta, data, exp, result


def test_hey_snips_all_stages(hey_snips):
    corpus, meta, data, exp, result = hey_snips
    check_shared_stages(data, exp, result)
    assert (data / "dict" / "keywords.txt").read_text() == "hey snips\n"
    for split in ("train", "dev", "test"):
        texts = read_table(data / split / "text")
        durs = read_table(data / split / "utt2dur")
        utt2spk = read_table(data / split / "utt2spk")
        usable = [e for e in meta[split] if e["duration"] > 0]
        assert len(texts) == len(usable)
        by_id = {u.split("-", 1)[1]: u for u in texts}
        for e in usable:
            utt = by_id[e["id"]]
            assert texts[utt] == ("hey snips" if e["is_hotword"] else "<filler>")
            assert utt2spk[utt] == str(e["worker_id"])
            assert float(durs[utt]) == pytest.approx(e["duration"], abs=1e-3)
        labels = {e["key"]: e["label"] for e in read_list(data / split / "data.list")}
        assert sorted(labels.values()) == sorted(0 if e["is_hotword"] else -1 for e in usable)
    assert "duration not positive" in result.stderr       # the zero-length entry, reported
    assert (exp / "log" / "train.rank0.log").exists() and (exp / "log" / "train.rank1.log").exists()
    assert "world=2" in (exp / "log" / "train.rank0.log").read_text()
    score = exp / "score"
    summary = (score / "summary.txt").read_text()
    assert summary.startswith("hey_snips: FRR") and "@1 FA/h" in summary
    assert summary.strip() in result.stdout
    assert (score / "det_hey_snips.txt").exists()
    assert (score / "det.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    from toolkit.export import read_metadata
    meta_onnx = read_metadata(str(exp / "export" / "model.onnx"))
    assert meta_onnx["keywords"] == ["hey snips"]
    # The shipped threshold is the dev set's, never the test's; the test reports at it.
    dev = json.loads((exp / "score_dev" / "det.json").read_text())
    assert "/dev/" in dev["config"]["data_list"]
    selected = dev["curves"]["hey snips"]["selected"]
    assert selected["threshold"] is not None, selected
    assert meta_onnx["threshold"] == pytest.approx(selected["threshold"])
    deployed = json.loads((score / "det.json").read_text())["deployed"]
    assert deployed["threshold"] == pytest.approx(meta_onnx["threshold"])
    assert "at the deployed threshold" in summary
    assert_dev_loss_fell(exp)


def test_hey_snips_absent_corpus_is_explained(tmp_path):
    result = run_recipe("hey_snips", "--data", tmp_path / "data", "--stage", -1,
                        "--stop-stage", 0)
    assert result.returncode != 0
    err = result.stderr
    assert "Hey Snips corpus is not in" in err and "request" in err
    assert "hey_snips_kws_4.0.tar.gz" in err and "--corpus-dir" in err
    assert "stage 0:" not in result.stdout


def test_hey_snips_archive_is_extracted(tmp_path):
    src = tmp_path / "src" / SNIPS_DIR
    build_hey_snips(str(src), sizes={"train": (1, 1), "dev": (1, 1), "test": (1, 1)},
                    zero_duration_entry=False)
    dl = tmp_path / "data" / "download"
    dl.mkdir(parents=True)
    with tarfile.open(dl / "hey_snips_kws_4.0.tar.gz", "w:gz") as tar:
        tar.add(src, arcname=SNIPS_DIR)
    result = run_recipe("hey_snips", "--data", tmp_path / "data", "--stage", -1,
                        "--stop-stage", 0)
    assert result.returncode == 0, result.stderr[-2000:]
    assert (dl / SNIPS_DIR / "train.json").exists()
    assert len(read_table(tmp_path / "data" / "test" / "text")) == 2


# ============================================================================ Mobvoi hotwords

@pytest.fixture(scope="module")
def hi_xiaowen(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("hi_xiaowen")
    corpus = tmp / "mobvoi"
    meta = build_mobvoi_hotwords(str(corpus))
    data, exp, result = full_run("hi_xiaowen", tmp, corpus)
    return corpus, meta, data, exp, result


def test_hi_xiaowen_all_stages(hi_xiaowen):
    corpus, meta, data, exp, result = hi_xiaowen
    check_shared_stages(data, exp, result)
    keywords = ["hi xiaowen", "nihao wenwen"]
    assert (data / "dict" / "keywords.txt").read_text().splitlines() == keywords
    for split in ("train", "dev", "test"):
        texts = read_table(data / split / "text")
        assert len(texts) == len(meta[split])
        by_id = {u.split("-", 1)[1]: u for u in texts}
        labels = {e["key"]: e["label"] for e in read_list(data / split / "data.list")}
        for e in meta[split]:
            utt = by_id[e["utt_id"]]
            kw = e["keyword_id"]
            assert texts[utt] == (keywords[kw] if kw >= 0 else "<filler>")
            assert labels[utt] == kw
        # An utterance without a speaker id is its own speaker, never pooled under one id.
        spk = read_table(data / split / "utt2spk")
        nameless = [by_id[e["utt_id"]] for e in meta[split] if e["speaker_id"] is None]
        assert nameless and len({spk[u] for u in nameless}) == len(nameless)
        assert all(spk[u] == f"nospk_{u.split('-', 1)[1]}" for u in nameless)
    score = exp / "score"
    lines = (score / "summary.txt").read_text().splitlines()
    # Each keyword's own operating points, then both at the one threshold shipped (dev's).
    assert [line.split(":")[0].split(" at the deployed")[0] for line in lines] == [
        "hi_xiaowen", "nihao_wenwen", "hi_xiaowen", "nihao_wenwen"]
    assert all("at the deployed threshold" in line for line in lines[2:])
    for line in lines:
        assert line in result.stdout
    assert (score / "det_hi_xiaowen.txt").exists() and (score / "det_nihao_wenwen.txt").exists()
    det = json.loads((score / "det.json").read_text())
    assert sorted(det["curves"]) == keywords
    from toolkit.export import read_metadata
    assert read_metadata(str(exp / "export" / "model.onnx"))["keywords"] == keywords
    assert_dev_loss_fell(exp)


def test_hi_xiaowen_absent_corpus_is_explained(tmp_path):
    # Nothing listens on port 9 of the loopback: the download fails at once, as offline.
    result = run_recipe("hi_xiaowen", "--corpus-dir", tmp_path / "nothing", "--data",
                        tmp_path / "data", "--stage", -1, "--stop-stage", 0,
                        "--download-url", "http://127.0.0.1:9")
    assert result.returncode != 0
    err = result.stderr
    assert "cannot download http://127.0.0.1:9/mobvoi_hotword_dataset.tgz" in err
    assert "Mobvoi hotword corpus is not in" in err
    assert "https://www.openslr.org/resources/87/mobvoi_hotword_dataset.tgz" in err
    assert "mobvoi_hotword_dataset_resources.tgz" in err and "--corpus-dir" in err


def test_hi_xiaowen_prints_every_archive_checksum(tmp_path):
    """With no recorded checksums, stage -1 names the sha256 of both archives before it
    stops, not just the first one."""
    import hashlib
    import tarfile
    corpus = tmp_path / "dl"
    corpus.mkdir()
    digests = {}
    for part in ("mobvoi_hotword_dataset", "mobvoi_hotword_dataset_resources"):
        member = tmp_path / part
        member.mkdir()
        (member / "readme.txt").write_text(part)
        archive = corpus / f"{part}.tgz"
        with tarfile.open(archive, "w:gz") as tar:
            tar.add(member, arcname=part)
        digests[part] = hashlib.sha256(archive.read_bytes()).hexdigest()
    result = run_recipe("hi_xiaowen", "--corpus-dir", corpus, "--data", tmp_path / "data",
                        "--stage", -1, "--stop-stage", -1, "--download-url", "http://127.0.0.1:9")
    assert result.returncode != 0
    for part, digest in digests.items():
        assert f"no known sha256 for {part}.tgz" in result.stderr and digest in result.stderr


def test_hi_xiaowen_bad_keyword_id_is_reported(tmp_path):
    corpus = tmp_path / "mobvoi"
    build_mobvoi_hotwords(str(corpus), sizes={"train": (1, 1), "dev": (1, 1), "test": (1, 1)})
    p_train = corpus / "mobvoi_hotword_dataset_resources" / "p_train.json"
    entries = json.loads(p_train.read_text())
    entries[0]["keyword_id"] = 7
    p_train.write_text(json.dumps(entries))
    result = run_recipe("hi_xiaowen", "--corpus-dir", corpus, "--data", tmp_path / "data",
                        "--stage", 0, "--stop-stage", 0)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "keyword_id 7 unexpected in p_train.json" in result.stderr
    assert len(read_table(tmp_path / "data" / "train" / "text")) == 2


# ============================================================================ every recipe

def test_kws_score_needs_its_arguments():
    """Stage 6's scoring script (utils/kws_score.sh) names what it takes."""
    result = subprocess.run(["bash", os.path.join(ROOT, "utils", "kws_score.sh"), "model.onnx"],
                            capture_output=True, text=True, timeout=60, env=ENV)
    assert result.returncode != 0
    assert "MODEL DATA_LIST INVENTORY OUT_DIR" in result.stderr


def test_recipes_refuse_unknown_options():
    for recipe in ("speech_commands", "hey_snips", "hi_xiaowen"):
        result = run_recipe(recipe, "--no-such-option", 1, timeout=120)
        assert result.returncode != 0 and "unknown option --no-such-option" in result.stderr
