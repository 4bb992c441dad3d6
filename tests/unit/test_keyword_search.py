"""Zero-shot CTC keyword search (toolkit.tasks.kws.search) on posteriors made by hand, and
the pieces of phone recognition it shares with the phone_ctc task: greedy CTC decoding, the
edit distance behind the phone error rate, espeak-ng's variants merged into phones."""
import numpy as np
import pytest

from toolkit.nn.ctc import edit_distance, greedy_decode
from toolkit.tasks.kws.search import KeywordSearch, calibrate_threshold
from toolkit.tasks.kws.tokens import base_phone

UNITS = 7          # blank + 6 phones


def posteriors(sequence, confidence=0.9):
    """One frame per entry of `sequence` (unit ids), that unit at `confidence`."""
    lp = np.full((len(sequence), UNITS), np.log((1 - confidence) / (UNITS - 1)))
    lp[np.arange(len(sequence)), sequence] = np.log(confidence)
    return lp


KEYWORD = [1, 2, 3]                      # "p1 p2 p3"
SPOKEN = [0, 0, 1, 1, 0, 2, 2, 3, 0, 0]


def test_the_keyword_scores_its_phones_peaks_and_a_confusable_scores_lower():
    search = KeywordSearch([KEYWORD], ["kw"], max_frames=50)
    hit = search.step(posteriors(SPOKEN))[:, 0]
    assert hit.max() == pytest.approx(0.9, abs=1e-6)        # geometric mean of the peaks
    assert hit[:5].max() < 0.1                               # not before its later phones
    assert hit[5:7].max() < 0.3                              # p3 not yet heard
    search.reset()
    confusable = search.step(posteriors([0, 0, 1, 1, 0, 4, 4, 3, 0, 0]))[:, 0]   # p2 -> p4
    assert confusable.max() < 0.3
    search.reset()
    reordered = search.step(posteriors([0, 3, 3, 0, 2, 2, 1, 1, 0, 0]))[:, 0]
    assert reordered.max() < 0.3


def test_streamed_in_any_chunks_equals_whole():
    frames = posteriors(SPOKEN * 4 + [0, 5, 5, 0] * 3)
    search = KeywordSearch([KEYWORD, [4, 5]], ["a", "b"], max_frames=30)
    whole = search.step(frames)
    search.reset()
    pieces = np.concatenate([search.step(c) for c in np.array_split(frames, 9)])
    assert np.array_equal(whole, pieces)
    assert whole.shape == (len(frames), 2)


def test_phones_too_far_apart_are_no_keyword():
    spread = [0, 1, 1] + [0] * 20 + [2, 3, 0]
    search = KeywordSearch([KEYWORD], ["kw"], max_frames=15)
    assert search.step(posteriors(spread))[:, 0].max() < 0.3      # as if p1 were missing
    search = KeywordSearch([KEYWORD], ["kw"], max_frames=60)
    assert search.step(posteriors(spread))[:, 0].max() > 0.8
    # and a finished keyword stops scoring once the bound has passed
    search.reset()
    tail = search.step(posteriors(SPOKEN + [0] * 80))[:, 0]
    assert tail[-10:].max() < 0.1


def test_calibration_keeps_to_the_false_alarm_budget():
    clips = [np.array([[p]], np.float32) for p in (0.9, 0.5, 0.7, 0.2)]
    # 2 hours, 1 FA/h: two clips may fire, the third highest (0.5) may not.
    threshold = calibrate_threshold(clips, 2.0, 1.0)
    assert 0.5 < threshold <= 0.5 + 1e-6
    assert calibrate_threshold(clips, 0.5, 1.0) > 0.9
    assert calibrate_threshold(clips, 10.0, 1.0) == 0.0
    assert calibrate_threshold([], 1.0, 1.0) is None


def test_calibration_counts_every_firing_in_a_clip_and_smooths_as_detection():
    # One hour-long clip firing three times (peaks 0.9, 0.8, 0.7, 2 s apart) and a quiet one.
    loud = np.zeros((600, 1), np.float32)
    loud[[100, 300, 500], 0] = [0.9, 0.8, 0.7]
    quiet = np.full((600, 1), 0.1, np.float32)
    # 2 FA/h over 1 h: the 0.7 peak must not fire as well (one alarm per clip would allow 0.1).
    threshold = calibrate_threshold([loud, quiet], 1.0, 2.0)
    assert 0.7 < threshold <= 0.7 + 1e-6
    assert calibrate_threshold([loud, quiet], 1.0, 2.0, refractory_frames=1000) <= 0.1 + 1e-6
    # With a 10-frame mean the peaks are a tenth as high: so is the threshold.
    smoothed = calibrate_threshold([loud, quiet], 1.0, 2.0, smooth_frames=10)
    assert 0.07 < smoothed <= 0.1 + 1e-6


def test_the_path_bound_follows_the_keyword():
    from toolkit.tasks.kws.search import keyword_max_frames
    long_keyword = list(range(1, 7)) * 5               # 30 phones, 6 frames each
    frames = posteriors([0] + [p for p in long_keyword for _ in range(6)] + [0])
    search = KeywordSearch([long_keyword], ["long"])   # its own bound: 600 frames
    assert search.max_frames == [keyword_max_frames(30)] == [600]
    assert search.step(frames)[:, 0].max() > 0.8
    # The 180 frames it takes are more than a fixed 1.5 s bound allows: phones are lost.
    assert KeywordSearch([long_keyword], ["long"], max_frames=150).step(frames)[:, 0].max() < 0.6
    # The search knows where the path began: 180 frames before its last phone's end.
    search.reset()
    scores = search.step(frames)
    t = int(np.argmax(scores[:, 0]))
    assert search.path_frames[t, 0] == pytest.approx(t, abs=2)


def test_greedy_decoding_and_edit_distance():
    assert greedy_decode(posteriors([0, 1, 1, 0, 1, 2, 2, 0])) == [1, 1, 2]
    assert edit_distance([1, 2, 3], [1, 3]) == 1
    assert edit_distance([], [4, 5]) == 2
    assert edit_distance("kitten", "sitting") == 3


@pytest.mark.parametrize("raw,phone", [("t#", "t"), ("t2", "t"), ("@2", "@"), ("aI3", "aI"),
                                       ("i@3", "i@"), ("0", "0"), ("3", "3"), ("3:", "3:"),
                                       ("dZ", "dZ")])
def test_espeak_variants_merge_into_their_phone(raw, phone):
    assert base_phone(raw) == phone
