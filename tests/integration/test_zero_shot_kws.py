"""`toolkit.bin.kws` and `Detector.zero_shot` as a user meets them, with the shipped phone
front end and real espeak-ng speech: a long spoken command is found, calibration counts
every firing of a negative recording, nested keywords both report, detections start where
the keyword began, and bad inputs or arguments get one line, not a traceback."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import soundfile as sf

from in_process import run_main

RATE = 16000
LONG = "okay google turn on the kitchen lights please and also the bedroom lights"
# Whole-second chunks: the streaming itself is tested elsewhere, here the decisions.
CHUNK = ["--chunk-ms", "1000"]


def kws(*args):
    """toolkit.bin.kws's real main(argv) in this process (in_process.run_main): a fresh
    interpreter per call only added its imports; test_bad_files_are_named_skipped_and_the_
    rest_scanned runs the real process."""
    from toolkit.bin import kws as binary
    return run_main(binary.main, CHUNK + list(args))


def kws_process(*args):
    """The binary as a user starts it: its own interpreter and exit status."""
    return subprocess.run([sys.executable, "-m", "toolkit.bin.kws", *CHUNK, *map(str, args)],
                          capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))


def detections(stdout):
    rows = [line.split("\t") for line in stdout.splitlines() if line.strip()]
    return [(r[0], r[1], float(r[2]), float(r[3]), float(r[4])) for r in rows]


@pytest.fixture(scope="module")
def audio(tmp_path_factory):
    """espeak-ng speech as 16 kHz WAV files, each rendered with a fixed seed."""
    from toolkit.data.audio import resample
    from toolkit.voicebank.espeak import Espeak
    out = tmp_path_factory.mktemp("kws_audio")
    engine = Espeak()
    pad = np.zeros(RATE // 2, np.float32)

    def say(text, seed=0):
        engine.seed(seed)
        return resample(engine.synth(text, "en-us"), engine.rate, RATE)

    files = {}

    def write(name, wave):
        files[name] = out / f"{name}.wav"
        sf.write(files[name], wave, RATE)

    write("jarvis", np.concatenate([pad, say("hey jarvis"), pad]))
    write("long", np.concatenate([pad, say(LONG), pad]))
    # A recording that fires again and again (the keyword, 2 s apart): calibration on it
    # must count every firing, not one per file.
    gap = np.zeros(2 * RATE, np.float32)
    write("neighbours", np.concatenate([np.concatenate([say("hey jarvis", i), gap])
                                        for i in range(8)]))
    write("other", np.concatenate([pad, say("good morning, the train leaves at nine"), pad]))
    write("silent", np.zeros(RATE, np.float32))
    write("empty", np.zeros(0, np.float32))
    nan = np.full(RATE, 0.1, np.float32)
    nan[100] = np.nan
    sf.write(out / "nan.wav", nan, RATE, subtype="FLOAT")
    files["nan"] = out / "nan.wav"
    files["list"] = out / "negatives.list"
    files["list"].write_text("".join(
        json.dumps({"key": k, "wav": str(files[k]), "duration": sf.info(files[k]).duration}) + "\n"
        for k in ("neighbours", "other", "silent")))
    return files


def test_a_keyword_longer_than_a_second_and_a_half_is_found(audio):
    from toolkit.tasks.kws.search import keyword_max_frames
    duration = sf.info(audio["long"]).duration - 1.0
    assert duration > 3.0                        # the command takes over 3 s to say
    got = detections(kws("--keywords", LONG, audio["long"]).stdout)
    assert [d[1] for d in got] == [LONG], got
    # It starts where the command began (0.5 s of silence first), not at its end.
    assert got[0][2] == pytest.approx(0.5, abs=0.25) and got[0][3] - got[0][2] > 3.0
    assert keyword_max_frames(4) == 150 and keyword_max_frames(60) == 1200


def test_detections_start_where_the_keyword_began(audio):
    (row,) = detections(kws("--keywords", "hey jarvis", audio["jarvis"]).stdout)
    start, end = row[2], row[3]
    assert start == pytest.approx(0.5, abs=0.15), row
    assert 0.4 < end - start < 1.2, row


def test_a_keyword_inside_another_reports_the_longer_one(audio):
    rows = detections(kws("--keywords", "hey jarvis,hey", audio["jarvis"]).stdout)
    assert [r[1] for r in rows] == ["hey jarvis"], rows
    # Said alone, the short one is reported (once the longer can no longer overlap it).
    rows = detections(kws("--keywords", "hey jarvis,jarvis", audio["jarvis"]).stdout)
    assert [r[1] for r in rows] == ["hey jarvis"], rows


def test_calibration_counts_every_firing_of_a_long_negative(audio):
    # 3 files, about 42 s: at 100 FA/h one alarm is allowed over them.
    files = [audio["neighbours"], audio["other"], audio["silent"]]
    run = kws("--keywords", "hey jarvis", "--calibrate", audio["list"], "--fa-per-hour", 100)
    assert run.returncode == 0, run.stderr
    threshold = float(run.stdout.split("threshold ")[1].split()[0])
    fired = detections(kws("--keywords", "hey jarvis", "--threshold", threshold, *files).stdout)
    assert len(fired) <= 1, (threshold, fired)
    # One alarm per file at most would allow a threshold just above the second file's
    # peak, where the first fires 8 times.
    everything = detections(kws("--keywords", "hey jarvis", "--threshold", 1e-4, *files).stdout)
    other_peak = max([d[4] for d in everything if d[0] == str(audio["other"])] or [0.0])
    repeated = [d for d in everything if d[0] == str(audio["neighbours"]) and d[4] > other_peak]
    assert len(repeated) >= 6, (other_peak, everything)
    assert threshold > other_peak + 0.1


def test_calibration_honours_smoothing(audio):
    plain = kws("--keywords", "hey jarvis", "--calibrate", audio["list"], "--fa-per-hour", 100)
    smooth = kws("--keywords", "hey jarvis", "--calibrate", audio["list"], "--fa-per-hour", 100,
                 "--smooth-frames", 100)
    value = [float(r.stdout.split("threshold ")[1].split()[0]) for r in (plain, smooth)]
    assert value[1] < value[0], value      # a 1 s mean peaks lower than single frames


def test_bad_files_are_named_skipped_and_the_rest_scanned(audio):
    run = kws_process("--keywords", "hey jarvis", audio["empty"], audio["silent"],
                      audio["nan"], audio["jarvis"], audio["jarvis"].with_name("missing.wav"))
    assert run.returncode == 1
    assert [d[0] for d in detections(run.stdout)] == [str(audio["jarvis"])]
    err = run.stderr
    assert f"skipped {audio['empty']}" in err and f"skipped {audio['nan']}" in err
    assert "missing.wav" in err and "3 of 5 input(s) skipped" in err
    assert "silent" not in err and "Traceback" not in err


@pytest.mark.parametrize("args,message", [
    (["--keywords", ","], "names no keyword"),
    (["--keywords", "日本"], "no English pronunciation"),
    (["--keywords", "!!!"], "no English pronunciation"),
])
def test_unusable_keywords_are_refused_in_one_line(audio, args, message):
    run = kws(*args, audio["jarvis"])
    assert run.returncode == 2 and message in run.stderr, run.stderr
    assert "Traceback" not in run.stderr


def test_calibrating_on_nothing_is_one_line(audio, tmp_path):
    empty = tmp_path / "empty.list"
    empty.write_text("")
    only_bad = tmp_path / "bad.list"
    only_bad.write_text(json.dumps({"key": "x", "wav": str(audio["nan"]), "duration": 1.0}) + "\n")
    for data_list in (empty, only_bad):
        run = kws("--keywords", "hey jarvis", "--calibrate", data_list)
        assert run.returncode != 0 and "Traceback" not in run.stderr, run.stderr
        assert str(data_list) in run.stderr


def test_a_model_without_a_threshold_is_one_line(audio, tmp_path):
    """A head exported without a stored threshold, and fusion without `fused_threshold`."""
    from toolkit.tasks.kws.detector import Detector
    from toolkit.tasks.kws.search import ZeroShotBackend
    from toolkit.errors import DataError
    with pytest.raises(DataError, match="stores no threshold"):
        Detector(ZeroShotBackend(["hey jarvis"]))
