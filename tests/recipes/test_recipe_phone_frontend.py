"""The wake-word recipe on the shipped phone front end (--frontend phone_frontend) at a
tiny size: stages 0-6 through the real run.sh on its default corpus for this front end
(conf/phone_corpus.yaml: espeak-ng, Kokoro for a share of every spoken kind), features computed once per
corpus with the front end the export names (fingerprinted), and a head that learned
something, alone and fused with zero-shot search: test positives score above test negatives. The front-end recipe itself is checked for its
stages and card fields by tests/unit/test_layout.py and test_pretrained.py; its task, PER
binary and export by tests/integration/test_phone_frontend.py."""
import json
import os

import numpy as np

from test_recipe_wake_word import RECIPE, tiny_corpus_config
from process_tree import run_tree

TINY = ["--num-procs", "1", "--average-num", "2", "--train-overrides",
        "training.max_epoch=12 dataset.max_frames_in_batch=3000 training.log_interval=5 "
        "optim.scheduler.warmup_steps=5"]


def test_recipe_stages_with_the_phone_frontend(tmp_path):
    data, exp = tmp_path / "data", tmp_path / "exp"
    cmd = ["bash", os.path.join(RECIPE, "run.sh"), "--keyword", "hey jarvis", "--data",
           str(data), "--exp", str(exp), "--frontend", "phone_frontend",
           "--corpus-config", tiny_corpus_config(tmp_path / "corpus.yaml", source="phone_corpus.yaml"),
           *TINY]
    result = run_tree(cmd, 900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    for split in ("train", "dev", "test"):
        assert (data / split / "phone_frontend" / "feats.scp").exists()
        assert not (data / split / "fbank").exists()
    # The front end's default corpus: Kokoro speaks positives and negatives alike (no
    # engine shortcut), and the test set's neighbours and accent variants are measured apart.
    kinds = {}
    for split in ("train", "dev", "test"):
        with open(data / split / "data.list") as f:
            for e in map(json.loads, f):
                if e["key"].startswith("kokoro"):
                    kinds.setdefault(e["kind"], 0)
                    kinds[e["kind"]] += 1
    assert kinds.get("pos") and kinds.get("conf", 0) + kinds.get("neg", 0), kinds
    from toolkit import pretrained
    from toolkit.export import read_metadata
    meta = read_metadata(str(exp / "export" / "model.onnx"))
    front = meta["feature"]["frontend"]
    assert meta["feature"]["type"] == "phone_frontend"
    assert front["source"] == "pretrained:phone-voicebank-v5"
    assert front["sha256"] == pretrained.card_sha256("phone-voicebank-v5")
    assert meta["model_config"]["input_dim"] == len(front["units"])
    assert "parity streamed front end vs whole utterance" in result.stderr
    summary = (exp / "score" / "summary.txt").read_text()
    assert summary.startswith("hey_jarvis: FRR") and "neighbours fire" in summary
    assert "accent variants accepted" in summary and summary.strip() in result.stdout
    assert "| neighbour category |" in (exp / "score" / "product.md").read_text()
    # Learned: the exported head, streaming from audio, scores positives above negatives.
    from toolkit.data.augment import load_mono
    from toolkit.tasks.kws.detector import Detector
    detector = Detector.from_path(str(exp / "export" / "model.onnx"), threshold=0.5)
    peaks = {0: [], -1: []}
    with open(data / "test" / "data.list") as f:
        for entry in map(json.loads, f):
            detector.reset()
            probs = detector.backend.step(detector.frontend.accept(load_mono(entry["wav"], 16000)))
            peaks[0 if entry["label"] == 0 else -1].append(float(probs.max()))
    assert peaks[0] and peaks[-1]
    assert np.mean(peaks[0]) > np.mean(peaks[-1]) + 0.1, peaks       # 0.43 vs 0.23 here
    check_fusion_with_zero_shot_search(data, exp, result.stdout)


def check_fusion_with_zero_shot_search(data, exp, stdout):
    """Stage 6 chose the fusion weights on the dev set, scored the head fused with zero-shot
    search and its verifier and stored its threshold; a fused frame is the weighted
    geometric mean of the three, streamed in chunks as whole, and positives score above
    negatives."""
    from toolkit.data.augment import load_mono
    from toolkit.data.features import extractor_from_metadata
    from toolkit.export import read_metadata
    from toolkit.tasks.kws.detector import Detector, load_backend
    from toolkit.tasks.kws.fusion import fuse
    from toolkit.tasks.kws.search import KeywordSearch
    assert "fused with zero-shot search" in stdout
    assert (exp / "score_fused" / "summary.txt").read_text().startswith("hey_jarvis: FRR")
    model = str(exp / "export" / "model.onnx")
    meta = read_metadata(model)
    assert 0.0 < meta["fused_threshold"] <= 1.0 and "threshold" in meta
    # The fused threshold is the dev set's; the test reports at it.
    dev_fused = json.loads((exp / "score_fused_dev" / "det.json").read_text())
    assert meta["fused_threshold"] == dev_fused["curves"]["hey jarvis"]["selected"]["threshold"]
    assert json.loads((exp / "score_fused" / "det.json").read_text())["deployed"][
        "threshold"] == meta["fused_threshold"]
    chosen = json.loads((exp / "fusion" / "fusion.json").read_text())
    assert meta["fusion_weights"] == chosen["chosen"] and len(chosen["candidates"]) > 20
    head, fused = load_backend(model), load_backend(model, fuse_zero_shot=True)
    assert fused.metadata["threshold"] == meta["fused_threshold"]
    search = KeywordSearch.for_words(["hey jarvis"], meta["feature"]["frontend"]["units"])
    assert Detector(fused).threshold == meta["fused_threshold"]
    extractor = extractor_from_metadata(meta["feature"])
    peaks = {0: [], -1: []}
    with open(data / "test" / "data.list") as f:
        entries = [json.loads(line) for line in f]
    entries = [e for e in entries if e["label"] == 0][:20] + \
        [e for e in entries if e["label"] != 0][:20]
    for entry in entries:
        feats = extractor.compute(load_mono(entry["wav"], 16000))
        head.reset(), fused.reset(), search.reset()
        whole = fused.step(feats)
        expected = fuse(head.step(feats), search.step(feats), search.verifier,
                        meta["fusion_weights"])
        np.testing.assert_allclose(whole, expected, atol=1e-6)
        fused.reset()
        chunked = np.concatenate([fused.step(feats[i:i + 7]) for i in range(0, len(feats), 7)])
        np.testing.assert_allclose(chunked, whole, atol=1e-6)
        peaks[0 if entry["label"] == 0 else -1].append(float(whole.max()))
    assert peaks[0] and peaks[-1]
    assert np.mean(peaks[0]) > np.mean(peaks[-1]) + 0.1, peaks
    check_dev_fused_from_components(data, exp, model)


def check_dev_fused_from_components(data, exp, model):
    """The dev set's fused scores are fused from the components choose_fusion read (no
    second search of dev), bit for bit what the deployed fused model computes."""
    import kaldiio
    from in_process import run_main
    from toolkit.bin import compute_posteriors
    assert not (exp / "score_fused_dev" / "test_probs.ark").exists()
    stored = dict(kaldiio.load_ark(str(exp / "fusion" / "dev_fused.ark")))
    with open(data / "dev" / "data.list") as f:
        entries = [json.loads(line) for line in f]
    assert list(stored) == [e["key"] for e in entries]
    some = exp / "dev_some.list"
    some.write_text("".join(json.dumps(e) + "\n" for e in entries[:6] + entries[-6:]))
    result = run_main(compute_posteriors.main, ["--model", model, "--data-list", str(some),
                                                "--output", str(exp / "dev_some.ark"),
                                                "--fuse-zero-shot"])
    assert result.returncode == 0, result.stderr
    again = dict(kaldiio.load_ark(str(exp / "dev_some.ark")))
    assert len(again) == 12
    for key, scores in again.items():
        assert scores.shape[1] == 1 and np.array_equal(scores, stored[key]), key
