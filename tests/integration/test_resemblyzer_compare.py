"""tools/benchmarks/resemblyzer_compare.py: Resemblyzer's embeddings of a recipe's test
sets scored by the recipe's own score_speaker on the same trial lists, beside the recipe's
results. The real encoder runs (tools/test.sh installs Resemblyzer; the tool itself is
opt-in); without it the tool says how to install it, in one line."""
import json
import os
import sys

import pytest

from toolkit.tasks.speaker import corpus as sc
from in_process import run_main
from installed import require_module
from tool_module import load_tool

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOOL = os.path.join(ROOT, "tools", "benchmarks", "resemblyzer_compare.py")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """A tiny espeak-ng speaker corpus: 4 test speakers of 3 utterances, 3 cohort speakers."""
    out = tmp_path_factory.mktemp("rz") / "data"
    sc.generate_corpus(str(out), seed=5, sizes=sc.Sizes(3, 2, 4, 2, 2, 3), nj=2)
    return out


@pytest.fixture(scope="module")
def tool():
    return load_tool("benchmarks/resemblyzer_compare.py")


def run_tool(tool, *args):
    """The tool's real main(argv), in this process (in_process.run_main): no interpreter
    start-up and torch, Resemblyzer and toolkit imports per run."""
    return run_main(tool.main, args)


def test_without_resemblyzer_it_says_how_to_install_it(tool, corpus, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "resemblyzer", None)         # import fails, as uninstalled
    result = run_tool(tool, "--data", corpus, "--out-dir", tmp_path / "out")
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("error: Resemblyzer is not "
                                                             "installed")
    assert "bash tools/install_resemblyzer.sh" in result.stderr
    assert not (tmp_path / "out" / "embeddings").exists()


def test_a_test_set_without_trials_is_named(tool, corpus, tmp_path):
    result = run_tool(tool, "--data", str(corpus), "--test-sets", "test dev", "--out-dir",
                      str(tmp_path / "out"))
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines()[-1] == f"error: {corpus}/dev has no trials file"


def test_resemblyzer_scored_by_score_speaker_beside_a_recipe(tool, corpus, tmp_path):
    require_module("resemblyzer", "bash tools/install_resemblyzer.sh")
    # A recipe's scores of the same list, as its scoring stage (utils/speaker_score.sh) leaves them.
    exp = tmp_path / "exp_x"
    (exp / "score" / "trials").mkdir(parents=True)
    recipe = {"eer_percent": 12.5, "eer_threshold": 0.3, "min_dcf_0.01": 0.9,
              "min_dcf_0.05": 0.7, "trials": 66, "targets": 12, "nontargets": 54}
    (exp / "score" / "trials" / "result.json").write_text(json.dumps(
        {"trials": str(corpus / "test" / "trials"), "systems": {"cosine": recipe}}))
    out = tmp_path / "out"
    result = run_tool(tool, "--data", str(corpus), "--out-dir", str(out), "--exp", str(exp),
                      "--cohort-dir", str(corpus / "train"), "--cohort-utts-per-spk", "2",
                      "--as-norm-top", "2", "--nj", "1")
    assert result.returncode == 0, result.stderr[-3000:]
    import kaldiio
    vectors = kaldiio.load_scp(str(out / "embeddings" / "test" / "embeddings.scp"))
    assert len(vectors) == 12 and {v.shape for v in vectors.values()} == {(256,)}
    cohort = kaldiio.load_scp(str(out / "embeddings" / "cohort" / "speaker_embeddings.scp"))
    assert len(cohort) == 3
    got = json.loads((out / "results.json").read_text())["trials"]["systems"]
    assert set(got) == {"resemblyzer", "resemblyzer_cohort", "exp_x"}
    assert set(got["resemblyzer"]) == {"cosine"}
    assert set(got["resemblyzer_cohort"]) == {"cosine", "cosine + AS-Norm top 2"}
    assert got["exp_x"]["cosine"] == recipe
    plain = got["resemblyzer"]["cosine"]
    assert plain["trials"] == 66 and plain["targets"] == 12 and 0 <= plain["eer_percent"] <= 100
    # Each vector is Resemblyzer's own embedding of the utterance, as its authors make it.
    import soundfile
    from resemblyzer import VoiceEncoder, preprocess_wav
    key, path = (corpus / "test" / "wav.scp").read_text().splitlines()[0].split()
    audio, rate = soundfile.read(path, dtype="float32")
    own = VoiceEncoder("cpu", verbose=False).embed_utterance(preprocess_wav(audio, rate))
    assert abs(vectors[key] - own).max() < 1e-5
    summary = (out / "score" / "resemblyzer" / "trials" / "summary.txt").read_text()
    assert summary.startswith("resemblyzer trials cosine: EER ")
    table = (out / "results.md").read_text()
    assert table in result.stdout
    assert "| trials | resemblyzer | 66 (12) |" in table and "| trials | exp_x: cosine |" in table
    # Rerun: the embeddings are reused.
    mtime = os.path.getmtime(out / "embeddings" / "test" / "embeddings.scp")
    again = run_tool(tool, "--data", str(corpus), "--out-dir", str(out), "--nj", "1")
    assert again.returncode == 0 and "reusing" in again.stderr
    assert os.path.getmtime(out / "embeddings" / "test" / "embeddings.scp") == mtime
