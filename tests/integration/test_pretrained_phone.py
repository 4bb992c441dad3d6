"""The shipped phone front end (toolkit/pretrained/phone-voicebank-v2; its card's sha256
and damaged weights: test_pretrained.py): it streams chunk by chunk as it runs whole, it
learned phones (espeak-ng speech decoded far better than by the same network untrained),
and zero-shot search in its posteriors finds "hey jarvis" and not "hey travis"."""
import numpy as np
import pytest
import torch

from toolkit import pretrained

NAME = "phone-voicebank-v2"
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


def test_shipped_and_described():
    assert NAME in pretrained.available()
    meta = pretrained.metadata(NAME)
    assert meta["task"] == "phone_ctc" and meta["units"][0] == "<blank>"
    assert meta["activation"] == "log_softmax" and meta["feature"]["frame_shift_ms"] == 10.0


def test_streams_chunk_by_chunk_as_whole(speech):
    from toolkit.data.features import num_frames
    from toolkit.tasks.kws.export import stream_in_chunks
    from toolkit.tasks.kws.frontend import PhoneFrontEnd
    front = PhoneFrontEnd("pretrained:" + NAME)
    wave = speech[VOICES[0], SENTENCES[0]]
    whole = front.compute(wave)
    assert whole.shape == (num_frames(len(wave), RATE), len(front.units))
    assert np.abs(stream_in_chunks(front.stream(), wave) - whole).max() < 1e-4


def test_it_learned_phones(speech):
    from toolkit.nn.ctc import edit_distance, greedy_decode
    from toolkit.tasks.kws.frontend import PhoneFrontEnd
    from toolkit.tasks.kws.models import build_model
    from toolkit.tasks.kws.tokens import espeak_lexicon
    front = PhoneFrontEnd("pretrained:" + NAME)
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
