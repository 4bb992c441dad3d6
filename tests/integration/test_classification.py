"""Command-word scoring (toolkit.bin.score_commands) on a real tiny BC-ResNet exported to
ONNX and TorchScript: the binary's confusion matrix and accuracy must equal the ones
computed here with NumPy from PyTorch's own predictions on the same WAV files."""
import json

import numpy as np
import pytest
import soundfile as sf
import torch

from toolkit.tasks.kws.classification import class_report, confusion_matrix, utterance_probs
from toolkit.data.features import compute_fbank, fbank_metadata, fbank_options
from toolkit.tasks.kws.export import build_metadata, export_onnx, export_torchscript
from toolkit.tasks.kws.models import MODELS, build_model
from in_process import run_main

RATE = 16000
CLASSES = ["yes", "no", "up"]
NUM_UTTS = 12


def run_cli(*args, check=True):
    """score_commands' real main(argv), in this process (in_process.run_main): its output,
    files and exit status, without an interpreter start-up per call."""
    from toolkit.bin import score_commands
    proc = run_main(score_commands.main, args)
    if check:
        assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def make_wave(seed):
    # 1 s clips: a tone whose pitch depends on the seed, over noise of varying level.
    rng = np.random.default_rng(seed)
    t = np.arange(RATE) / RATE
    tone = 0.3 * rng.uniform(0.2, 1.0) * np.sin(2 * np.pi * (200 + 300 * (seed % 6)) * t)
    return (tone + rng.uniform(0.005, 0.1) * rng.standard_normal(RATE)).astype(np.float32)


def wav_features(path):
    wave, rate = sf.read(path, dtype="float32")
    assert rate == RATE
    return compute_fbank(wave, fbank_options())


def make_model(feats):
    """Random BC-ResNet made to give varied, clear-cut predictions: BatchNorm statistics
    calibrated on the clips (random-init statistics make every clip look alike) and a
    nearest-prototype classifier (three clips' embeddings as class directions)."""
    config = MODELS.get("bcresnet").Config(type="bcresnet", input_dim=40,
                                           num_outputs=len(CLASSES), scale=0.5, dropout=0.0)
    torch.manual_seed(1)
    model = build_model(config)
    stacked = np.concatenate(feats)
    model.cmvn.load_stats(stacked.mean(0), 1.0 / stacked.std(0))
    for m in model.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.reset_running_stats()
            m.momentum = None          # cumulative average over the calibration pass
    frames = min(len(f) for f in feats)
    batch = torch.from_numpy(np.stack([f[:frames] for f in feats]))
    with torch.no_grad():
        model.train()
        model(batch)
        model.eval()
        emb = torch.stack([
            model.head(model.blocks(model.stem(
                model.cmvn(torch.from_numpy(f)[None]).transpose(1, 2).unsqueeze(1)))).mean(dim=(2, 3))[0]
            for f in feats])
        w = emb[:len(CLASSES)] - emb.mean(0)
        w = 20 * w / w.norm(dim=1, keepdim=True)
        model.classifier.weight.copy_(w)
        model.classifier.bias.copy_(-(w @ emb.mean(0)))
    return model


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("commands")
    wavs = []
    for i in range(NUM_UTTS):
        path = str(root / f"utt{i:02d}.wav")
        sf.write(path, make_wave(i), RATE, subtype="PCM_16")
        wavs.append(path)
    feats = [wav_features(p) for p in wavs]
    model = make_model(feats)
    with torch.no_grad():
        logits = [model(torch.from_numpy(f)[None])[0][0].numpy() for f in feats]
    preds = np.array([int(np.argmax(x)) for x in logits])
    # Preconditions of a meaningful test: several classes predicted, and no near-tie an
    # exported runtime's rounding could flip.
    assert len(set(preds.tolist())) >= 2, preds
    assert min(float(np.sort(x)[-1] - np.sort(x)[-2]) for x in logits) > 1e-3
    # Labels: right for two clips in three, the next class otherwise.
    labels = np.array([p if i % 3 else (p + 1) % len(CLASSES) for i, p in enumerate(preds)])

    entries = [{"key": f"utt{i:02d}", "wav": w, "duration": 1.0, "label": int(labels[i])}
               for i, w in enumerate(wavs)]
    # Unscorable: no class, a class index beyond the inventory.
    entries.append({"key": "neg-filler", "wav": wavs[0], "duration": 1.0, "label": -1})
    entries.append({"key": "odd-label", "wav": wavs[1], "duration": 1.0, "label": 7})
    data_list = root / "test.list"
    data_list.write_text("".join(json.dumps(e) + "\n" for e in entries))
    inventory = root / "classes.txt"
    inventory.write_text("".join(c + "\n" for c in CLASSES))

    metadata = build_metadata(model, fbank_metadata(fbank_options()), CLASSES, None)
    paths = {"onnx": str(root / "model.onnx"), "torchscript": str(root / "model.zip")}
    export_onnx(model, paths["onnx"], metadata)
    export_torchscript(model, paths["torchscript"], metadata)

    expected = np.zeros((len(CLASSES), len(CLASSES)), dtype=np.int64)
    for t, p in zip(labels, preds):
        expected[t, p] += 1
    return {"root": root, "paths": paths, "list": data_list, "inventory": inventory,
            "labels": labels, "preds": preds, "expected": expected}


@pytest.mark.parametrize("fmt", ["onnx", "torchscript"])
def test_score_commands_matches_pytorch(setup, fmt):
    out = setup["root"] / f"out-{fmt}"
    proc = run_cli("--model", setup["paths"][fmt], "--data-list", setup["list"],
                   "--inventory", setup["inventory"], "--out-dir", out)
    expected, labels, preds = setup["expected"], setup["labels"], setup["preds"]
    correct = int((labels == preds).sum())
    summary = (f"accuracy {100 * correct / NUM_UTTS:.2f}% ({correct}/{NUM_UTTS}) "
               f"over {len(CLASSES)} classes")
    assert proc.stdout.strip() == summary

    doc = json.loads((out / "confusion.json").read_text())
    assert doc["classes"] == CLASSES
    assert np.array_equal(np.array(doc["matrix"]), expected)
    assert doc["correct"] == correct and doc["total"] == NUM_UTTS
    for k, c in enumerate(doc["per_class"]):
        assert c["count"] == int((labels == k).sum())
        assert c["predicted"] == int((preds == k).sum())
        tp = int(((labels == k) & (preds == k)).sum())
        assert c["correct"] == tp
        if c["predicted"]:
            assert c["precision"] == pytest.approx(tp / c["predicted"])
        else:
            assert c["precision"] is None
        if c["count"]:
            assert c["recall"] == pytest.approx(tp / c["count"])
            assert c["accuracy"] == c["recall"]

    # Per-utterance predictions agree with PyTorch, not only in aggregate.
    rows = [line.split() for line in (out / "predictions.txt").read_text().splitlines()]
    assert [r[0] for r in rows] == [f"utt{i:02d}" for i in range(NUM_UTTS)]
    assert [CLASSES.index(r[2]) for r in rows] == preds.tolist()

    # Text matrix: class names in the header and as row names, counts aligned.
    lines = (out / "confusion.txt").read_text().splitlines()
    header = lines[0].split()
    assert header[-len(CLASSES) - 1:] == CLASSES + ["total"]
    for k, name in enumerate(CLASSES):
        cells = lines[1 + k].split()
        assert cells[0] == name
        assert [int(v) for v in cells[1:1 + len(CLASSES)]] == expected[k].tolist()
    assert len({len(line) for line in lines}) == 1      # right-aligned columns

    report = (out / "accuracy.txt").read_text()
    assert report.splitlines()[0] == summary
    for name in CLASSES:
        assert name in report
    # The two unscorable utterances are counted and named, in the report and the log.
    assert "skipped utterances: 2" in report
    assert "neg-filler" in report and "odd-label" in report
    assert doc["skipped"]["total"] == 2
    stderr = proc.stderr
    assert "2 utterances skipped" in stderr and "odd-label" in stderr

    png = (out / "confusion.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    import matplotlib.image
    image = matplotlib.image.imread(str(out / "confusion.png"))
    assert image.ndim == 3 and image.shape[0] >= 300 and image.shape[1] >= 300
    assert float(image[..., :3].std()) > 0.05          # something was drawn


def test_inventory_size_mismatch_is_an_error(setup, tmp_path):
    inventory = tmp_path / "two.txt"
    inventory.write_text("yes\nno\n")
    proc = run_cli("--model", setup["paths"]["onnx"], "--data-list", setup["list"],
                   "--inventory", inventory, "--out-dir", tmp_path / "out", check=False)
    assert proc.returncode != 0
    assert "has 2 classes but the model was exported with 3" in proc.stderr
    assert not (tmp_path / "out" / "confusion.json").exists()


class FakeBackend:
    """Stands in for detector backends: returns a fixed output whatever the features."""

    def __init__(self, output):
        self.output = np.asarray(output, dtype=np.float32)
        self.resets = 0

    def reset(self):
        self.resets += 1

    def step(self, feats):
        return self.output


def test_frame_posteriors_are_averaged_and_class_vectors_kept():
    frames = FakeBackend([[0.9, 0.1, 0.0], [0.0, 0.3, 0.0], [0.0, 0.3, 0.9]])
    got = utterance_probs(frames, np.zeros((3, 40), np.float32))
    assert np.allclose(got, [0.3, 0.7 / 3, 0.3])
    assert frames.resets == 1          # every utterance starts from a fresh cache
    assert int(np.argmax(got)) == 0
    vector = FakeBackend([0.2, 0.5, 0.3])
    assert np.allclose(utterance_probs(vector, np.zeros((5, 40), np.float32)), [0.2, 0.5, 0.3])


def test_report_arithmetic():
    labels = [0, 0, 0, 1, 1, 2]
    preds = [0, 0, 1, 1, 0, 0]
    matrix = confusion_matrix(labels, preds, 3)
    assert matrix.tolist() == [[2, 1, 0], [1, 1, 0], [1, 0, 0]]
    report = class_report(matrix, CLASSES)
    assert report["correct"] == 3 and report["total"] == 6
    assert report["accuracy"] == pytest.approx(0.5)
    yes, no, up = report["per_class"]
    assert yes["precision"] == pytest.approx(2 / 4) and yes["recall"] == pytest.approx(2 / 3)
    assert no["precision"] == pytest.approx(1 / 2) and no["recall"] == pytest.approx(1 / 2)
    assert up["precision"] is None and up["recall"] == 0.0 and up["f1"] is None
