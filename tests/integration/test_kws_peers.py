"""The opt-in wake-word peers of tools/benchmarks/oww_compare.py (microWakeWord and
PocketSphinx, tools/benchmarks/kws_peers.py), run for real on espeak-ng speech padded as
oww_compare pads it: well-formed scores, no state carried between clips, the keyword ranked
above an unrelated sentence, and oww_compare's wiring of them. tools/test.sh installs them
(tools/install_kws_peers.sh): a missing package fails these tests, it never skips them."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import soundfile as sf

from in_process import run_main
from installed import require_module
from tool_module import load_tool

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
INSTALL = "bash tools/install_kws_peers.sh"
RATE, LEAD, TAIL = 16000, 2.0, 0.5
KEYWORDS = ("hey jarvis", "alexa")
OTHER = "the weather is nice today"
# espeak-ng's eight English accents (not chosen for the results below).
ACCENTS = ("en", "en-us", "en-us-nyc", "en-gb-scotland", "en-gb-x-rp", "en-gb-x-gbclan",
           "en-gb-x-gbcwmd", "en-029")
# libespeak-ng keeps waveform state from one utterance to the next: a fresh interpreter
# renders the clips in a fixed order, so they do not depend on what the worker ran before.
RENDER = """
import json, sys
import numpy as np
from toolkit.data.audio import resample
from toolkit.voicebank.espeak import Espeak
engine, clips = Espeak(), {}
for accent in json.loads(sys.argv[3]):
    for text in json.loads(sys.argv[2]):
        engine.seed(0)
        clips[text + "|" + accent] = resample(engine.synth(text, accent), engine.rate, 16000)
np.savez(sys.argv[1], **clips)
"""


@pytest.fixture(scope="module")
def tool():
    require_module("pymicro_wakeword", INSTALL)
    require_module("pocketsphinx", INSTALL)
    return load_tool("benchmarks/oww_compare.py")


@pytest.fixture(scope="module")
def speech(tmp_path_factory):
    """(text, accent) -> the unpadded float32 clip at 16 kHz."""
    path = tmp_path_factory.mktemp("kws_peers") / "clips.npz"
    subprocess.run([sys.executable, "-c", RENDER, str(path), json.dumps(KEYWORDS + (OTHER,)),
                    json.dumps(ACCENTS)], check=True, timeout=120,
                   env=dict(os.environ, PYTHONPATH=ROOT))
    with np.load(path) as z:
        return {tuple(k.split("|")): z[k].astype(np.float32) for k in z.files}


def threads() -> int:
    return len(os.listdir("/proc/self/task"))


@pytest.mark.parametrize("keyword", KEYWORDS)
@pytest.mark.parametrize("peer", ["micro_wakeword", "pocketsphinx"])
def test_peer_scores_rank_the_keyword_above_an_unrelated_sentence(tool, speech, peer, keyword):
    before = threads()
    system = tool.PEERS[peer][0](keyword)
    first, peaks = None, {}
    for (text, accent), wave in sorted(speech.items()):
        if text not in (keyword, OTHER):
            continue
        audio = tool.padded(wave, f"{text}|{accent}", LEAD, TAIL)
        probs = system.scores(system.extractor.compute(audio))
        ends = system.frame_end_s(len(probs))
        assert probs.dtype == np.float32 and probs.ndim == 2 and probs.shape[1] == 1
        assert len(probs) >= 1 and len(ends) == len(probs)
        assert np.all((probs >= 0) & (probs <= 1))
        assert np.all(np.diff(ends) > 0) and ends[0] > 0 and ends[-1] <= len(audio) / RATE
        if peer == "pocketsphinx":      # a last frame at the clip's end keeps every clip
            assert ends[-1] == pytest.approx(len(audio) / RATE)
        peaks[text, accent] = float(probs.max())
        first = first or (audio, probs)
    again = system.scores(system.extractor.compute(first[0]))
    np.testing.assert_array_equal(again, first[1])          # nothing kept from other clips
    assert threads() == before                               # one thread per process
    wins = [a for a in ACCENTS if peaks[keyword, a] > peaks[OTHER, a]]
    # Measured: microWakeWord hey_jarvis 5 of 8 (its keyword peaks: 0.0008 to 0.91; 3 tie or
    # lose at <= 0.01), alexa 8 of 8 (0.99 vs <= 0.009); PocketSphinx "hey jarvis" 8 of 8
    # (0.04 to 0.79 vs no candidate), "alexa" 5 of 8 (0.15 to 0.72 vs 0.19 to 0.57: its
    # short keyphrase fires on unrelated speech). Hence the majority, not every accent.
    assert len(wins) > len(ACCENTS) / 2, (wins, peaks)


def test_unknown_keywords_are_named():
    require_module("pocketsphinx", INSTALL)
    sys.path.insert(0, os.path.join(ROOT, "tools", "benchmarks"))
    try:
        import kws_peers
    finally:
        sys.path.pop(0)
    with pytest.raises(ValueError, match=r"dictionary has no \['zorblax'\]"):
        kws_peers.PocketSphinxSystem("hey zorblax").scores(np.zeros(RATE, np.int16))
    with pytest.raises(ValueError, match="no builtin model for 'hey zorblax'"):
        kws_peers.MicroWakeWordSystem("hey zorblax")


def test_oww_compare_scores_the_peers_after_openwakeword(tool, speech, tmp_path):
    """score_clips: openWakeWord, then the peers in PEERS' order whatever order they are
    asked in, each with only the frames that end after the lead."""
    require_module("openwakeword", "bash tools/install_oww.sh")
    from toolkit.data.features import oww_model_dir
    clips = []
    for text in ("hey jarvis", OTHER):
        key = f"{text.replace(' ', '_')}-en-us"
        sf.write(tmp_path / f"{key}.wav", speech[text, "en-us"], RATE, subtype="FLOAT")
        clips.append({"key": key, "wav": str(tmp_path / f"{key}.wav"), "kind": "pos",
                      "duration": len(speech[text, "en-us"]) / RATE})
    got = tool.score_clips(clips, "hey jarvis", [], oww_model_dir(), LEAD, TAIL, 1,
                           peers=("pocketsphinx", "micro_wakeword"))
    assert len(got) == 3
    for column, peer in ((1, "micro_wakeword"), (2, "pocketsphinx")):
        system = tool.PEERS[peer][0]("hey jarvis")
        for clip, kept in zip(clips, got[column]):
            wave, _ = sf.read(clip["wav"], dtype="float32")
            probs = system.scores(system.extractor.compute(
                tool.padded(wave, clip["key"], LEAD, TAIL)))
            np.testing.assert_array_equal(kept, probs[system.frame_end_s(len(probs)) > LEAD])


@pytest.mark.parametrize("flag,module", [("--micro-wakeword", "pymicro_wakeword"),
                                         ("--pocketsphinx", "pocketsphinx")])
def test_oww_compare_names_the_installer_of_a_missing_peer(tool, tmp_path, monkeypatch, flag,
                                                           module):
    require_module("openwakeword", "bash tools/install_oww.sh")
    monkeypatch.setitem(sys.modules, module, None)         # import fails, as uninstalled
    result = run_main(tool.main, ["--out-dir", tmp_path / "out", flag, "--size", "tiny"])
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert INSTALL in result.stderr and flag in result.stderr
    assert not (tmp_path / "out").exists()


def test_oww_compare_scores_every_system_as_a_product(tool):
    """The threshold from general negatives only (a neighbour scoring above every positive
    never sets it), then neighbours by category and accent variants counted at it."""
    def clip(kind, category="", seconds=360.0):
        return {"kind": kind, "category": category, "text": f"{kind} {category}",
                "speaker": "v", "duration": seconds}
    clips = [clip("pos")] * 4 + [clip("neg")] * 9 + [clip("noise")] \
        + [clip("conf", "real_word"), clip("conf", "alone"), clip("conf", "inside_word")] \
        + [clip("accent", "accent")] * 2
    peaks = [0.9, 0.8, 0.5, 0.2] + [0.1] * 8 + [0.45, 0.0] + [0.99, 0.3, 0.95] + [0.85, 0.05]
    row = tool.product_row([np.array([[p]], np.float32) for p in peaks], clips)
    assert row["general_hours"] == pytest.approx(1.0) and row["positives"] == 4
    # 1 FA/h over 1 h: the top general negative (0.45) may fire, the next (0.1) not
    assert row["threshold"]["1.0"] == pytest.approx(0.1, abs=1e-6)
    assert row["frr"]["1.0"] == 0.0 and row["frr"]["0.5"] == 0.25
    rep = row["product"]
    assert rep["neighbours"] == {"clips": 2, "fired": 2, "share": 1.0}
    assert rep["categories"]["inside_word"]["fired"] == 1
    assert rep["accent"] == {"clips": 2, "accepted": 1, "share": 0.5}
