"""egs/tts_speakers/v1 end to end at a tiny size through the real run.sh (TTS speakers,
lists and features, training, averaging, large-margin fine-tuning, export, extraction,
scoring with and without AS-Norm), and the speaker-corpus generator: deterministic for
the seed and for any nj, speakers and voice families disjoint across splits, procedural
voices beyond the fixed ones, festival only when asked for and then in test only."""
import json
import os
import re
import subprocess
import sys

import pytest

from toolkit.tasks.speaker import corpus as sc
from toolkit.tts.corpus import voice_family
from toolkit.tts.espeak import VARIANTS, espeak_voices

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RECIPE = os.path.join(ROOT, "egs", "tts_speakers", "v1")
ENV = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
SIZES = ["--num-train-speakers", "8", "--train-utts", "4", "--num-dev-speakers", "3",
         "--dev-utts", "3", "--num-test-speakers", "4", "--test-utts", "3"]
# The default config (ECAPA-TDNN) at a tiny width.
TINY = ("model.channels=16 model.mfa_channels=32 model.se_bottleneck=8 "
        "model.attention_bottleneck=8 model.embed_dim=16 task.chunk_frames=50 "
        "task.eval_max_frames=200 dataset.batch_size=8 training.max_epoch=2 "
        "optim.scheduler.warmup_steps=2 training.log_interval=2")
TINY_LM = "training.max_epoch=1 task.chunk_frames=100 dataset.batch_size=8"


def run_recipe(tmp, *args, timeout=600):
    cmd = ["bash", os.path.join(RECIPE, "run.sh"), "--data", str(tmp / "data"),
           "--exp", str(tmp / "exp"), *SIZES, "--num-procs", "1", "--average-num", "2",
           "--as-norm-top", "4", "--cohort-utts-per-spk", "2", "--train-overrides", TINY,
           "--lm-config", "conf/lm.yaml", "--lm-train-overrides", TINY_LM, *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=ENV)


def read_table(path):
    with open(path) as f:
        return dict(line.rstrip("\n").split(" ", 1) for line in f if line.strip())


@pytest.fixture(scope="module")
def recipe_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("tts_speakers")
    result = run_recipe(tmp)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    return tmp, result


def test_all_stages_produce_their_outputs(recipe_run):
    tmp, result = recipe_run
    data = tmp / "data"
    assert sorted(set(re.findall(r"^stage (\d+):", result.stdout, flags=re.M)), key=int) == \
        [str(s) for s in range(8)]
    speakers = {}
    for split, (n_spk, n_utt) in {"train": (8, 4), "dev": (3, 3), "test": (4, 3)}.items():
        check = subprocess.run([sys.executable, "-m", "toolkit.bin.validate_data_dir",
                                str(data / split)], capture_output=True, text=True, env=ENV)
        assert check.returncode == 0, check.stderr
        utt2spk = read_table(data / split / "utt2spk")
        speakers[split] = set(utt2spk.values())
        assert len(speakers[split]) == n_spk and len(utt2spk) == n_spk * n_utt
        entries = [json.loads(l) for l in (data / split / "data.list").read_text().splitlines()]
        assert {e["key"] for e in entries} == set(utt2spk)
    assert not (speakers["train"] & speakers["dev"] or speakers["train"] & speakers["test"]
                or speakers["dev"] & speakers["test"])
    assert (data / "dict" / "speakers.txt").read_text().split() == sorted(speakers["train"])
    trials = (data / "test" / "trials").read_text().splitlines()
    assert len(trials) == 12 * 11 // 2
    assert sum(t.endswith(" target") for t in trials) == 4 * 3
    for split in ("train", "dev"):
        assert len((data / split / "fbank" / "data.list").read_text().splitlines()) == \
            len(read_table(data / split / "utt2spk"))
    for name in ("exp", "exp_lm"):
        sys_dir = tmp / name
        assert (sys_dir / "avg_2.pt").exists()
        for f in ("model.onnx", "model.zip", "model.safetensors", "config.json"):
            assert (sys_dir / "export" / f).exists(), (name, f)
        assert len((sys_dir / "embeddings" / "test" / "embeddings.scp").read_text()
                   .splitlines()) == 12
        assert len((sys_dir / "embeddings" / "cohort" / "speaker_embeddings.scp").read_text()
                   .splitlines()) == 8
        summary = (sys_dir / "score" / "summary.txt").read_text().splitlines()
        assert [l.split(":")[0] for l in summary] == [f"{name} trials cosine",
                                                       f"{name} trials cosine + AS-Norm top 4"]
        for line in summary:
            assert re.search(r"EER \d+\.\d\d% minDCF\(0\.01\) \d\.\d{3} minDCF\(0\.05\) "
                             r"\d\.\d{3} over 66 trials \(12 target\)$", line), line
            assert line in result.stdout
    import yaml
    assert yaml.safe_load((tmp / "exp" / "config.yaml").read_text())["model"]["type"] == "ecapa_tdnn"
    assert "initialised model, head from" in result.stderr      # fine-tuning kept the head
    assert result.stderr.count("parity onnx vs PyTorch") == 2


def test_stage0_rerun_does_nothing(recipe_run):
    tmp, _ = recipe_run
    before = (tmp / "data" / "wavs" / "test").stat().st_mtime_ns
    again = run_recipe(tmp, "--stage", "0", "--stop-stage", "0", timeout=120)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "complete for these arguments; nothing to do" in again.stderr
    assert (tmp / "data" / "wavs" / "test").stat().st_mtime_ns == before


# ------------------------------------------------------------------ the generator

def synth(out, *args, status=0):
    cmd = [sys.executable, "-m", "toolkit.bin.synth_speaker_data", "--out-dir", str(out),
           "--num-train-speakers", "5", "--train-utts", "3", "--num-dev-speakers", "2",
           "--dev-utts", "2", "--num-test-speakers", "3", "--test-utts", "2", *args]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=ENV)
    assert result.returncode == status, result.stderr[-3000:]
    return result


def tree(root):
    """relative path -> bytes of every file the generator wrote (paths made relative)."""
    out = {}
    for d, _, files in os.walk(root):
        for f in files:
            path = os.path.join(d, f)
            out[os.path.relpath(path, root)] = open(path, "rb").read().replace(
                str(root).encode(), b"<root>")
    return out


@pytest.fixture(scope="module")
def seed3(tmp_path_factory):
    out = tmp_path_factory.mktemp("synth") / "a"
    synth(out, "--nj", "1", "--seed", "3")
    return out


def test_generator_is_deterministic_for_seed_and_nj(seed3, tmp_path):
    synth(tmp_path / "b", "--nj", "2", "--seed", "3")
    a, b = tree(seed3), tree(tmp_path / "b")
    assert sorted(a) == sorted(b) and len([k for k in a if k.endswith(".wav")]) == 5 * 3 + 2 * 2 + 3 * 2
    assert all(a[k] == b[k] for k in a), [k for k in a if a[k] != b[k]][:5]
    synth(tmp_path / "c", "--nj", "2", "--seed", "4")
    c = tree(tmp_path / "c")
    assert c["train/text"] != a["train/text"]


def test_speakers_and_voice_families_are_disjoint():
    voices = espeak_voices()
    sizes = sc.Sizes(train_speakers=100, dev_speakers=16, test_speakers=20)
    by_split, missing = sc.assign_voices(voices, sizes, seed=777)
    assert missing == {"train": 0, "dev": 0, "test": 0}
    families = {s: {voice_family(v) for v in vs} for s, vs in by_split.items()}
    assert not (families["train"] & families["test"] or families["train"] & families["dev"]
                or families["dev"] & families["test"])
    assert len(families["test"]) == 3        # 8 accents per variant: 20 speakers from 3
    # Training spreads over every remaining family before taking a second accent of one.
    assert len(families["train"]) == len(VARIANTS) - 3 - 2
    # Beyond the fixed voices the rest is left to procedural voices, test first.
    big = sc.Sizes(train_speakers=300, dev_speakers=24, test_speakers=40)
    by_split, missing = sc.assign_voices(voices, big, seed=777)
    assert missing == {"train": 300 - 8 * (len(VARIANTS) - 5 - 3), "dev": 0, "test": 0}
    assert len(by_split["test"]) == 40


def test_speaker_and_utterances_do_not_depend_on_corpus_size():
    voice = espeak_voices()[5]
    speaker = sc.speaker_profile(voice, 777)
    assert speaker == sc.speaker_profile(voice, 777)
    few = sc.plan_utterances(speaker, 3, 777, sc.SNR_DB)
    many = sc.plan_utterances(speaker, 10, 777, sc.SNR_DB)
    assert few == many[:3]
    assert len({u.text for u in many}) == 10
    assert all(abs(u.rate - speaker.rate) <= speaker.rate * sc.RATE_SPREAD + 1 for u in many)


def test_festival_only_when_asked_and_then_in_a_test_only_corpus(seed3, tmp_path):
    # Festival is installed on the development machine: not asked for, it is not used.
    for split in ("train", "dev", "test"):
        engines = {v.split()[0] for v in read_table(seed3 / split / "spk2voice").values()}
        assert engines == {"espeak"}, (split, engines)
    from toolkit.tts.engines import engine_class
    if not engine_class("festival").available():
        pytest.skip("festival is not installed")
    refused = synth(tmp_path / "full", "--engines", "espeak,festival", status=2)
    assert "error: festival is reserved for the unseen-engine test" in refused.stderr
    assert "--test-only" in refused.stderr and not (tmp_path / "full").exists()
    synth(tmp_path / "fest", "--nj", "2", "--engines", "espeak,festival", "--test-only")
    assert sorted(os.listdir(tmp_path / "fest")) == [".synth_speaker_data.json", "test",
                                                      "voices.tsv", "wavs"]
    test_voices = read_table(tmp_path / "fest" / "test" / "spk2voice")
    festival = [v for v in test_voices.values() if v.startswith("festival ")]
    assert festival and len(test_voices) == 3
