"""The corpus layer every TTS generator stands on (toolkit.voicebank.corpus), through the three
generators that use it (wake word, speaker, codec speech): reserved voices never reach
train or dev, one wording of every engine error, the stamp decides what is redone,
cleaning removes only what a generator writes, the voice inventory lists every voice that
speaks, and an engine that is installed but not named changes no byte of stage 0."""
import json
import os
import shutil
import subprocess
import sys

import pytest

from toolkit.tasks.codec import corpus as codec
from toolkit.tasks.kws import corpus as kws
from toolkit.tasks.speaker import corpus as speaker
from toolkit.voicebank import SynthError, Voice
from toolkit.voicebank import corpus as C, corpus_dir as D
from toolkit.voicebank.espeak import espeak_voices
from file_tree import file_tree
from installed import require_engine, require_root_and_unshare


ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FESTIVAL = tuple(Voice(f"festival_{v}", "festival", v)
                 for v in ("kal_diphone", "ked_diphone", "cmu_us_slt_arctic_hts"))

# The three binaries at tiny sizes, with their stage-0 arguments.
BINARIES = {
    "kws": ["toolkit.bin.synth_kws_data", "--keyword", "hey snips", "--num-train-pos", "2",
            "--num-train-neg", "2", "--num-dev-pos", "1", "--num-dev-neg", "1",
            "--num-test-pos", "1", "--num-test-neg", "1"],
    "speaker": ["toolkit.bin.synth_speaker_data", "--num-train-speakers", "2", "--train-utts",
                "2", "--num-dev-speakers", "2", "--dev-utts", "2", "--num-test-speakers", "2",
                "--test-utts", "2"],
    "codec": ["toolkit.bin.synth_codec_data", "--num-train", "3", "--num-dev", "1",
              "--num-test", "1", "--random-voices", "2", "--sentences", "1,1"],
}


def generate(family, out, **kwargs):
    """Each generator at a tiny size, espeak-ng alone unless `engines` says otherwise."""
    kwargs.setdefault("engines", ("espeak",))
    kwargs.setdefault("nj", 2)
    if family == "kws":
        return kws.generate_corpus(["hey snips"], str(out), sizes=kws.Sizes(2, 2, 1, 1, 1, 1),
                                   **kwargs)
    if family == "speaker":
        return speaker.generate_corpus(str(out), sizes=speaker.Sizes(2, 2, 2, 2, 2, 2), **kwargs)
    return codec.generate_speech(str(out), sizes=codec.Sizes(3, 1, 1), noisy=False,
                                 sentences=(1, 1), **kwargs)


@pytest.fixture(scope="module")
def default_corpus(tmp_path_factory):
    """family -> its generator's corpus at the tiny size and default arguments, made once
    for the module (the parent process never loads espeak-ng, so each render starts from
    the same state whenever it runs): read it, or copy it (shutil.copytree) to change it."""
    made = {}

    def corpus(family):
        if family not in made:
            made[family] = tmp_path_factory.mktemp(family) / "data"
            generate(family, made[family])
        return made[family]
    return corpus


def read_table(path):
    with open(path, encoding="utf-8") as f:
        return dict(line.rstrip("\n").split(" ", 1) for line in f if line.strip())


def tree(root):
    """relative path -> bytes of every file under `root` (its own path made relative)."""
    return file_tree(root)


def spoken_voices(groups):
    """Every voice a plan speaks with, babble talkers included, by split."""
    out = {}
    for g in groups:
        for spec in list(g.specs) + list(g.babble):
            if spec.voice is not None:
                out.setdefault(g.split, set()).add(spec.voice.spk)
    return out


# ------------------------------------------------------------------------ reserved voices

def plan(family, engines, tmp_dir, splits=C.SPLITS):
    """(groups, voices by split) of each family's planner."""
    if family == "kws":
        planned = kws.plan_corpus(["hey snips"], 777, kws.Sizes(40, 40, 10, 10, 20, 20),
                                  (5.0, 30.0), engines, tmp_dir, splits=splits)
        return planned.groups, planned.by_split
    if family == "speaker":
        groups, speakers, _ = speaker.plan_corpus(
            777, speaker.Sizes(20, 2, 6, 2, 8, 2), (10.0, 30.0), engines, tmp_dir, splits)
        return groups, {s: [p.voice for p in ps] for s, ps in speakers.items()}
    groups, by_split, _ = codec.plan_corpus(777, codec.Sizes(60, 20, 30), (5.0, 25.0),
                                            engines, 0, 0, (1, 1), tmp_dir, splits)
    return groups, by_split


@pytest.mark.parametrize("family", ["kws", "speaker", "codec"])
def test_reserved_voices_speak_only_in_test_only_corpora(family, tmp_path, monkeypatch):
    """Festival's voices and any voice the layer's rule reserves (here, as the voice bank's
    rule will, two espeak-ng voices) never speak in train or dev, not even as babble; a
    test-only corpus adds every one of them to its test split."""
    kept = {"en-us_f3", "en_m2"}
    rule = C.reserved_for_evaluation
    monkeypatch.setattr(C, "reserved_for_evaluation",
                        lambda v: v.spk in kept or rule(v))
    reserved = kept | {v.spk for v in FESTIVAL}
    full = C.Engines(("espeak", "festival"), FESTIVAL, test_only=False)
    (tmp_path / "a").mkdir()
    groups, by_split = plan(family, full, str(tmp_path / "a"))
    spoken = spoken_voices(groups)
    assert set(spoken) == set(C.SPLITS) and all(spoken.values())
    for split in C.SPLITS:      # a full corpus leaves them out altogether
        assert not spoken[split] & reserved, split
        assert not {v.spk for v in by_split[split]} & reserved
    only = C.Engines(("espeak", "festival"), FESTIVAL, test_only=True)
    (tmp_path / "b").mkdir()
    groups, by_split = plan(family, only, str(tmp_path / "b"), splits=("test",))
    assert {g.split for g in groups} == {"test"}
    assert reserved <= {v.spk for v in by_split["test"]}
    assert spoken_voices(groups)["test"] & reserved
    for split in ("train", "dev"):
        assert not {v.spk for v in by_split.get(split, ())} & reserved


def test_the_festival_rule_and_engine_usage():
    assert [C.reserved_for_evaluation(v) for v in FESTIVAL] == [True] * 3
    assert not any(C.reserved_for_evaluation(v) for v in espeak_voices())
    voices = espeak_voices()[:3] + list(FESTIVAL)
    assert C.Engines(("espeak",), (), False).usable(voices) == (voices[:3], [])
    assert C.Engines(("espeak",), (), True).usable(voices) == (voices[:3], list(FESTIVAL))
    assert C.engine_shares(["espeak"]) == {"espeak": 1.0}
    assert C.engine_shares(["espeak", "flite"]) == {"espeak": 0.8, "flite": 0.2}
    assert C.engine_shares(["festival", "flite"]) == {"festival": 0.5, "flite": 0.5}


@pytest.mark.parametrize("family", ["speaker", "codec"])
def test_a_procedural_voice_without_its_variant_file_is_an_error(family, tmp_path,
                                                                  monkeypatch):
    """espeak-ng falls back to the plain accent, silently, when a variant file is missing:
    the layer's probe turns that into an error instead of a corpus of other voices."""
    module = {"speaker": speaker, "codec": codec}[family]
    real = module.private_espeak_data

    def without_files(voices, tmp_dir):
        path = real(voices, tmp_dir)
        for v in voices:
            os.unlink(os.path.join(path, "voices", "!v", v.name.split("+")[1]))
        return path

    monkeypatch.setattr(module, "private_espeak_data", without_files)
    # A failed run removes what it wrote: the directory too where it made it, and only
    # its own files from a directory that was there.
    (tmp_path / "there").mkdir()
    for out in (tmp_path / "x", tmp_path / "there"):
        with pytest.raises(SynthError, match="ignored the procedural voice"):
            if family == "speaker":     # more speakers than the fixed voices
                speaker.generate_corpus(str(out), sizes=speaker.Sizes(220, 2, 2, 2, 2, 2))
            else:
                generate(family, out, n_random_voices=3)
    assert not (tmp_path / "x").exists() and os.listdir(tmp_path / "there") == []


# ------------------------------------------------------------------------ engine errors

def cli_error(family, capsys, *extra):
    """The binary's main() in this process: (exit status, its stderr)."""
    module = __import__(BINARIES[family][0], fromlist=["main"])
    status = module.main(BINARIES[family][1:] + list(extra))
    return status, capsys.readouterr().err


def test_one_wording_of_every_engine_error_in_all_three_generators(tmp_path, monkeypatch,
                                                                   capsys):
    empty = tmp_path / "empty_path"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))          # no flite, no festival
    cases = {
        "espeak,nope": "error: unknown TTS engine 'nope'; known: espeak, ",   # and the rest
        "espeak,espeak": "error: engine named twice in --engines: espeak,espeak",
        ",": "error: --engines needs engine names, e.g. espeak or espeak,kokoro; got ','",
        "espeak,flite": "error: flite was asked for (--engines) but no `flite` binary is on "
                        "PATH: apt-get install flite",
    }
    for engines, line in cases.items():
        said = {}
        for family in BINARIES:
            out = tmp_path / f"{family}_out"
            status, err = cli_error(family, capsys, "--out-dir", str(out), "--engines", engines)
            assert status == 2 and "Traceback" not in err and not out.exists(), (family, err)
            said[family] = [x for x in err.splitlines() if x.startswith("error:")]
        assert said["kws"] == said["speaker"] == said["codec"], said
        assert len(said["kws"]) == 1 and said["kws"][0].startswith(line), said


def test_a_reserved_engine_is_refused_alike_outside_test_only(tmp_path, capsys):
    require_engine("festival")
    for family in BINARIES:
        out = tmp_path / family
        status, err = cli_error(family, capsys, "--out-dir", str(out), "--engines",
                                "espeak,festival")
        assert status == 2 and err.splitlines()[-1] == (
            "error: festival is reserved for the unseen-engine test: its voices never speak "
            "in train or dev. Write its evaluation set alone with --test-only (and an "
            "--out-dir of its own)"), (family, err)
        assert not out.exists()


# ------------------------------------------------------------------------ stamp, cleaning

@pytest.mark.parametrize("family", ["kws", "speaker", "codec"])
def test_the_stamp_decides_what_is_made_again(family, tmp_path):
    out = tmp_path / "data"
    generate(family, out)
    stamp_path = out / {"kws": kws, "speaker": speaker, "codec": codec}[family].STAMP_NAME
    stamp = json.loads(stamp_path.read_text())
    assert stamp["engines"] == ["espeak"] and not stamp["test_only"]
    assert set(stamp["engine_versions"]) == {"espeak"}
    before = tree(out)
    wav = next((out / "wavs" / "train").iterdir())
    mtime = wav.stat().st_mtime_ns
    generate(family, out, nj=1)                     # the same corpus: nothing is redone
    assert wav.stat().st_mtime_ns == mtime
    # Another engine build (as the stamp records it): made again, to the same bytes here.
    stamp["engine_versions"]["espeak"] = "an older build"
    stamp_path.write_text(json.dumps(stamp))
    generate(family, out)
    assert wav.stat().st_mtime_ns != mtime and tree(out) == before
    # A WAV lost: incomplete, made again.
    wav.unlink()
    generate(family, out)
    assert wav.exists() and tree(out) == before
    # A stamp of other arguments: made again for the new ones.
    generate(family, out, seed=5)
    assert json.loads(stamp_path.read_text())["seed"] == 5 and tree(out) != before


@pytest.mark.parametrize("family", ["kws", "speaker", "codec"])
def test_cleaning_removes_only_what_the_generator_writes(family, tmp_path, default_corpus):
    out = tmp_path / "data"
    shutil.copytree(default_corpus(family), out)              # what `generate` wrote there
    (out / "notes.txt").write_text("mine\n")                    # the user's
    (out / "lang").mkdir()
    (out / "lang" / "words.txt").write_text("a 1\n")
    (out / "train" / "data.list").write_text("{}\n")            # a later stage's, now stale
    if family == "codec":
        (out / "voices.txt").write_text("stale\n")               # written by older versions
    generate(family, out, seed=5)
    assert (out / "notes.txt").read_text() == "mine\n"
    assert (out / "lang" / "words.txt").read_text() == "a 1\n"
    assert not (out / "train" / "data.list").exists()
    assert not (out / "voices.txt").exists() and not (out / D.TMP_NAME).exists()
    kept = {"notes.txt", "lang"}
    written = set(os.listdir(out)) - kept
    corpus_dir = {"kws": kws, "speaker": speaker, "codec": codec}[family].corpus_dir(str(out))
    assert written <= set(corpus_dir.written_names())
    corpus_dir.clean()
    assert sorted(os.listdir(out)) == sorted(kept)


def run_cli(family, out, capsys, *extra):
    """The binary's real main() in this process (what these tests check is its exit status,
    its `error:` lines and the files; a fresh interpreter per run only cost its start-up):
    (exit status, stderr)."""
    capsys.readouterr()
    module = __import__(BINARIES[family][0], fromlist=["main"])
    status = module.main(BINARIES[family][1:] + ["--out-dir", str(out), "--nj", "1", *extra])
    return status, capsys.readouterr().err


def refused(family, out, capsys, *extra):
    """The binary's one `error:` line for a run it must refuse, checked to leave every
    file of `out` as it was."""
    before = tree(out)
    status, err = run_cli(family, out, capsys, *extra)
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert status == 2 and "Traceback" not in err and len(errors) == 1, (family, err)
    assert tree(out) == before, family
    return errors[0]


@pytest.mark.parametrize("family", ["kws", "speaker", "codec"])
def test_a_corpus_of_the_other_kind_is_refused_not_emptied(family, tmp_path, capsys):
    """Issue 34, fault 4: --test-only into a full corpus's --out-dir removed its train/,
    dev/ and wavs/. A test-only corpus's test split is the full corpus's files (the same
    wavs/test names), so the two never share a directory: either way round the run is
    refused with one line naming the directory and what it holds, and no byte changes."""
    full, only = tmp_path / "full", tmp_path / "only"
    assert run_cli(family, full, capsys)[0] == 0
    assert {"train", "dev", "test", "wavs"} <= set(os.listdir(full))
    line = refused(family, full, capsys, "--test-only")
    assert line.startswith(f"error: {full} holds a finished full corpus (") and \
        "train/, dev/, test/" in line and "--test-only an --out-dir of its own" in line, line
    assert run_cli(family, only, capsys, "--test-only")[0] == 0
    line = refused(family, only, capsys)
    assert line.startswith(f"error: {only} holds a finished test-only corpus (") and \
        "train/" not in line and "full corpus an --out-dir of its own" in line, line
    # Each kind still remakes its own kind for other arguments, as the stamp decides.
    assert run_cli(family, only, capsys, "--test-only", "--seed", "5")[0] == 0
    assert all(n.startswith("test") for n in os.listdir(only / "wavs"))
    assert json.loads(next(only.glob(".synth_*.json")).read_text())["seed"] == 5


def test_files_no_stamp_of_the_generator_accounts_for_are_refused(tmp_path, capsys,
                                                                 default_corpus):
    """Another generator's corpus in the --out-dir (both write train/, test/, wavs/,
    voices.tsv), or the user's own data dirs, are not this generator's to remove."""
    out = tmp_path / "data"
    shutil.copytree(default_corpus("kws"), out)             # its stamp is broken below
    for family in ("speaker", "codec"):
        line = refused(family, out, capsys)
        assert line.startswith(f"error: {out} holds voices.tsv, train/, dev/, test/, ") and \
            "wavs/train/" in line and " but no " in line and \
            "(it has .synth_kws_data.json: another generator's corpus)" in line, line
    own = tmp_path / "own"
    (own / "train").mkdir(parents=True)
    (own / "train" / "wav.scp").write_text("u1 /data/u1.wav\n")
    line = refused("speaker", own, capsys)
    assert line == (f"error: {own} holds train/ but no .synth_speaker_data.json: they are "
                    "not a corpus this generator wrote, so they are left alone; give this "
                    "corpus an --out-dir of its own, or remove them first"), line
    # An unreadable stamp tells nothing of what is there: refused too.
    stamp = out / kws.STAMP_NAME
    stamp.write_text('{"format": 4, "seed"')
    line = refused("kws", out, capsys)
    assert line.startswith(f"error: {stamp}: unreadable stamp (") and \
        "nothing there is removed" in line, line


def test_a_test_only_corpus_cleans_only_its_own_split(tmp_path):
    """A test-only stamp accounts for the test split alone: remaking it for other
    arguments leaves a train/ it did not write (and wavs/ entries of no split) alone."""
    out = tmp_path / "data"
    generate("speaker", out, test_only=True)
    (out / "train").mkdir()
    (out / "train" / "notes").write_text("mine\n")
    (out / "wavs" / "extra").mkdir()
    generate("speaker", out, test_only=True, seed=5)
    assert (out / "train" / "notes").read_text() == "mine\n"
    assert sorted(os.listdir(out / "wavs")) == ["extra", "test"]
    speaker.corpus_dir(str(out)).clean()
    assert sorted(os.listdir(out)) == ["train", "wavs"] and os.listdir(out / "wavs") == ["extra"]


@pytest.mark.parametrize("test_only", [False, True])
def test_an_interrupted_run_is_cleaned_by_the_next_whatever_its_kind(test_only, tmp_path):
    """A run claims the directory (its stamp, marked unfinished) before writing: what an
    interrupted run left is this generator's, and the next run of either kind remakes it;
    files the claim does not account for in the next run's way are refused, not used."""
    out = tmp_path / "data"
    interrupted = not test_only
    codec.corpus_dir(str(out)).claim({"format": codec.FORMAT_VERSION,
                                      "test_only": interrupted})
    assert json.loads((out / codec.STAMP_NAME).read_text())[D.FINISHED] is False
    for name in ("test",) if interrupted else ("train", "test"):
        (out / "wavs" / name).mkdir(parents=True)
        (out / "wavs" / name / "half.wav").write_bytes(b"RIFF")
    if interrupted:                 # a test-only run writes no train split
        (out / "wavs" / "train").mkdir()
        with pytest.raises(SynthError, match=r"holds wavs/train/ but \.synth_codec_data\.json "
                                             r"does not account for them"):
            generate("codec", out, test_only=test_only)
        assert (out / "wavs" / "test" / "half.wav").exists()
        (out / "wavs" / "train").rmdir()
    generate("codec", out, test_only=test_only)
    assert not (out / "wavs" / "test" / "half.wav").exists()
    assert (out / "train").exists() != test_only
    assert D.FINISHED not in json.loads((out / codec.STAMP_NAME).read_text())


# ------------------------------------------------------------------------ inventory

@pytest.mark.parametrize("family", ["kws", "speaker", "codec"])
def test_the_inventory_lists_every_voice_that_speaks(family, default_corpus):
    out = default_corpus(family)
    lines = (out / D.INVENTORY_NAME).read_text().splitlines()
    assert lines[0].split("\t") == list(D.INVENTORY_COLUMNS)
    rows = [line.split("\t") for line in lines[1:]]
    stamp = json.loads(next(out.glob(".synth_*.json")).read_text())
    voices = {v.spk: v for v in espeak_voices()}
    for spk, split, engine, name, blend, version in rows:
        assert engine == "espeak" and blend == "-"
        assert version == stamp["engine_versions"]["espeak"]
        if spk in voices:                                 # fixed voices; else procedural
            assert voices[spk].name == name
    for split in C.SPLITS:
        speakers = set(read_table(out / split / "utt2spk").values()) - {f"noise_{split}"}
        assert {r[0] for r in rows if r[1] == split} == speakers, split
    assert [r[1] for r in rows] == sorted((r[1] for r in rows), key=C.SPLITS.index)


def test_blend_weights_in_the_inventory():
    from toolkit.voicebank.kokoro import blend_voice
    blended = blend_voice([("af_bella", 0.6), ("am_adam", 0.4)])
    assert D._blend_text(blended) == "af_bella:0.6,am_adam:0.4"
    assert D._blend_text(blend_voice([("bf_alice", 3), ("bm_lewis", 1)])) == \
        "bf_alice:0.75,bm_lewis:0.25"
    assert D._blend_text(espeak_voices()[0]) == "-"
    # a blend with a reserved voice in it is reserved like the voice
    assert C.reserved_for_evaluation(Voice("x", "kokoro", "m", mix=(("af_bella", 0.5),
                                                                   ("af_heart", 0.5))))
    assert not C.reserved_for_evaluation(blended)


# ------------------------------------------------------------------------ test-only corpora

def test_test_only_speaker_and_speech_corpora_are_the_held_out_test_split(tmp_path,
                                                                          default_corpus):
    """espeak-ng alone, --test-only writes the full corpus's test split, byte for byte."""
    for family, names in (("speaker", ("test",)), ("codec", ("test",))):
        full, only = default_corpus(family), tmp_path / f"{family}_only"
        summary = generate(family, only, test_only=True)
        assert set(summary) - {"trials"} == set(names)
        a, b = tree(full), tree(only)
        assert sorted(os.listdir(only)) == sorted(
            [n for n in os.listdir(full) if n not in ("train", "dev")])
        shared = [k for k in b if not k.startswith((".synth", "voices.tsv"))]
        assert shared and all(a[k] == b[k] for k in shared), family
        assert json.loads(next(only.glob(".synth_*.json")).read_text())["test_only"]


# ------------------------------------------------------------------------ installed engines

def _hidden(binaries):
    """A shell prefix that runs the rest of the line with `binaries` hidden (bind mounts
    of /dev/null in a private mount namespace)."""
    mounts = " && ".join(f"mount --bind /dev/null {shutil.which(b)}" for b in binaries)
    return ["unshare", "-m", "bash", "-c", mounts + ' && exec "$@"', "hide"]


INSTALLED = [b for b in ("flite", "text2wave", "festival") if shutil.which(b)]


@pytest.mark.parametrize("family", ["kws", "speaker", "codec"])
def test_stage0_is_byte_identical_whether_or_not_an_unnamed_engine_is_installed(family,
                                                                                tmp_path):
    require_engine("flite")                 # tools/test.sh installs flite and festival
    require_root_and_unshare()
    env = dict(os.environ, OMP_NUM_THREADS="1")
    check = subprocess.run(_hidden(INSTALLED) + [sys.executable, "-c",
                           "import shutil, sys; sys.exit(any(map(shutil.which, sys.argv[1:])))",
                           *INSTALLED], capture_output=True, text=True, env=env)
    assert check.returncode == 0, check.stderr                 # hidden in there
    outs = []
    for name, prefix in (("installed", []), ("hidden", _hidden(INSTALLED))):
        out = tmp_path / name
        cmd = prefix + [sys.executable, "-m", *BINARIES[family], "--out-dir", str(out),
                        "--nj", "2"]
        res = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT,
                             timeout=300)
        assert res.returncode == 0, res.stderr[-3000:]
        outs.append(tree(out))
    assert outs[0] == outs[1] and len(outs[0]) > 10        # every byte, stamp included
