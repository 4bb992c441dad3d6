"""The personal wake word's parts without speech: the .enrol file (round trip and every
refusal in one line), the gate threshold's calibration and AS-Norm scoring on synthetic
embeddings, the cohort beside an encoder, and the gated detector's audio buffer on scripted
posteriors (each window cut from the stream as a whole stream gives it)."""
import json
import os
import shutil

import numpy as np
import pytest

from toolkit.errors import DataError, MissingInputError
from toolkit.tasks.kws import enrol as E

RATE = 16000
DIM = 64


def unit(x):
    x = np.asarray(x, np.float64)
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def enrolment(**changes):
    rng = np.random.default_rng(0)
    fields = dict(embeddings=unit(rng.standard_normal((3, 8))).astype(np.float32),
                  encoder="pretrained:ecapa-voicebank-v1", encoder_sha256="ab" * 32,
                  keywords=["hey jarvis"], threshold=0.8125, scoring="cosine", context_s=0.3,
                  clips=["a.wav", "b.wav", "c.wav"])
    fields.update(changes)
    return E.Enrolment(**fields)


# ---------------------------------------------------------------------------- the file

def test_an_enrolment_reads_back_as_written(tmp_path):
    path = str(tmp_path / "me.enrol")
    before = enrolment(scoring="as-norm", cohort_sha256="cd" * 32)
    before.save(path)
    after = E.Enrolment.load(path)
    assert after.embeddings.dtype == np.float32
    np.testing.assert_array_equal(after.embeddings, before.embeddings)   # bit for bit
    for key in ("encoder", "encoder_sha256", "keywords", "threshold", "scoring", "context_s",
                "clips", "cohort_sha256"):
        assert getattr(after, key) == getattr(before, key), key
    data = json.loads(open(path).read())
    assert data["format"] == E.FORMAT and data["version"] == E.VERSION


def _mutations():
    """(name, change to the file's JSON, text expected in the one-line error)."""
    def drop(key):
        return lambda d: d.pop(key)

    def put(key, value):
        return lambda d: d.__setitem__(key, value)

    def row(i, value):
        return lambda d: d["embeddings"].__setitem__(i, value)
    cases = [("format", put("format", "something-else"), "'format'"),
             ("version", put("version", 2), "'version'"),
             ("threshold text", put("threshold", "high"), "'threshold'"),
             ("threshold bool", put("threshold", True), "'threshold'"),
             ("context negative", put("context_s", -0.1), "'context_s'"),
             ("scoring", put("scoring", "plda"), "'scoring'"),
             ("as-norm without cohort", put("scoring", "as-norm"), "'cohort_sha256'"),
             ("keywords empty", put("keywords", []), "'keywords'"),
             ("keywords a string", put("keywords", "hey jarvis"), "'keywords'"),
             ("clips numbers", put("clips", [1, 2]), "'clips'"),
             ("encoder", put("encoder", 3), "'encoder'"),
             ("encoder sha", put("encoder_sha256", ""), "'encoder_sha256'"),
             ("no rows", put("embeddings", []), "'embeddings'"),
             ("a row not a list", put("embeddings", [0.5, 0.5]), "'embeddings'"),
             ("ragged", row(1, [1.0, 0.0]), "ragged"),
             ("text in a row", row(0, ["x"] * 8), "not a number"),
             ("NaN", row(2, [float("nan")] * 8), "NaN"),
             ("not unit", row(0, [1.0] * 8), "not 1")]
    cases += [(f"missing {k}", drop(k), f"missing key '{k}'")
              for k in ("encoder", "encoder_sha256", "scoring", "threshold", "keywords",
                        "context_s", "clips", "embeddings")]
    return cases


@pytest.mark.parametrize("name,change,message", _mutations(), ids=[c[0] for c in _mutations()])
def test_a_wrong_field_is_refused_in_one_line_naming_file_and_key(tmp_path, name, change,
                                                                  message):
    path = str(tmp_path / "me.enrol")
    enrolment().save(path)
    data = json.loads(open(path).read())
    change(data)
    with open(path, "w") as f:
        json.dump(data, f)            # NaN is written as JSON's NaN token, which parses
    with pytest.raises(DataError) as err:
        E.Enrolment.load(path)
    text = str(err.value)
    assert message in text and text.startswith(path) and "\n" not in text, text


@pytest.mark.parametrize("text,message", [("{\"format\": ", "not JSON"),
                                          ("[1, 2]", "JSON object"),
                                          ("", "not JSON")])
def test_a_file_that_is_no_enrolment_is_one_line(tmp_path, text, message):
    path = tmp_path / "me.enrol"
    path.write_text(text)
    with pytest.raises(DataError, match=message) as err:
        E.Enrolment.load(str(path))
    assert str(err.value).startswith(str(path)) and "\n" not in str(err.value)


def test_a_missing_enrolment_says_how_to_make_one(tmp_path):
    with pytest.raises(MissingInputError, match="--enroll"):
        E.Enrolment.load(str(tmp_path / "none.enrol"))


# ---------------------------------------------------------------------------- calibration

def speakers(rng, n):
    return unit(rng.standard_normal((n, DIM)))


def clips_of(rng, speaker, n, noise=0.6):
    """Embeddings of `n` clips of a speaker: its direction plus session noise."""
    return unit(speaker + noise * unit(rng.standard_normal((n, DIM))))


def test_without_a_cohort_the_threshold_keeps_the_user_and_refuses_others():
    rng = np.random.default_rng(1)
    me, others = speakers(rng, 1)[0], speakers(rng, 200)
    enrolled = clips_of(rng, me, 3, noise=0.4)
    threshold = E.calibrate_gate_threshold(enrolled)
    score = E.EnrolmentScorer(enrolled, None)
    mine = score(clips_of(rng, me, 200, noise=0.4))
    theirs = score(np.concatenate([clips_of(rng, s, 1) for s in others]))
    assert np.mean(mine >= threshold) >= 0.98, (threshold, np.sort(mine)[:5])
    assert np.mean(theirs < threshold) == 1.0, (threshold, np.sort(theirs)[-5:])
    # Its rule: spread_factor times the farthest held-out clip's cosine distance.
    farthest = max(1 - float(E.EnrolmentScorer(np.delete(enrolled, i, 0), None)(enrolled[i])[0])
                   for i in range(3))
    assert threshold == pytest.approx(1 - E.SPREAD_FACTOR * farthest)
    # One clip has no spread to measure: the floor alone.
    assert E.calibrate_gate_threshold(enrolled[:1]) == pytest.approx(
        1 - E.SPREAD_FACTOR * E.MIN_SPREAD)
    # Identical clips do not make a threshold of 1 that refuses the user.
    assert E.calibrate_gate_threshold(np.repeat(enrolled[:1], 3, 0)) < 1 - E.MIN_SPREAD


def test_with_a_cohort_the_threshold_lies_between_impostors_and_the_user():
    rng = np.random.default_rng(2)
    me, cohort = speakers(rng, 1)[0], speakers(rng, 300)
    enrolled = clips_of(rng, me, 4)
    threshold = E.calibrate_gate_threshold(enrolled, cohort)
    score = E.EnrolmentScorer(enrolled, cohort)
    mine = score(clips_of(rng, me, 200))
    strangers = score(np.concatenate([clips_of(rng, s, 1) for s in speakers(rng, 300)]))
    assert np.mean(mine >= threshold) >= 0.98, (threshold, np.sort(mine)[:5])
    # The bound is the cohort's 99 % quantile of speaker means; one clip of a stranger
    # spreads wider than a mean: most, not 99 %, are kept out (a random threshold: 50 %).
    assert np.mean(strangers < threshold) >= 0.95, (threshold, np.sort(strangers)[-5:])
    # user_lean places it between the cohort's bound (0) and the lowest held-out clip (1).
    bound = E.calibrate_gate_threshold(enrolled, cohort, user_lean=0.0)
    lowest = E.calibrate_gate_threshold(enrolled, cohort, user_lean=1.0)
    halfway = E.calibrate_gate_threshold(enrolled, cohort, user_lean=0.5)
    assert bound < halfway < lowest and halfway == pytest.approx((bound + lowest) / 2)
    assert threshold == pytest.approx(bound + E.USER_LEAN * (lowest - bound))
    # The target side's reference: a quantile of the held-out scores (0: the lowest).
    median = E.calibrate_gate_threshold(enrolled, cohort, user_lean=1.0, target_quantile=0.5)
    assert median > lowest
    # One clip: the impostors' bound alone.
    assert E.calibrate_gate_threshold(enrolled[:1], cohort) == pytest.approx(
        E.calibrate_gate_threshold(enrolled[:1], cohort, user_lean=0.0))


def test_where_impostors_reach_the_user_the_user_is_kept(caplog):
    """A cohort full of near-copies of the user: its top quantile beats every held-out
    clip, and the threshold falls to the lowest of them rather than refuse the user."""
    rng = np.random.default_rng(3)
    me = speakers(rng, 1)[0]
    enrolled = clips_of(rng, me, 3, noise=0.8)
    cohort = np.concatenate([clips_of(rng, me, 100, noise=0.05), speakers(rng, 100)])
    held_out = [float(E.EnrolmentScorer(np.delete(enrolled, i, 0), cohort)(enrolled[i])[0])
                for i in range(3)]
    assert E.calibrate_gate_threshold(enrolled, cohort) == pytest.approx(min(held_out))
    assert "will keep most voices" in caplog.text


def test_a_cohort_speaker_is_not_its_own_impostor():
    """The impostor side scores each cohort speaker with top-n stats of the others only."""
    rng = np.random.default_rng(4)
    cohort = speakers(rng, 30)
    means, stds = E._cohort_self_stats(cohort, 5)
    for i in (0, 17):
        others = np.sort(np.delete(cohort, i, 0) @ cohort[i])[-5:]
        assert means[i] == pytest.approx(others.mean()) and stds[i] == pytest.approx(others.std())


# ---------------------------------------------------------------------------- cohort, gate

@pytest.fixture(scope="module")
def encoder_dir(tmp_path_factory):
    """A copy of the shipped encoder's export, for cohorts beside it."""
    from toolkit import pretrained
    folder = tmp_path_factory.mktemp("encoder")
    weights = pretrained.weights("ecapa-voicebank-v1")
    for name in ("model.safetensors", "config.json"):
        shutil.copy(os.path.join(os.path.dirname(weights), name), folder / name)
    return folder


def write_cohort(folder, tensors):
    from safetensors.numpy import save_file
    path = str(folder / E.COHORT_FILE)
    save_file(tensors, path)
    return path


def test_load_cohort_reads_the_file_beside_the_weights(encoder_dir):
    model = str(encoder_dir / "model.safetensors")
    assert E.load_cohort(model) is None
    cohort = np.random.default_rng(5).standard_normal((7, 192)).astype(np.float32)
    write_cohort(encoder_dir, {"embeddings": cohort})
    try:
        np.testing.assert_array_equal(E.load_cohort(model), cohort)
    finally:
        os.remove(encoder_dir / E.COHORT_FILE)
    shipped = E.load_cohort(E.DEFAULT_SPEAKER_ENCODER)      # pretrained:NAME is resolved
    assert shipped is None or shipped.shape[1] == 192


@pytest.mark.parametrize("tensors,message", [
    ({"embeddings": np.zeros((4, 10), np.float32) + 1}, "expected (speakers >= 2, 192)"),
    ({"embeddings": np.ones(192, np.float32)}, "expected (speakers >= 2, 192)"),
    ({"embeddings": np.ones((1, 192), np.float32)}, "expected (speakers >= 2, 192)"),
    ({"vectors": np.ones((4, 192), np.float32)}, "no tensor 'embeddings' (found: vectors)"),
    ({"embeddings": np.full((4, 192), np.nan, np.float32)}, "NaN"),
    ({"embeddings": np.ones((4, 192), np.int32)}, "expected float32"),
    ({"embeddings": np.zeros((4, 192), np.float32)}, "all-zero row"),
    (b"not safetensors at all", "not a readable safetensors file"),
])
def test_a_bad_cohort_is_refused_naming_its_file(encoder_dir, tensors, message):
    if isinstance(tensors, bytes):
        (encoder_dir / E.COHORT_FILE).write_bytes(tensors)
        path = str(encoder_dir / E.COHORT_FILE)
    else:
        path = write_cohort(encoder_dir, tensors)
    try:
        with pytest.raises(DataError) as err:
            E.load_cohort(str(encoder_dir / "model.safetensors"))
    finally:
        os.remove(path)
    assert message in str(err.value) and path in str(err.value), str(err.value)


def gate_enrolment(encoder_dir, scoring="cosine", **changes):
    from toolkit.fileio import sha256_file
    from toolkit.tasks.speaker.embed import model_fingerprint
    model = str(encoder_dir / "model.safetensors")
    cohort = encoder_dir / E.COHORT_FILE
    fields = dict(embeddings=unit(np.random.default_rng(6).standard_normal((3, 192)))
                  .astype(np.float32), encoder=model, encoder_sha256=model_fingerprint(model),
                  scoring=scoring, threshold=0.5,
                  cohort_sha256=sha256_file(str(cohort)) if cohort.exists() else None)
    fields.update(changes)
    return enrolment(**fields)


def test_the_gate_scores_cosine_or_as_norm_like_speaker_scoring(encoder_dir):
    from toolkit.tasks.speaker.scoring import adaptive_snorm
    rng = np.random.default_rng(7)
    test = unit(rng.standard_normal(192))
    plain = E.SpeakerGate(gate_enrolment(encoder_dir))
    mean = unit(plain.enrolment.embeddings.astype(np.float64).mean(axis=0))
    assert plain.score(test) == pytest.approx(float(test @ mean), rel=1e-9)
    assert plain.accepts(0.5) and not plain.accepts(0.4999)
    cohort = rng.standard_normal((150, 192)).astype(np.float32)
    write_cohort(encoder_dir, {"embeddings": cohort})
    try:
        gate = E.SpeakerGate(gate_enrolment(encoder_dir, "as-norm"))
        vectors = np.stack([mean, test])
        want = adaptive_snorm(np.array([test @ mean]), np.array([0]), np.array([1]), vectors,
                              unit(cohort.astype(np.float64)), top_n=100)[0]
        assert gate.score(test) == pytest.approx(want, rel=1e-9)
        # An enrolment whose threshold is on another cohort's scale is refused ...
        with pytest.raises(DataError, match="cohort sha256"):
            E.SpeakerGate(gate_enrolment(encoder_dir, "as-norm", cohort_sha256="0" * 64))
    finally:
        os.remove(encoder_dir / E.COHORT_FILE)
    # ... and one that needs a cohort the encoder no longer has.
    with pytest.raises(DataError, match=f"no {E.COHORT_FILE}"):
        E.SpeakerGate(gate_enrolment(encoder_dir, "as-norm", cohort_sha256="0" * 64))


def test_an_enrolment_of_another_encoder_is_refused_naming_both(encoder_dir):
    other = gate_enrolment(encoder_dir, encoder_sha256="f" * 64)
    with pytest.raises(DataError) as err:
        E.SpeakerGate(other)
    text = str(err.value)
    assert "f" * 64 in text and other.encoder in text and "enrol again" in text, text


# ---------------------------------------------------------------------------- the buffer

class ScriptedBackend:
    """Posteriors written in advance, frame by global frame (whatever the features)."""

    def __init__(self, probs, keywords):
        from toolkit.data.features import fbank_metadata, fbank_options
        self.probs = probs
        self.metadata = {"keywords": keywords, "feature": fbank_metadata(fbank_options()),
                         "threshold": 0.5}
        self.reset()

    def reset(self):
        self.t = 0

    def step(self, feats):
        out = self.probs[self.t:self.t + len(feats)]
        self.t += len(feats)
        return out


class RecordingGate(E.SpeakerGate):
    """A gate whose "speaker" is the first sample of the window: the stream's samples hold
    their own index, so each window says where it was cut from."""

    def __init__(self, context_s):
        from types import SimpleNamespace
        self.enrolment = SimpleNamespace(context_s=context_s)
        self.sample_rate, self.threshold, self.windows = RATE, 0.0, []

    def embed(self, wave):
        self.windows.append(wave)
        return wave

    def score(self, embedding):
        # Every other window refused: the rejected are counted, the others kept.
        return 1.0 if len(self.windows) % 2 else -1.0


def stream_and_posteriors(seconds=30.0):
    n = int(seconds * RATE)
    audio = (np.arange(n) % 1000 / 1000.0 - 0.5).astype(np.float32) * 0.1
    frames = (n - 400) // 160 + 1
    probs = np.zeros((frames, 2), np.float32)
    for start, length, k in [(100, 60, 0), (400, 80, 0), (430, 30, 1), (900, 40, 1),
                             (1500, 70, 0), (2200, 90, 1), (frames - 10, 10, 0)]:
        probs[start:start + length, k] = 0.9      # k 1 ("jarvis") nests in k 0
    # A lone "jarvis" whose onset lies 2 s (the most) before it fires, then held 2 s for
    # the nested-keyword rule: its window begins the longest keyword, the hold and the
    # context before the stream's end when it is scored.
    probs[600:900, 1] = 0.3
    return audio, probs


def run_gated(audio, probs, chunk, context_s=0.3):
    from toolkit.tasks.kws.detector import Detector
    gate = RecordingGate(context_s)
    detector = Detector(ScriptedBackend(probs, ["hey jarvis", "jarvis"]), enrolled=gate)
    out, largest = [], 0
    for s in range(0, len(audio), chunk):
        out += detector.accept_waveform(audio[s:s + chunk])
        largest = max(largest, detector._recent.size)
    out += detector.flush()
    return detector, gate, out, largest


def test_gated_windows_are_those_of_the_whole_stream_at_any_chunking():
    audio, probs = stream_and_posteriors()
    whole_det, whole_gate, whole, _ = run_gated(audio, probs, len(audio))
    assert len(whole_gate.windows) >= 5 and whole_det.rejected == len(whole_gate.windows) // 2
    assert [d.speaker_score for d in whole] == [1.0] * len(whole)
    for chunk in (1600, 16000, 777):
        detector, gate, out, largest = run_gated(audio, probs, chunk)
        assert [(d.keyword, d.start_s, d.end_s, d.score) for d in out] == \
            [(d.keyword, d.start_s, d.end_s, d.score) for d in whole]
        assert len(gate.windows) == len(whole_gate.windows)
        for got, want in zip(gate.windows, whole_gate.windows):
            np.testing.assert_array_equal(got, want)
        # Bounded by the longest keyword, the nested hold and the context (+ a chunk).
        bound = ((detector._lookback_frames + 2) * 0.01 + 0.3) * RATE + 2 * chunk
        assert largest <= bound, (chunk, largest, bound)
    # Each window is the detection's with the context either side (the ungated detector's
    # detections, in the order they came) ...
    from toolkit.tasks.kws.detector import Detector
    plain = Detector(ScriptedBackend(probs, ["hey jarvis", "jarvis"]))
    found = plain.accept_waveform(audio) + plain.flush()
    assert len(found) == len(whole_gate.windows)
    for det, window in zip(found, whole_gate.windows):
        a, b = E.window_bounds(det.start_s, det.end_s, 0.3, RATE, len(audio))
        np.testing.assert_array_equal(window, audio[a:b])
    # ... the last one, a keyword at the very end, cut at the stream's end.
    assert all(len(w) > 0.6 * RATE for w in whole_gate.windows[:-1])
    last = whole_gate.windows[-1]
    assert len(last) < 0.6 * RATE
    np.testing.assert_array_equal(last, audio[len(audio) - len(last):])


def test_without_context_the_window_is_the_keyword():
    audio, probs = stream_and_posteriors(8.0)
    _, gate, _, _ = run_gated(audio, probs, 1600, context_s=0.0)
    _, gate_ctx, _, _ = run_gated(audio, probs, 1600, context_s=0.25)
    assert len(gate.windows[0]) + int(0.5 * RATE) == len(gate_ctx.windows[0])
