"""Tests of the TTS layer (toolkit.voicebank) and the synthetic wake-word corpus on top of it
(toolkit.tasks.kws.corpus)."""
import collections
import json
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest
import soundfile as sf

from toolkit.data.audio import resample
from toolkit.tasks.kws import corpus as S, corpus_render as R, corpus_text as T
from toolkit.voicebank import SynthError, Voice, espeak as E, flite as F, signal as sig
from toolkit.voicebank.corpus import open_engines
from toolkit.voicebank.engines import ENGINES, engine_class
from toolkit.voicebank.render import Renderer
from file_tree import file_digests
from installed import require_engine


KW = "hey snips"
SIZES = S.Sizes(train_pos=10, train_neg=30, dev_pos=6, dev_neg=10, test_pos=6, test_neg=14)
FILES = ("wav.scp", "text", "utt2dur", "utt2spk", "spk2utt", "utt2kind")


def _generate(path, seed=777, nj=2, keywords=(KW,), sizes=SIZES):
    # espeak-ng only (the default, spelled out): an installed flite is never looked at.
    S.generate_corpus(list(keywords), str(path), seed=seed, sizes=sizes, nj=nj,
                      engines=("espeak",))
    return str(path)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return _generate(tmp_path_factory.mktemp("a") / "data", nj=2)


@pytest.fixture(scope="module")
def corpus_nj1(tmp_path_factory):
    return _generate(tmp_path_factory.mktemp("b") / "data", nj=1)


def _table(path):
    with open(path, encoding="utf-8") as f:
        return [line.rstrip("\n").split(" ", 1) for line in f]


def _dict(path):
    return {k: v for k, v in _table(path)}


def _digest(out_dir):
    """sha256 of every output file; absolute paths in wav.scp made relative."""
    return file_digests(out_dir, relative_in=("wav.scp",))


def test_data_dirs_well_formed(corpus):
    assert open(os.path.join(corpus, "dict", "keywords.txt")).read() == KW + "\n"
    assert open(os.path.join(corpus, "dict", "tts_engines")).read() == "espeak 1\n"
    with open(os.path.join(corpus, S.STAMP_NAME), encoding="utf-8") as f:
        stamp = json.load(f)
    assert stamp["engines"] == ["espeak"] and stamp["engine_voices"] == {}
    for split in S.SPLITS:
        d = os.path.join(corpus, split)
        tables = {n: _table(os.path.join(d, n)) for n in FILES}
        keys = [k for k, _ in tables["wav.scp"]]
        pos, neg = SIZES.of(split)
        accents = round(S.ACCENT_SHARE * pos) if split == "test" else 0
        assert len(keys) == pos + neg + accents
        assert keys == sorted(keys) and len(set(keys)) == len(keys)   # C-locale order
        for n in ("text", "utt2dur", "utt2spk", "utt2kind"):
            assert [k for k, _ in tables[n]] == keys, n
        spk_of = dict(tables["utt2spk"])
        spks = [spk_of[k] for k in keys]
        assert spks == sorted(spks), "Kaldi: speakers must be sorted when utterances are"
        assert all(k.startswith(spk_of[k] + "-") for k in keys)
        spk2utt = {s: u.split() for s, u in tables["spk2utt"]}
        assert list(spk2utt) == sorted(spk2utt)
        assert sorted(u for us in spk2utt.values() for u in us) == keys
        assert all(spk_of[u] == s for s, us in spk2utt.items() for u in us)
        durs = dict(tables["utt2dur"])
        for k, path in tables["wav.scp"]:
            assert os.path.isabs(path) and path.endswith(f"wavs/{split}/{k}.wav")
            info = sf.info(path)
            assert (info.samplerate, info.channels, info.subtype) == (16000, 1, "PCM_16")
            assert abs(info.frames / 16000 - float(durs[k])) < 0.0006
            assert 0.8 < info.frames / 16000 < 6.0


def test_keyword_times_of_positives(corpus):
    """kw_times: one span per positive, inside the audio, after the leading silence; the
    keyword-alone positives end their span where the speech ends (espeak's END)."""
    for split in S.SPLITS:
        d = os.path.join(corpus, split)
        kind, text, dur = (_dict(os.path.join(d, n)) for n in ("utt2kind", "text", "utt2dur"))
        spans = {k: tuple(map(float, v.split())) for k, v in _table(os.path.join(d, "kw_times"))}
        assert sorted(spans) == sorted(k for k, v in kind.items() if v == "pos")
        for k, (start, end) in spans.items():
            assert S.SILENCE_S[0] - 0.01 <= start < end <= float(dur[k]) - S.SILENCE_S[0] + 0.01
            assert end - start > 0.25, (k, text[k], start, end)      # "hey snips" takes time
            if text[k] == KW:
                assert float(dur[k]) - end <= S.SILENCE_S[1] + 0.01


def test_keyword_span_of_words():
    starts = [(1, 0), (6, 2205), (10, 8820), (16, 17640)]       # "okay hey snips turn it"
    text = "okay hey snips turn it"                              # "it" has no onset event
    # 22050 -> 16000 Hz; 100 output samples of leading silence trimmed; 30000 kept
    span = R.keyword_span(text, (1, 3), starts, 22050, 16000, (100, 30100))
    assert span == pytest.approx(((1600 - 100) / 16000, (12800 - 100) / 16000))
    assert R.keyword_span(text, (1, 4), starts, 22050, 16000, (100, 30100)) is None  # no "it"
    assert R.keyword_span("okay hey snips", (1, 3), starts[:3], 22050, 16000, (0, 20000)) \
        == pytest.approx((1600 / 16000, 20000 / 16000))          # last words: end of speech
    assert R.word_char_starts("okay hey  snips") == [1, 6, 11]


def test_voices_disjoint(corpus):
    spk = {s: set(_dict(os.path.join(corpus, s, "utt2spk")).values()) for s in S.SPLITS}
    assert not spk["test"] & (spk["train"] | spk["dev"])
    assert not spk["dev"] & spk["train"]
    voices = S.split_voices(E.espeak_voices(), 777)
    names = {s: {v.spk for v in vs} for s, vs in voices.items()}
    assert not names["test"] & (names["train"] | names["dev"]) and not names["dev"] & names["train"]
    assert sum(len(v) for v in names.values()) == len(E.ACCENTS) * len(E.VARIANTS)
    for split in S.SPLITS:   # every split hears every accent
        assert {n.split("_")[0] for n in names[split]} == set(E.ACCENTS)


def test_texts(corpus):
    kw = KW.split()
    conf_texts = set()
    for split in S.SPLITS:
        text = _dict(os.path.join(corpus, split, "text"))
        kind = _dict(os.path.join(corpus, split, "utt2kind"))
        cats = _dict(os.path.join(corpus, split, "utt2cat"))
        # accent variants ("hey snops") are in the test split only, and never negatives
        assert set(kind.values()) == {"conf", "neg", "noise", "pos"} | \
            ({"accent"} if split == "test" else set())
        assert {k for k, v in kind.items() if v in ("conf", "accent")} == set(cats)
        for k, t in text.items():
            words = t.split()
            if kind[k] == "pos":
                assert T.contains_phrase(words, kw), t
            elif kind[k] == "accent":
                assert cats[k] == "accent" and not T.contains_phrase(words, kw), t
            else:
                assert not T.contains_phrase(words, kw), t
            if kind[k] == "noise":
                assert t == S.NOISE_TEXT
            else:
                assert t == t.lower() and t == " ".join(words)
            if kind[k] == "conf":
                conf_texts.add(t)
    assert {"hey", "snips"} <= conf_texts   # each keyword word alone is a confusable


def test_confusable_generator():
    cats = T.confusable_categories("hey snips")
    assert cats["alone"] == ["hey", "snips"] and cats["reorder"] == ["snips hey"]
    # consonants changed; "hey snaps" changes a vowel only: an accent's, not a neighbour
    assert {"say snips", "hey slips"} <= set(cats["real_word"])
    assert "hey snaps" not in cats["real_word"] and "hey snops" in T.accent_variants("hey snips")
    keywords = ["hey snips", "ok computer", "alexa"]
    filt = T.TextFilter(keywords, {})          # words only: no espeak needed
    cats = {k: T.confusable_categories(k) for k in keywords}
    rng = np.random.default_rng(0)
    seen = set()
    for i in range(300):
        text, category = T.confusable_text(i, rng, keywords, cats, filt)
        words = text.split()
        seen.add(category)
        assert not any(T.contains_phrase(words, k.split()) for k in keywords)
        assert text not in {a for k in keywords for a in T.accent_variants(k)}
    assert seen == {"alone", "reorder", "real_word", "inside_word", "cross_boundary"}
    for i in range(50):
        words = T.negative_text(rng, filt).split()
        assert 2 <= len(words) <= 8


def test_sound_filter_rejects_homophones():
    filt = T.TextFilter(["hey snips"], {"en": {"hey": "heI", "hay": "heI", "snips": "snIps",
                                                "snaps": "snaps"}})
    assert not filt.is_negative("hay snips")       # sounds like the keyword
    assert filt.is_negative("hay snaps") and filt.is_negative("snips hey")


def test_plan_is_deterministic_and_in_range():
    voices = S.split_voices(E.espeak_voices(), 5)["train"]
    filt = T.TextFilter([KW], {})
    cats = {KW: T.confusable_categories(KW)}

    def plan(seed):
        return S.plan_split("train", 50, 150, [KW], voices, filt, cats, seed, (5.0, 30.0))

    a, b, c = plan(1), plan(1), plan(2)
    assert [g.specs for g in a] == [g.specs for g in b] != [g.specs for g in c]
    # the keyword's 50 positives and 45 confusables, then the 105 general negatives
    assert [len(g.specs) for g in a] == [64, 31, 64, 41]
    specs = [s for g in a for s in g.specs]
    assert len({s.utt for s in specs}) == 200
    speech = [s for s in specs if s.kind != "noise"]
    assert all(5.0 <= s.snr_db <= 30.0 for s in speech)
    assert all(s.voice in voices for s in speech)
    assert {s.noise for s in specs} == set(S.NOISE_TYPES)
    assert sum(s.kind == "noise" for s in specs) == 15


def test_train_mix_shifts_confusables_to_whole_keyword_homophones():
    voices = S.split_voices(E.espeak_voices(), 5)
    filt = T.TextFilter([KW, "alexa"], {})
    cats = {k: T.confusable_categories(k) for k in (KW, "alexa")}

    def texts(split, **mix):
        groups = S.plan_split(split, 100, 1000, [KW, "alexa"], voices[split], filt, cats, 7,
                              (5.0, 30.0), **mix)
        return [(s.kind, s.text) for g in groups for s in g.specs]

    base = texts("train")
    mixed = texts("train", conf_share=0.5, hard_share=0.5)
    substitutes = {t for k in (KW, "alexa") for c in T.HARD for t in cats[k][c]}
    n_conf = sum(k == "conf" for k, _ in mixed)
    n_hard = sum(k == "conf" and t in substitutes for k, t in mixed)
    n_hard_base = sum(k == "conf" and t in substitutes for k, t in base)
    assert sum(k == "conf" for k, _ in base) == 300 and n_conf == 500
    assert sum(k == "noise" for k, _ in mixed) == 100 and len(mixed) == 1100
    # half are drawn from the whole-keyword homophones, and the in-turn walk adds more
    assert 0.5 * n_conf <= n_hard <= 0.75 * n_conf and n_hard > 2.5 * n_hard_base
    # both keywords get them: real-word neighbours of the phrase and of the one-word keyword
    assert {t for k, t in mixed if k == "conf"} & set(cats["alexa"]["real_word"])
    assert {t for k, t in mixed if k == "conf"} & set(cats[KW]["real_word"])
    assert not any(T.contains_phrase(t.split(), kw.split()) for _, t in mixed if _ == "conf"
                   for kw in (KW, "alexa"))
    # a plan without the options is the plan before them (dev/test never get them)
    assert texts("train", conf_share=S.NEG_MIX["conf"], hard_share=0.0) == base
    assert texts("test") != base


def test_other_engines_speak_only_the_kinds_given():
    """--other-kinds pos: the neural engine's share goes to positives alone, and every other
    utterance is planned exactly as in a corpus the other engine never speaks in."""
    from toolkit.voicebank.kokoro import kokoro_voices
    voices = S.split_voices(E.espeak_voices(), 5)["train"] + kokoro_voices()[:4]
    filt = T.TextFilter([KW], {})
    cats = {KW: T.confusable_categories(KW)}

    def plan(**kw):
        groups = S.plan_split("train", 200, 400, [KW], voices, filt, cats, 7, (5.0, 30.0), **kw)
        return [s for g in groups for s in g.specs]

    only_pos = plan(other_share=0.5, other_kinds=("pos",))
    every_kind = plan(other_share=0.5)
    espeak_only = plan(other_share=0.0)
    kokoro = [s for s in only_pos if s.voice is not None and s.voice.engine == "kokoro"]
    assert {s.kind for s in kokoro} == {"pos"} and 70 <= len(kokoro) <= 130
    assert {s.kind for s in every_kind if s.voice and s.voice.engine == "kokoro"} == \
        {"pos", "conf", "neg"}
    # the same texts in the same order; non-positives keep their espeak-ng voices
    assert [(s.kind, s.text) for s in only_pos] == [(s.kind, s.text) for s in espeak_only]
    assert [s for s in only_pos if s.kind != "pos"] == \
        [s for s in espeak_only if s.kind != "pos"]
    assert S.check_other_kinds(["neg", "pos"]) == ("pos", "neg")
    for bad in ([], ["pos", "noise"]):
        with pytest.raises(S.SynthError, match="other-engine kinds"):
            S.check_other_kinds(bad)


def test_determinism_across_nj_and_seed(corpus, corpus_nj1, tmp_path):
    a, b = _digest(corpus), _digest(corpus_nj1)
    # WAVs, 7 tables per split, dict/keywords.txt, dict/tts_engines, voices.tsv, the stamp
    n_accent = round(S.ACCENT_SHARE * SIZES.test_pos)
    assert a == b and len(a) == sum(sum(SIZES.of(s)) for s in S.SPLITS) + n_accent + 8 * 3 + 4
    other = _digest(_generate(tmp_path / "c", seed=778))     # `corpus` but for the seed
    assert other["train/text"] != a["train/text"]
    assert other["train/wav.scp"] != a["train/wav.scp"]


def test_rerun_skips_work_and_args_change_regenerates(tmp_path):
    out = _generate(tmp_path / "e", sizes=S.Sizes(3, 3, 2, 2, 2, 2))
    wav = _table(os.path.join(out, "train", "wav.scp"))[0][1]
    mtime = os.stat(wav).st_mtime_ns
    _generate(out, nj=1, sizes=S.Sizes(3, 3, 2, 2, 2, 2))      # nj is not an output argument
    assert os.stat(wav).st_mtime_ns == mtime                    # nothing was rendered again
    _generate(out, sizes=S.Sizes(2, 2, 2, 2, 2, 2))
    assert len(_table(os.path.join(out, "train", "wav.scp"))) == 4
    assert len(os.listdir(os.path.join(out, "wavs", "train"))) == 4   # old wavs removed


def test_noise_and_levels(corpus):
    for split in S.SPLITS:
        kind = _dict(os.path.join(corpus, split, "utt2kind"))
        for k, path in _table(os.path.join(corpus, split, "wav.scp")):
            x, _ = sf.read(path)
            rms_db = 10 * np.log10(np.mean(x ** 2) + 1e-20)
            assert rms_db > -60, (k, rms_db)                   # never silent
            assert np.max(np.abs(x)) < 0.99                    # no clipping
            if kind[k] == "noise":
                # stationary noise: both halves at about the same level
                h = len(x) // 2
                assert abs(10 * np.log10(np.mean(x[:h] ** 2) / np.mean(x[h:] ** 2))) < 6


def test_mix_at_snr():
    sr = 16000
    rng = np.random.default_rng(0)
    t = np.arange(sr * 2) / sr
    # speech-like: 200 Hz harmonics in 4 Hz syllables, with a silent gap
    speech = np.sin(2 * np.pi * 200 * t) * np.maximum(0, np.sin(2 * np.pi * 4 * t)) ** 2
    speech[sr // 2: sr] = 0
    speech = np.concatenate([np.zeros(sr // 2), speech, np.zeros(sr // 2)]).astype(np.float32)
    for color in ("white", "pink", "brown"):
        for snr in (5.0, 17.5, 30.0):
            noise = sig.colored_noise(len(speech), color, rng, sr)
            mixed, scaled = sig.mix_at_snr(speech, noise, snr)
            measured = 10 * np.log10(sig.active_power(speech) / np.mean(scaled.astype(np.float64) ** 2))
            assert abs(measured - snr) < 0.05
            np.testing.assert_allclose(mixed, speech + scaled, atol=1e-6)
    pool = [speech, speech[::-1].copy(), np.roll(speech, 1234)]
    babble = sig.babble_noise(len(speech), pool, rng)
    assert abs(np.sqrt(np.mean(babble.astype(np.float64) ** 2)) - 1) < 1e-3
    # noise colours: pink falls ~3 dB/octave, brown ~6 dB/octave
    for color, slope in (("white", 0), ("pink", -3), ("brown", -6)):
        x = sig.colored_noise(sr * 4, color, rng, sr)
        f = np.fft.rfftfreq(len(x), 1 / sr)
        p = np.abs(np.fft.rfft(x)) ** 2
        band = [10 * np.log10(p[(f >= lo) & (f < 2 * lo)].mean()) for lo in (250, 500, 1000, 2000)]
        assert abs(np.mean(np.diff(band)) - slope) < 1.0, (color, band)


def test_resample():
    sr1, sr2 = 22050, 16000
    t = np.arange(sr1) / sr1
    for f in (200, 3000, 6500):
        y = resample(np.sin(2 * np.pi * f * t), sr1, sr2)
        assert len(y) == sr2
        ref = np.sin(2 * np.pi * f * np.arange(len(y)) / sr2)
        assert np.max(np.abs(y - ref)[300:-300]) < 2e-3
    y = resample(np.sin(2 * np.pi * 9500 * t), sr1, sr2)     # above 8 kHz: removed
    assert np.sqrt(np.mean(y[300:-300] ** 2)) < 1e-3
    y = resample(np.sin(2 * np.pi * 1000 * t[:8000] * sr1 / 8000), 8000, 16000)  # upsampling
    assert np.max(np.abs(y[300:-300] - np.sin(2 * np.pi * 1000 * np.arange(16000) / 16000)[300:-300])) < 2e-3


def test_errors(tmp_path, capsys):
    with pytest.raises(S.SynthError, match="empty keyword"):
        S.generate_corpus(["  "], str(tmp_path / "x"))
    with pytest.raises(S.SynthError, match="duplicate"):
        S.generate_corpus(["hey snips", "Hey  Snips"], str(tmp_path / "x"))
    with pytest.raises(S.SynthError, match="train confusable share 0.95"):
        S.generate_corpus(["hey snips"], str(tmp_path / "x"), train_conf_share=0.95)
    with pytest.raises(S.SynthError, match="hard-confusable share -0.1"):
        S.generate_corpus(["hey snips"], str(tmp_path / "x"), train_hard_share=-0.1)
    with pytest.raises(S.SynthError, match="unknown TTS engine 'nope'; known: espeak, festival"):
        S.generate_corpus(["hey snips"], str(tmp_path / "x"), engines=("espeak", "nope"))
    with pytest.raises(S.SynthError, match="named twice"):
        S.generate_corpus(["hey snips"], str(tmp_path / "x"), engines=("espeak", "espeak"))
    from toolkit.bin import synth_kws_data as cli
    assert cli.main(["--keyword", "", "--out-dir", str(tmp_path / "x")]) == 2   # UserError
    assert "empty keyword" in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "x")
    # A broken install, in a fresh interpreter: libespeak-ng is one per process, and once an
    # earlier test of this worker initialised it, initialising it again from an empty data
    # dir succeeds and speaks no phonemes.
    empty = tmp_path / "no_data"
    empty.mkdir()
    for broken, says in (("get_data_path", r"failed to initialise.*pip install -e \.\[tts\]"),
                         ("get_library_path", r"library missing.*pip install -e \.\[tts\]")):
        script = f"""
import espeakng_loader
espeakng_loader.{broken} = lambda: {str(empty / "nope")!r}
from toolkit.tasks.kws import corpus as S
try:
    S.generate_corpus(["hey snips"], {str(tmp_path / "y")!r}, sizes=S.Sizes(1, 1, 1, 1, 1, 1),
                      nj=2, engines=("espeak",))
except S.SynthError as err:
    print(err)
"""
        out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                             timeout=120)
        assert out.returncode == 0 and re.search(says, out.stdout), out.stdout + out.stderr
        assert not os.path.exists(tmp_path / "y" / S.STAMP_NAME)


def test_cli_args():
    from toolkit.bin import synth_kws_data as cli
    a = cli.get_args(["--keyword", "hey snips", "--keyword", "ok computer", "--out-dir", "d"])
    assert a.keyword == ["hey snips", "ok computer"] and a.nj == 2 and a.seed == 777
    assert a.engines == "espeak"
    assert (a.train_pos, a.train_neg, a.test_neg) == (2000, 6000, 1800)


def test_multiple_keywords(tmp_path):
    out = _generate(tmp_path / "m", keywords=("hey snips", "ok computer"),
                    sizes=S.Sizes(8, 12, 2, 2, 2, 2))
    assert open(os.path.join(out, "dict", "keywords.txt")).read() == "hey snips\nok computer\n"
    text = _dict(os.path.join(out, "train", "text"))
    kind = _dict(os.path.join(out, "train", "utt2kind"))
    hits = {k: sum(T.contains_phrase(t.split(), k.split()) for u, t in text.items()
                   if kind[u] == "pos") for k in ("hey snips", "ok computer")}
    assert hits == {"hey snips": 4, "ok computer": 4}
    for u, t in text.items():
        if kind[u] != "pos":
            assert not any(T.contains_phrase(t.split(), k.split())
                           for k in ("hey snips", "ok computer"))


FAKE_FLITE = '''#!{python}
# Stand-in for Debian flite: lists voices, writes a voiced buzz for the text, prints no
# phone segments (so it times no words); logs every call to $FAKE_FLITE_LOG. The standard
# library alone: it starts once per clip, and numpy's import cost more than the clip.
import array, math, os, sys, wave
a = sys.argv[1:]
if os.environ.get("FAKE_FLITE_LOG"):
    with open(os.environ["FAKE_FLITE_LOG"], "a") as log:
        log.write(" ".join(a) + "\\n")
if "-lv" in a:
    print("Voices available: kal awb_time kal16 awb rms slt")
    sys.exit(0)
text, out = a[a.index("-t") + 1], a[a.index("-o") + 1]
stretch = float([x for x in a if x.startswith("duration_stretch=")][0].split("=")[1])
n = int(16000 * 0.25 * len(text.split()) * stretch)
buzz = array.array("h")
for i in range(n):
    s = math.sin(2 * math.pi * 120 * i / 16000)
    buzz.append(round(32767 * 0.3 * ((s > 0) - (s < 0)) * math.sin(math.pi * 4 * i / 16000) ** 2))
with wave.open(out, "wb") as w:
    w.setnchannels(1)
    w.setsampwidth(2)
    w.setframerate(16000)
    w.writeframes(buzz.tobytes())
'''
# A test-only corpus (flite is reserved): its test split alone is rendered. Its flite share
# (seed 777): 3 voices, 6 keyword-alone positives and 3 in a carrier sentence.
FLITE_SIZES = S.Sizes(train_pos=8, train_neg=4, dev_pos=8, dev_neg=4, test_pos=32, test_neg=6)


@pytest.fixture(scope="module")
def fake_flite_dir(tmp_path_factory):
    bindir = tmp_path_factory.mktemp("fake_flite")
    exe = bindir / "flite"
    exe.write_text(FAKE_FLITE.format(python=sys.executable))
    exe.chmod(0o755)
    return str(bindir)


@pytest.fixture
def flite_on_path(fake_flite_dir, monkeypatch):
    monkeypatch.setenv("PATH", f"{fake_flite_dir}{os.pathsep}{os.environ['PATH']}")
    return fake_flite_dir


@pytest.fixture(scope="module")
def flite_corpus(fake_flite_dir, tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PATH", f"{fake_flite_dir}{os.pathsep}{os.environ['PATH']}")
        out = str(tmp_path_factory.mktemp("flite") / "data")
        S.generate_corpus([KW], out, seed=777, sizes=FLITE_SIZES, nj=2,
                          engines=("espeak", "flite"), test_only=True)
    return out


def test_flite_voices_when_asked_for(flite_corpus, flite_on_path, tmp_path):
    assert F.flite_voices() == list(F.FLITE_VOICES)
    assert [v.spk for v in engine_class("flite").voices()] == \
        [f"flite_{v}" for v in F.FLITE_VOICES]
    # flite's voices are festival's speakers: reserved, they speak in a test-only corpus
    # alone (all of them) and a training corpus that names flite is refused
    assert not os.path.exists(os.path.join(flite_corpus, "train"))
    spk = set(_dict(os.path.join(flite_corpus, "test", "utt2spk")).values())
    flite = {v for v in spk if v.startswith("flite_")}
    assert len(flite) >= 2 and flite <= {f"flite_{v}" for v in F.FLITE_VOICES}
    with pytest.raises(SynthError, match="flite is reserved for the unseen-engine test"):
        S.generate_corpus([KW], str(tmp_path / "refused"), sizes=FLITE_SIZES,
                          engines=("espeak", "flite"))
    assert not os.path.exists(tmp_path / "refused")
    assert open(os.path.join(flite_corpus, "dict", "tts_engines")).read() == \
        "espeak 0.8\nflite 0.2\n"
    with open(os.path.join(flite_corpus, S.STAMP_NAME), encoding="utf-8") as f:
        stamp = json.load(f)
    assert stamp["engines"] == ["espeak", "flite"]
    assert stamp["engine_shares"] == {"espeak": 0.8, "flite": 0.2}
    assert stamp["engine_voices"] == {"flite": list(F.FLITE_VOICES)}
    out = str(tmp_path / "again")
    shutil.copytree(flite_corpus, out)
    S.generate_corpus([KW], out, sizes=FLITE_SIZES, engines=("espeak",), test_only=True)
    spk2 = set(_dict(os.path.join(out, "test", "utt2spk")).values())
    assert not any(v.startswith("flite_") for v in spk2)      # args changed: regenerated


def test_flite_keyword_alone_positives_span_their_speech(flite_corpus, flite_on_path, tmp_path):
    """An engine that times no words (this flite prints no phone segments): a positive that
    is the keyword alone spans its whole trimmed speech, one in a carrier gets no span."""
    plan_dir = tmp_path / "plan"
    plan_dir.mkdir()
    groups = S.plan_corpus([KW], 777, FLITE_SIZES, (5.0, 30.0),
                           open_engines(["espeak", "flite"], test_only=True), str(plan_dir),
                           splits=("test",)).groups
    tts = Renderer(16000, str(tmp_path))
    alone = 0
    for g in groups:
        times = _dict(os.path.join(flite_corpus, g.split, "kw_times"))
        for spec in g.specs:
            if spec.kind != "pos" or spec.voice.engine != "flite":
                continue
            if spec.text != KW:
                assert spec.utt not in times, spec.text
                continue
            speech, span = R.speak(tts, spec, seed=0)
            assert span == (0.0, len(speech) / 16000)
            lead = round(spec.lead_s * 16000) / 16000
            assert times[spec.utt] == f"{lead:.3f} {lead + len(speech) / 16000:.3f}"
            alone += 1
    assert alone >= 3


def test_engines_without_espeak(flite_on_path, tmp_path):
    """espeak-ng still filters the texts, but only flite speaks."""
    out = str(tmp_path / "only_flite")
    S.generate_corpus([KW], out, sizes=S.Sizes(2, 2, 1, 1, 1, 1), engines=("flite",),
                      test_only=True)
    assert all(spk.startswith(("flite_", "noise_"))
               for spk in _dict(os.path.join(out, "test", "utt2spk")).values())
    assert open(os.path.join(out, "dict", "tts_engines")).read() == "flite 1\n"


def test_flite_word_onsets_from_phone_segments(monkeypatch):
    said = {}

    def fake_run(cmd, **kwargs):        # flite -ps on the words between commas
        said["text"] = cmd[cmd.index("-t") + 1]
        return subprocess.CompletedProcess(cmd, 0, said["stdout"], "")

    monkeypatch.setattr(F.subprocess, "run", fake_run)
    said["stdout"] = "pau ow k ey pau hh ey pau s n ih p s pau \n"
    segments = [("pau", 0.2), ("ow", 0.3), ("k", 0.35), ("ey", 0.5), ("hh", 0.55),
                ("ey", 0.7), ("pau", 0.8), ("s", 0.9), ("n", 0.95), ("ih", 1.0), ("p", 1.05),
                ("s", 1.2), ("pau", 1.4)]
    # each word starts where its first phone starts, a pause before it left out
    assert F.flite_word_onsets("okay hey  snips", "kal16", segments, 16000) == \
        [(1, 3200), (6, 8000), (11, 12800)]
    assert said["text"] == "okay, hey, snips"
    assert F.flite_word_onsets("okay hey snips", "kal16", [], 16000) is None
    said["stdout"] = "pau ow k ey pau hh ey pau s n ih p pau \n"   # one phone fewer
    assert F.flite_word_onsets("okay hey snips", "kal16", segments, 16000) is None
    said["stdout"] = "pau ow k ey hh ey pau s n ih p s pau \n"     # two words in one
    assert F.flite_word_onsets("okay hey snips", "kal16", segments, 16000) is None


def _run_synth(out, capsys, monkeypatch, path_env, *extra, **env_extra):
    """The real binary's main() on a tiny corpus, in this process with PATH set to
    `path_env` (what is checked is its exit status, stderr and files, not the process):
    returncode and stderr."""
    with monkeypatch.context() as mp:
        for name, value in dict(env_extra, PATH=path_env).items():
            mp.setenv(name, value)
        from toolkit.bin import synth_kws_data
        capsys.readouterr()
        status = synth_kws_data.main([
            "--keyword", KW, "--out-dir", str(out), "--seed", "777", "--num-train-pos", "3",
            "--num-train-neg", "3", "--num-dev-pos", "2", "--num-dev-neg", "2",
            "--num-test-pos", "2", "--num-test-neg", "2", "--nj", "2", *extra])
        return subprocess.CompletedProcess("synth_kws_data", status, "", capsys.readouterr().err)


def test_engines_espeak_ignores_an_installed_flite(fake_flite_dir, tmp_path, capsys, monkeypatch):
    log = tmp_path / "flite_calls"
    without = _run_synth(tmp_path / "without", capsys, monkeypatch, os.environ["PATH"])
    with_flite = _run_synth(tmp_path / "with", capsys, monkeypatch,
                            f"{fake_flite_dir}{os.pathsep}{os.environ['PATH']}",
                            "--engines", "espeak", FAKE_FLITE_LOG=str(log))
    assert without.returncode == 0, without.stderr
    assert with_flite.returncode == 0, with_flite.stderr
    a, b = _digest(str(tmp_path / "without")), _digest(str(tmp_path / "with"))
    assert len(a) == 14 + 8 * 3 + 4 and a == b       # every file, the stamp included
    assert not log.exists()                           # flite was never run

    env_log = dict(os.environ, FAKE_FLITE_LOG=str(log))
    assert subprocess.run([os.path.join(fake_flite_dir, "flite"), "-lv"], env=env_log,
                          capture_output=True).returncode == 0
    assert log.exists()                               # the log does record calls


def test_engine_asked_for_but_missing_is_one_error_line(tmp_path, capsys, monkeypatch):
    empty = tmp_path / "empty_path"
    empty.mkdir()
    res = _run_synth(tmp_path / "out", capsys, monkeypatch, str(empty), "--engines",
                     "espeak,flite")
    assert res.returncode == 2
    assert "error: flite was asked for (--engines) but no `flite` binary is on PATH: " \
           "apt-get install flite" in res.stderr
    assert "Traceback" not in res.stderr and not (tmp_path / "out").exists()


def test_an_unknown_other_kind_is_one_error_line(tmp_path, capsys, monkeypatch):
    res = _run_synth(tmp_path / "out", capsys, monkeypatch, os.environ["PATH"], "--other-kinds",
                     "pos,noise")
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert "error: other-engine kinds ['pos', 'noise']: each must be one of pos,conf,neg" \
        in res.stderr and not (tmp_path / "out").exists()


def test_engine_registry(monkeypatch, tmp_path):
    assert {"espeak", "flite", "festival"} <= set(ENGINES.names())
    assert engine_class("espeak").available()
    voices = engine_class("espeak").voices()
    assert len(voices) == len(E.ACCENTS) * len(E.VARIANTS)
    assert all(isinstance(v, Voice) and v.engine == "espeak" for v in voices)
    with pytest.raises(S.SynthError, match="unknown TTS engine 'nope'"):
        engine_class("nope")
    monkeypatch.setenv("PATH", str(tmp_path))         # neither flite nor festival here
    for name, hint in (("flite", "apt-get install flite"),
                       ("festival", "apt-get install festival festvox-kallpc16k")):
        cls = engine_class(name)
        assert not cls.available() and cls.voices() == [] and hint in cls.unavailable_reason()
    # generic layer: importing it loads no task code
    code = ("import sys, toolkit.voicebank.corpus, toolkit.voicebank.engines, toolkit.voicebank.pool, "
            "toolkit.voicebank.render, toolkit.voicebank.signal; "
            "sys.exit(any(m.startswith('toolkit.tasks') for m in sys.modules))")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_espeak_engine_speaks_with_word_onsets(tmp_path):
    from toolkit.voicebank.pool import run_forked
    voice = engine_class("espeak").voices()[0]

    def speak(_):
        a = engine_class("espeak")(str(tmp_path)).synth("hey snips", voice, rate=150, seed=3)
        return a.audio, a.sample_rate, a.word_onsets

    (audio, sr, onsets), again = run_forked(speak, [None, None], 1, str(tmp_path))
    assert audio.dtype == np.float32 and sr == 22050 and len(audio) > sr // 4
    assert [c for c, _ in onsets] == [1, 5] and onsets[0][1] < onsets[1][1]
    assert np.array_equal(audio, again[0])           # a fresh child: the same samples


def test_festival_engine_is_deterministic(tmp_path, monkeypatch):
    require_engine("festival")
    monkeypatch.setenv("TOOLKIT_TTS_CACHE", "off")     # festival itself, not its clip cache
    cls = engine_class("festival")
    for voice in cls.voices():        # diphone and HTS voices set the rate differently
        slow, again = (cls(str(tmp_path)).synth("hey snips", voice, rate=120) for _ in range(2))
        fast = cls(str(tmp_path)).synth("hey snips", voice, rate=220)
        assert slow.word_onsets is None and slow.audio.dtype == np.float32
        assert np.array_equal(slow.audio, again.audio) and slow.sample_rate == again.sample_rate
        assert len(fast.audio) < 0.8 * len(slow.audio), voice    # the rate is applied


def test_random_variant_files_are_well_formed_and_seeded():
    a = E.random_voices(30, E.ACCENTS, seed=5)
    assert [v.variant for v in a] == [v.variant for v in E.random_voices(30, E.ACCENTS, 5)]
    assert [v.variant for v in a] != [v.variant for v in E.random_voices(30, E.ACCENTS, 6)]
    assert {v.name.split("+")[0] for v in a} == set(E.ACCENTS)       # accents in turn
    assert len({v.spk for v in a}) == 30 and all("_rv" in v.spk for v in a)
    for v in a:
        lines = [line.split() for line in v.variant.splitlines()]
        assert lines[0] == ["language", "variant"] and lines[1] == ["name", v.name.split("+")[1]]
        keys = [line[0] for line in lines]
        assert keys.count("formant") == 9 and "pitch" in keys
        base, top = (int(x) for x in lines[keys.index("pitch")][1:])
        assert 65 <= base <= 250 and base < top
        for line in lines:
            if line[0] == "formant":
                assert 70 <= int(line[2]) <= 135 and 0 <= int(line[3]) <= 140


# The real Debian flite (tools/test.sh installs it): the fake above stands in for it
# elsewhere, where a test must not depend on its voices.
@pytest.fixture
def real_flite():
    require_engine("flite")


REAL_FLITE = pytest.mark.usefixtures("real_flite")


@REAL_FLITE
def test_real_flite_speaks_every_voice_with_word_onsets(tmp_path):
    cls = engine_class("flite")
    assert [v.name for v in cls.voices()] == list(F.FLITE_VOICES)
    for voice in cls.voices():
        speech = cls(str(tmp_path)).synth("okay hey snips", voice, rate=175)
        again = cls(str(tmp_path)).synth("okay hey snips", voice, rate=175)
        slow = cls(str(tmp_path)).synth("okay hey snips", voice, rate=110)
        audio, sr = speech.audio, speech.sample_rate
        assert audio.dtype == np.float32 and sr == 16000 and np.abs(audio).max() > 0.05
        assert np.array_equal(audio, again.audio), voice          # a fresh process each time
        assert len(slow.audio) > 1.3 * len(audio), voice          # the rate is applied
        # -psdur's phone segments give every word its onset, in order, inside the audio.
        onsets = speech.word_onsets
        assert [c for c, _ in onsets] == [1, 6, 10], voice
        samples = [s for _, s in onsets]
        assert samples == sorted(samples) and 0 < samples[0] and samples[-1] < len(audio)
        # Speech follows each onset: the 100 ms after "snips" starts are not silence.
        tail = audio[samples[-1]:samples[-1] + sr // 10]
        assert np.sqrt(np.mean(tail ** 2)) > 0.01, voice


@REAL_FLITE
def test_real_flite_corpus_times_keywords_in_carrier_sentences(tmp_path):
    """With real phone segments, positives in a carrier sentence get keyword times too
    (the fake flite above prints none, so only keyword-alone positives get them)."""
    out = str(tmp_path / "flite_only")
    S.generate_corpus([KW], out, sizes=S.Sizes(4, 4, 2, 2, 8, 4), engines=("flite",),
                      test_only=True)
    carriers = 0
    for split in ("test",):
        kinds = _dict(os.path.join(out, split, "utt2kind"))
        texts = _dict(os.path.join(out, split, "text"))
        durations = _dict(os.path.join(out, split, "utt2dur"))
        times = _dict(os.path.join(out, split, "kw_times"))
        assert all(spk.startswith(("flite_", "noise_"))
                   for spk in _dict(os.path.join(out, split, "utt2spk")).values())
        for utt, kind in kinds.items():
            if kind != "pos":
                continue
            start, end = map(float, times[utt].split())
            assert 0 < start < end <= float(durations[utt]), utt
            carriers += texts[utt] != KW
    assert carriers >= 2


def test_outside_dev_speaks_every_unreserved_voice_of_its_engines_in_dev_alone(tmp_path):
    """--outside-dev: a dev split alone, for choosing on voices unlike the training ones:
    every voice of pico and RHVoice but RHVoice's reserved ones (slt is festival's speaker,
    two are for evaluation only) and those --exclude-voices names (the voices a front end
    heard), and no train or test split."""
    from toolkit.voicebank import is_reserved
    require_engine("pico")
    require_engine("rhvoice")
    # Small: still every voice speaks (3 to 8 utterances each) and every kind is there.
    sizes = S.Sizes(train_pos=0, train_neg=0, dev_pos=6, dev_neg=12, test_pos=0, test_neg=0)
    out = str(tmp_path / "odev")
    excluded = ("pico_en-gb", "rhvoice_bdl")       # what phone-voicebank-v3..v5 trained on
    summary = S.generate_corpus([KW], out, sizes=sizes, engines=("pico", "rhvoice"),
                                outside_dev=True, exclude_voices=excluded)
    assert list(summary) == ["dev"] and summary["dev"]["utts"] == 18
    assert not os.path.exists(os.path.join(out, "train"))
    assert not os.path.exists(os.path.join(out, "test"))
    free = {v.spk for name in ("pico", "rhvoice") for v in engine_class(name).voices()
            if not is_reserved(v)}
    assert {"pico_en-us", "pico_en-gb", "rhvoice_alan", "rhvoice_bdl"} <= free
    assert not free & {"rhvoice_slt", "rhvoice_lyubov", "rhvoice_evgeniy-eng"}
    free -= set(excluded)
    with open(os.path.join(out, "voices.tsv"), encoding="utf-8") as f:
        rows = [line.rstrip("\n").split("\t") for line in f][1:]
    assert {r[0] for r in rows} == free and {r[1] for r in rows} == {"dev"}
    speakers = set(_dict(os.path.join(out, "dev", "utt2spk")).values()) - {"noise_dev"}
    assert speakers == free                         # every one of them speaks
    kinds = collections.Counter(_dict(os.path.join(out, "dev", "utt2kind")).values())
    assert kinds["pos"] == 6 and kinds["conf"] > 0 and kinds["neg"] > 0
    # The same engines and seed in a test-only corpus hold out other voices: not a dev set.
    with pytest.raises(SynthError, match="choose one"):
        S.generate_corpus([KW], str(tmp_path / "both"), sizes=sizes, engines=("pico",),
                          test_only=True, outside_dev=True)
    with pytest.raises(SynthError, match="no --blends"):
        S.generate_corpus([KW], str(tmp_path / "blends"), sizes=sizes, engines=("pico",),
                          outside_dev=True, blends=2)
    with pytest.raises(SynthError, match="flite is reserved"):
        S.generate_corpus([KW], str(tmp_path / "flite"), sizes=sizes, engines=("flite",),
                          outside_dev=True)
    with pytest.raises(SynthError, match="pico_en-au: no such voice .* pico_en-gb,pico_en-us"):
        S.generate_corpus([KW], str(tmp_path / "unknown"), sizes=sizes, engines=("pico",),
                          outside_dev=True, exclude_voices=("pico_en-au",))
    with pytest.raises(SynthError, match="no --blends"):
        S.generate_corpus([KW], str(tmp_path / "xblends"), sizes=sizes, engines=("pico",),
                          exclude_voices=("pico_en-gb",), blends=2)
    assert not os.path.exists(str(tmp_path / "unknown" / "dev"))
