"""Export (TorchScript / ONNX / safetensors) through the real CLI, metadata and threshold,
and the streaming detector on every backend, through the Python API and the CLIs."""
import dataclasses
import copy
import importlib
import json
import logging
import os
import re
import shutil
import subprocess
import sys

import kaldiio
import numpy as np
import pytest
import soundfile as sf
import torch

from toolkit.config import dump_config, redact
from toolkit.config import load_config
from toolkit.data.augment import load_mono
from toolkit.data.features import compute_fbank, fbank_options
from toolkit.tasks.kws.detector import Detector, load_backend
from toolkit.tasks.kws.export import StreamingScorer, check_parity, read_metadata
from toolkit.tasks.kws.models import build_model
from in_process import run_main

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RECIPE = os.path.join(REPO, "egs", "wake_word", "s0", "conf", "ds_tcn.yaml")
RATE = 16000
KEYWORDS = ["hey_box", "ok_box"]


def run_cli(name, *args, input=None):
    """The binary's real main(argv) in this process (in_process.run_main: no interpreter
    start-up per call); with `input`, a real process reading it on stdin (kws -)."""
    if input is None:
        proc = run_main(importlib.import_module(f"toolkit.bin.{name}").main, args)
        assert proc.returncode == 0, f"{name} failed ({proc.returncode}):\n{proc.stderr[-3000:]}"
        return proc.stdout, proc.stderr
    # One intra-op thread: on a small shared machine torch's thread pool only spins.
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-m", f"toolkit.bin.{name}", *map(str, args)],
                          cwd=REPO, input=input, capture_output=True, timeout=120, env=env)
    assert proc.returncode == 0, (f"{name} failed ({proc.returncode}):\n"
                                  + proc.stderr.decode(errors="replace")[-3000:])
    return proc.stdout.decode(), proc.stderr.decode()


def make_wave(seed, seconds):
    rng = np.random.default_rng(seed)
    n = int(seconds * RATE)
    t = np.arange(n) / RATE
    # Tone bursts at changing pitch over noise: features (and posteriors) vary in time.
    env = (np.sin(2 * np.pi * 1.3 * t + seed) > 0).astype(np.float64)
    x = 0.3 * env * np.sin(2 * np.pi * (300 + 400 * t) * t) + 0.02 * rng.standard_normal(n)
    return (np.clip(x, -1, 1) * 32767).astype(np.int16)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    root = tmp_path_factory.mktemp("export")
    exp = root / "exp"
    exp.mkdir()
    cfg = load_config(RECIPE, ["model.hidden_dim=16", "model.num_layers=3", "model.kernel_size=3",
                               "model.dilations=[1,2,4]", "model.input_dim=40",
                               f"model.num_outputs={len(KEYWORDS)}"])
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    cmvn = {"mean": (torch.randn(40, generator=g) + 12).tolist(),
            "inv_std": (torch.rand(40, generator=g) * 0.3 + 0.2).tolist()}
    model = build_model(cfg.model, cmvn)
    for m in model.modules():
        if isinstance(m, torch.nn.BatchNorm1d):
            m.running_mean.copy_(torch.randn(m.num_features, generator=g) * 0.2)
            m.running_var.copy_(torch.rand(m.num_features, generator=g) + 0.5)
    model.eval()
    # As the trainer saves it (only the fields export needs).
    ckpt = exp / "avg.pt"
    torch.save({"model": model.state_dict(),
                "model_config": redact(dataclasses.asdict(cfg.model))}, str(ckpt))
    dump_config(cfg, str(exp / "config.yaml"))
    (exp / "inventory.txt").write_text("".join(k + "\n" for k in KEYWORDS))

    wavs = []
    for i, seconds in enumerate([3.2, 1.1, 2.05]):
        path = root / f"utt{i}.wav"
        sf.write(str(path), make_wave(i, seconds), RATE, subtype="PCM_16")
        wavs.append(str(path))
    entries = [{"key": f"utt{i}", "wav": w, "duration": sf.info(w).duration, "label": -1}
               for i, w in enumerate(wavs)]
    test_list = root / "test.list"
    test_list.write_text("".join(json.dumps(e) + "\n" for e in entries))

    out = exp / "export"
    _, log = run_cli("export_model", "--checkpoint", ckpt, "--exp-dir", exp, "--out-dir", out,
                     "--test-data", test_list, "--num-check", 3)
    return {"root": root, "exp": exp, "ckpt": str(ckpt), "out": out, "model": model,
            "cfg": cfg, "wavs": wavs, "entries": entries, "log": log}


def features_of(path):
    return compute_fbank(load_mono(path, RATE), fbank_options())


def backend_posteriors(model_path, wav):
    backend = load_backend(model_path)
    return backend.step(features_of(wav))


def test_export_files_and_metadata(exported):
    out, model = exported["out"], exported["model"]
    for name in ("model.zip", "model.onnx", "model.safetensors", "config.json"):
        assert (out / name).is_file() and (out / name).stat().st_size > 0
    # The binary checked both formats against PyTorch and logged the worst difference.
    for name in ("onnx", "torchscript"):
        match = re.search(rf"parity {name} vs PyTorch: max abs diff (\S+) over 3 utterances",
                          exported["log"])
        assert match, exported["log"]
        assert float(match.group(1)) <= 1e-4
    for name in ("model.onnx", "model.zip", "model.safetensors"):
        meta = read_metadata(str(out / name))
        assert meta["keywords"] == KEYWORDS
        assert meta["cache_size"] == model.cache_size
        assert meta["feature"]["sample_rate"] == RATE
        assert meta["feature"]["num_mel_bins"] == 40
        assert meta["feature"]["frame_shift_ms"] == 10.0
        assert meta["threshold"] is None
        assert meta["model_config"]["hidden_dim"] == 16
        np.testing.assert_allclose(meta["cmvn"]["mean"], model.cmvn.mean.numpy(), rtol=1e-6)
    from safetensors.torch import load_file
    state = load_file(str(out / "model.safetensors"))
    reference = model.state_dict()
    assert set(state) == set(reference)
    for k, v in reference.items():
        assert torch.equal(state[k], v), k


def test_onnx_matches_pytorch(exported):
    import onnxruntime as ort
    model = exported["model"]
    feats = features_of(exported["wavs"][0])[None]
    cache = np.random.default_rng(0).standard_normal((1, model.cache_size)).astype(np.float32)
    session = ort.InferenceSession(str(exported["out"] / "model.onnx"),
                                   providers=["CPUExecutionProvider"])
    probs, new_cache = session.run(None, {"feats": feats, "cache": cache})
    with torch.no_grad():
        ref_probs, ref_cache = StreamingScorer(model)(torch.from_numpy(feats),
                                                      torch.from_numpy(cache))
    assert probs.shape == (1, feats.shape[1], len(KEYWORDS))
    assert np.max(np.abs(probs - ref_probs.numpy())) <= 1e-4
    assert np.max(np.abs(new_cache - ref_cache.numpy())) <= 1e-4
    assert np.all((probs > 0) & (probs < 1))
    # Not a constant output: posteriors move with the input.
    assert probs.std() > 1e-3


def test_parity_check_detects_a_mismatch(exported):
    out, model = exported["out"], exported["model"]
    paths = {"onnx": str(out / "model.onnx"), "torchscript": str(out / "model.zip")}
    feats = [features_of(exported["wavs"][1])]
    worst = check_parity(model, paths, feats, chunks=(0, 7))
    assert set(worst) == {"onnx", "torchscript"} and max(worst.values()) <= 1e-4
    other = copy.deepcopy(model)
    with torch.no_grad():
        other.classifier.bias += 0.5
    with pytest.raises(RuntimeError, match="disagrees"):
        check_parity(other, paths, feats, chunks=(0,))


def test_parity_cannot_pass_on_nan_missing_outputs_or_broadcast_shapes():
    """compare() fails on what a max over |diff| or zip() would let through."""
    from toolkit.export import ParityError, compare
    case = [(np.zeros((1, 4), np.float32),)]
    ref = lambda x: (np.ones((1, 4), np.float32), np.zeros((1, 2), np.float32))  # noqa: E731
    ok = compare(ref, {"same": ref}, case, 1e-4)
    assert ok == {"same": 0.0}
    bad = {
        "nan": lambda x: (np.full((1, 4), np.nan, np.float32), np.zeros((1, 2), np.float32)),
        "missing": lambda x: (np.ones((1, 4), np.float32),),
        "broadcast": lambda x: (np.ones((1, 1), np.float32), np.zeros((1, 2), np.float32)),
    }
    words = {"nan": "non-finite", "missing": "1 outputs, PyTorch 2",
             "broadcast": "shape (1, 1), PyTorch (1, 4)"}
    for name, fn in bad.items():
        with pytest.raises(ParityError, match=re.escape(words[name])):
            compare(ref, {name: fn, "same": ref}, case, 1e-4)
    # A diverged checkpoint: the reference itself is not finite.
    nan_ref = lambda x: (np.full((1, 4), np.nan, np.float32),)  # noqa: E731
    with pytest.raises(ParityError, match="not finite"):
        compare(nan_ref, {"same": nan_ref}, case, 1e-4)


def test_keyword_parity_catches_nan_outputs(exported):
    out, model = exported["out"], exported["model"]
    feats = [features_of(exported["wavs"][1])]
    diverged = copy.deepcopy(model)
    with torch.no_grad():
        diverged.classifier.bias.fill_(float("nan"))
    with pytest.raises(RuntimeError, match="not finite"):
        check_parity(diverged, {"onnx": str(out / "model.onnx")}, feats, chunks=(0,))
    # The safetensors file is checked too.
    worst = check_parity(model, {"safetensors": str(out / "model.safetensors")}, feats,
                         chunks=(0,))
    assert set(worst) == {"safetensors"} and worst["safetensors"] <= 1e-6


def test_set_threshold_updates_every_format(exported, tmp_path):
    out = tmp_path / "export"
    shutil.copytree(exported["out"], out)
    run_cli("set_threshold", "--export-dir", out, "--threshold", 0.42)
    for name in ("model.onnx", "model.zip", "model.safetensors"):
        meta = read_metadata(str(out / name))
        assert meta["threshold"] == pytest.approx(0.42)
        assert meta["keywords"] == KEYWORDS      # the rest is kept
    # A detector picks up the stored threshold; the models still load and run.
    for name in ("model.onnx", "model.zip"):
        det = Detector.from_path(str(out / name))
        assert det.threshold == pytest.approx(0.42)
        det.accept_waveform(make_wave(5, 0.3))


def pick_threshold(probs):
    """A threshold near the median of the frame maxima, in a clear gap between values, so
    tiny backend differences cannot flip a frame across it."""
    values = np.unique(probs.max(axis=1))
    mid = len(values) // 2
    window = range(max(0, mid - 10), min(len(values) - 1, mid + 10))
    i = max(window, key=lambda j: values[j + 1] - values[j])
    assert values[i + 1] - values[i] > 1e-4
    return float((values[i] + values[i + 1]) / 2)


@pytest.fixture(scope="module")
def threshold(exported):
    probs = backend_posteriors(str(exported["out"] / "model.onnx"), exported["wavs"][0])
    return pick_threshold(probs)


def detections(detector, wave_int16, chunk):
    detector.reset()
    found = []
    for start in range(0, len(wave_int16), chunk):
        found += detector.accept_waveform(wave_int16[start:start + chunk])
    return found


def test_detector_same_on_every_backend_and_chunking(exported, threshold):
    wave, _ = sf.read(exported["wavs"][0], dtype="int16")
    paths = {"onnx": str(exported["out"] / "model.onnx"),
             "torchscript": str(exported["out"] / "model.zip"),
             "safetensors": str(exported["out"] / "model.safetensors"),
             "checkpoint": exported["ckpt"]}
    results = {}
    for name, path in paths.items():
        det = Detector.from_path(path, threshold=threshold)
        assert det.keywords == KEYWORDS
        chunked = detections(det, wave, RATE // 10)           # 100 ms
        whole = detections(det, wave, len(wave))
        floats = detections(det, wave.astype(np.float32) / 32768.0, 2345)
        for other in (whole, floats):
            assert [(d.keyword, d.start_s, d.end_s) for d in other] == \
                [(d.keyword, d.start_s, d.end_s) for d in chunked]
            assert np.allclose([d.score for d in other], [d.score for d in chunked], atol=1e-4)
        results[name] = chunked
    ref = results["onnx"]
    assert len(ref) >= 2                          # detections exist (and refractory spaces them)
    for k in {d.keyword for d in ref}:            # each keyword under its own refractory period
        mine = [d for d in ref if d.keyword == k]
        assert all(b.end_s - a.end_s > 1.0 for a, b in zip(mine, mine[1:]))
    assert all(d.score >= threshold and d.keyword_name == KEYWORDS[d.keyword] for d in ref)
    for name, got in results.items():
        assert [(d.keyword, d.start_s, d.end_s) for d in got] == \
            [(d.keyword, d.start_s, d.end_s) for d in ref], name
        assert np.allclose([d.score for d in got], [d.score for d in ref], atol=1e-4), name


def test_detector_matches_decision_rule_on_posteriors(exported, threshold):
    # The detector's audio path (streaming fbank + cached model) gives the same frames as
    # offline features through the backend, so its detections are those of `detect`.
    from toolkit.tasks.kws.decision import detect
    path = str(exported["out"] / "model.onnx")
    probs = backend_posteriors(path, exported["wavs"][0])
    expected = detect(probs, threshold)
    wave, _ = sf.read(exported["wavs"][0], dtype="int16")
    got = detections(Detector.from_path(path, threshold=threshold), wave, 1600)
    assert [(d.keyword, d.start_s, d.end_s) for d in got] == \
        [(d.keyword, d.start_s, d.end_s) for d in expected]


def test_kws_cli_file_and_stdin(exported, threshold):
    model = str(exported["out"] / "model.onnx")
    wav = exported["wavs"][0]
    wave, _ = sf.read(wav, dtype="int16")
    det = Detector.from_path(model, threshold=threshold)
    api = detections(det, wave, RATE // 10)
    assert api
    lines = [f"{d.keyword_name}\t{d.start_s:.2f}\t{d.end_s:.2f}\t{d.score:.3f}" for d in api]
    stdout, stderr = run_cli("kws", "--model", model, "--threshold", threshold, wav, "-",
                             input=wave.astype("<i2").tobytes())
    out_lines = stdout.splitlines()
    from_file = [line.split("\t", 1)[1] for line in out_lines if line.startswith(wav + "\t")]
    from_stdin = [line.split("\t", 1)[1] for line in out_lines if line.startswith("-\t")]
    assert from_file == lines
    assert from_stdin == lines
    assert len(out_lines) == 2 * len(lines)
    assert f"{2 * len(lines)} detection(s)" in stderr


def test_compute_posteriors_cli(exported, tmp_path):
    entries = list(exported["entries"])
    entries.insert(1, {"key": "gone", "wav": str(tmp_path / "gone.wav"), "duration": 1.0,
                       "label": -1})
    data_list = tmp_path / "post.list"
    data_list.write_text("".join(json.dumps(e) + "\n" for e in entries))
    model = str(exported["out"] / "model.onnx")
    ark = tmp_path / "post" / "posteriors.ark"
    run_cli("compute_posteriors", "--model", model, "--data-list", data_list, "--output", ark)
    got = dict(kaldiio.load_ark(str(ark)))
    assert sorted(got) == [e["key"] for e in exported["entries"]]     # the missing one skipped
    for e in exported["entries"]:
        expected = backend_posteriors(model, e["wav"])
        assert got[e["key"]].shape == expected.shape == (len(features_of(e["wav"])), len(KEYWORDS))
        np.testing.assert_allclose(got[e["key"]], expected, atol=1e-6, rtol=0)
    # Workers on slices of the list write the same ark, byte for byte, skips included, and
    # leave nothing else beside it.
    for nj in (2, len(entries) + 1):
        sliced = tmp_path / f"post_nj{nj}" / "posteriors.ark"
        _, stderr = run_cli("compute_posteriors", "--model", model, "--data-list", data_list,
                            "--output", sliced, "--nj", nj)
        assert sliced.read_bytes() == ark.read_bytes()
        assert os.listdir(sliced.parent) == ["posteriors.ark"]
        assert f"{len(entries) - 1} utterances, 1 skipped (missing_file=1" in stderr, stderr


def test_fusion_with_zero_shot_search_needs_a_head_on_phone_posteriors(exported, tmp_path):
    from toolkit.errors import DataError
    model = str(exported["out"] / "model.onnx")
    with pytest.raises(DataError, match="phone posteriors.*reads 'kaldi_fbank'"):
        load_backend(model, fuse_zero_shot=True)
    from toolkit.bin import compute_posteriors
    proc = run_main(compute_posteriors.main, ["--model", model, "--data-list", "unused.list",
                                              "--output", tmp_path / "p.ark", "--fuse-zero-shot"])
    assert proc.returncode != 0 and "phone posteriors" in proc.stderr, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr


def test_export_skips_bad_test_entries(exported, tmp_path):
    from toolkit.bin import export_model
    entries = [{"key": "gone", "wav": str(tmp_path / "gone.wav"), "duration": 1.0, "label": -1}]
    entries += exported["entries"][1:2]
    data_list = tmp_path / "test.list"
    data_list.write_text("".join(json.dumps(e) + "\n" for e in entries))
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        rc = export_model.main(["--checkpoint", exported["ckpt"], "--exp-dir", str(exported["exp"]),
                                "--out-dir", str(tmp_path / "out"), "--test-data", str(data_list)])
    finally:
        for h in list(root.handlers):
            root.removeHandler(h)
        for h in handlers:
            root.addHandler(h)
        root.setLevel(level)
    assert rc == 0
    assert (tmp_path / "out" / "model.onnx").is_file()
