"""egs/tts_speakers/v1 end to end at a tiny size through the real run.sh (TTS speakers,
the outside test set, lists and features, training, averaging, large-margin fine-tuning,
export, extraction, scoring of both test sets with and without AS-Norm; the shipped
pretrained encoder and Resemblyzer scored beside on the same lists), and the
speaker-corpus generator: deterministic for the seed and for any nj, speakers and voice
families disjoint across splits, procedural voices beyond the fixed ones, festival only
when asked for and then in test only; on the voice bank: Kokoro blends as speakers that
never hold a reserved voice, each engine's held-out voices independent of the others
named, a test-only corpus of the held-out and reserved voices, trial lists per engine
beside the list of every pair (cross-engine pairs among them)."""
import json
import os
import re
import subprocess
import sys

import pytest

from toolkit.tasks.speaker import corpus as sc
from toolkit.voicebank import Voice, is_reserved
from toolkit.voicebank.corpus import Engines, voice_family
from toolkit.voicebank.espeak import VARIANTS, espeak_voices
from toolkit.voicebank.kokoro import kokoro_voices
from file_tree import file_tree
from installed import require_engine
from process_tree import run_tree

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RECIPE = os.path.join(ROOT, "egs", "tts_speakers", "v1")
ENV = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
SIZES = ["--num-train-speakers", "8", "--train-utts", "4", "--num-dev-speakers", "3",
         "--dev-utts", "3", "--num-test-speakers", "4", "--test-utts", "3"]
# The recipe's corpus settings (conf/corpus.yaml: the seed) at the sizes above.
CORPUS = "defaults: [{recipe}/conf/corpus.yaml]\n" + "".join(
    f"{k[2:].replace('-', '_')}: {v}\n" for k, v in zip(SIZES[::2], SIZES[1::2]))
# The default config (ECAPA-TDNN) at a tiny width.
TINY = ("model.channels=16 model.mfa_channels=32 model.se_bottleneck=8 "
        "model.attention_bottleneck=8 model.embed_dim=16 task.chunk_frames=50 "
        "task.eval_max_frames=200 dataset.batch_size=8 training.max_epoch=2 "
        "optim.scheduler.warmup_steps=2 training.log_interval=2")
TINY_LM = "training.max_epoch=1 task.chunk_frames=100 dataset.batch_size=8"


def run_recipe(tmp, *args, timeout=600):
    # espeak-ng alone: the recipe's default Kokoro voices and festival/flite outside are for
    # the real runs; a tiny ECAPA-TDNN from scratch (the default fine-tunes the shipped
    # encoder, whose width a tiny run cannot afford; tests/test_pretrained.py fine-tunes it).
    corpus = tmp / "corpus.yaml"
    corpus.write_text(CORPUS.format(recipe=RECIPE))
    cmd = ["bash", os.path.join(RECIPE, "run.sh"), "--data", str(tmp / "data"),
           "--exp", str(tmp / "exp"), "--corpus-config", str(corpus), "--engines", "espeak",
           "--blends", "0",
           "--outside-engines", "", "--config", "conf/ecapa.yaml",
           "--outside-utts", "2", "--num-procs", "1", "--average-num", "2",
           "--as-norm-top", "4", "--cohort-utts-per-spk", "2", "--train-overrides", TINY,
           "--lm-config", "conf/lm.yaml", "--lm-train-overrides", TINY_LM, *args]
    return run_tree(cmd, timeout, env=ENV)


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
    # Stage 2 (global CMVN) is no step of a speaker recipe.
    assert sorted(set(re.findall(r"^stage (\d+):", result.stdout, flags=re.M)), key=int) == \
        [str(s) for s in (0, 1, 3, 4, 5, 6, 7)]
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
    # The outside test set: the held-out espeak-ng speakers (the only engine here), 2 each.
    outside = read_table(data / "outside" / "test" / "utt2spk")
    assert set(outside.values()) == speakers["test"] and len(outside) == 4 * 2
    for name in ("exp", "exp_lm"):
        sys_dir = tmp / name
        assert (sys_dir / "avg_2.pt").exists()
        for f in ("model.onnx", "model.zip", "model.safetensors", "config.json"):
            assert (sys_dir / "export" / f).exists(), (name, f)
        assert len((sys_dir / "embeddings" / "test" / "embeddings.scp").read_text()
                   .splitlines()) == 12
        assert len((sys_dir / "embeddings" / "outside" / "test" / "embeddings.scp")
                   .read_text().splitlines()) == 8
        assert len((sys_dir / "embeddings" / "cohort" / "speaker_embeddings.scp").read_text()
                   .splitlines()) == 8
        summary = (sys_dir / "score" / "summary.txt").read_text().splitlines()
        assert [l.split(":")[0] for l in summary] == [
            f"{name} trials cosine", f"{name} trials cosine + AS-Norm top 4",
            f"{name} outside_trials cosine", f"{name} outside_trials cosine + AS-Norm top 4"]
        for line, counts in zip(summary, ["66 trials \\(12 target\\)"] * 2 +
                                ["28 trials \\(4 target\\)"] * 2):
            assert re.search(r"EER \d+\.\d\d% minDCF\(0\.01\) \d\.\d{3} minDCF\(0\.05\) "
                             r"\d\.\d{3} over " + counts + "$", line), line
            assert line in result.stdout
        assert json.loads((sys_dir / "score" / "outside_trials" / "result.json").read_text())[
            "trials"] == str(data / "outside" / "test" / "trials")
    import yaml
    assert yaml.safe_load((tmp / "exp" / "config.yaml").read_text())["model"]["type"] == "ecapa_tdnn"
    assert "initialised model, head from" in result.stderr      # fine-tuning kept the head
    # The floor: the training loss falls although the AAM margin ramps up under it (with
    # the learning rate at 0 the ramp raises it, 17.5 -> 21.0). The test voices are not
    # learned at this size: the test EER stays near an untrained extractor's.
    log = (tmp / "exp" / "log" / "train.rank0.log").read_text()
    losses = [float(v) for v in re.findall(r" step \d+/\d+ loss ([-0-9.]+)", log)]
    assert len(losses) >= 3 and losses[-1] < 0.95 * losses[0], losses
    assert result.stderr.count("parity onnx vs PyTorch") == 3
    # The shipped encoder, scored alike on the same lists, and Resemblyzer beside both.
    shipped = tmp / "ecapa-voicebank-v1"
    lines = (shipped / "score" / "summary.txt").read_text().splitlines()
    assert [l.split(":")[0] for l in lines] == [
        "ecapa-voicebank-v1 trials cosine", "ecapa-voicebank-v1 trials cosine + AS-Norm top 4",
        "ecapa-voicebank-v1 outside_trials cosine",
        "ecapa-voicebank-v1 outside_trials cosine + AS-Norm top 4"]
    table = (tmp / "resemblyzer" / "results.md").read_text()
    for system in ("| resemblyzer |", "| exp: cosine |", "| exp_lm: cosine |",
                   "| ecapa-voicebank-v1: cosine |"):
        assert table.count(system) == 2, (system, table)


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
    result = run_tree(cmd, 300, env=ENV)
    assert result.returncode == status, result.stderr[-3000:]
    return result


def tree(root):
    """relative path -> bytes of every file the generator wrote (paths made relative)."""
    return file_tree(root)


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
    require_engine("festival")
    refused = synth(tmp_path / "full", "--engines", "espeak,festival", status=2)
    assert "error: festival is reserved for the unseen-engine test" in refused.stderr
    assert "--test-only" in refused.stderr and not (tmp_path / "full").exists()
    synth(tmp_path / "fest", "--nj", "2", "--engines", "espeak,festival", "--test-only")
    assert sorted(os.listdir(tmp_path / "fest")) == [".synth_speaker_data.json", "test",
                                                      "voices.tsv", "wavs"]
    test_voices = read_table(tmp_path / "fest" / "test" / "spk2voice")
    festival = {k for k, v in test_voices.items() if v.startswith("festival ")}
    # every festival voice, beside the 3 espeak-ng speakers the full corpus holds out
    assert len(festival) == 3 and len(test_voices) == 3 + 3
    trials = {n: (tmp_path / "fest" / "test" / n).read_text().splitlines()
              for n in ("trials", "trials_espeak", "trials_festival")}
    assert len(trials["trials"]) == 12 * 11 // 2
    assert len(trials["trials_festival"]) == 6 * 5 // 2
    assert all(line.startswith("festival_") and line.split()[1].startswith("festival_")
               for line in trials["trials_festival"])


# ------------------------------------------------------------------ the voice bank

FESTIVAL = tuple(Voice(f"festival_{v}", "festival", v)
                 for v in ("kal_diphone", "ked_diphone", "cmu_us_slt_arctic_hts"))
FLITE = tuple(Voice(f"flite_{v}", "flite", v) for v in ("kal16", "awb", "rms", "slt"))
# An engine of fixed voices that may train (flite's are reserved: festival's speakers).
MBROLA = tuple(Voice(f"mbrola_{v}", "mbrola", v) for v in ("us1", "us2", "us3", "en1"))
BANK_SIZES = sc.Sizes(train_speakers=20, dev_speakers=8, test_speakers=8, train_utts=3,
                      dev_utts=2, test_utts=2)
KOKORO_SIZING = {"kokoro": sc.EngineSizing(train_utts=2, words=(3, 5))}


def plan_bank(tmp, engines, voices, test_only=False, blends=40, sizing=KOKORO_SIZING):
    """The speaker generator's plan (no synthesis: Kokoro need not be installed)."""
    tmp.mkdir()
    splits = ("test",) if test_only else sc.SPLITS
    groups, speakers, _ = sc.plan_corpus(777, BANK_SIZES, sc.SNR_DB,
                                         Engines(engines, tuple(voices), test_only), str(tmp),
                                         splits, blends, sizing)
    return groups, {s: [p.voice for p in ps] for s, ps in speakers.items()}


def test_kokoro_blends_are_speakers_that_never_hold_a_reserved_voice(tmp_path):
    groups, by_split = plan_bank(tmp_path / "a", ("espeak", "kokoro"), kokoro_voices())
    kokoro = {s: [v for v in vs if v.engine == "kokoro"] for s, vs in by_split.items()}
    blends = {s: [v for v in vs if v.mix] for s, vs in kokoro.items()}
    assert sum(len(b) for b in blends.values()) == 40
    assert len(blends["dev"]) == len(blends["test"]) == 2          # 5 % each
    # The 21 unreserved voices all train: every one is in some blend.
    bases = {v.name for v in kokoro["train"] if not v.mix}
    assert len(bases) == 21 and {n for b in blends["train"] for n in b.components} <= bases
    assert all(v.mix for s in ("dev", "test") for v in kokoro[s])
    spoken = [s for g in groups for s in list(g.specs) + list(g.babble)]
    assert not any(is_reserved(s.voice) for s in spoken)
    # espeak-ng's sizes as asked, the Kokoro speakers on top of them
    espeak = {s: [v for v in vs if v.engine == "espeak"] for s, vs in by_split.items()}
    assert [len(espeak[s]) for s in sc.SPLITS] == [20, 8, 8]
    # Kokoro's own sizing: 2 training utterances of 3-5 words; its dev/test the splits'
    for g in groups:
        for spec in g.specs:
            if spec.voice.engine == "kokoro":
                assert 3 <= len(spec.text.split()) <= 5
        # babble is spoken by espeak-ng: a Kokoro sentence costs a CPU-second
        assert {b.voice.engine for b in g.babble} == {"espeak"}
    per_spk = {}
    for g in groups:
        for spec in g.specs:
            per_spk[(g.split, spec.spk)] = per_spk.get((g.split, spec.spk), 0) + 1
    for split, utts in (("train", 2), ("dev", 2), ("test", 2)):
        assert {n for (s, spk), n in per_spk.items() if s == split and spk.startswith(
            "kokoro_")} == {utts}
    assert {n for (s, spk), n in per_spk.items() if s == "train" and
            not spk.startswith("kokoro_")} == {3}


def test_each_engine_holds_out_its_own_voices_whatever_else_is_named(tmp_path):
    alone = sc.split_engine_voices(MBROLA, 777)
    together = sc.split_engine_voices(MBROLA + tuple(kokoro_voices()[:10]), 777)
    for split in sc.SPLITS:
        assert [v for v in together[split] if v.engine == "mbrola"] == alone[split]
    assert [len(alone[s]) for s in sc.SPLITS] == [2, 1, 1]
    # and in a whole plan: mbrola's held-out test voice with or without Kokoro and blends
    _, a = plan_bank(tmp_path / "a", ("espeak", "mbrola"), MBROLA, blends=0, sizing={})
    _, b = plan_bank(tmp_path / "b", ("espeak", "mbrola", "kokoro"),
                     MBROLA + tuple(kokoro_voices()))
    for split in sc.SPLITS:
        assert any(v.engine == "mbrola" for v in a[split]), split
        assert [v for v in a[split] if v.engine != "kokoro"] == \
            [v for v in b[split] if v.engine != "kokoro"]


def test_a_test_only_corpus_is_the_reserved_voices_and_the_held_out_ones(tmp_path):
    voices = FESTIVAL + FLITE + tuple(kokoro_voices())
    engines = ("espeak", "festival", "flite", "kokoro")
    groups, only = plan_bank(tmp_path / "only", engines, voices, test_only=True)
    _, full = plan_bank(tmp_path / "full", ("espeak", "kokoro"), tuple(kokoro_voices()))
    test = {v.spk for v in only["test"]}
    reserved_kokoro = {v.spk for v in kokoro_voices() if is_reserved(v)}
    assert len(reserved_kokoro) == 7
    held_out = {v.spk for v in full["test"] if v.engine == "espeak"}
    # flite's voices are festival's speakers: all of them reserved, as festival's are
    assert test == reserved_kokoro | {v.spk for v in FESTIVAL + FLITE} | held_out
    # Kokoro is heard through its reserved voices alone: no blend, no unreserved voice
    assert not any(v.mix for v in only["test"])
    assert {g.split for g in groups} == {"test"}


def test_trial_lists_per_engine_beside_every_pair(tmp_path):
    specs = [sc.UttSpec(f"{spk}-{u}", spk, "a b", Voice(spk, engine, spk), 175, 50, 50)
             for spk, engine in (("e1", "espeak"), ("e2", "espeak"), ("k1", "kokoro"),
                                 ("k2", "kokoro"), ("f1", "flite")) for u in range(2)]
    names = sc.write_test_trials(str(tmp_path), specs, 777)
    assert names == ["trials", "trials_espeak", "trials_kokoro"]   # flite: one speaker
    rows = {n: [line.split() for line in (tmp_path / n).read_text().splitlines()]
            for n in names}
    assert len(rows["trials"]) == 10 * 9 // 2
    engine_of = {s.utt: s.voice.engine for s in specs}
    cross = [r for r in rows["trials"] if engine_of[r[0]] != engine_of[r[1]]]
    assert len(cross) == 45 - 6 - 6 - 1 and {r[2] for r in cross} == {"nontarget"}
    for engine in ("espeak", "kokoro"):
        own = rows[f"trials_{engine}"]
        assert len(own) == 6 and sum(r[2] == "target" for r in own) == 2
        assert all(engine_of[r[0]] == engine_of[r[1]] == engine for r in own)
    single = tmp_path / "single"        # one engine alone: the list of every pair only
    single.mkdir()
    assert sc.write_test_trials(str(single), specs[:4], 777) == ["trials"]


def test_bank_options_are_checked_before_any_work(tmp_path):
    cases = [
        (["--engine-words", "espeak=x"], "error: --engine-words: espeak=x is not a range"),
        (["--engine-train-utts", "espeak"], "error: --engine-train-utts: expected ENGINE=VALUE"),
        (["--engine-train-utts", "flite=3"], "error: sizes given for the engine 'flite', "
                                             "which --engines does not name (espeak)"),
        (["--engine-train-utts", "espeak=1"], "error: espeak: training utterances per "
                                              "speaker must be 2-1000, got 1"),
        (["--engine-words", "espeak=9-3"], "error: espeak: words per utterance must be"),
        (["--blends", "3"], "error: 3 blended voices asked for, but none of the engines "
                            "espeak mixes voices (kokoro does)"),
        (["--blends", "-1"], "error: blends must be >= 0, got -1"),
    ]
    for args, line in cases:
        out = tmp_path / "out"
        result = synth(out, *args, status=2)
        errors = [l for l in result.stderr.splitlines() if l.startswith("error:")]
        assert len(errors) == 1 and errors[0].startswith(line), (args, result.stderr[-500:])
        assert "Traceback" not in result.stderr and not (out / "train").exists()


def test_a_real_outside_test_set_of_the_reserved_kokoro_voices(tmp_path):
    """The real engine, at one or two words a clip (a clip costs about a CPU-second)."""
    require_engine("kokoro")
    out = tmp_path / "outside"
    result = synth(out, "--test-only", "--engines", "espeak,kokoro", "--num-test-speakers", "2",
                   "--engine-words", "kokoro=1-2")
    rows = [line.split("\t") for line in (out / "voices.tsv").read_text().splitlines()[1:]]
    kokoro = sorted(r[3] for r in rows if r[2] == "kokoro")
    assert kokoro == sorted(v.name for v in kokoro_voices() if is_reserved(v))
    assert len([r for r in rows if r[2] == "espeak"]) == 2
    assert "test/trials_kokoro: 91 trials (7 target)" in result.stderr
    import soundfile
    for line in (out / "test" / "wav.scp").read_text().splitlines():
        audio, rate = soundfile.read(line.split()[1])
        assert rate == 16000 and len(audio) > 0.3 * rate
