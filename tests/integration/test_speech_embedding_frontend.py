"""The speech_embedding feature type (openWakeWord's ONNX front end) and what it touches:
windowing arithmetic and frame end times, streamed vs whole-utterance features and
detector outputs, export of an embedding-input head, exact keyword end frames, the
festival test-only rule of the corpus generator (the wake-word recipe with
frontend=speech_embedding runs in tests/recipes/test_recipe_speech_embedding.py).

Tests marked `needs_oww` run the real models (openwakeword 0.5.1, which tools/test.sh
installs; they fail without it); the rest use a stand-in for the two ONNX models."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import soundfile as sf

from toolkit.config import ConfigError, DatasetConfig, FeatureConfig
from toolkit.config import validate
from toolkit.data import features as F
from toolkit.tasks.kws.data import keyword_end_frame
from in_process import run_main
from installed import INSTALL_HINT, require_engine

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RECIPE = os.path.join(ROOT, "egs", "wake_word", "s0")
RATE = 16000


def _oww_installed() -> bool:
    folder = F.oww_model_dir()
    return bool(folder) and all(os.path.isfile(os.path.join(folder, n))
                                for n in (F.MEL_MODEL, F.EMBEDDING_MODEL))


@pytest.fixture
def oww_installed():
    if not _oww_installed():
        pytest.fail("openwakeword 0.5.1 is not installed; "
                    + INSTALL_HINT.format("bash tools/install_oww.sh"), pytrace=False)


needs_oww = pytest.mark.usefixtures("oww_installed")


class StandInFrontEnd(F.SpeechEmbeddingFeatures):
    """The real chaining with the two ONNX models replaced by functions of the same
    shapes. Like melspectrogram.onnx, mel() depends on its whole input (a term in the
    call's maximum), so equal results need equal calls. Records every call."""

    def __init__(self):
        super().__init__("unused-mel.onnx", "unused-embedding.onnx")
        self.calls = []

    def mel(self, samples):
        n = (len(samples) - F.MEL_WINDOW) // F.MEL_HOP + 1
        assert n >= 1 and len(samples) == F.MEL_HOP * (n - 1) + F.MEL_WINDOW
        self.calls.append(n)
        rows = np.stack([samples[F.MEL_HOP * i:F.MEL_HOP * i + F.MEL_WINDOW] for i in range(n)])
        level = rows.mean(axis=1, keepdims=True) + 1e-3 * float(np.abs(samples).max())
        return (level * np.linspace(0.5, 1.5, F.MEL_BINS)[None]).astype(np.float32)

    def embed(self, windows):
        w = windows.astype(np.float64)
        stats = np.concatenate([w.mean(axis=1), w[:, -1], w[:, 0]], axis=1)     # (n, 96)
        return stats.astype(np.float32)


def chunked(stream, wave, sizes):
    from toolkit.tasks.kws.export import stream_in_chunks
    return stream_in_chunks(stream, wave, sizes)


def noise(seconds, seed=0, level=0.05):
    return (level * np.random.default_rng(seed).standard_normal(int(seconds * RATE))
            ).astype(np.float32)


# ----------------------------------------------------------------------------- arithmetic

@pytest.mark.parametrize("n", [0, 1, 1279, 1280, 1281, 2559, 2560, 16000, 12345, 48000])
def test_embeddings_per_samples_and_frame_end_times(n):
    ex = StandInFrontEnd()
    feats = ex.compute(noise(n / RATE, seed=n))
    assert len(feats) == n // F.EMBEDDING_HOP == ex.frames_for_samples(np.array([n]))[0]
    ends = ex.frame_end_times(len(feats))
    assert np.allclose(ends, 0.08 * np.arange(1, len(feats) + 1))
    # Embedding j ends where mel frame 8 j + 75 ends (in the stream, lead included).
    for j in range(len(feats)):
        mel_end = F.MEL_HOP * (F.STRIDE_FRAMES * j + F.WINDOW_FRAMES - 1) + F.MEL_WINDOW
        assert mel_end - F.LEAD_SAMPLES == round(ends[j] * RATE)


def test_mel_blocks_end_on_embedding_windows():
    """One model call per block of 8 mel frames (4 for the first), every embedding
    window ending on a block edge: no embedding waits for later frames."""
    ex = StandInFrontEnd()
    ex.compute(noise(3.0))
    assert ex.calls[0] == F.BLOCK_OFFSET and set(ex.calls[1:]) == {F.STRIDE_FRAMES}
    edges = np.cumsum(ex.calls)
    for j in range(10):
        assert F.STRIDE_FRAMES * j + F.WINDOW_FRAMES in edges


def test_embedding_depends_on_no_sample_after_its_end():
    ex = StandInFrontEnd()
    wave = noise(2.0, seed=3)
    base = ex.compute(wave)
    for j in (0, 5, 12):
        end = F.EMBEDDING_HOP * (j + 1)
        later = wave.copy()
        later[end:] += 0.3
        assert np.array_equal(ex.compute(later)[:j + 1], base[:j + 1])
        last = wave.copy()
        last[end - 1] += 0.3
        assert not np.array_equal(ex.compute(last)[j], base[j])


@pytest.mark.parametrize("sizes", [(1,), (7, 1000), (160,), (1280,), (1279, 1281), (12511, 1, 1),
                                   (1, 37, 160, 999, 4000)])
def test_streamed_front_end_equals_whole_utterance_stand_in(sizes):
    ex = StandInFrontEnd()
    wave = noise(2.3 if sizes != (1,) else 0.6, seed=len(sizes))
    offline = ex.compute(wave)
    streamed = chunked(ex.streaming(), wave, sizes)
    assert streamed.shape == offline.shape and np.array_equal(streamed, offline)


def test_keyword_end_frame_uses_frame_end_times():
    ends = 0.08 * np.arange(1, 21)
    entry = {"kw_end": 0.64, "duration": 1.6}
    assert keyword_end_frame(entry, 20, ends) == 7            # exactly on embedding 7's end
    assert keyword_end_frame(dict(entry, kw_end=0.641), 20, ends) == 8
    assert keyword_end_frame(dict(entry, kw_end=0.01), 20, ends) == 0
    assert keyword_end_frame(dict(entry, kw_end=5.0), 20, ends) == 19
    assert keyword_end_frame({"duration": 1.6}, 20, ends) == -1
    # fbank (no frame times): the fraction-of-duration rule, as before.
    assert keyword_end_frame(entry, 158) == int(0.64 / 1.6 * 158)


def test_kws_builder_takes_frame_times_from_the_pipeline():
    from toolkit.tasks.kws.data import KwsExampleBuilder

    class Pipeline:
        num_bins = 96

        def features(self, entry, epoch, audio=None, spec_aug=True):
            return np.zeros((20, 96), np.float32)

        def frame_end_times(self, n):
            return 0.08 * np.arange(1, n + 1)

    entry = {"key": "a", "wav": "a.wav", "duration": 1.6, "label": 0, "kw_end": 0.72}
    assert KwsExampleBuilder(Pipeline(), True, None)(entry, 0)[2] == 8
    assert KwsExampleBuilder(Pipeline(), True, None)(dict(entry, label=-1), 0)[2] == -1


# ----------------------------------------------------------------------------- config

def _raw_config(**feature):
    return {"task": {"type": "kws"}, "dataset": {"feature": feature},
            "model": {"type": "ds_tcn"}, "loss": {"type": "max_pooling"}}


def test_feature_type_is_validated():
    import toolkit.tasks  # noqa: F401
    assert validate(_raw_config()).dataset.feature.type == "fbank"
    with pytest.raises(ConfigError, match="dataset.feature.type: unknown 'mfcc'"):
        validate(_raw_config(type="mfcc"))
    raw = _raw_config(type="speech_embedding")
    raw["dataset"]["vtlp_range"] = [0.9, 1.1]
    with pytest.raises(ConfigError, match="warp mel bins"):
        validate(raw)
    raw["dataset"]["vtlp_range"] = []
    raw["dataset"]["sample_rate"] = 8000
    with pytest.raises(ConfigError, match="16000 Hz"):
        validate(raw)


def test_missing_wheel_is_a_clear_error(monkeypatch):
    from toolkit.errors import MissingInputError
    monkeypatch.setattr(F, "oww_model_dir", lambda: None)
    with pytest.raises(MissingInputError, match=r"pip install --no-deps openwakeword==0\.5\.1"):
        F.build_extractor(FeatureConfig(type="speech_embedding"), RATE)


def test_fbank_stays_the_default_extractor():
    from toolkit.data.pipeline import FeaturePipeline
    pipeline = FeaturePipeline(DatasetConfig(), seed=0, train=False)
    wave = noise(1.0)
    assert isinstance(pipeline.extractor, F.FbankFeatures) and pipeline.num_bins == 40
    assert pipeline.frame_end_times(10) is None
    expected = F.compute_fbank(wave, F.options_from_config(DatasetConfig().feature, RATE))
    assert np.array_equal(pipeline.extract(wave, 0, "k"), expected)
    assert F.extractor_from_metadata(pipeline.extractor.metadata()).metadata() == \
        pipeline.extractor.metadata()


def test_detector_defaults_follow_the_frame_rate():
    from toolkit.tasks.kws.detector import frames_for_seconds
    assert frames_for_seconds(100, 10.0) == 100 and frames_for_seconds(200, 10.0) == 200
    assert frames_for_seconds(100, 80.0) == 12 and frames_for_seconds(200, 80.0) == 25


# ----------------------------------------------------------------------------- export

def _embedding_head(seed=0):
    import torch
    from toolkit.tasks.kws.models import MODELS, build_model
    torch.manual_seed(seed)
    config = MODELS.get("ds_tcn").Config(type="ds_tcn", input_dim=96, num_outputs=1,
                                         hidden_dim=16, num_layers=3, kernel_size=3,
                                         dilations=[1, 2, 4], dropout=0.0)
    return build_model(config).eval()


STAND_IN_META = {"type": "speech_embedding", "sample_rate": RATE, "frame_shift_ms": 80.0,
                 "dim": 96, "input_scale": 32768.0,
                 "frontend": {"package": "openwakeword", "version": "0.5.1",
                              "mel_model": F.MEL_MODEL, "embedding_model": F.EMBEDDING_MODEL}}


def test_export_parity_of_an_embedding_input_head(tmp_path):
    from toolkit.export import read_metadata
    from toolkit.tasks.kws.export import build_metadata, check_parity, export_model_files
    model = _embedding_head()
    meta = build_metadata(model, STAND_IN_META, ["hey jarvis"], 0.5)
    paths = export_model_files(model, str(tmp_path), meta)
    rng = np.random.default_rng(1)
    feats = [(rng.standard_normal((n, 96)) * 5).astype(np.float32) for n in (1, 7, 40)]
    worst = check_parity(model, paths, feats, tolerance=1e-4)
    assert set(worst) == {"torchscript", "onnx", "safetensors"} and max(worst.values()) < 1e-4
    for name in ("model.onnx", "model.zip", "model.safetensors"):
        stored = read_metadata(str(tmp_path / name))
        assert stored["feature"]["type"] == "speech_embedding"
        assert stored["feature"]["frame_shift_ms"] == 80.0
    # The front end's models are named, never included.
    assert os.path.getsize(tmp_path / "model.onnx") < 200_000


# ----------------------------------------------------------------------------- corpus

def test_festival_is_refused_for_training(tmp_path):
    from toolkit.voicebank import SynthError
    from toolkit.tasks.kws.corpus import generate_corpus
    require_engine("festival")          # installed, and refused as reserved for testing
    refusal = "reserved for the unseen-engine test"
    for engines in (["festival"], ["espeak", "festival"]):
        with pytest.raises(SynthError, match=refusal):
            generate_corpus(["hey jarvis"], str(tmp_path / "data"), engines=engines)
    assert not (tmp_path / "data").exists()
    from toolkit.bin import synth_kws_data          # its real main(argv), in this process
    out = run_main(synth_kws_data.main, ["--keyword", "hey jarvis", "--out-dir",
                                         tmp_path / "d2", "--engines", "espeak,festival"])
    assert out.returncode == 2 and refusal in out.stderr


def test_test_only_corpus_is_the_held_out_test_split(tmp_path):
    """--test-only with espeak writes data/test alone, byte for byte the test split of the
    full corpus of the same seed (the same held-out voices)."""
    from toolkit.tasks.kws.corpus import Sizes, generate_corpus
    # Every split drawn (its voices and random streams come first), few utterances each.
    sizes = Sizes(train_pos=1, train_neg=2, dev_pos=1, dev_neg=1, test_pos=2, test_neg=3)
    full, only = tmp_path / "full", tmp_path / "only"
    generate_corpus(["hey jarvis"], str(full), seed=5, sizes=sizes, nj=1)
    summary = generate_corpus(["hey jarvis"], str(only), seed=5, sizes=sizes, nj=1,
                              test_only=True)
    assert set(summary) == {"test"}
    assert sorted(os.listdir(only)) == [".synth_kws_data.json", "dict", "test", "voices.tsv",
                                        "wavs"]
    for name in ("text", "utt2spk", "utt2dur", "utt2kind", "kw_times"):
        assert (full / "test" / name).read_bytes() == (only / "test" / name).read_bytes()
    for wav in sorted((full / "wavs" / "test").iterdir()):
        assert wav.read_bytes() == (only / "wavs" / "test" / wav.name).read_bytes()
    assert not json.loads((full / ".synth_kws_data.json").read_text())["test_only"]
    # Rerunning with the same arguments finds it complete.
    stamp = (only / ".synth_kws_data.json").stat().st_mtime_ns
    generate_corpus(["hey jarvis"], str(only), seed=5, sizes=sizes, nj=1, test_only=True)
    assert (only / ".synth_kws_data.json").stat().st_mtime_ns == stamp


# ----------------------------------------------------------------------------- real models

@needs_oww
def test_real_mel_model_windowing():
    """The facts the front end relies on, measured on melspectrogram.onnx: N samples give
    (N - 512) // 160 + 1 frames (N / 160 - 3 for N a multiple of 160); frame i reads
    samples [160 i, 160 i + 512) only; the output floor is the whole call's max - 80 dB."""
    ex = F.build_extractor(FeatureConfig(type="speech_embedding"), RATE)
    wave = noise(1.0, seed=4, level=0.1) * 32768
    for n in (512, 640, 700, 1600, 1759, 16000):
        assert len(ex.mel(wave[:n])) == (n - 512) // 160 + 1
        if n % 160 == 0:
            assert len(ex.mel(wave[:n])) == n // 160 - 3
    base = ex.mel(wave[:3200])
    i = 8
    changed = wave[:3200].copy()
    changed[160 * i + 512:160 * i + 900] *= 1.5
    changed[:160 * i] *= 1.5
    assert np.array_equal(ex.mel(changed)[i], base[i])
    quiet = np.zeros(1632, np.float32)
    quiet[1000:] = 1.0
    alone = ex.mel(quiet)
    loud = quiet.copy()
    loud[:400] = 20000 * np.sin(np.arange(400))
    assert not np.array_equal(ex.mel(loud)[-1], alone[-1])   # why mel runs in fixed blocks


@needs_oww
@pytest.mark.parametrize("sizes", [(1, 37, 160, 999, 4000), (1280,), (333,), (12511, 1, 1)])
def test_real_front_end_streamed_equals_whole_utterance(sizes):
    ex = F.build_extractor(FeatureConfig(type="speech_embedding"), RATE)
    wave = noise(2.5, seed=9, level=0.1)
    wave[8000:20000] *= 8
    offline = ex.compute(wave)
    assert offline.shape == (len(wave) // 1280, 96)
    streamed = chunked(F.extractor_from_metadata(ex.metadata()).streaming(), wave, sizes)
    assert streamed.shape == offline.shape
    assert float(np.max(np.abs(streamed - offline))) <= 1e-5


@needs_oww
def test_metadata_names_and_fingerprints_the_models(tmp_path):
    from toolkit.errors import DataError
    ex = F.build_extractor(FeatureConfig(type="speech_embedding"), RATE)
    meta = ex.metadata()
    front = meta["frontend"]
    assert front["package"] == "openwakeword" and front["version"] == "0.5.1"
    assert set(front["sha256"]) == {F.MEL_MODEL, F.EMBEDDING_MODEL}
    from toolkit.config import dataset_config_from_metadata
    assert dataset_config_from_metadata(meta).feature.type == "speech_embedding"
    other = tmp_path / F.MEL_MODEL
    other.write_bytes(b"not the model")
    with pytest.raises(DataError, match="not the melspectrogram.onnx this model was trained"):
        F.extractor_from_metadata(meta, mel_model=str(other))


@needs_oww
def test_whole_detector_streamed_equals_offline(tmp_path):
    from toolkit.tasks.kws.detector import Detector
    from toolkit.tasks.kws.export import build_metadata, export_model_files
    ex = F.build_extractor(FeatureConfig(type="speech_embedding"), RATE)
    model = _embedding_head(seed=2)
    paths = export_model_files(model, str(tmp_path / "export"),
                               build_metadata(model, ex.metadata(), ["hey jarvis"], None))
    wave = noise(4.0, seed=5, level=0.1)
    wave[16000:32000] *= 6
    whole = Detector.from_path(paths["onnx"], threshold=0.5)
    offline = whole.backend.step(whole.frontend.accept(wave))
    assert whole.decision.refractory_frames == 12 and whole.decision.frame_shift_ms == 80.0
    threshold = float(np.median(offline))
    for sizes in [(1600,), (1, 37, 160, 999, 4000), (777,)]:
        det = Detector.from_path(paths["onnx"], threshold=threshold, refractory_frames=3)
        ref = Detector.from_path(paths["onnx"], threshold=threshold, refractory_frames=3)
        probs, found, start, i = [], [], 0, 0
        while start < len(wave):
            piece = wave[start:start + sizes[i % len(sizes)]]
            probs.append(det.backend.step(det.frontend.accept(piece)))
            start, i = start + len(piece), i + 1
        assert float(np.max(np.abs(np.concatenate(probs) - offline))) <= 1e-5
        start, i = 0, 0
        det.reset()
        while start < len(wave):
            piece = wave[start:start + sizes[i % len(sizes)]]
            found += det.accept_waveform(piece)
            start, i = start + len(piece), i + 1
        # Same firings; scores agree as the posteriors do (the head's ONNX kernels round
        # differently for different chunk lengths).
        expected = ref.accept_waveform(wave)
        assert found and [(d.keyword, d.start_s, d.end_s) for d in found] == \
            [(d.keyword, d.start_s, d.end_s) for d in expected]
        assert max(abs(a.score - b.score) for a, b in zip(found, expected)) <= 1e-5
    # The CLI on the same model (its real main(argv), in this process).
    from toolkit.bin import kws
    sf.write(str(tmp_path / "a.wav"), wave, RATE, subtype="FLOAT")
    out = run_main(kws.main, ["--model", paths["onnx"], "--threshold", threshold,
                              tmp_path / "a.wav"])
    assert out.returncode == 0, out.stderr
    assert "detection(s)" in out.stderr


@needs_oww
def test_keyword_end_frame_exact_through_the_pipeline(tmp_path):
    from toolkit.data.pipeline import FeaturePipeline
    from toolkit.tasks.kws.data import KwsExampleBuilder
    path = str(tmp_path / "a.wav")
    sf.write(path, noise(1.6, seed=1), RATE, subtype="PCM_16")
    entry = {"key": "a", "wav": path, "duration": 1.6, "label": 0, "kw_end": 0.64}
    cfg = DatasetConfig(feature=FeatureConfig(type="speech_embedding"))
    builder = KwsExampleBuilder(FeaturePipeline(cfg, seed=0, train=False), True, None)
    feats, _, end, _ = builder(entry, 0)
    assert feats.shape == (20, 96) and end == 7           # embedding 7 ends at 0.64 s
    assert builder(dict(entry, kw_end=0.65), 0)[2] == 8
    # Played twice as fast, frames last 160 ms of the original: 0.65 s falls in frame 4.
    fast = DatasetConfig(feature=FeatureConfig(type="speech_embedding"), speed_perturb=[2.0])
    feats, _, end, _ = KwsExampleBuilder(FeaturePipeline(fast, seed=0, train=True), True,
                                         None)(dict(entry, kw_end=0.65), 0)
    assert len(feats) == 10 and end == 4


@needs_oww
def test_features_identical_across_processes_and_precomputed(tmp_path):
    """Exact resume needs features that do not depend on the process: a forked worker, a
    fresh interpreter and the precomputed archive give the same bits."""
    import multiprocessing as mp
    from toolkit.data.features_store import compute_features_for_list
    from toolkit.data.pipeline import FeaturePipeline
    path = str(tmp_path / "a.wav")
    sf.write(path, noise(2.2, seed=7, level=0.2), RATE, subtype="PCM_16")
    entry = {"key": "a", "wav": path, "duration": 2.2}
    cfg = DatasetConfig(feature=FeatureConfig(type="speech_embedding"))
    pipeline = FeaturePipeline(cfg, seed=0, train=False)
    here = pipeline.features(entry, 0)
    with mp.get_context("fork").Pool(1) as pool:
        forked = pool.apply(pipeline.features, (entry, 0))
    code = ("import sys, numpy as np; from toolkit.config import DatasetConfig, FeatureConfig; "
            "from toolkit.data.pipeline import FeaturePipeline; "
            "p = FeaturePipeline(DatasetConfig(feature=FeatureConfig(type='speech_embedding')), 0, False); "
            f"np.save(sys.argv[1], p.features({{'key': 'a', 'wav': {path!r}, 'duration': 2.2}}, 0))")
    subprocess.run([sys.executable, "-c", code, str(tmp_path / "fresh.npy")], check=True,
                   timeout=120)
    lst = tmp_path / "in.list"
    lst.write_text(json.dumps(entry) + "\n")
    out_list = compute_features_for_list(str(lst), str(tmp_path / "feats"), cfg, nj=1)
    stored = pipeline.features(json.loads(open(out_list).readline()), 0)
    for other in (forked, np.load(tmp_path / "fresh.npy"), stored):
        assert np.array_equal(here, other)


@needs_oww
def test_killed_training_on_embeddings_resumes_bitwise(tmp_path):
    """Embeddings computed on the fly in two forked loader workers (lazy ONNX sessions),
    with speed perturbation: a run killed twice ends where an uninterrupted one does."""
    import copy
    import random
    from test_trainer_resume import assert_same_run, train_with_kills
    from train_utils import TINY_CONFIG, Corpus, latest_payload, run_train
    config = copy.deepcopy(TINY_CONFIG)
    config["dataset"]["feature"] = {"type": "speech_embedding"}
    config["dataset"]["vtlp_range"] = []
    config["loss"] = {"type": "max_pooling", "min_duration": 1, "end_window": [0, 3]}
    # 24 training utterances, not 36: fewer steps for each run to redo; the kills still
    # land in the first two thirds of the run, across epochs.
    corpus = Corpus(str(tmp_path / "data"), num_train=24, num_dev=6, config=config)
    reference = str(tmp_path / "reference")
    result = run_train(corpus.train_args(reference), 0)
    assert result.returncode == 0, result.stderr[-3000:]
    ref = latest_payload(reference)
    exp = str(tmp_path / "killed")
    rng = random.Random(7)
    points = sorted(rng.sample(range(1, max(4, ref["step"] * 2 // 3)), 2))
    assert train_with_kills(corpus.train_args(exp), 0, points, exp, rng) == 2
    assert_same_run(ref, latest_payload(exp))
