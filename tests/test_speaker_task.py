"""The speaker-embedding task on the generic trainer, with the real binaries: training
with a ramped AAM margin and dev EER, exact SIGKILL resume (1 process, 2 gloo ranks),
the experiment contract (a reordered inventory is refused), fine-tuning onto another
speaker set (embedding strict, head re-initialised), export parity, extraction (resumable
parts, speaker means), scoring with AS-Norm, and the two-WAV CLI."""
import glob
import json
import os
import random
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch

from speaker_data import SpeakerCorpus
from test_trainer_resume import assert_same_run, train_with_kills
from train_utils import env, latest_payload, run_train


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return SpeakerCorpus(str(tmp_path_factory.mktemp("speakers")))


@pytest.fixture(scope="module")
def trained(corpus, tmp_path_factory):
    exp = str(tmp_path_factory.mktemp("trained") / "exp")
    result = run_train(corpus.train_args(exp))
    assert result.returncode == 0, result.stderr[-3000:]
    return exp, result.stderr


def test_training_logs_margin_ramp_and_dev_eer(trained):
    exp, log = trained
    margins = [float(line.split(" margin ")[1].split()[0]) for line in log.splitlines()
               if " margin " in line and "step " in line]
    assert margins[0] == 0.0 and margins[-1] == pytest.approx(0.2)
    assert margins == sorted(margins)
    assert "dev: eer " in log
    payload = latest_payload(exp)
    assert set(payload["modules"]) == {"model", "head"}
    assert payload["task_state"]["inventory"][0] == "spk000"
    from toolkit.trainer.checkpoint import list_checkpoints
    assert any(c.meta.get("dev_metric") == "eer" and c.dev_loss is not None
               for c in list_checkpoints(exp))


@pytest.mark.parametrize("nproc", [0, 2], ids=["one-process", "torchrun-2-ranks"])
def test_killed_speaker_runs_end_bitwise_identical(corpus, tmp_path, nproc):
    ref = str(tmp_path / "ref")
    result = run_train(corpus.train_args(ref), nproc)
    assert result.returncode == 0, result.stderr[-3000:]
    reference = latest_payload(ref)
    exp = str(tmp_path / "killed")
    rng = random.Random(7 + nproc)
    points = sorted(rng.sample(range(1, max(4, reference["step"] * 2 // 3)), 2))
    hits = train_with_kills(corpus.train_args(exp), nproc, points, exp, rng)
    assert hits == 2
    # Weights, optimizer, schedule, position, random streams and the margin schedule's
    # step (it follows the restored step) all equal the uninterrupted run's.
    assert_same_run(reference, latest_payload(exp))


def test_reordered_inventory_is_refused(corpus, trained, tmp_path):
    exp, _ = trained
    copy = str(tmp_path / "exp")
    shutil.copytree(exp, copy)
    names = open(corpus.inventory).read().split()
    reordered = tmp_path / "reordered.txt"
    reordered.write_text("\n".join([names[1], names[0]] + names[2:]) + "\n")
    result = run_train(corpus.train_args(copy, inventory=str(reordered)))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "class inventory (or its order) changed" in result.stderr
    assert "index 0: 'spk000' -> 'spk001'" in result.stderr


def test_fine_tuning_onto_another_speaker_set(corpus, trained, tmp_path):
    exp, _ = trained
    src = sorted(glob.glob(os.path.join(exp, "ckpt-*.pt")))[-1]
    other = tmp_path / "other.txt"
    other.write_text("".join(f"spk{s:03d}\n" for s in range(4)))          # 4 of the 6
    lines = [json.loads(l) for l in open(corpus.train)]
    subset = tmp_path / "subset.list"
    subset.write_text("".join(json.dumps(e) + "\n" for e in lines if e["label"] < 4))
    args = corpus.train_args(str(tmp_path / "ft"), "training.max_epoch=1", "optim.lr=0",
                             f"training.init_checkpoint={src}", inventory=str(other))
    args[args.index("--train-data") + 1] = str(subset)
    result = run_train(args)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "head is re-initialised for this inventory (4 speakers; the checkpoint's had 6)" \
        in result.stderr
    assert "initialised model from" in result.stderr and "head start fresh" in result.stderr
    source = torch.load(src, weights_only=True)["modules"]
    tuned = latest_payload(str(tmp_path / "ft"))["modules"]
    key = next(k for k in source["model"] if k.endswith("weight") and "bn" not in k)
    assert torch.equal(source["model"][key], tuned["model"][key])       # lr 0: kept
    assert tuned["head"]["weight"].shape[0] == 4


def test_export_extract_score_and_cli(corpus, trained, tmp_path):
    exp, _ = trained
    ckpt = sorted(glob.glob(os.path.join(exp, "ckpt-*.pt")))[-1]
    out = str(tmp_path / "export")

    def run(*args):
        proc = subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True,
                              env=env(), timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return proc
    run("toolkit.bin.export_model", "--checkpoint", ckpt, "--exp-dir", exp, "--out-dir", out,
        "--test-data", corpus.dev, "--num-check", "4")
    for name in ("model.onnx", "model.zip", "model.safetensors", "config.json"):
        assert os.path.exists(os.path.join(out, name))
    meta = json.load(open(os.path.join(out, "config.json")))
    assert meta["task"] == "speaker" and meta["embed_dim"] == 16
    # ONNX with a dynamic time axis: two lengths, equal to PyTorch.
    from toolkit.tasks.speaker.embed import Embedder
    onnx = Embedder.from_path(os.path.join(out, "model.onnx"))
    torch_model = Embedder.from_path(ckpt)
    wavs = [json.loads(l)["wav"] for l in open(corpus.dev)][:3]
    for wav in wavs:
        assert np.max(np.abs(onnx.embed(wav) - torch_model.embed(wav))) < 1e-4
    # Extraction in two parts; a rerun skips the finished ones.
    emb_dir = str(tmp_path / "emb")
    run("toolkit.bin.extract_embeddings", "--model", os.path.join(out, "model.onnx"),
        "--data-list", corpus.dev, "--out-dir", emb_dir, "--nj", "2")
    assert len(open(os.path.join(emb_dir, "embeddings.scp")).readlines()) == 16
    assert len(open(os.path.join(emb_dir, "speaker_embeddings.scp")).readlines()) == 4
    again = run("toolkit.bin.extract_embeddings", "--model", os.path.join(out, "model.onnx"),
                "--data-list", corpus.dev, "--out-dir", emb_dir, "--nj", "2")
    assert "2 of 2 parts already extracted" in again.stderr
    train_dir = str(tmp_path / "emb_train")
    run("toolkit.bin.extract_embeddings", "--model", os.path.join(out, "model.onnx"),
        "--data-list", corpus.train, "--out-dir", train_dir)
    # Kaldi-form trials among the dev utterances.
    keys = sorted(json.loads(l)["key"] for l in open(corpus.dev))
    trials = tmp_path / "trials.txt"
    trials.write_text("".join(f"{a} {b} {'target' if a[:6] == b[:6] else 'nontarget'}\n"
                              for i, a in enumerate(keys) for b in keys[i + 1:]))
    score = run("toolkit.bin.score_sv", "--trials", str(trials), "--embeddings",
                os.path.join(emb_dir, "embeddings.scp"), "--cohort",
                os.path.join(train_dir, "speaker_embeddings.scp"), "--as-norm-top", "3",
                "--out-dir", str(tmp_path / "score"))
    summary = open(tmp_path / "score" / "summary.txt").read()
    assert "cosine: EER" in summary and "AS-Norm top 3: EER" in summary and "minDCF(0.01)" in summary
    assert open(tmp_path / "score" / "det.png", "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    result = json.load(open(tmp_path / "score" / "result.json"))
    assert result["systems"]["cosine"]["trials"] == len(keys) * (len(keys) - 1) // 2
    # Two WAVs on the command line.
    cli = run("toolkit.bin.sv", "--model", os.path.join(out, "model.onnx"), wavs[0], wavs[1],
              "--threshold", "0.5")
    value, verdict = cli.stdout.split()
    assert abs(float(value) - onnx.score(wavs[0], wavs[1])) < 1e-4 and verdict in ("same", "different")
