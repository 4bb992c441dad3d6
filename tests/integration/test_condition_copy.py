"""Condition copies of a data dir (toolkit.voicebank.conditions, toolkit.bin.make_condition_copy)
on a tiny data dir of espeak-ng speech through the real codecs: the same ids, speakers and
texts with each chain in utt2cond; byte-identical for nj=1 and nj=2; a rerun does nothing;
a run killed part-way resumes, keeping the WAVs written whole; other arguments remake only
this writer's files; a folder of someone else's is refused; unreadable audio is skipped and
counted, or an error that names it beyond 1 %."""
import os
import re
import signal
import subprocess
import sys
import tempfile

import numpy as np
import pytest
import soundfile as sf

from toolkit.data import kaldi
from toolkit.errors import DataError, MissingInputError
from toolkit.voicebank import conditions
from toolkit.voicebank.channel import ConditionSettings
from file_tree import file_tree

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SR = 16000
TEXTS = ("the quick brown fox jumps over the lazy dog",
         "please call stella and ask her to bring these things",
         "seven slippery snakes slid slowly south",
         "turn on the kitchen lights and close the blinds",
         "nobody expected the meeting to end before noon",
         "a large red balloon floated over the quiet village")
STEP = re.compile(r"(room:(small|medium|large)/\d+\.\dm|noise:(white|pink|brown|babble)/\d+\.\ddB|"
                  r"mic:eq\d|clip:\d+\.\d%|telephone:g711|codec2:(3200|2400|1600|1200|700C)|"
                  r"opus:\d+kbps)")


def make_dir(root, n=6):
    """A Kaldi dir of `n` espeak-ng utterances (two voices, three speakers) at -18 dBFS."""
    from toolkit.data.audio import resample
    from toolkit.voicebank import Voice
    from toolkit.voicebank.engines import EspeakEngine
    from toolkit.voicebank.signal import pcm16, peak_gain, place_at_level
    engine = EspeakEngine(tempfile.mkdtemp(dir=root))
    tables = {"wav.scp": {}, "text": {}, "utt2spk": {}}
    os.makedirs(os.path.join(root, "wavs"), exist_ok=True)
    for i in range(n):
        voice = ("en-us", "en-gb-x-rp")[i % 2]
        spoken = engine.synth(TEXTS[i % len(TEXTS)], Voice(voice, "espeak", voice))
        wave = place_at_level(resample(spoken.audio, spoken.sample_rate, SR), SR, -18.0, 0.2, 0.2)
        utt = f"spk{i % 3}-utt{i:02d}"
        path = os.path.join(root, "wavs", utt + ".wav")
        sf.write(path, pcm16(wave * peak_gain(wave)), SR, subtype="PCM_16")
        tables["wav.scp"][utt], tables["text"][utt] = path, TEXTS[i % len(TEXTS)]
        tables["utt2spk"][utt] = f"spk{i % 3}"
    src = os.path.join(root, "train")
    kaldi.write_data_dir(src, tables)
    return src


@pytest.fixture(scope="module")
def src(tmp_path_factory):
    return make_dir(str(tmp_path_factory.mktemp("cond_src")))


@pytest.fixture(scope="module")
def reference(src, tmp_path_factory):
    """The copy of `src` with seed 3, nj=1."""
    out = str(tmp_path_factory.mktemp("cond_ref") / "copy")
    summary = conditions.write_condition_copy(src, out, seed=3, nj=1)
    return out, summary


def files_of(out):
    """{relative path: bytes} of everything in a copy, wav.scp's paths made relative."""
    return file_tree(out, relative_in=("wav.scp",))


def mtimes(out):
    return {os.path.join(f, n): os.stat(os.path.join(f, n)).st_mtime_ns
            for f, _, names in os.walk(out) for n in names}


def test_a_copy_keeps_ids_speakers_texts_and_lengths(src, reference):
    out, summary = reference
    assert summary["utts"] == 6 and summary["skipped"] == 0
    for name in ("text", "utt2spk", "spk2utt"):
        assert open(os.path.join(out, name)).read() == open(os.path.join(src, name)).read()
    source, copy = kaldi.read_table(os.path.join(src, "wav.scp")), \
        kaldi.read_table(os.path.join(out, "wav.scp"))
    assert sorted(copy) == sorted(source)
    labels = kaldi.read_table(os.path.join(out, "utt2cond"))
    durations = kaldi.read_table(os.path.join(out, "utt2dur"))
    assert sorted(labels) == sorted(source)
    for key, path in copy.items():
        assert path == os.path.join(os.path.abspath(out), "wavs", key + ".wav")
        info, original = sf.info(path), sf.info(source[key])
        assert info.subtype == "PCM_16" and info.samplerate == SR
        assert info.frames == original.frames                 # time-aligned, same length
        assert float(durations[key]) == pytest.approx(info.frames / SR, abs=1e-3)
        assert labels[key] == "clean" or all(STEP.fullmatch(p) for p in labels[key].split("+"))
        wave, _ = sf.read(path)
        assert 0.01 < np.abs(wave).max() <= 0.98 + 1e-4            # peak-safe
    assert sum(summary["conditions"].values()) >= 6
    assert not [n for n in os.listdir(os.path.join(out, "wavs")) if n.startswith(".")]


def test_nj_does_not_change_a_byte_and_a_rerun_does_nothing(src, reference, tmp_path):
    out2 = str(tmp_path / "copy_nj2")
    conditions.write_condition_copy(src, out2, seed=3, nj=2)
    assert files_of(out2) == files_of(reference[0])
    before = mtimes(out2)
    summary = conditions.write_condition_copy(src, out2, seed=3, nj=2)
    assert mtimes(out2) == before and summary["utts"] == 6
    # Through the binary too: same arguments, nothing written.
    from toolkit.bin import make_condition_copy
    assert make_condition_copy.main(["--src", src, "--out", out2, "--seed", "3", "--nj", "1"]) == 0
    assert mtimes(out2) == before


def test_a_killed_run_resumes_and_keeps_the_whole_wavs(src, reference, tmp_path):
    """A real kill: the parent and its render child are killed by SIGKILL once three WAVs
    are there; the rerun keeps those three (not rewritten) and makes the rest."""
    out = str(tmp_path / "copy")
    script = f"""
import os, signal
from toolkit.voicebank import conditions
real, done = conditions._render_one, []
def render_then_die(*args):
    result = real(*args)
    done.append(result)
    if len(done) == 3:
        open({out!r} + "/wavs/.tmp-half.wav", "wb").write(b"RIFF")   # a write cut short
        os.killpg(os.getpgid(0), signal.SIGKILL)
    return result
conditions._render_one = render_then_die
conditions.write_condition_copy({src!r}, {out!r}, seed=3, nj=1)
"""
    proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT, start_new_session=True,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    wavs = os.path.join(out, "wavs")
    kept = sorted(n for n in os.listdir(wavs) if not n.startswith("."))
    assert len(kept) == 3 and os.path.exists(os.path.join(wavs, ".tmp-half.wav"))
    assert not os.path.exists(os.path.join(out, "wav.scp"))          # tables come last
    stamp = conditions._read_stamp(out)
    assert stamp["finished"] is False
    written = {n: os.stat(os.path.join(wavs, n)).st_mtime_ns for n in kept}
    conditions.write_condition_copy(src, out, seed=3, nj=2)
    assert {n: os.stat(os.path.join(wavs, n)).st_mtime_ns for n in kept} == written
    assert files_of(out) == files_of(reference[0])                  # as if never killed
    assert conditions._read_stamp(out)["finished"] is True


def test_other_arguments_remake_only_this_writers_files(src, reference, tmp_path):
    out = str(tmp_path / "copy")
    conditions.write_condition_copy(src, out, seed=3, nj=1)
    with open(os.path.join(out, "notes.txt"), "w") as f:
        f.write("mine")
    with open(os.path.join(out, "wavs", "README"), "w") as f:
        f.write("mine too")
    settings = ConditionSettings(room_prob=0.0, noise_prob=1.0, noise_kinds=("pink",),
                                 channel_prob=1.0, channels=("telephone",), clip_prob=0.0,
                                 mic_also_prob=0.0)
    summary = conditions.write_condition_copy(src, out, seed=3, nj=1, settings=settings)
    labels = kaldi.read_table(os.path.join(out, "utt2cond"))
    assert summary["conditions"] == {"noise": 6, "telephone": 6}
    assert all(re.fullmatch(r"noise:pink/\d+\.\ddB\+telephone:g711", v) for v in labels.values())
    assert open(os.path.join(out, "notes.txt")).read() == "mine"
    assert open(os.path.join(out, "wavs", "README")).read() == "mine too"
    changed = files_of(out)
    assert changed["wavs/spk0-utt00.wav"] != files_of(reference[0])["wavs/spk0-utt00.wav"]
    # Another seed changes the chains as well.
    conditions.write_condition_copy(src, out, seed=4, nj=1)
    assert kaldi.read_table(os.path.join(out, "utt2cond")) != \
        kaldi.read_table(os.path.join(reference[0], "utt2cond"))


def test_a_folder_without_the_stamp_is_refused_untouched(src, tmp_path):
    out = tmp_path / "theirs"
    out.mkdir()
    (out / "wav.scp").write_text("a /x.wav\n")
    with pytest.raises(DataError, match="did not write"):
        conditions.write_condition_copy(src, str(out), seed=3)
    assert sorted(os.listdir(out)) == ["wav.scp"]
    with pytest.raises(DataError, match="folder of its own"):
        conditions.write_condition_copy(src, src, seed=3)


def test_unreadable_audio_is_skipped_counted_or_an_error_naming_it(src, tmp_path, monkeypatch,
                                                                   capsys):
    bad = tmp_path / "bad"
    bad.mkdir()
    for name in ("text", "utt2spk"):
        (bad / name).write_text(open(os.path.join(src, name)).read())
    scp = kaldi.read_table(os.path.join(src, "wav.scp"))
    broken = tmp_path / "broken.wav"
    broken.write_bytes(b"RIFF\x00\x00\x00\x00WAVEnot audio")
    scp["spk1-utt01"] = str(broken)
    kaldi.write_table(str(bad / "wav.scp"), scp)
    from toolkit.bin import make_condition_copy
    out = str(tmp_path / "copy")
    assert make_condition_copy.main(["--src", str(bad), "--out", out, "--nj", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("error: ") and "spk1-utt01" in err and "1 of 6" in err, err
    monkeypatch.setattr(conditions, "MAX_SKIPPED", 0.2)
    summary = conditions.write_condition_copy(str(bad), out, seed=1234, nj=1)
    assert summary["utts"] == 5 and summary["skipped"] == 1
    assert "spk1-utt01" not in kaldi.read_table(os.path.join(out, "wav.scp"))
    assert "spk1-utt01" not in kaldi.read_table(os.path.join(out, "text"))
    # A missing wav.scp is named.
    (tmp_path / "empty").mkdir()
    with pytest.raises(MissingInputError, match=r"empty/wav.scp not found"):
        conditions.write_condition_copy(str(tmp_path / "empty"), str(tmp_path / "x"), seed=1)


def test_every_condition_at_once_through_the_binary(src, tmp_path, capsys):
    from toolkit.bin import make_condition_copy
    out = str(tmp_path / "all")
    assert make_condition_copy.main([
        "--src", src, "--out", out, "--nj", "2", "--room-prob", "1", "--noise-prob", "1",
        "--noise-kinds", "babble", "--channel-prob", "1", "--channels", "codec2,opus",
        "--mic-also-prob", "1", "--clip-prob", "1", "--snr-db", "5,10"]) == 0
    assert "6 utterances" in capsys.readouterr().out
    for label in kaldi.read_table(os.path.join(out, "utt2cond")).values():
        assert re.fullmatch(r"room:\w+/[\d.]+m\+noise:babble/(5|6|7|8|9|10)\.\ddB\+mic:eq\d\+"
                            r"clip:[\d.]+%\+(codec2:\w+|opus:\d+kbps)", label), label
    assert make_condition_copy.main(["--src", src, "--out", out, "--channels", "radio"]) == 2
    assert "channels radio" in capsys.readouterr().err
