"""Wake-word decision rule shared by the streaming detector and by scoring.

Scoring (toolkit.tasks.kws.det) replays this rule, so a DET point measured offline is what
a deployed detector with the same settings does.

The rule, per utterance, on frame posteriors ``probs`` [T, K] (K keywords):

1. Smoothing (causal).  ``s[t, k]`` is the mean of ``probs[t-n+1 .. t, k]`` with
   ``n = smooth_frames``; near the utterance start only the ``t+1`` frames seen
   so far are averaged.  Sums run in float64 over a fixed window order, so a
   chunked stream reproduces the whole-utterance values bit for bit.
2. Firing, per keyword.  Keyword k fires at frame ``t`` when ``s[t, k] >=
   threshold[k]`` and ``t`` is outside k's own refractory period.  Keywords decide
   independently: "hey jarvis" is not silenced because "alexa" fired a moment before.
3. Refractory.  After k fires at ``t``, frames ``t+1 .. t+refractory_frames`` cannot
   fire k, so its next possible firing is ``t + refractory_frames + 1``
   (``refractory_frames = 0`` disables it).  There is no re-arming: a score that stays
   above threshold fires again once the period ends.
4. Reporting.  ``end_s`` is the end of the firing frame, ``(t + 1) * shift``, i.e. when
   the decision is available.  The onset ``t0``: where the scorer knows where its
   keyword began (a search path, ``path_frames``), that start; otherwise the start of
   the run of frames ending at ``t`` whose smoothed score stays ``>= onset_fraction *
   threshold``, limited to the last ``max_keyword_frames`` frames.  Either way it lies
   after k's previous firing (k's detections never overlap); ``start_s = t0 * shift``.
   ``score`` is the peak smoothed score over ``t0 .. t`` (the last
   ``max_keyword_frames`` of them).  Onset and score look only backwards.
5. Nested keywords.  When keyword k's words lie inside keyword j's ("hey" in "hey
   jarvis", ``nested`` pairs (k, j)), a detection of k that overlaps one of j is dropped:
   the longer keyword wins.  To know, k's detection is held until j could no longer
   begin before k's end (``hold_frames`` after it), or until ``flush()`` at the end of
   a stream.  Keywords that nest in no other are reported at once.

Scoring replays rules 1-4 (``det``); rule 5 applies to keyword sets that nest, which
the recipes' models do not have.
"""
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple, Union

import numpy as np

# Defaults shared by the streaming detector, scoring and the CLIs.
DEFAULT_FRAME_SHIFT_MS = 10.0
DEFAULT_SMOOTH_FRAMES = 1
DEFAULT_REFRACTORY_FRAMES = 100  # 1 s at 10 ms
DEFAULT_MAX_KEYWORD_FRAMES = 200  # 2 s: onset search window
DEFAULT_ONSET_FRACTION = 0.5

Threshold = Union[float, Sequence[float], np.ndarray]


@dataclass(frozen=True)
class Detection:
    keyword: int  # keyword index (line index in keywords.txt)
    start_s: float  # estimated onset, seconds from utterance start
    end_s: float  # end of the firing frame, seconds from utterance start
    score: float  # peak smoothed score over [start, end]


def _check_probs(probs: np.ndarray, num_keywords: Optional[int] = None) -> np.ndarray:
    probs = np.asarray(probs)
    if probs.ndim != 2:
        raise ValueError(f"posteriors must be a [T, K] matrix, got shape {probs.shape}")
    if num_keywords is not None and probs.shape[1] != num_keywords:
        raise ValueError(f"posteriors have {probs.shape[1]} columns, expected {num_keywords} keywords")
    return probs


def _window_mean(buf: np.ndarray, first_frame: int, smooth_frames: int) -> np.ndarray:
    """Causal means for the last ``len(buf) - smooth_frames + 1`` rows of ``buf``.

    ``buf`` holds ``smooth_frames - 1`` rows of history (zeros before the
    utterance start) followed by the new frames; ``first_frame`` is the global
    index of the first new frame.  Streaming and whole-utterance calls both go
    through here with identical window contents and summation order, which is
    what makes them agree exactly.
    """
    n = smooth_frames
    t = buf.shape[0] - n + 1
    acc = buf[0:t].copy()
    for j in range(1, n):
        acc += buf[j:j + t]
    counts = np.minimum(np.arange(first_frame, first_frame + t) + 1, n).astype(np.float64)
    return acc / counts[:, None]


def smooth_scores(probs: np.ndarray, smooth_frames: int = DEFAULT_SMOOTH_FRAMES) -> np.ndarray:
    """Whole-utterance causal smoothing, float64 [T, K] (rule step 1)."""
    if smooth_frames < 1:
        raise ValueError(f"smooth_frames must be >= 1, got {smooth_frames}")
    x = _check_probs(probs).astype(np.float64)
    pad = np.zeros((smooth_frames - 1, x.shape[1]), dtype=np.float64)
    return _window_mean(np.concatenate([pad, x]), 0, smooth_frames)


def nested_pairs(keywords: Sequence[str]) -> List[Tuple[int, int]]:
    """(k, j) for every keyword k whose words are a contiguous run of keyword j's words
    ("hey" and "jarvis" in "hey jarvis"; "hey" is not in "heyday")."""
    words = [k.lower().split() for k in keywords]
    pairs = []
    for k, short in enumerate(words):
        for j, long in enumerate(words):
            if j != k and 0 < len(short) < len(long) and any(
                    long[i:i + len(short)] == short for i in range(len(long) - len(short) + 1)):
                pairs.append((k, j))
    return pairs


@dataclass
class _Held:
    detection: Detection
    onset: int      # frames, inclusive
    frame: int      # the firing frame
    release: int    # emitted once the stream has passed this frame


class DecisionState:
    """Streaming detector state for one utterance / audio stream.

    Carries the smoothing history, the smoothed-score history used for onset estimation,
    each keyword's refractory state, the held detections of nested keywords and the
    global frame index across ``step`` calls. Feeding an utterance in chunks of any size
    (then ``flush()``) yields exactly the detections of ``detect`` on the whole utterance.
    """

    def __init__(self, threshold: Threshold, smooth_frames: int = DEFAULT_SMOOTH_FRAMES,
                 refractory_frames: int = DEFAULT_REFRACTORY_FRAMES,
                 max_keyword_frames: int = DEFAULT_MAX_KEYWORD_FRAMES,
                 onset_fraction: float = DEFAULT_ONSET_FRACTION,
                 frame_shift_ms: float = DEFAULT_FRAME_SHIFT_MS,
                 num_keywords: Optional[int] = None,
                 nested: Sequence[Tuple[int, int]] = (),
                 hold_frames: Optional[int] = None):
        if smooth_frames < 1:
            raise ValueError(f"smooth_frames must be >= 1, got {smooth_frames}")
        if refractory_frames < 0:
            raise ValueError(f"refractory_frames must be >= 0, got {refractory_frames}")
        if max_keyword_frames < 1:
            raise ValueError(f"max_keyword_frames must be >= 1, got {max_keyword_frames}")
        if not 0.0 <= onset_fraction <= 1.0:
            raise ValueError(f"onset_fraction must be in [0, 1], got {onset_fraction}")
        if frame_shift_ms <= 0:
            raise ValueError(f"frame_shift_ms must be > 0, got {frame_shift_ms}")
        self.threshold = np.atleast_1d(np.asarray(threshold, dtype=np.float64))
        if self.threshold.ndim != 1:
            raise ValueError("threshold must be a scalar or one value per keyword")
        self.smooth_frames = int(smooth_frames)
        self.refractory_frames = int(refractory_frames)
        self.max_keyword_frames = int(max_keyword_frames)
        self.onset_fraction = float(onset_fraction)
        self.frame_shift_ms = float(frame_shift_ms)
        self.num_keywords = num_keywords
        self.nested = [(int(k), int(j)) for k, j in nested]
        self.hold_frames = int(self.max_keyword_frames if hold_frames is None else hold_frames)
        self.reset()

    def reset(self) -> None:
        """Start a new stream (utterance)."""
        self.frame_index = 0  # global index of the next frame
        self._next_allowed: Optional[np.ndarray] = None  # per keyword (refractory state)
        self._last_fire: Optional[np.ndarray] = None  # per keyword (bounds the onset)
        self._raw_hist: Optional[np.ndarray] = None  # last smooth_frames-1 raw frames
        self._smooth_hist: Optional[np.ndarray] = None  # last max_keyword_frames-1 smoothed
        self._held: List[_Held] = []
        self._recent: dict = {}  # keyword -> (onset, frame) of its last detection

    def _init_shapes(self, k: int) -> None:
        if self.num_keywords is None:
            self.num_keywords = k
        if self.threshold.size not in (1, self.num_keywords):
            raise ValueError(f"got {self.threshold.size} thresholds for {self.num_keywords} keywords")
        for pair in self.nested:
            if not all(0 <= i < self.num_keywords for i in pair):
                raise ValueError(f"nested pair {pair} names a keyword outside 0..{self.num_keywords - 1}")
        # Before the utterance start the window is zero-padded (and the mean
        # divides by the frames seen), matching smooth_scores().
        self._raw_hist = np.zeros((self.smooth_frames - 1, self.num_keywords), dtype=np.float64)
        self._smooth_hist = np.zeros((0, self.num_keywords), dtype=np.float64)
        self._thr = np.broadcast_to(self.threshold, (self.num_keywords,)).copy()
        self._next_allowed = np.zeros(self.num_keywords, dtype=np.int64)
        self._last_fire = np.full(self.num_keywords, -1, dtype=np.int64)

    def _time(self, frame: int) -> float:
        return frame * self.frame_shift_ms / 1000.0

    def step(self, probs_chunk: np.ndarray,
             path_frames: Optional[np.ndarray] = None) -> List[Detection]:
        """Consume frames [t, K] (and, from a search, [t, K] frames since each keyword's
        best path began); return the detections decided within them."""
        if self._raw_hist is None:
            self._init_shapes(_check_probs(probs_chunk).shape[1])
        x = _check_probs(probs_chunk, self.num_keywords).astype(np.float64)
        t = x.shape[0]
        if t == 0:
            return []
        g0 = self.frame_index
        buf = np.concatenate([self._raw_hist, x])
        smoothed = _window_mean(buf, g0, self.smooth_frames)
        # History + new rows so the onset search can look back across chunks.
        hist = np.concatenate([self._smooth_hist, smoothed])
        hist_g0 = g0 - self._smooth_hist.shape[0]  # global frame of hist[0]

        fired: List[_Held] = []
        over = smoothed >= self._thr
        for k in range(self.num_keywords):
            cands = np.flatnonzero(over[:, k])
            pos = int(np.searchsorted(cands, self._next_allowed[k] - g0))
            while pos < cands.size:
                i = int(cands[pos])
                frame = g0 + i
                lo = max(0, frame - self.max_keyword_frames + 1, int(self._last_fire[k]) + 1)
                col = hist[lo - hist_g0:frame - hist_g0 + 1, k]
                if path_frames is not None:
                    onset = max(frame - int(path_frames[i, k]) + 1, int(self._last_fire[k]) + 1, 0)
                else:
                    below = np.flatnonzero(col < self.onset_fraction * self._thr[k])
                    onset = lo + (int(below[-1]) + 1 if below.size else 0)
                peak = float(col[max(onset, lo) - lo:].max())
                fired.append(_Held(Detection(keyword=k, start_s=self._time(onset),
                                             end_s=self._time(frame + 1), score=peak),
                                   onset, frame, frame + self.hold_frames))
                self._last_fire[k] = frame
                self._next_allowed[k] = frame + self.refractory_frames + 1
                pos = int(np.searchsorted(cands, self._next_allowed[k] - g0))

        self.frame_index = g0 + t
        if self.smooth_frames > 1:
            self._raw_hist = buf[buf.shape[0] - (self.smooth_frames - 1):].copy()
        keep = self.max_keyword_frames - 1
        self._smooth_hist = hist[max(0, hist.shape[0] - keep):].copy() if keep else hist[:0].copy()
        fired.sort(key=lambda h: (h.frame, h.detection.keyword))
        if not self.nested:
            return [h.detection for h in fired]
        return self._resolve_nested(fired, self.frame_index - 1)

    def _resolve_nested(self, fired: List[_Held], now: int) -> List[Detection]:
        """Rule 5: a nested keyword's detection overlapping its container's is dropped;
        otherwise it is released once its container can no longer overlap it."""
        out: List[Detection] = []
        inner = {k for k, _ in self.nested}
        # The container of a frame first, so its inner keywords see it.
        for h in sorted(fired, key=lambda h: (h.frame, h.detection.keyword not in
                                              {j for _, j in self.nested})):
            k = h.detection.keyword
            containers = [j for kk, j in self.nested if kk == k]
            if any(self._overlaps(h, self._recent.get(j)) for j in containers):
                continue
            self._recent[k] = (h.onset, h.frame)
            inners = [kk for kk, j in self.nested if j == k]
            self._held = [c for c in self._held
                          if not (c.detection.keyword in inners and h.onset <= c.frame)]
            if k in inner:
                self._held.append(h)
            else:
                out.append(h.detection)
        ready = [c for c in self._held if c.release <= now]
        self._held = [c for c in self._held if c.release > now]
        return sorted(out + [c.detection for c in ready], key=lambda d: (d.end_s, d.keyword))

    @staticmethod
    def _overlaps(h: _Held, other) -> bool:
        return other is not None and h.onset <= other[1] and other[0] <= h.frame

    def flush(self) -> List[Detection]:
        """The end of the stream: the held detections of nested keywords, in time order."""
        held, self._held = self._held, []
        return sorted((c.detection for c in held), key=lambda d: (d.end_s, d.keyword))


def detect(probs: np.ndarray, threshold: Threshold,
           smooth_frames: int = DEFAULT_SMOOTH_FRAMES,
           refractory_frames: int = DEFAULT_REFRACTORY_FRAMES,
           max_keyword_frames: int = DEFAULT_MAX_KEYWORD_FRAMES,
           onset_fraction: float = DEFAULT_ONSET_FRACTION,
           frame_shift_ms: float = DEFAULT_FRAME_SHIFT_MS,
           nested: Sequence[Tuple[int, int]] = (),
           path_frames: Optional[np.ndarray] = None) -> List[Detection]:
    """Whole-utterance detections of the rule above (probs [T, K])."""
    # One code path with the streaming detector, so the two cannot drift apart.
    state = DecisionState(threshold, smooth_frames=smooth_frames,
                          refractory_frames=refractory_frames,
                          max_keyword_frames=max_keyword_frames,
                          onset_fraction=onset_fraction, frame_shift_ms=frame_shift_ms,
                          nested=nested)
    return state.step(probs, path_frames) + state.flush()
