"""Personal wake word: enrol a user's voice from a few clips of the keyword, and a speaker
gate that keeps a detection only when the keyword was said in that voice.

    detector = Detector.zero_shot(["hey jarvis"])
    enrolment = enrol(detector, ["me1.wav", "me2.wav", "me3.wav"])
    enrolment.save("me.enrol")
    gated = Detector.zero_shot(["hey jarvis"], enrolled="me.enrol")   # speaker_score set

Each enrolment clip is run through the detector; the window of its best detection (with
`context_s` of audio either side) is embedded by a speaker encoder. A firing of the gated
detector is embedded the same way and scored against the mean enrolment embedding: cosine,
or AS-Norm when the encoder ships an impostor cohort (`cohort.safetensors` beside its
weights). The gate's threshold comes from the enrolment clips and the cohort alone
(`calibrate_gate_threshold`).
"""
import json
import logging
import math
import os
from dataclasses import dataclass, field
from typing import List, Optional, Sequence, Tuple, Union

import numpy as np

from toolkit.errors import DataError, MissingInputError

logger = logging.getLogger(__name__)

DEFAULT_SPEAKER_ENCODER = "pretrained:ecapa-voicebank-v2"
DEFAULT_CONTEXT_S = 0.3
FORMAT = "toolkit-kws-enrolment"
VERSION = 1
COHORT_FILE = "cohort.safetensors"        # toolkit.pretrained.COHORT
SCORINGS = ("cosine", "as-norm")
# AS-Norm statistics over each side's most similar cohort speakers (the encoder card's
# figures use top 100 too).
AS_NORM_TOP_N = 100
# Audio is fed to the detector in pieces of this length at enrolment: results do not
# depend on it (streaming equals whole), memory does.
ENROL_CHUNK_S = 1.0
# Fewer enrolment clips than this give a noisy mean and almost no spread estimate.
RECOMMENDED_CLIPS = 3

# Gate calibration defaults, all in one place, chosen on egs/wake_word/s0's dev set ("hey
# jarvis", 23 voices, the detector at 1 FA/h of its negatives; the trade-off table is in
# its RESULTS.md): the lowest cost to the user's FRR whose impostor acceptance is <= 5 %
# (+3.5 points, 4.6 %; a threshold 0.2 of the way up to the user's lowest score: +4.1,
# 3.4 %; the cohort's 0.95 quantile: +1.8, 13.9 %). See calibrate_gate_threshold for how
# each is used.
IMPOSTOR_QUANTILE = 0.99   # cohort: the impostor side's bound (top 1 % of its speakers)
USER_LEAN = 0.0            # cohort: threshold this far from that bound to the lowest target
SPREAD_FACTOR = 3.0        # no cohort: a test may lie this many times the enrolment spread away
MIN_SPREAD = 0.01          # no cohort: floor of that spread (cosine distance)
TARGET_QUANTILE = 0.0      # cohort: the target side's reference, a quantile of the held-out
                           # scores (0: the lowest)
FLOOR_AT_BOUND = False     # cohort: where the sides overlap, the threshold is the bound (True)
                           # or the target reference (False: keep the user)


# ---------------------------------------------------------------------------- cohort

def _encoder_file(encoder: str) -> str:
    from toolkit.tasks.speaker.embed import speaker_model_file
    return speaker_model_file(encoder)


def _embed_dim(model_file: str) -> int:
    """The encoder's embedding size, from its export metadata or checkpoint config."""
    if model_file.endswith(".pt"):
        from toolkit.trainer.checkpoint import load_payload
        return int(load_payload(model_file)["config"]["model"]["embed_dim"])
    from toolkit.export import read_metadata
    return int(read_metadata(model_file)["embed_dim"])


def cohort_path(encoder_path: str) -> Optional[str]:
    """`cohort.safetensors` beside the encoder's weights, or None when there is none; a
    shipped encoder's is checked against its model card (toolkit.pretrained.companion)."""
    from toolkit import pretrained
    return pretrained.companion(_encoder_file(encoder_path), COHORT_FILE)


def load_cohort(encoder_path: str) -> Optional[np.ndarray]:
    """The AS-Norm cohort shipped with an encoder: (N, D) float32 mean embeddings of its
    training speakers (tensor `embeddings` of cohort.safetensors beside the weights;
    `pretrained:NAME` is resolved first); None when the encoder has none."""
    path = cohort_path(encoder_path)
    if path is None:
        return None
    from safetensors import SafetensorError
    from safetensors.numpy import load_file
    try:
        tensors = load_file(path)
    except (SafetensorError, OSError, ValueError) as err:
        raise DataError(f"{path}: not a readable safetensors file ({err})") from None
    if "embeddings" not in tensors:
        raise DataError(f"{path}: no tensor 'embeddings' (found: "
                        f"{', '.join(sorted(tensors)) or 'none'})")
    cohort = tensors["embeddings"]
    dim = _embed_dim(_encoder_file(encoder_path))
    if cohort.ndim != 2 or len(cohort) < 2 or cohort.shape[1] != dim:
        raise DataError(f"{path}: tensor 'embeddings' has shape {tuple(cohort.shape)}, "
                        f"expected (speakers >= 2, {dim}) for the encoder's {dim}-d embeddings")
    if not np.issubdtype(cohort.dtype, np.floating):
        raise DataError(f"{path}: tensor 'embeddings' is {cohort.dtype}, expected float32")
    if not np.isfinite(cohort).all():
        raise DataError(f"{path}: tensor 'embeddings' holds NaN or infinity")
    if (np.linalg.norm(cohort, axis=1) == 0).any():
        raise DataError(f"{path}: tensor 'embeddings' has an all-zero row")
    return cohort.astype(np.float32)


# ---------------------------------------------------------------------------- scoring

def _unit(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, np.float64)
    return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)


def _cohort_self_stats(cohort: np.ndarray, top_n: int,
                       chunk: int = 512) -> Tuple[np.ndarray, np.ndarray]:
    """Each cohort speaker's top-n stats against the others: a speaker is no impostor of
    itself, and its own score of 1 would inflate them."""
    means, stds = np.empty(len(cohort)), np.empty(len(cohort))
    n = min(top_n, len(cohort) - 1)
    for s in range(0, len(cohort), chunk):
        scores = cohort[s:s + chunk] @ cohort.T
        rows = np.arange(len(scores))
        scores[rows, s + rows] = -np.inf
        top = -np.partition(-scores, n - 1, axis=1)[:, :n]
        means[s:s + chunk], stds[s:s + chunk] = top.mean(axis=1), top.std(axis=1)
    return means, stds


class EnrolmentScorer:
    """Scores unit test embeddings against one enrolment mean: cosine, or AS-Norm (adaptive
    s-norm, toolkit.tasks.speaker.scoring) with the enrolment side's stats computed once."""

    def __init__(self, embeddings: np.ndarray, cohort: Optional[np.ndarray],
                 top_n: int = AS_NORM_TOP_N):
        from toolkit.tasks.speaker.scoring import cohort_top_stats
        self.mean = _unit(np.mean(_unit(embeddings), axis=0))
        self.cohort = None if cohort is None else _unit(cohort)
        if self.cohort is not None:
            self.top_n = min(top_n, len(self.cohort))
            mu, sd = cohort_top_stats(self.mean[None], self.cohort, self.top_n)
            self.enrol_stats = (float(mu[0]), max(float(sd[0]), 1e-12))

    def __call__(self, tests: np.ndarray, test_stats=None) -> np.ndarray:
        """Scores of unit rows `tests`; `test_stats` (means, stds) replaces their own
        cohort stats (the cohort's own rows, scored without themselves)."""
        from toolkit.tasks.speaker.scoring import cohort_top_stats
        tests = np.atleast_2d(np.asarray(tests, np.float64))
        raw = tests @ self.mean
        if self.cohort is None:
            return raw
        mu_t, sd_t = test_stats or cohort_top_stats(tests, self.cohort, self.top_n)
        mu_e, sd_e = self.enrol_stats
        return 0.5 * ((raw - mu_e) / sd_e + (raw - mu_t) / np.maximum(sd_t, 1e-12))


def calibrate_gate_threshold(embeddings: np.ndarray, cohort: Optional[np.ndarray] = None, *,
                             impostor_quantile: float = IMPOSTOR_QUANTILE,
                             user_lean: float = USER_LEAN,
                             spread_factor: float = SPREAD_FACTOR,
                             min_spread: float = MIN_SPREAD,
                             top_n: int = AS_NORM_TOP_N,
                             target_quantile: float = TARGET_QUANTILE,
                             floor_at_bound: bool = FLOOR_AT_BOUND) -> float:
    """The gate's threshold, from the enrolment embeddings (N, D) and the cohort only.

    Target side: each enrolment clip scored against the mean of the others (leave one
    out), the way the gate will score a new clip; the lowest of them is the user at their
    least typical. With a cohort (AS-Norm scale), the impostor side is the cohort's
    speakers scored against the whole enrolment, and its `impostor_quantile` bounds what
    impostors reach: the threshold goes `user_lean` of the way from that bound to the
    lowest target. Under 1/2 leans to keeping the user, since a few clips of one session
    understate how far the user's later clips stray, while the cohort's quantile is a
    stable estimate. It never exceeds the lowest target: where the two sides overlap the
    user is kept (a weak gate beats a wake word that ignores its owner).
    Without a cohort nothing says where impostors score, so the threshold comes from the
    user's own spread: a test may lie `spread_factor` times as far (cosine distance) from
    the enrolment mean as the farthest held-out clip, floored at `min_spread` (clips of
    one recording differ by almost nothing). One clip has no held-out score: the cohort's
    bound alone, or the floor alone."""
    emb = _unit(embeddings)
    if emb.ndim != 2 or len(emb) == 0:
        raise ValueError(f"need (clips, dim) enrolment embeddings, got shape {emb.shape}")
    if not 0.0 < impostor_quantile <= 1.0 or not 0.0 <= user_lean <= 1.0:
        raise ValueError("impostor_quantile must be in (0, 1] and user_lean in [0, 1]")
    held_out = [float(EnrolmentScorer(np.delete(emb, i, axis=0), cohort, top_n)(emb[i])[0])
                for i in range(len(emb))] if len(emb) > 1 else []
    if cohort is None:
        spread = max(1.0 - min(held_out), min_spread) if held_out else min_spread
        return float(1.0 - spread_factor * spread)
    scorer = EnrolmentScorer(emb, cohort, top_n)
    if len(scorer.cohort) < 2:
        raise ValueError("a cohort needs at least 2 speakers")
    impostors = scorer(scorer.cohort, _cohort_self_stats(scorer.cohort, scorer.top_n))
    bound = float(np.quantile(impostors, impostor_quantile))
    if not held_out:
        return bound
    lowest = float(np.quantile(held_out, target_quantile))
    if lowest <= bound:
        logger.warning("the enrolment clips score no higher than the cohort's top impostors "
                       "(%.3f <= %.3f): the speaker gate will keep most voices", lowest, bound)
        return float(lowest if not floor_at_bound else bound)
    return float(bound + user_lean * (lowest - bound))


# ---------------------------------------------------------------------------- enrolment

@dataclass
class Enrolment:
    """A user's voice for the speaker gate; `threshold` is on the gate's score scale
    (cosine, or AS-Norm with the encoder's cohort)."""
    embeddings: np.ndarray          # (N, D) float32 unit rows, one per enrolment clip
    encoder: str                    # as given, e.g. "pretrained:ecapa-voicebank-v1"
    encoder_sha256: str             # model_fingerprint of the resolved encoder file
    keywords: List[str]
    threshold: float
    scoring: str                    # "as-norm" (the encoder has a cohort) or "cosine"
    context_s: float
    clips: List[str] = field(default_factory=list)
    cohort_sha256: Optional[str] = None   # the cohort AS-Norm was calibrated with

    def to_json(self) -> dict:
        return {"format": FORMAT, "version": VERSION, "encoder": self.encoder,
                "encoder_sha256": self.encoder_sha256, "scoring": self.scoring,
                "cohort_sha256": self.cohort_sha256, "threshold": float(self.threshold),
                "keywords": list(self.keywords), "context_s": float(self.context_s),
                "clips": [str(c) for c in self.clips],
                # float32 -> float: JSON's shortest repr reads back to the same float32
                "embeddings": [[float(v) for v in row]
                               for row in np.asarray(self.embeddings, np.float32)]}

    def save(self, path: str) -> None:
        from toolkit.fileio import atomic_write_text
        data = self.to_json()
        rows = data.pop("embeddings")
        # One key a line and one embedding a line: readable, and diffable by clip.
        lines = [f" {json.dumps(k)}: {json.dumps(v)}," for k, v in data.items()]
        lines.append(' "embeddings": [\n' + ",\n".join(f"  {json.dumps(r)}" for r in rows)
                     + "\n ]")
        atomic_write_text(path, "{\n" + "\n".join(lines) + "\n}\n")

    @classmethod
    def load(cls, path: str) -> "Enrolment":
        """An enrolment file, every field checked: a DataError names the file and key."""
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except FileNotFoundError:
            raise MissingInputError(f"enrolment {path} not found (make one with "
                                    "toolkit.bin.kws --enroll CLIPS --out FILE)") from None
        except (OSError, UnicodeDecodeError) as err:
            raise DataError(f"{path}: not a readable enrolment file ({err})") from None
        try:
            data = json.loads(text)
        except ValueError as err:
            raise DataError(f"{path}: not an enrolment file (not JSON: {err})") from None
        return cls.from_json(data, path)

    @classmethod
    def from_json(cls, data, path: str = "enrolment") -> "Enrolment":
        def bad(key, why):
            return DataError(f"{path}: key '{key}' {why}")

        if not isinstance(data, dict):
            raise DataError(f"{path}: not an enrolment file (a JSON object expected)")
        if data.get("format") != FORMAT:
            raise DataError(f"{path}: not an enrolment file (key 'format' is "
                            f"{data.get('format')!r}, expected {FORMAT!r})")
        if data.get("version") != VERSION:
            raise bad("version", f"is {data.get('version')!r}: this toolkit reads version "
                      f"{VERSION} (enrol again)")
        required = ("encoder", "encoder_sha256", "scoring", "threshold", "keywords",
                    "context_s", "clips", "embeddings")
        for key in required:
            if key not in data:
                raise DataError(f"{path}: missing key '{key}'")
        for key in ("encoder", "encoder_sha256"):
            if not isinstance(data[key], str) or not data[key]:
                raise bad(key, "must be a non-empty string")
        if data["scoring"] not in SCORINGS:
            raise bad("scoring", f"is {data['scoring']!r}, expected one of {', '.join(SCORINGS)}")
        cohort_sha = data.get("cohort_sha256")
        if data["scoring"] == "as-norm" and (not isinstance(cohort_sha, str) or not cohort_sha):
            raise bad("cohort_sha256", "must name the cohort of as-norm scoring")
        if cohort_sha is not None and not isinstance(cohort_sha, str):
            raise bad("cohort_sha256", "must be a string or null")
        for key in ("threshold", "context_s"):
            value = data[key]
            if isinstance(value, bool) or not isinstance(value, (int, float)) \
                    or not math.isfinite(value):
                raise bad(key, f"must be a finite number, got {value!r}")
        if data["context_s"] < 0:
            raise bad("context_s", f"must be >= 0, got {data['context_s']!r}")
        for key, allow_empty in (("keywords", False), ("clips", True)):
            value = data[key]
            if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value) \
                    or (not value and not allow_empty):
                raise bad(key, "must be a list of non-empty strings"
                          + ("" if allow_empty else " (at least one)"))
        return cls(embeddings=_check_embeddings(data["embeddings"], bad),
                   encoder=data["encoder"], encoder_sha256=data["encoder_sha256"],
                   keywords=list(data["keywords"]), threshold=float(data["threshold"]),
                   scoring=data["scoring"], context_s=float(data["context_s"]),
                   clips=list(data["clips"]), cohort_sha256=cohort_sha)


def _check_embeddings(rows, bad) -> np.ndarray:
    if not isinstance(rows, list) or not rows or not all(isinstance(r, list) for r in rows):
        raise bad("embeddings", "must be a non-empty list of rows (lists of numbers)")
    width = len(rows[0])
    for i, row in enumerate(rows):
        if len(row) != width or not row:
            raise bad("embeddings", f"is ragged: row {i} has {len(row)} values, row 0 {width}")
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in row):
            raise bad("embeddings", f"row {i} holds a value that is not a number")
    emb = np.asarray(rows, np.float64)
    if not np.isfinite(emb).all():
        raise bad("embeddings", "holds NaN or infinity")
    norms = np.linalg.norm(emb, axis=1)
    if (np.abs(norms - 1.0) > 1e-3).any():
        i = int(np.argmax(np.abs(norms - 1.0)))
        raise bad("embeddings", f"row {i} has length {norms[i]:.4g}, not 1 (damaged file?)")
    return emb.astype(np.float32)


# ---------------------------------------------------------------------------- the gate

class SpeakerGate:
    """Scores the speaker of a detection's audio against an enrolment. `enrolment`: an
    Enrolment or the path of a .enrol file; `encoder` overrides the enrolment's encoder
    path (a moved file), checked against its fingerprint all the same; `embedder` skips
    loading it (it must be that encoder)."""

    def __init__(self, enrolment: Union[Enrolment, str, os.PathLike], embedder=None,
                 encoder: Optional[str] = None, threads: int = 1):
        from toolkit.tasks.speaker.embed import Embedder, model_fingerprint
        if not isinstance(enrolment, Enrolment):
            enrolment = Enrolment.load(os.fspath(enrolment))
        self.enrolment = enrolment
        encoder = encoder or enrolment.encoder
        model_file = _encoder_file(encoder)
        actual = model_fingerprint(model_file)
        if actual != enrolment.encoder_sha256:
            raise DataError(f"the enrolment was made with encoder {enrolment.encoder} (sha256 "
                            f"{enrolment.encoder_sha256}) but {encoder} is {model_file} (sha256 "
                            f"{actual}): enrol again with this encoder")
        self.embedder = embedder or Embedder.from_path(model_file, threads)
        self.sample_rate = int(self.embedder.sample_rate)
        cohort = None
        if enrolment.scoring == "as-norm":
            cohort = load_cohort(model_file)
            found = _cohort_sha256(model_file)
            if cohort is None or found != enrolment.cohort_sha256:
                raise DataError(
                    f"the enrolment's threshold is on the AS-Norm scale of cohort sha256 "
                    f"{enrolment.cohort_sha256}, but {model_file} has "
                    + (f"cohort sha256 {found}" if found else f"no {COHORT_FILE}")
                    + ": enrol again")
        self._scorer = EnrolmentScorer(enrolment.embeddings, cohort)
        self.threshold = float(enrolment.threshold)

    def embed(self, wave: np.ndarray) -> np.ndarray:
        """(D,) unit embedding of float audio at the encoder's rate (16 kHz)."""
        return _unit(self.embedder.embed(np.asarray(wave, np.float32))).astype(np.float32)

    def score(self, embedding: np.ndarray) -> float:
        return float(self._scorer(_unit(embedding))[0])

    def accepts(self, score: float) -> bool:
        return score >= self.threshold


def _cohort_sha256(model_file: str) -> Optional[str]:
    from toolkit.fileio import sha256_file
    path = cohort_path(model_file)
    return sha256_file(path) if path else None


# ---------------------------------------------------------------------------- enrol

def window_bounds(start_s: float, end_s: float, context_s: float, rate: int,
                  total: Optional[int] = None) -> Tuple[int, int]:
    """Samples [a, b) of a detection's window with `context_s` either side, clipped to the
    stream's start and, when known, its length `total`. The one rule for enrolment and
    gate, so both embed the same audio of the same clip."""
    a = max(0, int(round((start_s - context_s) * rate)))
    b = int(round((end_s + context_s) * rate))
    return a, (b if total is None else min(b, total))


def _expand(clips: Sequence) -> List[str]:
    """WAV paths, a folder standing for its *.wav files (sorted)."""
    paths: List[str] = []
    for clip in clips:
        clip = os.fspath(clip)
        if os.path.isdir(clip):
            found = sorted(os.path.join(clip, f) for f in os.listdir(clip)
                           if f.lower().endswith(".wav"))
            if not found:
                raise DataError(f"enrolment folder {clip} holds no .wav file")
            paths += found
        else:
            paths.append(clip)
    return paths


def enrol(detector, clips: Sequence, encoder: str = DEFAULT_SPEAKER_ENCODER,
          context_s: float = DEFAULT_CONTEXT_S, embedder=None) -> Enrolment:
    """An Enrolment from clips of the user saying a keyword (WAV paths or folders of
    them): each clip's highest-scoring detection, with `context_s` either side, embedded
    by `encoder`. Clips where the detector finds no keyword, or that cannot be read, are
    all named in one DataError."""
    from toolkit.data.audio import BadEntry
    from toolkit.data.augment import load_mono
    from toolkit.tasks.speaker.embed import Embedder, model_fingerprint
    if getattr(detector, "gate", None) is not None:
        raise ValueError("enrol() needs a detector without a speaker gate")
    if context_s < 0:
        raise ValueError(f"context_s must be >= 0, got {context_s}")
    paths = _expand(clips)
    if not paths:
        raise DataError("no enrolment clips given")
    model_file = _encoder_file(encoder)
    embedder = embedder or Embedder.from_path(model_file)
    if int(embedder.sample_rate) != detector.sample_rate:
        raise DataError(f"speaker encoder {encoder} reads {embedder.sample_rate} Hz audio, the "
                        f"detector {detector.sample_rate} Hz")
    rate, chunk = detector.sample_rate, max(1, int(detector.sample_rate * ENROL_CHUNK_S))
    embeddings, keywords, missed, unreadable = [], [], [], []
    for path in paths:
        try:
            wave = load_mono(path, rate)
        except BadEntry as err:
            unreadable.append(f"{path} ({err.reason.replace('_', ' ')})")
            continue
        detector.reset()
        found = [d for s in range(0, len(wave), chunk)
                 for d in detector.accept_waveform(wave[s:s + chunk])] + detector.flush()
        if not found:
            missed.append(path)
            continue
        best = max(found, key=lambda d: d.score)
        a, b = window_bounds(best.start_s, best.end_s, context_s, rate, len(wave))
        embeddings.append(_unit(embedder.embed(wave[a:b])))
        keywords.append(best.keyword_name)
    detector.reset()
    if missed or unreadable:
        parts = []
        if missed:
            parts.append(f"keyword not detected in {', '.join(missed)}: each enrolment clip "
                         f"must say {' or '.join(repr(k) for k in detector.keywords)} "
                         f"(detector threshold {detector.threshold:g})")
        if unreadable:
            parts.append(f"unreadable: {', '.join(unreadable)}")
        raise DataError("; ".join(parts))
    if len(embeddings) < RECOMMENDED_CLIPS:
        logger.warning("enrolling from %d clip(s): %d or more give a steadier voice and "
                       "threshold", len(embeddings), RECOMMENDED_CLIPS)
    emb = np.stack(embeddings).astype(np.float32)
    cohort = load_cohort(model_file)
    return Enrolment(embeddings=emb, encoder=encoder,
                     encoder_sha256=model_fingerprint(model_file),
                     keywords=[k for k in detector.keywords if k in keywords],
                     threshold=calibrate_gate_threshold(emb, cohort),
                     scoring="cosine" if cohort is None else "as-norm",
                     context_s=float(context_s), clips=paths,
                     cohort_sha256=_cohort_sha256(model_file) if cohort is not None else None)
