"""Expected errors reach the user as one `error:` line and exit status 2, never a
traceback: through the recipes (no GPU, nothing exported yet) and the binaries (a bad
config key, a duplicate key in a data dir, a missing data list, a missing model)."""
import os
import subprocess
import sys

import pytest

from train_utils import ROOT, Corpus, env, run_train

RECIPE = os.path.join(ROOT, "egs", "wake_word", "s0", "run.sh")


def assert_one_error_line(proc, *needles):
    text = proc.stdout + proc.stderr
    assert proc.returncode == 2, text[-3000:]
    assert "Traceback" not in text and "ChildFailedError" not in text, text[-3000:]
    errors = [line for line in text.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, text[-3000:]
    for needle in needles:
        assert needle in errors[0], errors[0]


def recipe(tmp_path, *args):
    return subprocess.run(["bash", RECIPE, "--data", str(tmp_path / "data"),
                           "--exp", str(tmp_path / "exp"), *args], capture_output=True,
                          text=True, env=env(), timeout=300)


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="this machine has CUDA")
def test_gpus_requested_without_cuda(tmp_path):
    proc = recipe(tmp_path, "--stage", "3", "--stop-stage", "3", "--gpus", "0")
    assert_one_error_line(proc, "gpus=0", "no usable CUDA device", "gpus=-1")


def test_scoring_before_export_names_the_missing_model(tmp_path):
    proc = recipe(tmp_path, "--stage", "6", "--stop-stage", "6")
    assert_one_error_line(proc, "model.onnx not found", "export stage")


def test_bad_gpus_value(tmp_path):
    proc = recipe(tmp_path, "--stage", "3", "--stop-stage", "3", "--gpus", "zero")
    assert_one_error_line(proc, "gpus=zero")


def test_binaries_report_input_errors_in_one_line(tmp_path):
    corpus = Corpus(str(tmp_path / "c"), num_train=6, num_dev=2)
    bad_key = run_train(corpus.train_args(str(tmp_path / "e1"), "training.max_epochs=3"))
    assert_one_error_line(bad_key, "training.max_epochs")
    missing = run_train(corpus.train_args(str(tmp_path / "e2"), train=str(tmp_path / "nope.list")))
    assert_one_error_line(missing, "nope.list", "not found")
    # A duplicate key in a Kaldi data dir: the line, and what fixes it.
    data = tmp_path / "dup"
    data.mkdir()
    wav = open(corpus.train).readline().split('"wav": "')[1].split('"')[0]
    (data / "wav.scp").write_text(f"a {wav}\nb {wav}\nb {wav}\n")
    (data / "text").write_text("a hey chirp\nb hey chirp\n")
    proc = subprocess.run([sys.executable, "-m", "toolkit.bin.make_datalist", str(data),
                           str(tmp_path / "dup.list"), "--inventory", corpus.inventory],
                          capture_output=True, text=True, env=env(), timeout=120)
    assert_one_error_line(proc, "wav.scp:3: duplicate key b", "utils/fix_data_dir.sh")
    no_model = subprocess.run([sys.executable, "-m", "toolkit.bin.kws", "--model",
                               str(tmp_path / "missing.onnx"), wav], capture_output=True,
                              text=True, env=env(), timeout=120)
    assert_one_error_line(no_model, "missing.onnx not found")
