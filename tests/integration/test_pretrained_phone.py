"""The shipped phone front end (toolkit/pretrained/phone-voicebank-v2; its card's sha256
and damaged weights: test_pretrained.py): it streams chunk by chunk as it runs whole, it
learned phones (espeak-ng speech decoded far better than by the same network untrained),
zero-shot search in its posteriors finds "hey jarvis" and not "hey travis", it exports to
ONNX, and as the feature type `phone_frontend` it leaves the trainer's threads alone, names
its default in the config and refuses features another front end precomputed."""
import json
import multiprocessing
import os
import re

import numpy as np
import pytest
import soundfile as sf
import torch

from toolkit import pretrained
from toolkit.errors import DataError

NAME = "phone-voicebank-v2"           # the default front end
SHIPPED = [NAME, "phone-voicebank-v3", "phone-voicebank-v4", "phone-voicebank-v5"]
RATE = 16000
SENTENCES = ["hey jarvis, turn on the lights", "hey travis, turn on the lights",
             "good morning everyone, how are you", "the seventh train leaves at half past nine"]
VOICES = ["en-us", "en-us+f3"]


@pytest.fixture(scope="module")
def speech():
    """espeak-ng speech, rendered before any front end or search starts (espeak-ng is one
    library per process: the lexicon lookups of the search use it too)."""
    from toolkit.data.audio import resample
    from toolkit.voicebank.espeak import Espeak
    engine = Espeak()
    pad = np.zeros(RATE // 2, np.float32)
    speech = {}
    for seed, (v, t) in enumerate((v, t) for v in VOICES for t in SENTENCES):
        engine.seed(seed)   # espeak-ng's breath noise is otherwise seeded from the clock
        speech[v, t] = np.concatenate([pad, resample(engine.synth(t, v), engine.rate, RATE), pad])
    return speech


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_and_described(name):
    assert name in pretrained.available()
    meta = pretrained.metadata(name)
    assert meta["task"] == "phone_ctc" and meta["units"][0] == "<blank>"
    assert meta["activation"] == "log_softmax" and meta["feature"]["frame_shift_ms"] == 10.0


@pytest.mark.parametrize("name", SHIPPED)
def test_streams_chunk_by_chunk_as_whole(speech, name):
    from toolkit.data.features import num_frames
    from toolkit.tasks.kws.export import stream_in_chunks
    from toolkit.tasks.kws.frontend import PhoneFrontEnd
    front = PhoneFrontEnd("pretrained:" + name)
    wave = speech[VOICES[0], SENTENCES[0]]
    whole = front.compute(wave)
    assert whole.shape == (num_frames(len(wave), RATE), len(front.units))
    assert np.abs(stream_in_chunks(front.stream(), wave) - whole).max() < 1e-4


@pytest.mark.parametrize("name", SHIPPED)
def test_it_learned_phones(speech, name):
    from toolkit.nn.ctc import edit_distance, greedy_decode
    from toolkit.tasks.kws.frontend import PhoneFrontEnd
    from toolkit.tasks.kws.models import build_model
    from toolkit.tasks.kws.tokens import espeak_lexicon
    front = PhoneFrontEnd("pretrained:" + name)
    index = {u: i for i, u in enumerate(front.units)}
    lexicon = espeak_lexicon({w.strip(",") for t in SENTENCES for w in t.split()})
    untrained = build_model(type(front.model.config)(**vars(front.model.config))).eval()
    errors = {"shipped": 0, "untrained": 0}
    reference = 0
    for (_, text), wave in speech.items():
        ref = [index[p] for w in text.split() for p in lexicon[w.strip(",")]]
        reference += len(ref)
        errors["shipped"] += edit_distance(greedy_decode(torch.from_numpy(front.compute(wave))),
                                           ref)
        feats = torch.from_numpy(front.fbank.compute(wave))[None]
        with torch.no_grad():
            errors["untrained"] += edit_distance(greedy_decode(untrained(feats)[0][0]), ref)
    assert errors["shipped"] / reference < 0.35, errors
    assert errors["untrained"] / reference > 0.8, errors


def test_zero_shot_finds_the_keyword_not_its_confusable(speech):
    from toolkit.tasks.kws.detector import Detector
    detector = Detector.zero_shot(["hey jarvis"])
    fired = {}
    for (voice, text), wave in speech.items():
        detector.reset()
        found = []
        for start in range(0, len(wave), 1600):
            found += detector.accept_waveform(wave[start:start + 1600])
        fired[voice, text] = [d.keyword_name for d in found]
    for voice in VOICES:
        assert fired[voice, SENTENCES[0]] == ["hey jarvis"], fired
        for text in SENTENCES[1:]:
            assert fired[voice, text] == [], fired


@pytest.fixture
def keep_threads():
    before = torch.get_num_threads()
    yield before
    torch.set_num_threads(before)


def test_export_model_exports_the_shipped_front_end(speech, tmp_path, keep_threads):
    """d486171: a NotImplementedError traceback for phone-voicebank-v1 and -v2."""
    from toolkit.bin import export_model
    from toolkit.export import onnx_runner, read_metadata
    from toolkit.tasks.kws.export import run_chunked
    from toolkit.tasks.kws.frontend import PhoneFrontEnd
    out = tmp_path / "export"
    assert export_model.main(["--pretrained", NAME, "--out-dir", str(out), "--num-check", "2"]) == 0
    assert sorted(os.listdir(out)) == ["config.json", "model.onnx", "model.safetensors",
                                       "model.zip"]
    meta = read_metadata(str(out / "model.onnx"))
    assert meta["task"] == "phone_ctc" and meta["units"] == pretrained.metadata(NAME)["units"]
    front = PhoneFrontEnd("pretrained:" + NAME)
    wave = speech[VOICES[1], SENTENCES[0]]
    feats = front.fbank.compute(wave)
    onnx = run_chunked(onnx_runner(str(out / "model.onnx")), feats, meta["cache_size"], 16)
    assert np.abs(onnx - front.compute(wave)).max() < 1e-4
    # The export dir is itself a front end, as the shipped model is.
    assert np.abs(PhoneFrontEnd(str(out)).compute(wave) - front.compute(wave)).max() < 1e-4


_FORKED = {}


def _threads_in_a_worker(wave):
    _FORKED["extractor"].compute(wave)
    return torch.get_num_threads()


def test_the_feature_extractor_leaves_the_process_threads_alone(keep_threads):
    """d486171 set the whole process to one thread on building it: every head on phone
    posteriors trained single-threaded. One thread is for worker processes only."""
    from toolkit.config import FeatureConfig
    from toolkit.data.features import build_extractor
    torch.set_num_threads(3)
    extractor = build_extractor(FeatureConfig(type="phone_frontend"), RATE)
    wave = np.random.default_rng(0).uniform(-0.3, 0.3, RATE).astype(np.float32)
    assert extractor.compute(wave).shape[1] == len(pretrained.metadata(NAME)["units"])
    assert torch.get_num_threads() == 3
    _FORKED["extractor"] = extractor
    try:
        with multiprocessing.get_context("fork").Pool(1) as pool:   # a loader worker's way
            assert pool.apply(_threads_in_a_worker, (wave,)) == 1
    finally:
        _FORKED.clear()
    assert torch.get_num_threads() == 3


def test_an_empty_frontend_model_is_named_at_config_time():
    """"" followed whatever default a later release ships; now the experiment's config
    records the concrete name (a later default is then a refused change on resume)."""
    from toolkit.config import DatasetConfig
    from toolkit.config.validate import check_dataset
    from toolkit.tasks.kws.frontend import DEFAULT_FRONTEND
    cfg = DatasetConfig(sample_rate=RATE)
    cfg.feature.type = "phone_frontend"
    check_dataset(cfg)
    assert cfg.feature.frontend_model == DEFAULT_FRONTEND == "pretrained:" + NAME
    cfg.feature.frontend_model = "pretrained:phone-voicebank-v1"
    check_dataset(cfg)
    assert cfg.feature.frontend_model == "pretrained:phone-voicebank-v1"


def test_features_precomputed_by_another_front_end_are_refused(tmp_path):
    """compute_feats records the front end (sha256, output) in every entry; a config that
    names another one refuses them, on reading and before training (d486171 read them
    as the configured front end's)."""
    from toolkit.config import DatasetConfig
    from toolkit.config.validate import check_dataset
    from toolkit.data.features_store import compute_features_for_list
    from toolkit.data.pipeline import FeaturePipeline
    rng = np.random.default_rng(1)
    listing = tmp_path / "wav.list"
    with open(listing, "w") as f:
        for i in range(2):
            path = str(tmp_path / f"{i}.wav")
            sf.write(path, rng.uniform(-0.3, 0.3, RATE).astype(np.float32), RATE)
            f.write(json.dumps({"key": f"u{i}", "wav": path, "duration": 1.0}) + "\n")

    def config(model, output="posteriors"):
        cfg = DatasetConfig(sample_rate=RATE)
        cfg.feature.type, cfg.feature.frontend_model = "phone_frontend", model
        cfg.feature.frontend_output = output
        check_dataset(cfg)
        return cfg

    made_by = config("pretrained:phone-voicebank-v1")
    feats_list = compute_features_for_list(str(listing), str(tmp_path / "feats"), made_by, 1)
    entries = [json.loads(line) for line in open(feats_list)]
    same = FeaturePipeline(made_by, 0, False)
    assert same.features(entries[0], 0).shape[1] == len(pretrained.metadata(NAME)["units"])
    others = [FeaturePipeline(config(m, o), 0, False) for m, o in (
        ("", "posteriors"), ("pretrained:phone-voicebank-v1", "hidden"))]
    for pipeline in others:
        with pytest.raises(DataError, match="recompute them with toolkit.bin.compute_feats"):
            pipeline.features(entries[0], 0)
    assert all(e["feat_frontend"] == {"sha256": pretrained.card_sha256("phone-voicebank-v1"),
                                      "output": "posteriors"} for e in entries)
    # Features from before the record (d486171's compute_feats): refused too.
    old = {k: v for k, v in entries[0].items() if k != "feat_frontend"}
    with pytest.raises(DataError, match="without a record of their front end"):
        same.features(old, 0)
    # The trainer's check of a whole list, before its first step.
    from toolkit.data.features_store import check_stored_features
    from toolkit.data.sources import RawSource
    from toolkit.task import DataRequirements
    source = RawSource(feats_list, DataRequirements(require_label=False), made_by,
                       lambda durations: (np.asarray(durations) * 100).astype(int))
    check_stored_features(source, same.extractor, "train")
    for pipeline in others:
        with pytest.raises(DataError, match=re.escape(
                f"dataset.train_data {feats_list}: the features of 'u0' were computed by the "
                "front end with sha256")):
            check_stored_features(source, pipeline.extractor, f"dataset.train_data {feats_list}")
