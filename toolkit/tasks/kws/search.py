"""Zero-shot keyword spotting: a keyword's phones from espeak-ng, searched in the streaming
log phone posteriors of a phone front end (toolkit.tasks.kws.frontend); no training.

For each keyword a Viterbi pass over its CTC states (blank, p1, blank, p2, ..., pL, blank)
runs frame by frame with a free start: at every frame a path may begin, so the best path
ending at a frame is the tightest alignment of the keyword ending there. Each path also
carries the highest posterior each of its phones reached inside its own segment; the
keyword's score at a frame is the geometric mean of those peaks over the L phones, for the
best path in the keyword's last phone or the blank after it. A confusable ("hey travis"
for "hey jarvis") has one phone whose peak is low, which pulls the mean down even though
every other phone matches.

Beside each keyword runs a free phone loop: the best path through any units over the
same frames, the best unit of each frame. `verifier` (T, K) holds exp((keyword path's
log-probability - the free loop's) / phones): 1 when every frame's best unit is on the
keyword's path, small when another phone wins somewhere ("hey travis" loses on the /t/
where "hey jarvis" wins): a posterior ratio against the phones heard.

    searcher = KeywordSearch.for_words(["hey jarvis", "alexa"], units)
    scores = searcher.step(log_posteriors)        # (T, K) in [0, 1], state kept across calls

`ZeroShotBackend` puts front end and search behind the Backend interface of
toolkit.tasks.kws.detector, so `Detector` runs a zero-shot keyword like a trained model.
`FusedBackend` runs a head trained on the same posteriors beside the search and scores
each frame by a weighted geometric mean of head, search and verifier
(toolkit.tasks.kws.fusion; the weights chosen on a dev set).
"""
import logging
import re
from typing import Dict, List, Optional, Sequence

import numpy as np

from toolkit.errors import DataError

logger = logging.getLogger(__name__)

_NEG = -1.0e30
# A phone is being heard while its posterior is above 0.1 (for where a keyword began).
_HEARD = float(np.log(0.1))
# The longest a keyword may take from its first phone to now, in 10 ms frames: bounds how
# far apart its phones may lie and how long a finished keyword keeps its score. It follows
# the keyword: 200 ms a phone (twice a slow speaker's pace), never under 1.5 s, so "hey
# jarvis" keeps 1.5 s and a spoken command of 50 phones gets 10 s.
MIN_KEYWORD_FRAMES = 150
FRAMES_PER_PHONE = 20
# A word espeak-ng can say as English: letters, digits, apostrophes and hyphens. Other
# scripts come out as the names of their characters, punctuation as pause marks.
_ENGLISH_WORD = re.compile(r"^[a-z0-9'-]*[a-z0-9][a-z0-9'-]*$")
# The default threshold of zero-shot detection (Detector.zero_shot, toolkit.bin.kws
# --keywords) with phone-voicebank-v2: its keywords in espeak-ng speech score 0.3-0.8, their
# one-phone confusables and other speech below 0.15 (egs/voice_bank/phone_frontend/
# RESULTS.md); `toolkit.bin.kws --calibrate` picks one for your audio and false-alarm rate.
ZERO_SHOT_THRESHOLD = 0.3


def keyword_units(keyword: str, units: Sequence[str], voice: str = "en-us") -> List[int]:
    """The unit ids of `keyword`'s espeak-ng phones (word by word); an error names a phone
    the front end does not know."""
    from toolkit.tasks.kws.tokens import espeak_lexicon
    words = keyword.lower().split()
    if not words:
        raise DataError(f"keyword {keyword!r} is empty")
    for w in words:
        if not _ENGLISH_WORD.match(w):
            raise DataError(f"keyword {keyword!r}: {w!r} has no English pronunciation (zero-shot "
                            "keywords are English words, letters, digits, ' and -)")
    lexicon = espeak_lexicon(words, voice)
    index = {u: i for i, u in enumerate(units)}
    ids = []
    for w in words:
        if w not in lexicon:
            raise DataError(f"keyword {keyword!r}: espeak-ng gives no phones for {w!r}")
        for phone in lexicon[w]:
            if phone not in index:
                raise DataError(f"keyword {keyword!r}: phone {phone!r} of {w!r} is not among "
                                f"the front end's units ({len(units)}: {' '.join(units[1:])})")
            ids.append(index[phone])
    return ids


def keyword_max_frames(num_phones: int) -> int:
    """The longest a keyword of `num_phones` phones may take, in 10 ms frames."""
    return max(MIN_KEYWORD_FRAMES, FRAMES_PER_PHONE * int(num_phones))


class _Keyword:
    """Viterbi state of one keyword."""

    def __init__(self, ids: Sequence[int], blank: int, max_frames: int):
        self.max_frames = max_frames
        if not ids:
            raise ValueError("a keyword needs at least one unit")
        self.length = len(ids)
        ext = np.full(2 * len(ids) + 1, blank, dtype=np.int64)
        ext[1::2] = ids
        self.ext = ext
        self.is_phone = ext != blank
        states = len(ext)
        prev2 = np.concatenate([[blank, blank], ext[:-2]])
        self.may_skip = self.is_phone & (ext != prev2) & (np.arange(states) >= 2)
        self.reset()

    def reset(self) -> None:
        n = len(self.ext)
        self.score = np.full(n, _NEG)       # Viterbi log-probability of the best path
        self.peaks = np.zeros(n)            # sum of its phones' peak log-posteriors
        self.current = np.zeros(n)          # peak of the phone the state is in
        self.age = np.zeros(n, dtype=np.int64)   # frames since the path started
        self.lead = np.zeros(n, dtype=np.int64)  # frames its first phone was heard before
        self.free = np.zeros(n)             # the free phone loop's log-probability, same frames
        self.first_run = 0                        # frames the first phone has been heard

    def step(self, frame: np.ndarray):
        """(score, frames since the scored path began (this one included), verifier)."""
        e = frame[self.ext].astype(np.float64)
        n = len(self.ext)
        # Candidate predecessors of each state: stay, advance one state, skip a blank.
        score = np.full((3, n), _NEG)
        peaks = np.zeros((3, n))
        score[0], peaks[0] = self.score, self.peaks
        score[1, 1:], peaks[1, 1:] = self.score[:-1], self.peaks[:-1]
        score[2, 2:] = np.where(self.may_skip[2:], self.score[:-2], _NEG)
        peaks[2, 2:] = self.peaks[:-2]
        age = np.zeros((3, n), dtype=np.int64)
        age[0], age[1, 1:], age[2, 2:] = self.age, self.age[:-1], self.age[:-2]
        # A fresh start, in the leading blank or straight in the first phone, costs nothing
        # (every path's score is a sum of log-probabilities, at most 0).
        score[1, 0], peaks[1, 0] = 0.0, 0.0
        lead = np.zeros((3, n), dtype=np.int64)
        lead[0], lead[1, 1:], lead[2, 2:] = self.lead, self.lead[:-1], self.lead[:-2]
        free = np.zeros((3, n))
        free[0], free[1, 1:], free[2, 2:] = self.free, self.free[:-1], self.free[:-2]
        if score[1, 1] < 0.0:
            # A fresh start always wins the first phone's state (it costs nothing), so the
            # keyword began where the first phone did, the frames it has been heard so far
            # ago (at most a slow phone's length); reported, not counted against the bound.
            score[1, 1], peaks[1, 1], age[1, 1], free[1, 1] = 0.0, 0.0, 0, 0.0
            lead[1, 1] = min(self.first_run, FRAMES_PER_PHONE)
        age[1, 0], lead[1, 0], free[1, 0] = 0, 0, 0.0
        # A path longer than a keyword can last is no keyword (nor words far apart).
        score[age >= self.max_frames] = _NEG
        best = np.argmax(score, axis=0)
        cols = np.arange(n)
        entering = best > 0
        base = peaks[best, cols]
        current = np.where(entering, e, np.maximum(self.current, e))
        self.peaks = np.where(self.is_phone,
                              np.where(entering, base + e, base - self.current + current), base)
        self.current = np.where(self.is_phone, current, 0.0)
        self.score = np.maximum(score[best, cols] + e, _NEG)
        self.age = age[best, cols] + 1
        self.lead = lead[best, cols]
        self.free = free[best, cols] + float(frame.max())
        self.first_run = self.first_run + 1 if e[1] > _HEARD else 0
        # Done: the best path in the last phone or the blank after it.
        last = n - 2 + int(self.score[n - 1] > self.score[n - 2])
        if self.score[last] <= _NEG / 2:
            return 0.0, 0, 0.0
        ratio = min(0.0, self.score[last] - self.free[last]) / self.length
        return (float(np.exp(self.peaks[last] / self.length)),
                int(self.age[last] + self.lead[last]), float(np.exp(ratio)))


class KeywordSearch:
    """Streaming CTC keyword search over (T, units) log posteriors -> (T, K) scores; after
    each step `path_frames` (T, K) holds how many frames ago each scored path began.
    `max_frames`: one bound for every keyword, or None for each keyword's own
    (keyword_max_frames of its phone count)."""

    def __init__(self, keywords: Sequence[Sequence[int]], names: Sequence[str], blank: int = 0,
                 max_frames: Optional[int] = None):
        self.names = list(names)
        self.max_frames = [int(max_frames) if max_frames else keyword_max_frames(len(ids))
                           for ids in keywords]
        self._keywords = [_Keyword(ids, blank, bound)
                          for ids, bound in zip(keywords, self.max_frames)]
        self.path_frames = np.zeros((0, len(self._keywords)), np.int64)
        self.verifier = np.zeros((0, len(self._keywords)), np.float32)

    @classmethod
    def for_words(cls, keywords: Sequence[str], units: Sequence[str], voice: str = "en-us",
                  max_frames: Optional[int] = None) -> "KeywordSearch":
        return cls([keyword_units(k, units, voice) for k in keywords], keywords,
                   max_frames=max_frames)

    def reset(self) -> None:
        for k in self._keywords:
            k.reset()

    def step(self, log_posteriors: np.ndarray) -> np.ndarray:
        frames = np.asarray(log_posteriors)
        out = np.zeros((len(frames), len(self._keywords)), np.float32)
        ages = np.zeros(out.shape, np.int64)
        verifier = np.zeros(out.shape, np.float32)
        for t, frame in enumerate(frames):
            for j, k in enumerate(self._keywords):
                out[t, j], ages[t, j], verifier[t, j] = k.step(frame)
        self.path_frames = ages
        self.verifier = verifier
        return out


class ZeroShotBackend:
    """A Detector backend: fbank features of the front end in, keyword scores out."""

    def __init__(self, keywords: Sequence[str], frontend: str = "", voice: str = "en-us"):
        from toolkit.tasks.kws.frontend import DEFAULT_FRONTEND, PhoneFrontEnd
        self.frontend = PhoneFrontEnd(frontend or DEFAULT_FRONTEND)
        self.search = KeywordSearch.for_words(list(keywords), self.frontend.units, voice)
        self.metadata: Dict = {"task": "kws_zero_shot", "keywords": list(keywords),
                               "feature": self.frontend.fbank_metadata,
                               "frontend": {"source": self.frontend.source,
                                            "sha256": self.frontend.sha256},
                               "threshold": None}
        self.reset()

    def reset(self) -> None:
        self.cache = self.frontend.model.zero_cache(1)
        self.search.reset()
        self.path_frames = np.zeros((0, len(self.search.names)), np.int64)

    @property
    def max_keyword_frames(self) -> List[int]:
        return self.search.max_frames

    def step(self, feats: np.ndarray) -> np.ndarray:
        if len(feats) == 0:
            self.path_frames = np.zeros((0, len(self.search.names)), np.int64)
            return np.zeros((0, len(self.search.names)), np.float32)
        log_post, self.cache = self.frontend.run(feats, self.cache)
        scores = self.search.step(log_post)
        self.path_frames = self.search.path_frames
        return scores


def fusable(metadata: dict) -> bool:
    """Whether a keyword model reads phone posteriors, so the search can run beside it."""
    feature = metadata.get("feature", {})
    return feature.get("type") == "phone_frontend" and \
        (feature.get("frontend") or {}).get("output") == "posteriors"


class FusedBackend:
    """A head trained on a phone front end's posteriors and zero-shot search of its keywords
    in the same posteriors; a frame's score is the weighted geometric mean of head, search
    and the search's verifier (toolkit.tasks.kws.fusion; `fusion_weights` in the model's
    metadata, else head and search alike). The head learned the keyword from training
    voices and is confidently wrong on voices unlike them; the search knows every phone
    from the front end's many voices but forgives one missing phone; the verifier does not.
    Its threshold is `fused_threshold` in the model's metadata (stage 6 of
    egs/wake_word/s0 stores it), not the head's own. After each step `components` holds
    the (T, 3K) [head | search | verifier] scores the fusion was made of."""

    def __init__(self, head, voice: str = "en-us"):
        meta = head.metadata
        if not fusable(meta):
            feature = meta.get("feature", {})
            raise DataError(
                "fusion with zero-shot search needs a head on phone posteriors "
                "(dataset.feature.type phone_frontend, frontend_output posteriors); this model "
                f"reads {feature.get('type')!r}"
                + (f" ({feature['frontend'].get('output')})" if feature.get("frontend") else ""))
        from toolkit.tasks.kws.fusion import DEFAULT_WEIGHTS, check_weights
        self.head = head
        self.search = KeywordSearch.for_words(list(meta["keywords"]),
                                              meta["feature"]["frontend"]["units"], voice)
        self.weights = check_weights(meta.get("fusion_weights") or DEFAULT_WEIGHTS)
        self.metadata: Dict = dict(
            meta, fusion="weighted geometric mean of head, zero-shot search and its verifier",
            fusion_weights=self.weights, threshold=meta.get("fused_threshold"))
        self.reset()

    def reset(self) -> None:
        self.head.reset()
        self.search.reset()
        self.path_frames = np.zeros((0, len(self.search.names)), np.int64)
        self.components = np.zeros((0, 3 * len(self.search.names)), np.float32)

    @property
    def max_keyword_frames(self) -> List[int]:
        return self.search.max_frames

    def step(self, feats: np.ndarray) -> np.ndarray:
        from toolkit.tasks.kws.fusion import fuse, split_components
        head = self.head.step(feats)
        if len(feats) == 0:
            self.path_frames = np.zeros((0, len(self.search.names)), np.int64)
            self.components = np.zeros((0, 3 * len(self.search.names)), np.float32)
            return head
        search = self.search.step(feats)
        verifier = self.search.verifier
        self.path_frames = self.search.path_frames
        self.components = np.concatenate([head, search, verifier], axis=1).astype(np.float32)
        # Fused from the float32 components, so that fusing stored components
        # (choose_fusion --fused-output) gives these scores to the bit.
        return fuse(*split_components(self.components), self.weights)


def calibrate_threshold(scores: Sequence[np.ndarray], hours: float, fa_per_hour: float,
                        keyword: int = 0, smooth_frames: int = 1,
                        refractory_frames: int = 100) -> Optional[float]:
    """The lowest threshold at which the negatives fire at most `fa_per_hour` false alarms
    per hour, counted as deployment fires them (toolkit.tasks.kws.decision: smoothing,
    every firing under the refractory rule, however many in one clip) and as the recipe's
    DET code counts them. None without negatives or hours; above 1 when even the
    highest score fires too often."""
    from toolkit.tasks.kws.decision import detect, smooth_scores
    if not len(scores) or hours <= 0:
        return None
    columns = [np.asarray(s, np.float32)[:, keyword:keyword + 1] for s in scores if len(s)]
    allowed = int(np.floor(fa_per_hour * hours + 1e-9))

    def alarms(threshold: float) -> int:
        return sum(len(detect(c, threshold, smooth_frames=smooth_frames,
                              refractory_frames=refractory_frames)) for c in columns)

    # The count changes only at a smoothed score and never rises with the threshold (a
    # higher one fires on a subset of frames, and earliest-first firing under the
    # refractory rule picks at least as many from a superset): search the thresholds
    # just above each score.
    values = np.unique(np.concatenate([smooth_scores(c, smooth_frames)[:, 0] for c in columns]
                                      + [np.zeros(1)]))
    # Just above each score, as a float32 (what a model config stores) when one fits.
    above = values.astype(np.float32).astype(np.float64)
    above = np.where(above > values, above,
                     np.nextafter(values.astype(np.float32), np.float32(np.inf)).astype(np.float64))
    candidates = np.unique(np.concatenate([[0.0], above]))
    lo, hi = 0, len(candidates) - 1     # candidates[hi] is above every score: no alarm
    while lo < hi:
        mid = (lo + hi) // 2
        if alarms(float(candidates[mid])) <= allowed:
            hi = mid
        else:
            lo = mid + 1
    return float(candidates[lo])
