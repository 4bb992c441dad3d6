"""tools/benchmarks/personal_kws_speed.py (issue 55) on a tiny stream: 8 s with the keyword
every 4 s (voice A, then another voice), one pass each. It checks that the report is
complete and the numbers are sane, never that anything is fast (timings of a busy test
machine mean nothing)."""
import json
import math
import os
import subprocess
import sys

import pytest

from in_process import run_main
from tool_module import load_tool

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOOL = os.path.join(ROOT, "tools", "benchmarks", "personal_kws_speed.py")
ROWS = ["enrolment, 3 clips (models loaded: enrol + save)", "enrolment with the model loads",
        "ungated detection:", "gated detection:", "speaker scoring, per firing",
        "gated vs ungated RTF"]


@pytest.fixture(scope="module")
def tool():
    return load_tool("benchmarks/personal_kws_speed.py")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    # In a fresh interpreter: espeak-ng's audio depends on what the process said before
    # (toolkit.voicebank.espeak), and in this worker's process earlier tests spoke.
    out = tmp_path_factory.mktemp("personal_kws_speed") / "speed.json"
    result = subprocess.run([sys.executable, TOOL, "--seconds", "8", "--keyword-every", "4",
                             "--repeats", "1", "--out", str(out)], capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return result, json.loads(out.read_text())


def positive(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x) and x > 0


def test_the_table_and_json_have_every_row(run):
    result, res = run
    table = [line for line in result.stdout.splitlines() if line.startswith("| ")]
    assert table[0] == "| what | seconds | RTF | target | met? |"
    body = table[1:]
    assert len(body) == len(ROWS) == len(res["rows"])
    for want, line, row in zip(ROWS, body, res["rows"]):
        assert line.startswith(f"| {want}"), line
        assert row["what"].startswith(want), row
        assert len(line.split("|")) == 7, line                     # 5 cells
    for line, row in zip(body, res["rows"]):
        if row["met"] is not None:
            assert line.rstrip(" |").endswith("yes" if row["met"] else "NO"), line
    targets = [r for r in res["rows"] if r["target"]]
    assert [r["what"] for r in targets] == [r["what"] for r, want in zip(res["rows"], ROWS)
                                            if want in (ROWS[0], ROWS[1], ROWS[5])]
    assert all(isinstance(r["met"], bool) for r in targets)


def test_the_gate_scored_firings_and_the_numbers_are_sane(run):
    _, res = run
    assert res["stream"]["seconds"] == 8 and len(res["stream"]["keywords"]) == 2
    assert [k["enrolled"] for k in res["stream"]["keywords"]] == [True, False]
    gated, ungated = res["gated"], res["ungated"]
    assert len(ungated["firings"]) >= 1
    assert gated["kept"] + gated["rejected"] >= 1
    # Every firing of the ungated detector is scored by the gate, and kept or rejected.
    assert gated["speaker_scores_computed"] == gated["kept"] + gated["rejected"] \
        == len(ungated["firings"])
    assert len(gated["speaker_scores"]) == gated["speaker_scores_computed"]
    assert all(math.isfinite(s) for s in gated["speaker_scores"])
    assert all(f["speaker_score"] >= gated["gate_threshold"] for f in gated["kept_firings"])
    enrolment = res["enrolment"]
    for value in (enrolment["seconds"], enrolment["cold_seconds"],
                  enrolment["detector_load_seconds"], enrolment["encoder_load_seconds"],
                  ungated["seconds"], ungated["rtf"], gated["seconds"], gated["rtf"],
                  gated["speaker_scoring_seconds"]):
        assert positive(value), res
    assert enrolment["cold_seconds"] > enrolment["seconds"]
    assert math.isfinite(res["relative_difference"])
    assert res["relative_difference"] == pytest.approx(gated["rtf"] / ungated["rtf"] - 1)
    for row in res["rows"]:
        assert row["seconds"] is None or positive(row["seconds"]), row
        assert row["rtf"] is None or math.isfinite(row["rtf"]), row


@pytest.mark.parametrize("args,message", [
    (["--repeats", "0"], "--repeats must be >= 1"),
    (["--seconds", "8", "--keyword-every", "2"], "--keyword-every must be between"),
    (["--seconds", "8", "--keyword-every", "10"], "--keyword-every must be between"),
    (["--seconds", "-1"], "--seconds must be > 0"),
    (["--fuse-zero-shot"], "--fuse-zero-shot fuses a --model"),
])
def test_bad_arguments_exit_2(tool, args, message):
    result = run_main(tool.main, args)
    assert result.returncode == 2 and message in result.stderr, result.stderr
