"""The speaker-embedding task on the generic trainer, with the real binaries: training
with a ramped AAM margin and dev EER, exact SIGKILL resume (1 process, 2 gloo ranks),
the experiment contract (a reordered inventory is refused), fine-tuning onto another
speaker set (embedding strict, head re-initialised), export parity, extraction (resumable
parts, speaker means), scoring with AS-Norm, and the two-WAV CLI."""
import contextlib
import copy
import glob
import importlib
import json
import os
import random
import shutil
import signal

import numpy as np
import pytest
import torch

from in_process import run_main
from speaker_data import TINY_SPEAKER_CONFIG, SpeakerCorpus
from test_trainer_resume import assert_same_run, train_with_kills
from train_utils import latest_payload, run_train


# The speaker examples are drawn per seed, epoch and utterance, the same in a loader worker
# as in the trainer: the loader is not under test here (test_trainer_resume.py kills runs
# with loader workers), so every run loads in its trainer process.
CONFIG = copy.deepcopy(TINY_SPEAKER_CONFIG)
CONFIG["dataset"]["num_workers"] = 0


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return SpeakerCorpus(str(tmp_path_factory.mktemp("speakers")), config=CONFIG)


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
    assert any(c.meta.get("dev_metric_name") == "eer" and c.dev_metric is not None
               for c in list_checkpoints(exp))


@pytest.mark.parametrize("nproc", [0, 2], ids=["one-process", "torchrun-2-ranks"])
def test_killed_speaker_runs_end_bitwise_identical(corpus, trained, tmp_path, nproc):
    if nproc == 0:
        ref = trained[0]     # the same uninterrupted one-process run
    else:
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


def run_binary(module, *args):
    """A binary's real main(argv) in this process (in_process.run_main); it must succeed."""
    proc = run_main(importlib.import_module(module).main, args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def export(exp, checkpoint, out, dev):
    return run_main(importlib.import_module("toolkit.bin.export_model").main,
                    ["--checkpoint", checkpoint, "--exp-dir", exp, "--out-dir", out,
                     "--test-data", dev, "--num-check", "3"])


@pytest.fixture(scope="module")
def exported(corpus, trained, tmp_path_factory):
    """The trained run's last checkpoint exported once, for every test of the export."""
    exp, _ = trained
    ckpt = sorted(glob.glob(os.path.join(exp, "ckpt-*.pt")))[-1]
    out = str(tmp_path_factory.mktemp("exported") / "export")
    proc = export(exp, ckpt, out, corpus.dev)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return ckpt, out, proc.stderr


def test_export_extract_score_and_cli(corpus, trained, exported, tmp_path):
    exp, _ = trained
    ckpt, out, _ = exported
    run = run_binary
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
    score = run("toolkit.bin.score_speaker", "--trials", str(trials), "--embeddings",
                os.path.join(emb_dir, "embeddings.scp"), "--cohort",
                os.path.join(train_dir, "speaker_embeddings.scp"), "--as-norm-top", "3",
                "--out-dir", str(tmp_path / "score"))
    summary = open(tmp_path / "score" / "summary.txt").read()
    assert "cosine: EER" in summary and "AS-Norm top 3: EER" in summary and "minDCF(0.01)" in summary
    assert open(tmp_path / "score" / "det.png", "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    result = json.load(open(tmp_path / "score" / "result.json"))
    assert result["systems"]["cosine"]["trials"] == len(keys) * (len(keys) - 1) // 2
    # Two WAVs on the command line.
    cli = run("toolkit.bin.speaker", "--model", os.path.join(out, "model.onnx"), wavs[0], wavs[1],
              "--threshold", "0.5")
    value, verdict = cli.stdout.split()
    assert abs(float(value) - onnx.score(wavs[0], wavs[1])) < 1e-4 and verdict in ("same", "different")


# --------------------------------------------------------------------------- dev trials

def _write_list(path, entries):
    with open(path, "w") as f:
        f.writelines(json.dumps(e) + "\n" for e in entries)
    return str(path)


def _entries(path):
    return [json.loads(line) for line in open(path)]


@contextlib.contextmanager
def _deadline(seconds):
    """Fails (instead of hanging the suite) when the body runs longer than `seconds`."""
    def expired(signum, frame):
        raise TimeoutError(f"still running after {seconds} s")
    old = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def test_trials_end_when_cross_speaker_pairs_are_few():
    """10 utterances of A and 1 of B: 45 same-speaker pairs, only 10 others; the trial
    list takes those 10 instead of looking forever for 45."""
    from toolkit.tasks.speaker.data import make_trials
    keys = [f"a{i}" for i in range(10)] + ["b0"]
    with _deadline(10):
        enroll, test, labels = make_trials(keys, ["A"] * 10 + ["B"])
    assert int(labels.sum()) == 45 and int((labels == 0).sum()) == 10
    assert all("b0" in (e, t) for e, t, lab in zip(enroll, test, labels) if lab == 0)
    # Large and lopsided lists stay bounded too: 3000 of one speaker, 20 of another.
    keys = [f"a{i}" for i in range(3000)] + [f"b{i}" for i in range(20)]
    with _deadline(60):
        _, _, labels = make_trials(keys, ["A"] * 3000 + ["B"] * 20, max_targets=5000)
    assert int(labels.sum()) == 5000 and int((labels == 0).sum()) == 5000


def test_trials_refuse_lists_without_both_kinds_or_speakers():
    from toolkit.tasks.speaker.data import TrialError, make_trials
    with pytest.raises(TrialError, match="every speaker has one utterance"):
        make_trials(["a", "b", "c"], ["A", "B", "C"])
    with pytest.raises(TrialError, match="one speaker"):
        make_trials(["a", "b"], ["A", "A"])
    # Utterances without a speaker are not one speaker "" (their pairs are no targets).
    with pytest.raises(TrialError, match="1 utterances have no speaker"):
        make_trials(["a", "b", "c", "d"], ["A", "A", "", "B"])


def test_dev_lists_that_cannot_make_trials_are_refused_before_training(corpus, tmp_path):
    dev = _entries(corpus.dev)
    singles = _write_list(tmp_path / "singles.list",
                          list({e["spk"]: e for e in dev}.values()))
    unnamed = [dict(e) for e in dev]
    del unnamed[3]["spk"]
    cases = {singles: "every speaker has one utterance",
             _write_list(tmp_path / "unnamed.list", unnamed): "1 utterances have no speaker"}
    for path, words in cases.items():
        exp = str(tmp_path / ("exp_" + os.path.basename(path)))
        args = corpus.train_args(exp)
        args[args.index("--dev-data") + 1] = path
        result = run_train(args, timeout=120)
        assert result.returncode == 2, result.stderr[-3000:]
        assert f"error: {path}: " in result.stderr and words in result.stderr
        assert "Traceback" not in result.stderr
        assert not glob.glob(os.path.join(exp, "ckpt-*"))


def test_lopsided_dev_list_validates(corpus, tmp_path):
    """The issue's hang: a dev list of 10 utterances of one speaker and 1 of another kept
    every rank in the trial sampler forever after the first epoch."""
    from speaker_data import speaker_list
    skewed = _entries(speaker_list(str(tmp_path), "dev_many", [100], 10, 5, {}))
    skewed += _entries(speaker_list(str(tmp_path), "dev_one", [101], 1, 6, {}))
    dev = _write_list(tmp_path / "lopsided.list", skewed)
    exp = str(tmp_path / "exp")
    args = corpus.train_args(exp, "training.max_epoch=1")
    args[args.index("--dev-data") + 1] = dev
    result = run_train(args, timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "epoch 0 dev: eer " in result.stderr and "over 11 utterances" in result.stderr


# --------------------------------------------------------------------------- minimum input

XVECTOR = {"type": "tdnn_xvector", "frame_channels": [12, 12, 12, 12, 24], "embed_dim": 16}


def test_utterances_shorter_than_the_model_needs_are_counted_skips(corpus, tmp_path):
    """x-vector's unpadded TDNN needs 15 frames: a 0.1 s utterance (8 frames) in the
    training and the dev list is skipped and counted, not a crash of the forward pass."""
    import soundfile as sf
    import yaml
    from speaker_data import RATE, speaker_params, voice_wave
    wav = str(tmp_path / "short.wav")
    sf.write(wav, voice_wave(np.random.default_rng(1), *speaker_params(100), 0.1), RATE,
             subtype="PCM_16")
    short = {"key": "spk100-short", "wav": wav, "spk": "spk100", "duration": 0.1, "label": -1}
    dev = _write_list(tmp_path / "dev.list", _entries(corpus.dev) + [short])
    train = _write_list(tmp_path / "train.list", _entries(corpus.train)
                        + [dict(short, key="spk000-short", spk="spk000", label=0)])
    raw = copy.deepcopy(CONFIG)
    raw["model"] = XVECTOR
    raw["training"]["max_epoch"] = 1
    config = str(tmp_path / "xvector.yaml")
    with open(config, "w") as f:
        yaml.safe_dump(raw, f)
    args = corpus.train_args(str(tmp_path / "exp"), "dataset.max_bad_fraction=0.1",
                             config=config)
    args[args.index("--dev-data") + 1] = dev
    args[args.index("--train-data") + 1] = train
    result = run_train(args, timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "skip spk000-short: too_short_after_processing (8 frames, the model needs 15)" \
        in result.stderr
    assert "skip spk100-short: too_short_after_processing" in result.stderr
    assert "1 skipped (too_short_after_processing=1" in result.stderr
    assert "epoch 0 dev: eer " in result.stderr and "over 16 utterances" in result.stderr


def test_chunks_shorter_than_the_model_needs_are_refused():
    import toolkit.tasks  # noqa: F401
    from speaker_data import TINY_SPEAKER_CONFIG
    from toolkit.config import ConfigError
    from toolkit.config import validate
    raw = json.loads(json.dumps(TINY_SPEAKER_CONFIG))
    raw["model"] = XVECTOR
    raw["task"]["chunk_frames"] = 10
    with pytest.raises(ConfigError, match="task.chunk_frames=10: model tdnn_xvector needs at "
                                          "least 15 frames"):
        validate(raw)


def test_zero_frame_feature_matrix_is_a_counted_skip(tmp_path):
    """A precomputed feature matrix with no frames in a training list: BadEntry (the
    loader counts it), not `ValueError: high <= 0` from the chunk draw."""
    import kaldiio
    import toolkit.tasks  # noqa: F401
    from speaker_data import TINY_SPEAKER_CONFIG
    from toolkit.data.audio import BadEntry
    from toolkit.data.pipeline import FeaturePipeline
    from toolkit.config import validate
    from toolkit.tasks.speaker.task import SpeakerTask
    ark = str(tmp_path / "feats.ark")
    with kaldiio.WriteHelper(f"ark,scp:{ark},{tmp_path / 'feats.scp'}") as writer:
        writer("empty", np.zeros((0, 24), np.float32))
        writer("fine", np.ones((30, 24), np.float32))
    scp = dict(line.split() for line in open(tmp_path / "feats.scp"))
    cfg = validate(json.loads(json.dumps(TINY_SPEAKER_CONFIG)))
    cfg.head.num_classes = 6
    task = SpeakerTask(cfg, [f"spk{i:03d}" for i in range(6)])
    builder = task.example_builder(FeaturePipeline(cfg.dataset, seed=3, train=True))
    feats, label, _ = builder({"key": "fine", "feat": scp["fine"], "label": 2, "spk": "a"}, 0)
    assert feats.shape == (50, 24) and label == 2
    with pytest.raises(BadEntry) as err:
        builder({"key": "empty", "feat": scp["empty"], "label": 2, "spk": "a"}, 0)
    assert err.value.reason == "too_short_after_processing"


def test_export_checks_safetensors_and_refuses_a_diverged_checkpoint(corpus, trained, exported,
                                                                    tmp_path):
    exp, _ = trained
    ckpt, _, log = exported
    assert "parity safetensors vs PyTorch: max abs diff" in log
    assert "safetensors max diff" in log
    payload = torch.load(ckpt, weights_only=True)
    weight = next(k for k, v in payload["modules"]["model"].items() if v.is_floating_point()
                  and v.dim() > 1)
    payload["modules"]["model"][weight].fill_(float("nan"))
    diverged = str(tmp_path / "diverged.pt")
    torch.save(payload, diverged)
    bad = export(exp, diverged, tmp_path / "bad", corpus.dev)
    assert bad.returncode == 2, bad.stderr[-3000:]
    assert "error: exported embedding extractor: PyTorch output 0 of the checkpoint is not " \
           "finite" in bad.stderr
    assert "Traceback" not in bad.stderr
