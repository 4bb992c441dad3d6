"""The speech-codec recipe end to end at a tiny size through the real run.sh (synthetic
speech from the voice bank and its outside test set, data lists, two gloo ranks through
torchrun with both training phases, averaging, export with parity, evaluation of both test
sets against the baselines), and the speech generator it uses: byte-identical output for a
seed whatever nj, train/dev/test voices that never meet, Kokoro's blends and reserved
voices. Kokoro speaks in the recipe run when tools/install_voices.sh has installed it;
otherwise the outside test set is espeak-ng's held-out voices (the same stages)."""
import filecmp
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from installed import require_engine
from process_tree import run_tree

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RECIPE = os.path.join(ROOT, "egs", "tts_codec", "s0")

# The from-scratch config, shrunk: 4 steps (the adversarial phase starts at step 3 of 4),
# a checkpoint per step for the averaging, 0.25 s segments. (The default config fine-tunes
# the shipped codec: test_default_config_fine_tunes_the_shipped_codec.)
TINY_OVERRIDES = " ".join([
    "training.max_steps=4", "training.save_interval_steps=1", "training.val_interval_steps=2",
    "training.log_interval=1", "model.channels=4", "model.dilations=[1]",
    "task.segment_seconds=0.25", "task.eval_seconds=0.5", "dataset.batch_size=2",
    "dataset.num_workers=1", "discriminator.mpd.channels_scale=0.03"])
# The voice bank as the recipe uses it: espeak-ng and Kokoro voices and blends in training,
# Kokoro's reserved voices as the outside test set (tools/test.sh installs Kokoro).
ENGINES = ["--engines", "espeak,kokoro", "--blends", "2", "--test-engines", "kokoro"]
# Over conf/corpus.yaml: the training corpus's sizes, and Kokoro speaking half of it.
CORPUS_OPTS = "--num-train 6 --num-dev 2 --num-test 2 --other-share 0.5"
TINY = ["--config", "conf/codec_scratch.yaml", "--corpus-opts", CORPUS_OPTS, "--num-test-reserved", "2", "--random-voices", "2",
        "--max-voices", "6", "--nj", "1", "--eval-max-utts", "1",
        "--train-overrides", TINY_OVERRIDES, *ENGINES]


def run_recipe(tmp, *args, timeout=600):
    cmd = ["bash", os.path.join(RECIPE, "run.sh"), "--data", str(tmp / "data"),
           "--exp", str(tmp / "exp"), *TINY, *args]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return run_tree(cmd, timeout, env=env)


@pytest.fixture(scope="module")
def recipe_run(tmp_path_factory):
    require_engine("kokoro")
    tmp = tmp_path_factory.mktemp("codec_recipe")
    (tmp / "shipped").mkdir()
    result = run_recipe(tmp, "--stop-stage", "8", "--pretrained-root", str(tmp / "shipped"),
                        "--pretrained-name", "tiny-codec")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    return tmp, result


def table_rows(markdown: str):
    return [line for line in markdown.splitlines()
            if line.startswith("| ") and "---" not in line][1:]


def test_every_stage_writes_its_outputs(recipe_run):
    tmp, result = recipe_run
    data, exp = tmp / "data", tmp / "exp"
    for split in ("train", "dev", "test"):
        check = subprocess.run([sys.executable, "-m", "toolkit.bin.validate_data_dir",
                                str(data / split)], capture_output=True, text=True, timeout=120)
        assert check.returncode == 0, check.stdout + check.stderr
        entries = [json.loads(line) for line in (data / split / "data.list").read_text().splitlines()]
        keys = (data / split / "wav.scp").read_text().split("\n")
        assert len(entries) == len([k for k in keys if k]) == {"train": 6, "dev": 2, "test": 2}[split]
        assert all(os.path.exists(e["wav"]) and e["duration"] > 0.5 for e in entries)
    assert not (data / "train_noisy").exists()          # noisy=false by default
    # The outside test set: Kokoro's reserved voices (or espeak-ng's held-out ones).
    reserved = [json.loads(line) for line in
                (data / "reserved" / "test" / "data.list").read_text().splitlines()]
    assert len(reserved) == 2 and all(os.path.exists(e["wav"]) for e in reserved)
    from toolkit.voicebank import RESERVED_VOICES
    rows = [line.split("\t") for line in (data / "voices.tsv").read_text().splitlines()[1:]]
    outside = [line.split("\t") for line in
               (data / "reserved" / "voices.tsv").read_text().splitlines()[1:]]
    assert not {(r[2], r[3]) for r in rows} & RESERVED_VOICES
    assert outside and {(r[2], r[3]) for r in outside} <= RESERVED_VOICES
    assert {r[2] for r in rows if r[1] == "train"} == {"espeak", "kokoro"}
    assert any(r[4] != "-" for r in rows)               # blends, with their weights
    # Two gloo ranks trained both phases; the last 3 checkpoints were averaged.
    log = (exp / "log" / "train.rank0.log").read_text()
    assert "world=2" in log and (exp / "log" / "train.rank1.log").exists()
    assert (exp / "config.yaml").exists() and (exp / "avg_3.pt").exists()
    from toolkit.trainer.checkpoint import list_checkpoints, load_payload
    assert max(c.step for c in list_checkpoints(str(exp))) == 4
    final = load_payload(str(exp / "avg_3.pt"))
    assert set(final["modules"]) >= {"generator"}
    # Export: every format, checked against PyTorch.
    export = exp / "export"
    assert sorted(os.listdir(export)) == ["config.json", "decoder.onnx", "decoder.zip",
                                          "encoder.onnx", "encoder.zip", "model.safetensors"]
    assert "max diff" in result.stderr
    from toolkit.export import read_metadata
    meta = read_metadata(str(export / "encoder.onnx"))
    assert meta["task"] == "codec" and meta["n_codebooks"] == 6 and meta["bitrate"] == 2400.0
    # Stage 8 packaged the export with its card (both eval tables, the command quoted).
    from toolkit import pretrained
    from toolkit.tasks.codec.runtime import ExportedCodec
    shipped = str(tmp / "shipped")
    assert pretrained.available(shipped) == ["tiny-codec"]
    card = (tmp / "shipped" / "tiny-codec" / "README.md").read_text()
    assert "{{" not in card and "Codec2 2400" in card and "Opus 6" in card
    assert "--stop-stage 8" in card and re.search(r"at commit [0-9a-f]{40}", card)
    assert pretrained.card_sha256("tiny-codec", shipped) == pretrained.file_sha256(
        pretrained.weights("tiny-codec", root=shipped))
    wave = np.random.default_rng(0).uniform(-0.3, 0.3, 4000).astype(np.float32)
    packed = ExportedCodec(os.path.join(shipped, "tiny-codec"), "safetensors")
    assert np.array_equal(packed.encode(wave), ExportedCodec(str(export), "onnx").encode(wave))
    # Something was learned in 4 steps: on the fixed dev segments the decoded audio moved
    # towards the input (an untrained generator decodes them the same at every validation).
    dev = [dict((k, float(v)) for k, v in re.findall(r"(\w+) ([-0-9.]+)", line.split(" dev: ")[1]
                                                     .split(" over ")[0]))
           for line in log.splitlines() if " dev: " in line]
    assert len(dev) >= 2, log[-2000:]
    # Mel and STFT distances, not SI-SDR: four steps leave the waveform uncorrelated with
    # the input (SI-SDR near -50 dB either way), while its spectrum already moves.
    assert dev[-1]["mel_distance"] < dev[0]["mel_distance"], dev
    assert dev[-1]["stft_distance"] < dev[0]["stft_distance"], dev


@pytest.mark.parametrize("test_set", ["reserved", "test"])
def test_evaluation_table_has_codec_rates_and_baselines(recipe_run, test_set):
    tmp, result = recipe_run
    report = tmp / "exp" / "eval" / test_set
    rows = table_rows((report / "results.md").read_text())
    assert [r.split("|")[1].strip() for r in rows] == [
        "codec", "codec n_q=4", "codec n_q=3", "original (16-bit PCM)",
        "mel+Griffin-Lim 12 mels 50 fps 4 bit", "Codec2 2400", "Opus 6 kbit/s CBR"]
    rates = [r.split("|")[2].strip() for r in rows]
    assert rates[:6] == ["2.4", "1.6", "1.2", "256", "2.4", "2.4"]
    assert 6.0 <= float(rates[6]) <= 6.6                 # measured from the packets
    assert all(r in result.stdout for r in rows)       # stage 6 prints the table
    summary = json.loads((report / "results.json").read_text())
    assert summary["utterances"] == 1
    assert summary["metrics"] == ["mel_distance", "stft_distance", "si_sdr", "stoi", "pesq_wb",
                                  "pesq_nb", "visqol", "dnsmos_ovrl"]
    for row in summary["systems"]:
        assert all(row[k] is not None for k in summary["metrics"]), row
        assert abs(row["delay_ms"]) <= 100.0
    assert (report / "spectrograms.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_default_config_fine_tunes_the_shipped_codec(recipe_run):
    """The recipe's default config starts from the shipped codec-voicebank-v2 (every part
    loaded, the discriminators fresh): its first validation already decodes the dev set
    far closer than a fresh generator does, and it trains through the same stages."""
    tmp, _ = recipe_run
    exp = tmp / "exp_default"
    overrides = ("training.max_steps=2 training.save_interval_steps=1 training.val_interval_steps=1 "
                 "training.log_interval=1 dataset.batch_size=2 dataset.num_workers=1 "
                 "task.eval_seconds=0.5")
    run = run_recipe(tmp, "--config", "conf/codec_cpu.yaml", "--exp", str(exp), "--stage", "3",
                     "--stop-stage", "3", "--train-overrides", overrides)
    assert run.returncode == 0, run.stderr[-3000:]
    log = (exp / "log" / "train.rank0.log").read_text()
    assert re.search(r"initialised generator from \S+codec-voicebank-v2\S*model.safetensors; "
                     r"discriminator start(s)? fresh", log), log[-2000:]
    first = float(re.search(r" dev: mel_distance ([0-9.]+)", log).group(1))
    scratch = float(re.search(r" dev: mel_distance ([0-9.]+)",
                              (tmp / "exp" / "log" / "train.rank0.log").read_text()).group(1))
    assert first < 3.0 < scratch, (first, scratch)


def test_rerun_skips_finished_stages(recipe_run):
    tmp, _ = recipe_run
    before = sorted(p.name for p in (tmp / "exp").glob("ckpt-*.pt"))
    again = run_recipe(tmp, "--stop-stage", "3", timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "nothing to do" in again.stderr                # the data were complete
    assert "resumed from" in again.stderr                 # and so was the training
    assert sorted(p.name for p in (tmp / "exp").glob("ckpt-*.pt")) == before


def test_packaging_stays_in_the_experiment_unless_asked_to_ship(recipe_run):
    """Stage 8 without --pretrained-root writes $exp/pretrained/NAME, never the checkout's
    toolkit/pretrained (whose shipped model of the default name it would replace)."""
    from toolkit import pretrained
    tmp, _ = recipe_run
    shipped = pretrained.file_sha256(pretrained.weights("codec-voicebank-v1"))
    run = run_recipe(tmp, "--stage", "8", "--stop-stage", "8", timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert pretrained.available(str(tmp / "exp" / "pretrained")) == ["codec-voicebank-v1"]
    assert pretrained.file_sha256(pretrained.weights("codec-voicebank-v1")) == shipped
    # Again: the name is there now, and packaging refuses to overwrite it unasked.
    again = run_recipe(tmp, "--stage", "8", "--stop-stage", "8", timeout=300)
    assert again.returncode != 0 and "overwrite" in again.stderr, again.stderr[-2000:]
    bad = run_recipe(tmp, "--stage", "8", "--stop-stage", "8", "--ship", "yes", timeout=60)
    assert bad.returncode != 0 and "--ship yes" in bad.stderr


# --------------------------------------------------------------------------- generator

def generate(out, nj, seed=3, noisy=True):
    from toolkit.tasks.codec.corpus import Sizes, generate_speech
    return generate_speech(str(out), seed=seed, sizes=Sizes(train=5, dev=2, test=2), nj=nj,
                           n_random_voices=2, max_voices=0, noisy=noisy, sentences=(1, 1))


def same_tree(a, b) -> bool:
    """Every file byte-identical, wav.scp compared with the dir prefix removed."""
    for folder, _, files in os.walk(a):
        for name in files:
            pa = os.path.join(folder, name)
            pb = os.path.join(b, os.path.relpath(pa, a))
            if name == "wav.scp":
                if open(pa).read().replace(str(a), "") != open(pb).read().replace(str(b), ""):
                    return False
            elif not filecmp.cmp(pa, pb, shallow=False):
                return False
    return True


def test_generator_is_deterministic_for_any_nj(tmp_path):
    one, two, other = tmp_path / "nj1", tmp_path / "nj2", tmp_path / "seed4"
    summary = generate(one, 1)
    generate(two, 2)
    assert same_tree(one, two) and same_tree(two, one)
    assert summary["train"]["utts"] == summary["train_noisy"]["utts"] == 5
    generate(other, 2, seed=4)
    assert open(one / "test" / "text").read() != open(other / "test" / "text").read()
    # Noisy = clean + noise: the same keys, and the noise at the SNR of utt2snr.
    import numpy as np
    import soundfile as sf
    from toolkit.voicebank.signal import active_power
    snr = dict(line.split() for line in open(one / "dev_noisy" / "utt2snr"))
    assert snr.keys() == dict(line.split() for line in open(one / "dev" / "utt2spk")).keys()
    for utt, value in snr.items():
        clean, _ = sf.read(one / "wavs" / "dev" / f"{utt}.wav")
        mixed, _ = sf.read(one / "wavs" / "dev_noisy" / f"{utt}.wav")
        measured = 10 * np.log10(active_power(clean) / np.mean((mixed - clean) ** 2))
        assert abs(measured - float(value)) < 0.2, (utt, measured, value)
    # A finished corpus is not made again.
    mtime = os.path.getmtime(one / "train" / "wav.scp")
    generate(one, 2)
    assert os.path.getmtime(one / "train" / "wav.scp") == mtime


def test_voices_of_the_splits_are_disjoint(tmp_path):
    from toolkit.voicebank.espeak import ACCENTS, espeak_voices, random_voices
    from toolkit.tasks.codec.corpus import split_voices
    pool = espeak_voices() + random_voices(40, ACCENTS, 7)
    splits = split_voices(pool, seed=7)
    names = {s: {v.spk for v in vs} for s, vs in splits.items()}
    assert not (names["train"] & names["dev"] or names["train"] & names["test"]
                or names["dev"] & names["test"])
    assert sum(len(v) for v in names.values()) == len(pool)
    for vs in splits.values():              # every accent heard in every split
        assert {v.name.split("+")[0] for v in vs} == set(ACCENTS)
    capped = split_voices(pool, seed=7, max_voices=10)
    assert [len(capped[s]) for s in ("train", "dev", "test")] == [8, 1, 1]
    # In a generated corpus: speakers by utt2spk, and the inventory agrees.
    out = tmp_path / "corpus"
    generate(out, 2, noisy=False)
    spk = {s: set(dict(line.split() for line in open(out / s / "utt2spk")).values())
           for s in ("train", "dev", "test")}
    assert not (spk["train"] & spk["dev"] or spk["train"] & spk["test"] or spk["dev"] & spk["test"])
    listed = {}
    for line in open(out / "voices.tsv").readlines()[1:]:
        name, split, engine = line.split("\t")[:3]
        listed.setdefault(split, set()).add(name)
        assert engine == "espeak"
    assert listed == spk
    assert not (out / "train_noisy").exists()


def test_named_engines_only(tmp_path, monkeypatch):
    from toolkit.tasks.codec.corpus import Sizes, generate_speech
    from toolkit.voicebank import SynthError
    from toolkit.voicebank.corpus import check_engines
    from toolkit.voicebank.engines import FestivalEngine
    assert check_engines(["espeak"]) == ["espeak"]
    # An engine named but missing stops before any work, in one message.
    monkeypatch.setattr(FestivalEngine, "unavailable_reason",
                        classmethod(lambda cls: "no `text2wave` on PATH"))
    with pytest.raises(SynthError, match="festival was asked for"):
        generate_speech(str(tmp_path / "x"), sizes=Sizes(2, 1, 1), engines=["espeak", "festival"])
    assert not (tmp_path / "x").exists()
    with pytest.raises(SynthError, match="unknown TTS engine"):
        check_engines(["espeak", "nosuch"])


def plan_with_bank(tmp_path, names, voices, test_only=False, blends=12, other_share=0.5,
                   sizes=(60, 20, 30)):
    """codec.plan_corpus over espeak-ng and Kokoro's voice list (planning needs no Kokoro
    model: its voices and blends are names and weights)."""
    from toolkit.tasks.codec import corpus as codec
    from toolkit.voicebank.corpus import Engines
    tmp = tmp_path / ("only" if test_only else "full")
    tmp.mkdir()
    splits = ("test",) if test_only else ("train", "dev", "test")
    return codec.plan_corpus(777, codec.Sizes(*sizes), (5.0, 25.0),
                             Engines(tuple(names), tuple(voices), test_only), 0, 0, (1, 1),
                             str(tmp), splits, other_share, blends)


def test_bank_blends_train_their_voices_and_reserved_voices_stay_out(tmp_path):
    from toolkit.voicebank import RESERVED_VOICES, is_reserved
    from toolkit.voicebank.kokoro import kokoro_voices
    bank = kokoro_voices()
    groups, by_split, _ = plan_with_bank(tmp_path, ("espeak", "kokoro"), bank)
    spoken = {s: [spec.voice for g in groups if g.split == s for spec in g.specs]
              for s in ("train", "dev", "test")}
    blends = [v for vs in by_split.values() for v in vs if v.mix]
    assert blends and all(v.engine == "kokoro" for v in blends)
    bases = {name for b in blends for name in b.components}
    train_kokoro = {v.name for v in by_split["train"] if v.engine == "kokoro" and not v.mix}
    assert bases <= train_kokoro             # a blend's voices are all heard in training
    for split, voices in by_split.items():
        assert not any(is_reserved(v) for v in voices), split
        assert not any(("kokoro", n) in RESERVED_VOICES for v in voices for n in v.components)
        if split != "train":                 # no held-out voice is inside a training blend
            assert not {v.name for v in voices if v.engine == "kokoro" and not v.mix} & bases
            assert any(v.mix for v in voices), split
    # Kokoro speaks about --other-share of the utterances (drawn per utterance).
    share = sum(v.engine == "kokoro" for v in spoken["train"]) / len(spoken["train"])
    assert 0.35 <= share <= 0.65, share
    everyone = [v.spk for vs in by_split.values() for v in vs]
    assert len(everyone) == len(set(everyone))          # no voice in two splits
    # The outside test set: --test-only --engines kokoro is the seven reserved voices alone.
    groups, only, _ = plan_with_bank(tmp_path, ("kokoro",), bank, test_only=True)
    kokoro_reserved = {(e, n) for e, n in RESERVED_VOICES if e == "kokoro"}
    assert {(v.engine, v.name) for v in only["test"]} == kokoro_reserved
    assert {spec.voice.name for g in groups for spec in g.specs} == \
        {name for _, name in kokoro_reserved}


def test_bank_arguments_are_checked(tmp_path):
    from toolkit.tasks.codec.corpus import Sizes, generate_speech
    from toolkit.voicebank import SynthError
    for kwargs, message in (({"other_share": 1.5}, r"other-engine share 1\.5 is outside"),
                            ({"blends": -1}, "blends must be >= 0"),
                            ({"blends": 3}, "none of the engines espeak mixes voices")):
        with pytest.raises(SynthError, match=message):
            generate_speech(str(tmp_path / "x"), sizes=Sizes(2, 1, 1), noisy=False, **kwargs)
    res = subprocess.run([sys.executable, "-m", "toolkit.bin.synth_codec_data", "--out-dir",
                          str(tmp_path / "y"), "--blends", "2"], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 2 and res.stderr.strip().splitlines()[-1].startswith("error: ")
    assert not (tmp_path / "y" / "train").exists()
