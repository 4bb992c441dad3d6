"""Wake-word decision rule shared by the streaming detector and by scoring.

Scoring (toolkit/scoring.py) replays exactly this rule, so a DET point measured
offline is what a deployed detector with the same settings does.

The rule, per utterance, on frame posteriors ``probs`` [T, K] (K keywords):

1. Smoothing (causal).  ``s[t, k]`` is the mean of ``probs[t-n+1 .. t, k]`` with
   ``n = smooth_frames``; near the utterance start only the ``t+1`` frames seen
   so far are averaged.  Sums run in float64 over a fixed window order, so a
   chunked stream reproduces the whole-utterance values bit for bit.
2. Firing.  Frame ``t`` fires when some keyword has ``s[t, k] >= threshold[k]``
   and ``t`` is not in the refractory period.  Of the keywords over their
   threshold, the one with the highest smoothed score wins (ties: lowest index).
   At most one detection per frame.
3. Refractory.  After a firing at ``t``, frames ``t+1 .. t+refractory_frames``
   cannot fire (any keyword), so the next possible firing is
   ``t + refractory_frames + 1``.  ``refractory_frames = 0`` disables it.
   Note there is no re-arming: a score that stays above threshold fires again
   once the refractory period ends.
4. Reporting.  ``end_s`` is the end of the firing frame, ``(t + 1) * shift``,
   i.e. when the decision is available.  The onset ``t0`` is the start of the
   run of frames ending at ``t`` whose smoothed score of the fired keyword stays
   ``>= onset_fraction * threshold``, limited to the last ``max_keyword_frames``
   frames (the longest plausible keyword) and to frames after the previous
   firing (detections never overlap); ``start_s = t0 * shift``.  ``score``
   is the peak smoothed score of the fired keyword over ``t0 .. t``.  Onset and
   score look only backwards, so they are streaming-safe too.

With a scalar threshold the firing frames depend only on ``max_k s[t, k]`` and
the keyword on ``argmax_k s[t, k]``; scoring relies on that (see
``frame_max_and_argmax``).
"""
from dataclasses import dataclass
from typing import List, Optional, Sequence, Union

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


def frame_max_and_argmax(smoothed: np.ndarray):
    """Per-frame best score and keyword; with a scalar threshold frame t fires
    (outside refractory) iff ``best[t] >= threshold``, keyword ``which[t]``."""
    return smoothed.max(axis=1), smoothed.argmax(axis=1)


class DecisionState:
    """Streaming detector state for one utterance / audio stream.

    Carries the smoothing history, the smoothed-score history used for onset
    estimation, the refractory state and the global frame index across
    ``step`` calls.  Feeding an utterance in chunks of any size yields exactly
    the detections of ``detect`` on the whole utterance.
    """

    def __init__(self, threshold: Threshold, smooth_frames: int = DEFAULT_SMOOTH_FRAMES,
                 refractory_frames: int = DEFAULT_REFRACTORY_FRAMES,
                 max_keyword_frames: int = DEFAULT_MAX_KEYWORD_FRAMES,
                 onset_fraction: float = DEFAULT_ONSET_FRACTION,
                 frame_shift_ms: float = DEFAULT_FRAME_SHIFT_MS,
                 num_keywords: Optional[int] = None):
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
        self.reset()

    def reset(self) -> None:
        """Start a new stream (utterance)."""
        self.frame_index = 0  # global index of the next frame
        self.next_allowed = 0  # first frame allowed to fire (refractory state)
        self.last_fire = -1  # frame of the previous detection (bounds the onset)
        self._raw_hist: Optional[np.ndarray] = None  # last smooth_frames-1 raw frames
        self._smooth_hist: Optional[np.ndarray] = None  # last max_keyword_frames-1 smoothed

    def _init_shapes(self, k: int) -> None:
        if self.num_keywords is None:
            self.num_keywords = k
        if self.threshold.size not in (1, self.num_keywords):
            raise ValueError(f"got {self.threshold.size} thresholds for {self.num_keywords} keywords")
        # Before the utterance start the window is zero-padded (and the mean
        # divides by the frames seen), matching smooth_scores().
        self._raw_hist = np.zeros((self.smooth_frames - 1, self.num_keywords), dtype=np.float64)
        self._smooth_hist = np.zeros((0, self.num_keywords), dtype=np.float64)
        self._thr = np.broadcast_to(self.threshold, (self.num_keywords,)).copy()

    def _time(self, frame: int) -> float:
        return frame * self.frame_shift_ms / 1000.0

    def step(self, probs_chunk: np.ndarray) -> List[Detection]:
        """Consume frames [t, K]; return the detections that fire within them."""
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

        over = smoothed >= self._thr
        cands = np.flatnonzero(over.any(axis=1))  # local frames over some threshold
        detections: List[Detection] = []
        pos = int(np.searchsorted(cands, self.next_allowed - g0))
        while pos < cands.size:
            i = int(cands[pos])
            frame = g0 + i
            k = int(np.argmax(np.where(over[i], smoothed[i], -np.inf)))
            lo = max(0, frame - self.max_keyword_frames + 1, self.last_fire + 1)
            col = hist[lo - hist_g0:frame - hist_g0 + 1, k]
            below = np.flatnonzero(col < self.onset_fraction * self._thr[k])
            onset = lo + (int(below[-1]) + 1 if below.size else 0)
            peak = float(col[onset - lo:].max())
            detections.append(Detection(keyword=k, start_s=self._time(onset),
                                        end_s=self._time(frame + 1), score=peak))
            self.last_fire = frame
            self.next_allowed = frame + self.refractory_frames + 1
            pos = int(np.searchsorted(cands, self.next_allowed - g0))

        self.frame_index = g0 + t
        if self.smooth_frames > 1:
            self._raw_hist = buf[buf.shape[0] - (self.smooth_frames - 1):].copy()
        keep = self.max_keyword_frames - 1
        self._smooth_hist = hist[max(0, hist.shape[0] - keep):].copy() if keep else hist[:0].copy()
        return detections


def detect(probs: np.ndarray, threshold: Threshold,
           smooth_frames: int = DEFAULT_SMOOTH_FRAMES,
           refractory_frames: int = DEFAULT_REFRACTORY_FRAMES,
           max_keyword_frames: int = DEFAULT_MAX_KEYWORD_FRAMES,
           onset_fraction: float = DEFAULT_ONSET_FRACTION,
           frame_shift_ms: float = DEFAULT_FRAME_SHIFT_MS) -> List[Detection]:
    """Whole-utterance detections of the rule above (probs [T, K])."""
    # One code path with the streaming detector, so the two cannot drift apart.
    state = DecisionState(threshold, smooth_frames=smooth_frames,
                          refractory_frames=refractory_frames,
                          max_keyword_frames=max_keyword_frames,
                          onset_fraction=onset_fraction, frame_shift_ms=frame_shift_ms)
    return state.step(probs)
