"""tools/benchmarks/oww_verifier.py: openWakeWord's custom verifier, trained by its own
train_custom_verifier per enrolled voice and applied offline to each clip's stored
openWakeWord windows, on a small real plan: three espeak-ng voices saying "hey jarvis"
(three enrolment clips and two held-out clips each), a few negatives and other speech as
the verifier's negative reference."""
import json
import os

import numpy as np
import pytest
import soundfile as sf

from in_process import run_main
from tool_module import load_tool

pytest.importorskip("openwakeword")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOOL = os.path.join(ROOT, "tools", "benchmarks", "oww_verifier.py")
RATE = 16000
VOICES = {"A": "en-us+f3", "B": "en+m3", "C": "en-gb-x-rp+klatt"}
PROSODY = [(150, 45), (165, 50), (180, 55), (160, 40), (172, 60)]   # (rate, pitch) per clip
NEGATIVES = ["good morning the train leaves at nine", "hey travis, are you there",
             "turn on the lights please", "jars of jam on the shelf"]
REFERENCE = ["the quick brown fox jumps over the lazy dog", "please call me back tomorrow",
             "what a lovely day it is", "the meeting starts at ten"]


@pytest.fixture(scope="module")
def tool():
    return load_tool("benchmarks/oww_verifier.py")


@pytest.fixture(scope="module")
def plan(tmp_path_factory):
    """The plan file and its content: 16-bit WAVs rendered with fixed seeds."""
    from toolkit.data.audio import resample
    from toolkit.voicebank.espeak import Espeak
    out = tmp_path_factory.mktemp("oww_verifier_plan")
    engine = Espeak()

    def say(text, voice, seed, rate=175, pitch=50):
        engine.seed(seed)
        return resample(engine.synth(text, voice, rate=rate, pitch=pitch), engine.rate, RATE)

    def write(name, wave):
        path = str(out / f"{name}.wav")
        sf.write(path, wave, RATE, subtype="PCM_16")
        return path

    positives, enrol = [], {}
    for spk, voice in VOICES.items():
        for i, (rate, pitch) in enumerate(PROSODY):
            key = f"{spk}_{i}"
            positives.append({"key": key, "spk": spk,
                              "wav": write(key, say("hey jarvis", voice, i, rate, pitch))})
        enrol[spk] = [f"{spk}_0", f"{spk}_1", f"{spk}_2"]
    negatives = []
    for i, text in enumerate(NEGATIVES):
        wave = say(text, "en-us+m1", i)
        negatives.append({"key": f"neg{i}", "wav": write(f"neg{i}", wave),
                          "duration": len(wave) / RATE})
    reference = [write(f"ref{i}", say(text, ("en-029+f1", "en-us+m2")[i % 2], i))
                 for i, text in enumerate(REFERENCE)]
    content = {"keyword": "hey jarvis", "positives": positives, "negatives": negatives,
               "negative_reference": reference, "enrol": enrol}
    (out / "plan.json").write_text(json.dumps(content))
    return str(out / "plan.json"), content


@pytest.fixture(scope="module")
def run(tool, plan, tmp_path_factory):
    out = tmp_path_factory.mktemp("oww_verifier_out")
    result = run_main(tool.main, ["--plan", plan[0], "--out-dir", out, "--match-frr", "0.5",
                                  "--nj", "1"])
    assert result.returncode == 0, result.stderr[-3000:]
    return result, out, json.loads((out / "results.json").read_text())


def test_it_runs_end_to_end_with_figures_per_voice(run, plan):
    result, out, res = run
    assert (out / "results.md").read_text() in result.stdout
    assert res["enrolled"] == 3 and res["failed"] == []
    assert res["openwakeword"]["custom_verifier_threshold_default"] == 0.1
    # The detector threshold is the ungated model's 1 FA/h point, and the ungated row
    # (counted clip by clip here) agrees with the DET counting that chose it.
    assert res["mean"]["ungated"]["fa_per_hour"] == res["detector"]["fa_per_hour"] <= 1.0
    for spk in VOICES:
        v = res["voices"][spk]
        assert os.path.isfile(v["verifier"]) and v["error"] is None
        assert v["held_out_positives"] == 2 and v["impostor_positives"] == 10
        assert v["train_windows"]["positive"] > 0 and v["train_windows"]["negative"] > 0
        for row in ("ungated", "oww_defaults", "gate_at_default"):
            assert set(v[row]) == {"frr", "ia", "fa_per_hour"}
            assert 0 <= v[row]["frr"] <= 1 and 0 <= v[row]["ia"] <= 1
    curve = res["curve"]
    frr, ia = np.array(curve["frr"]), np.array(curve["ia"])
    assert len(curve["threshold"]) == len(frr) > 1000
    assert np.all(np.diff(frr) >= -1e-12) and np.all(np.diff(ia) <= 1e-12)
    assert frr[-1] == 1.0 and ia[-1] == 0.0              # nothing passes p >= 1
    match = res["match_frr"]["gate"]
    assert match["frr"] <= 0.5
    assert match["ia"] == min(i for f, i in zip(frr, ia) if f == match["frr"])
    assert not any(match["frr"] < f <= 0.5 for f in frr)


def test_a_voice_scores_its_own_clips_above_other_voices_clips(tool, run, plan, tmp_path):
    """Each voice's pickled verifier run by openWakeWord's own Model (custom_verifier_models,
    default custom_verifier_threshold) over the held-out clips: the verifier's probability
    per clip (max over the chunks it is asked about) is higher on the voice's own clips
    than on the other voices' clips, and the tool's offline figures are those numbers.
    One Model holds the wake-word model once ungated and once per voice (copies of the ONNX
    file named after the voice, each with that voice's verifier): its audio features, the
    bulk of the work, are computed once per clip instead of once per clip and model."""
    import shutil

    import openwakeword
    from toolkit.data.features import oww_model_dir
    _, _, res = run
    path, content = plan
    cvt = res["openwakeword"]["custom_verifier_threshold_default"]
    enrolled = {k for keys in content["enrol"].values() for k in keys}
    # The wake-word model under one name per voice (gated by that voice's verifier), then
    # under one more, ungated.
    gate = {spk: f"hey_jarvis_gated_{spk}" for spk in VOICES}
    names = [*gate.values(), "hey_jarvis_ungated"]
    for name in names:
        shutil.copyfile(os.path.join(oww_model_dir(), "hey_jarvis_v0.1.onnx"),
                        tmp_path / f"{name}.onnx")
    verifier = {spk: res["voices"][spk]["verifier"] for spk in VOICES}
    first, *rest = VOICES
    model = openwakeword.Model(wakeword_models=[str(tmp_path / f"{n}.onnx") for n in names],
                               inference_framework="onnx",
                               custom_verifier_models={gate[first]: verifier[first]},
                               custom_verifier_threshold=cvt)
    # openWakeWord 0.5.1's constructor takes one verifier at most, its first model's (after
    # each model it loads it compares the verifiers loaded with those given, model.py:186);
    # the others go where it put that one, unpickled as it does.
    for spk in rest:
        model.custom_verifier_models[gate[spk]] = tool.load_verifier(verifier[spk])
    assert list(model.models) == names and set(model.custom_verifier_models) == set(gate.values())

    def chunk_scores(clip):
        audio = tool.padded_int16(tool.read_wave(clip["wav"]), clip["key"], 2.0, 0.5)
        out = [model.predict(audio[i:i + 1280]) for i in range(0, len(audio) - 1279, 1280)]
        out = out[25:]                                # chunks ending after the 2 s lead
        return {name: np.array([o[name] for o in out]) for name in model.models}

    scores = {c["key"]: chunk_scores(c) for c in content["positives"]}
    aucs = []
    for spk in VOICES:
        v = res["voices"][spk]
        own, others = [], []
        for clip in content["positives"]:
            if clip["key"] in enrolled and clip["spk"] == spk:
                continue
            w, s = scores[clip["key"]]["hey_jarvis_ungated"], scores[clip["key"]][gate[spk]]
            assert np.any(w >= cvt), clip["key"]          # the verifier is asked on every clip
            (own if clip["spk"] == spk else others).append(s[w >= cvt].max())
        own, others = np.array(own), np.array(others)
        assert own.mean() > others.mean(), (spk, own, others)
        sep = v["separation"]
        assert sep["own_clips"] == 2 and sep["other_clips"] == 10
        assert abs(sep["mean_prob_own"] - own.mean()) < 1e-6
        assert abs(sep["mean_prob_others"] - others.mean()) < 1e-6
        aucs.append(((own[:, None] > others[None]) + 0.5 * (own[:, None] == others[None])).mean())
        assert abs(sep["auc"] - aucs[-1]) < 1e-9
    assert np.mean(aucs) >= 0.75, aucs


@pytest.mark.parametrize("fault", ["enrol key", "wav", "field"])
def test_a_bad_plan_is_one_error_line_naming_the_key_or_file(tool, plan, tmp_path, fault):
    content = json.loads(json.dumps(plan[1]))
    if fault == "enrol key":
        content["enrol"]["B"][2] = "B_9"
        want = "enrol['B'] names key 'B_9', which is not among the positives"
    elif fault == "wav":
        content["positives"][4]["wav"] = str(tmp_path / "gone.wav")
        want = f"positives[4] (key 'A_4'): wav file {tmp_path / 'gone.wav'} not found"
    else:
        del content["negatives"][1]["duration"]
        want = "negatives[1] (key 'neg1') has no 'duration'"
    bad = tmp_path / "plan.json"
    bad.write_text(json.dumps(content))
    result = run_main(tool.main, ["--plan", bad, "--out-dir", tmp_path / "out", "--nj", "1"])
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [f"error: {bad}: {want}"]
    assert not (tmp_path / "out").exists()
