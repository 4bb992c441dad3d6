"""The wake-word recipe with --frontend speech_embedding (openWakeWord's ONNX front end) at
a tiny size: its stages 1-6 through the real run.sh, the exported front end's parity, and a
config of the other front end refused. Needs openwakeword 0.5.1 (tools/test.sh installs it;
the test fails without it)."""
import json
import os
import subprocess
import time

import numpy as np

from toolkit.config import DatasetConfig
from toolkit.data import features as F
from test_recipe_wake_word import RECIPE, tiny_corpus_config
from test_speech_embedding_frontend import RATE, needs_oww, oww_installed  # noqa: F401
from process_tree import run_tree

TINY = ["--num-procs", "1", "--average-num", "2", "--train-overrides",
        "training.max_epoch=3 dataset.max_frames_in_batch=300 training.log_interval=2"]


@needs_oww
def test_recipe_stages_with_speech_embedding_frontend(tmp_path):
    data, exp = tmp_path / "data", tmp_path / "exp"
    cmd = ["bash", os.path.join(RECIPE, "run.sh"), "--keyword", "hey jarvis", "--data",
           str(data), "--exp", str(exp), "--frontend", "speech_embedding",
           "--corpus-config", tiny_corpus_config(tmp_path / "corpus.yaml"), *TINY]
    t0 = time.time()
    result = run_tree(cmd, 900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    for split in ("train", "dev", "test"):
        assert (data / split / "speech_embedding" / "feats.scp").exists()
        assert not (data / split / "fbank").exists()
    cmvn = json.loads((data / "train" / "global_cmvn_speech_embedding.json").read_text())
    assert len(cmvn["mean"]) == 96
    from toolkit.export import read_metadata
    meta = read_metadata(str(exp / "export" / "model.onnx"))
    assert meta["feature"]["type"] == "speech_embedding" and meta["model_config"]["input_dim"] == 96
    assert "parity streamed front end vs whole utterance" in result.stderr
    det = json.loads((exp / "score" / "det.json").read_text())
    assert det["config"]["frame_shift_ms"] == 80.0 and det["config"]["refractory_frames"] == 12
    assert (exp / "score" / "summary.txt").read_text().startswith("hey_jarvis: FRR")
    # The precomputed embeddings are the ones the exported front end gives on the audio.
    with open(data / "test" / "speech_embedding" / "data.list") as f:
        entry = json.loads(f.readline())
    from toolkit.data.augment import load_mono
    from toolkit.data.pipeline import FeaturePipeline
    stored = FeaturePipeline(DatasetConfig(), 0, False).read_features(entry)
    live = F.streaming_extractor(meta["feature"]).accept(load_mono(entry["wav"], RATE))
    assert np.array_equal(stored, live)
    # A config of the other front end is refused before any work.
    bad = subprocess.run(["bash", os.path.join(RECIPE, "run.sh"), "--frontend",
                          "speech_embedding", "--config", "conf/ds_tcn.yaml", "--data",
                          str(data), "--stage", "1", "--stop-stage", "1"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0 and "not --frontend speech_embedding" in bad.stderr
    assert time.time() - t0 < 900
