"""Decision rule (streaming == whole utterance) and DET scoring, by hand-made cases."""
import json
import logging
import os
import subprocess
import sys

import kaldiio
import numpy as np
import pytest

from toolkit.bin import score_kws
from toolkit.tasks.kws import scoring
from toolkit.tasks.kws.decision import (Detection, DecisionState, detect, nested_pairs,
                                        smooth_scores)
from toolkit.tasks.kws.det import (all_firings, bootstrap_frr_intervals, compute_det,
                                   operating_point, threshold_grid)

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def col(values, T=None):
    """[T, 1] float32 posteriors from a list (zero-padded to T)."""
    x = np.zeros((T or len(values), 1), dtype=np.float32)
    x[:len(values), 0] = values
    return x


def spikes(T, peaks, K=1, kw=0):
    """Zero posteriors with single-frame peaks {frame: value} on keyword kw."""
    x = np.zeros((T, K), dtype=np.float32)
    for t, v in peaks.items():
        x[t, kw] = v
    return x


# ----------------------------------------------------------------------------- decision rule

def test_threshold_crossing_and_refractory():
    x = col([0.1, 0.2, 0.6, 0.7, 0.8, 0.9, 0.4, 0.6, 0.1])
    dets = detect(x, 0.5, refractory_frames=3)
    # Fires at 2; 3..5 are refractory even though over threshold; 6 is below;
    # 7 fires again (no re-arming needed).  Onset: run >= 0.25 after the
    # previous firing; score: peak over the onset run.
    assert dets == [
        Detection(keyword=0, start_s=0.02, end_s=0.03, score=pytest.approx(0.6)),
        Detection(keyword=0, start_s=0.03, end_s=0.08, score=pytest.approx(0.9)),
    ]
    assert [d.end_s for d in detect(x, 0.5, refractory_frames=0)] == \
        pytest.approx([0.03, 0.04, 0.05, 0.06, 0.08])
    assert [d.end_s for d in detect(x, 0.5, refractory_frames=100)] == pytest.approx([0.03])
    assert detect(x, 0.95) == []
    # Threshold is inclusive (score >= threshold).
    assert len(detect(col([0.0, 0.5]), 0.5)) == 1


def test_onset_limited_by_max_keyword_frames_and_frame_shift():
    x = col([0.3] * 10 + [0.9])
    (d,) = detect(x, 0.5, max_keyword_frames=4, frame_shift_ms=20)
    assert (d.start_s, d.end_s) == pytest.approx((7 * 0.02, 11 * 0.02))
    (d,) = detect(x, 0.5, max_keyword_frames=100, onset_fraction=0.8)
    assert d.start_s == pytest.approx(0.10)  # 0.3 < 0.4: onset at the 0.9 frame


def test_smoothing_is_causal_and_averages_seen_frames():
    x = col([0.0, 0.0, 0.9, 0.9, 0.0, 0.0])
    np.testing.assert_allclose(smooth_scores(x, 3)[:, 0], [0, 0, 0.3, 0.6, 0.6, 0.3], atol=1e-6)
    (d,) = detect(x, 0.5, smooth_frames=3)
    assert d.end_s == pytest.approx(0.04)  # smoothed crosses at frame 3, not 2
    # At the start the mean is over the frames seen so far, not zero-diluted.
    np.testing.assert_allclose(smooth_scores(col([0.9, 0.3]), 3)[:, 0], [0.9, 0.6], atol=1e-6)
    assert detect(col([0.9, 0.3]), 0.5, smooth_frames=3)[0].end_s == pytest.approx(0.01)
    assert detect(x, 0.7, smooth_frames=3) == []


def test_each_keyword_decides_under_its_own_refractory_period():
    x = np.zeros((30, 2), dtype=np.float32)
    x[5] = [0.6, 0.7]  # both over: both fire
    x[10, 0] = 0.9  # within keyword 0's own refractory period: suppressed
    x[10, 1] = 0.0
    x[20, 0] = 0.9
    dets = detect(x, 0.5, refractory_frames=10)
    assert [(d.keyword, round(d.end_s, 3)) for d in dets] == [(0, 0.06), (1, 0.06), (0, 0.21)]
    # Per-keyword thresholds: keyword 1 needs 0.8, so only keyword 0 fires at frame 5.
    dets = detect(x, [0.5, 0.8], refractory_frames=10)
    assert [(d.keyword, round(d.end_s, 3)) for d in dets] == [(0, 0.06), (0, 0.21)]


def test_nested_keywords_the_longer_wins_and_the_shorter_alone_is_kept():
    """Keyword 0 "hey" lies inside keyword 1 "hey jarvis" (nested_pairs)."""
    assert nested_pairs(["hey", "hey jarvis", "jarvis", "heyday"]) == [(0, 1), (2, 1)]
    x = np.zeros((120, 2), dtype=np.float32)
    x[10:13, 0] = 0.9          # "hey" at frames 10-12 ...
    x[30:33, 1] = 0.9          # ... then "hey jarvis", whose path began at frame 8
    path = np.zeros((120, 2), dtype=np.int64)
    path[:, 1] = np.arange(120) - 8 + 1
    path[:, 0] = 3
    kw = dict(refractory_frames=50, max_keyword_frames=40, nested=[(0, 1)])
    (d,) = detect(x, 0.5, path_frames=path, **kw)
    assert (d.keyword, d.start_s, d.end_s) == (1, pytest.approx(0.08), pytest.approx(0.31))
    # Streamed: the held "hey" is dropped when "hey jarvis" arrives, in any chunking.
    for chunk in (1, 7, 120):
        state = DecisionState(0.5, hold_frames=40, **kw)
        got = []
        for i in range(0, 120, chunk):
            got += state.step(x[i:i + chunk], path[i:i + chunk])
        assert got + state.flush() == [d]
    # "hey" alone: reported once "hey jarvis" could no longer overlap it (40 frames on).
    alone = x.copy()
    alone[:, 1] = 0.0
    state = DecisionState(0.5, hold_frames=40, **kw)
    assert state.step(alone[:50], path[:50]) == []
    (late,) = state.step(alone[50:60], path[50:60])
    assert (late.keyword, late.end_s) == (0, pytest.approx(0.11))
    assert detect(alone, 0.5, path_frames=path, **kw) == [late]
    # ... and at the end of a stream, flush() gives it at once.
    state = DecisionState(0.5, hold_frames=40, **kw)
    assert state.step(alone[:20], path[:20]) == [] and state.flush() == [late]


def test_a_search_path_gives_the_onset():
    x = col([0.0] * 30 + [0.9])
    path = np.full((31, 1), 25, dtype=np.int64)       # the path began 25 frames back
    (d,) = detect(x, 0.5, path_frames=path)
    assert (d.start_s, d.end_s) == pytest.approx((0.06, 0.31))
    (d,) = detect(x, 0.5)                               # by the score alone: the last frame
    assert d.start_s == pytest.approx(0.30)


@pytest.mark.parametrize("smooth,refractory,max_kw", [(1, 0, 1), (4, 7, 12), (9, 3, 30)])
def test_streaming_equals_whole_for_every_chunk_size(smooth, refractory, max_kw):
    rng = np.random.default_rng(smooth)
    T = 70
    x = (rng.random((T, 3)) ** 3).astype(np.float32)  # sparse high values
    kw = dict(smooth_frames=smooth, refractory_frames=refractory, max_keyword_frames=max_kw)
    whole = detect(x, 0.4, **kw)
    assert len(whole) >= 3  # the case must exercise firing and refractory
    for chunk in range(1, T + 1):
        state = DecisionState(0.4, **kw)
        got = []
        for i in range(0, T, chunk):
            got += state.step(x[i:i + chunk])
        assert got == whole, f"chunk size {chunk}"
    # Irregular chunks (including empty ones) and reuse after reset().
    state.reset()
    cuts = np.sort(rng.integers(0, T, size=15))
    got = []
    for a, b in zip(np.r_[0, cuts], np.r_[cuts, T]):
        got += state.step(x[a:b])
    assert got == whole


# ----------------------------------------------------------------------------- DET

# Single keyword.  Positives (label 0, 1 s each) peak at 0.9, 0.8, 0.3, 0.1.
# Negatives: 1 h in total; N1 peaks at 0.25; N2 peaks at 0.75 (frame 10),
# 0.625 (frame 20, inside a 20-frame refractory period) and 0.375 (frame 50).
# Dyadic negative peaks are exact in float32, so the boundaries are crisp.
POS_PEAKS = [0.9, 0.8, 0.3, 0.1]


def hand_made():
    probs = [spikes(100, {50: p}) for p in POS_PEAKS]
    probs += [spikes(100, {30: 0.25}), spikes(100, {10: 0.75, 20: 0.625, 50: 0.375})]
    labels = [0, 0, 0, 0, -1, -1]
    durations = [1.0] * 4 + [1800.0, 1800.0]
    return probs, labels, durations


def at(det, thr):
    g = int(np.argmin(np.abs(det.thresholds - thr)))
    assert det.thresholds[g] == pytest.approx(thr)
    return float(det.frr[g, 0]), float(det.fa_per_hour[g, 0])


def test_det_hand_made_frr_fa_and_refractory():
    det = compute_det(*hand_made(), num_keywords=1, thresholds=threshold_grid(),
                              refractory_frames=20)
    assert det.num_positives.tolist() == [4]
    assert det.negative_hours[0] == pytest.approx(1.0)
    expected = {  # threshold: (FRR, FA/h)
        0.05: (0.0, 3), 0.2: (0.25, 3), 0.3: (0.25, 2), 0.35: (0.5, 2),
        0.5: (0.5, 1), 0.6: (0.5, 1),  # 0.625 peak suppressed by refractory
        0.7: (0.5, 1), 0.76: (0.5, 0), 0.85: (0.75, 0), 0.95: (1.0, 0), 1.0: (1.0, 0),
    }
    for thr, (frr, fa) in expected.items():
        assert at(det, thr) == pytest.approx((frr, fa)), thr
    # Without the refractory period the 0.625 peak counts too.
    det5 = compute_det(*hand_made(), num_keywords=1, refractory_frames=5)
    assert at(det5, 0.6) == pytest.approx((0.5, 2))
    # Threshold 0: zero scores count too, every refractory_frames + 1 frames.
    assert det.fa_count[0, 0] == 2 * 5  # two 100-frame negatives, firings at 0,21,42,63,84


def test_operating_points_and_target_threshold():
    det = compute_det(*hand_made(), num_keywords=1, refractory_frames=20)
    fa, frr = det.fa_per_hour[:, 0], det.frr[:, 0]
    got = {t: operating_point(det.thresholds, fa, frr, t) for t in (0.5, 1, 2, 3)}
    assert (got[0.5].threshold, got[0.5].frr, got[0.5].fa_per_hour) == pytest.approx((0.751, 0.5, 0))
    assert (got[1].threshold, got[1].frr, got[1].fa_per_hour) == pytest.approx((0.376, 0.5, 1))
    assert (got[2].threshold, got[2].frr, got[2].fa_per_hour) == pytest.approx((0.251, 0.25, 2))
    # 3 FA/h admits every threshold but 0 (zero scores fire there): FRR 0 from 0.001.
    assert (got[3].threshold, got[3].frr, got[3].fa_per_hour) == pytest.approx((0.001, 0.0, 3))
    assert operating_point(det.thresholds, fa, frr, 0.0).threshold == pytest.approx(0.751)
    none = operating_point(det.thresholds, np.full_like(fa, 5.0), frr, 1.0)
    assert none.threshold is None and none.frr is None


def test_det_multi_keyword_attribution():
    # Labelled 0: keyword 1 peaks 0.6 at frame 10 and keyword 0 0.8 at 15.
    x = np.zeros((100, 2), dtype=np.float32)
    x[10, 1], x[15, 0] = 0.6, 0.8
    det = compute_det([x], [0], [3600.0], num_keywords=2, refractory_frames=20)
    g5, g7 = 500, 700
    assert det.thresholds[g5] == 0.5 and det.thresholds[g7] == 0.7
    # At 0.5 keyword 1 fires (a false alarm for it) and keyword 0, deciding for itself,
    # fires too: a hit. At 0.7 only keyword 0 fires.
    assert det.miss_count[g5].tolist() == [0, 0] and det.fa_count[g5].tolist() == [0, 1]
    assert det.miss_count[g7].tolist() == [0, 0] and det.fa_count[g7].tolist() == [0, 0]
    assert np.isnan(det.frr[g5, 1])  # no positives for keyword 1


def test_det_matches_decision_rule_at_every_threshold():
    """Scoring replays deployment: brute force with detect() at each grid value."""
    rng = np.random.default_rng(7)
    K, probs, labels, durations = 2, [], [], []
    for i in range(24):
        T = int(rng.integers(20, 60))
        probs.append((rng.random((T, K)) ** 4).astype(np.float32))
        labels.append(int(rng.integers(-1, K)))
        durations.append(T / 100)
    thresholds = threshold_grid(0.02)
    for smooth, refractory in [(1, 0), (3, 6), (5, 25)]:
        det = compute_det(probs, labels, durations, K, thresholds, smooth, refractory)
        for g, thr in enumerate(thresholds):
            fa, miss = np.zeros(K, int), np.zeros(K, int)
            for x, label in zip(probs, labels):
                fired = [d.keyword for d in detect(x, thr, smooth_frames=smooth,
                                                   refractory_frames=refractory)]
                for k in fired:
                    fa[k] += k != label
                if label >= 0 and label not in fired:
                    miss[label] += 1
            assert det.fa_count[g].tolist() == fa.tolist(), (smooth, refractory, thr)
            assert det.miss_count[g].tolist() == miss.tolist(), (smooth, refractory, thr)
        # One keyword at a time: firing count never rises with the threshold
        # (greedy earliest-first selection is maximal for a superset).
        single = compute_det([p[:, :1] for p in probs], [-1] * len(probs), durations,
                                     1, thresholds, smooth, refractory)
        assert np.all(np.diff(single.fa_count[:, 0]) <= 0)


# ----------------------------------------------------------------------------- files and CLI

def write_inputs(tmp, probs, labels, durations, keywords=("hey snips",), scp=False,
                 speakers=None, texts=None):
    keys = [f"utt{i:03d}" for i in range(len(probs))]
    ark = str(tmp / "probs.ark")
    kaldiio.save_ark(ark, dict(zip(keys, probs)), scp=str(tmp / "probs.scp") if scp else None)
    with open(tmp / "data.list", "w") as f:
        for i, (k, lab, dur) in enumerate(zip(keys, labels, durations)):
            entry = {"key": k, "duration": dur, "label": lab, "wav": f"/x/{k}.wav"}
            if speakers:
                entry["spk"] = speakers[i]
            if texts:
                entry["txt"] = texts[i]
            f.write(json.dumps(entry) + "\n")
    (tmp / "keywords.txt").write_text("\n".join(keywords) + "\n")
    return str(tmp / "data.list"), ark, str(tmp / "keywords.txt")


EXPECTED_SUMMARY = ("hey_snips: FRR 50.00% @0.5 FA/h (thr 0.751), 50.00% @1 FA/h (thr 0.376), "
                    "25.00% @2 FA/h (thr 0.251); 4 positives, 1.00 h negatives")


def test_cli_end_to_end(tmp_path):
    data, ark, kws = write_inputs(tmp_path, *hand_made())
    out = tmp_path / "score"
    proc = subprocess.run(
        [sys.executable, "-m", "toolkit.bin.score_kws", "--data-list", data, "--posteriors", ark,
         "--inventory", kws, "--out-dir", str(out), "--refractory-s", "0.2", "--bootstrap", "0"],
        cwd=REPO, capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", "")})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == EXPECTED_SUMMARY
    assert (out / "summary.txt").read_text().strip() == EXPECTED_SUMMARY

    rows = (out / "det_hey_snips.txt").read_text().splitlines()
    assert rows[0].startswith("#") and rows[0].split()[1:] == ["threshold", "fa_per_hour", "frr"]
    table = np.loadtxt(out / "det_hey_snips.txt")
    assert table.shape == (1001 + 36, 3)     # 0.000..1.000 plus 4 decades of tail below 1
    assert table[600].tolist() == pytest.approx([0.6, 1.0, 0.5])
    assert rows[1001].split()[0] == "0.9991" and rows[-2].split()[0] == "0.9999999"

    doc = json.loads((out / "det.json").read_text())
    curve = doc["curves"]["hey snips"]
    assert len(doc["thresholds"]) == len(curve["frr"]) == len(curve["fa_per_hour"]) == 1037
    assert curve["selected"]["threshold"] == pytest.approx(0.376)
    assert doc["config"]["refractory_frames"] == 20 and doc["missing_keys"] == 0

    png = (out / "det.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000


# Speakers and texts of hand_made(): speaker a says three of the positives and the
# negative that fires, speaker b the weakest positive and the quiet negative.
HAND_SPEAKERS = ["a", "a", "a", "b", "b", "a"]
HAND_TEXTS = ["hey snips"] * 4 + ["hello there", "hey snoops"]


def test_error_report_lists_false_alarms_misses_and_speakers():
    """At 1 FA/h (threshold 0.376, refractory 20 frames) utt005 fires once, at frame 10
    (0.75; its 0.625 falls in the refractory period, its 0.375 under the threshold), and
    the positives peaking at 0.3 and 0.1 are missed."""
    probs, labels, durations = hand_made()
    utts = [scoring.Utterance(f"utt{i:03d}", d, lab, spk, txt) for i, (d, lab, spk, txt) in
            enumerate(zip(durations, labels, HAND_SPEAKERS, HAND_TEXTS))]
    thresholds = threshold_grid()
    firings = all_firings(probs, 1, thresholds, refractory_frames=20)
    rep = scoring.error_report(utts, probs, firings, 0, "hey snips", thresholds,
                               float(thresholds[376]), 1.0, 1.0)
    assert rep.false_alarms == [{"key": "utt005", "speaker": "a", "label": -1,
                                 "text": "hey snoops", "time_s": pytest.approx(0.10),
                                 "peak": pytest.approx(0.75)}]
    assert [(m["key"], m["speaker"]) for m in rep.misses] == [("utt003", "b"), ("utt002", "a")]
    assert [m["peak"] for m in rep.misses] == pytest.approx([0.1, 0.3])
    assert rep.speakers == [
        {"speaker": "b", "positives": 1, "missed": 1, "frr": 1.0, "false_alarms": 0},
        {"speaker": "a", "positives": 3, "missed": 1, "frr": pytest.approx(1 / 3),
         "false_alarms": 1}]
    # Counts agree with the DET curve at that threshold.
    det = compute_det(probs, labels, durations, 1, thresholds, firings=firings)
    assert len(rep.false_alarms) == det.fa_count[376, 0]
    assert len(rep.misses) == det.miss_count[376, 0]

    # Below 0.25 the first negative fires too, and every positive but the weakest is hit.
    rep = scoring.error_report(utts, probs, firings, 0, "hey snips", thresholds,
                               float(thresholds[200]), 5.0, 1.0)
    assert [(e["key"], e["time_s"]) for e in rep.false_alarms] == [
        ("utt005", pytest.approx(0.10)), ("utt005", pytest.approx(0.50)),
        ("utt004", pytest.approx(0.30))]
    assert [m["key"] for m in rep.misses] == ["utt003"]
    with pytest.raises(ValueError, match="not on the scoring grid"):
        scoring.error_report(utts, probs, firings, 0, "hey snips", thresholds, 0.3765, 1.0, 1.0)


def test_cli_writes_the_error_report(tmp_path):
    data, ark, kws = write_inputs(tmp_path, *hand_made(), speakers=HAND_SPEAKERS,
                                  texts=HAND_TEXTS)
    out = tmp_path / "score"
    assert score_kws.main(["--data-list", data, "--posteriors", ark, "--inventory", kws,
                           "--out-dir", str(out), "--refractory-s", "0.2",
                           "--bootstrap", "0"]) == 0
    lines = (out / "errors_hey_snips.txt").read_text().splitlines()
    assert lines[0] == ("# hey snips: threshold 0.376 (selected for 1 FA/h): 1 false alarms "
                        "in 1.00 h of other audio, 2 of 4 positives missed")
    assert lines[2] == "0.750000 0.10 utt005 a -1 hey snoops"
    assert lines[3].startswith("# speakers") and lines[4:6] == ["b 1/1 100.00% 0",
                                                                "a 1/3 33.33% 1"]
    assert lines[6].startswith("# misses") and lines[7:] == [
        "0.100000 utt003 b hey snips", "0.300000 utt002 a hey snips"]
    doc = json.loads((out / "det.json").read_text())
    report = doc["errors"]["hey snips"]
    assert report["threshold"] == pytest.approx(0.376) and len(report["misses"]) == 2

    # Without speakers or texts the tables still come, with "-" for the speaker.
    plain = tmp_path / "plain"
    plain.mkdir()
    data, ark, kws = write_inputs(plain, *hand_made())
    assert score_kws.main(["--data-list", data, "--posteriors", ark, "--inventory", kws,
                           "--out-dir", str(plain / "score"), "--refractory-s", "0.2",
                           "--bootstrap", "0"]) == 0
    text = (plain / "score" / "errors_hey_snips.txt").read_text().splitlines()
    assert "0.750000 0.10 utt005 - -1" in text and "- 2/4 50.00% 1" in text


def bootstrap_set(seed, n_pos=40, n_neg=60):
    """Positives peaking anywhere in [0.3, 1), negatives in [0, 0.9), some with two
    peaks more than the refractory period apart (two false alarms)."""
    rng = np.random.default_rng(seed)
    probs = [spikes(120, {60: float(rng.uniform(0.3, 0.999))}) for _ in range(n_pos)]
    for _ in range(n_neg):
        peaks = {20: float(rng.uniform(0, 0.9))}
        if rng.random() < 0.3:
            peaks[100] = float(rng.uniform(0, 0.9))
        probs.append(spikes(120, peaks))
    return probs, [0] * n_pos + [-1] * n_neg, [2.0] * n_pos + [60.0] * n_neg


def frr_of_resample(probs, labels, durations, pick, thresholds, target=20.0):
    """FRR at `target` FA/h of the test set made of utterances `pick` (repeats allowed)."""
    det = compute_det([probs[i] for i in pick], [labels[i] for i in pick],
                              [durations[i] for i in pick], 1, thresholds, refractory_frames=30)
    return operating_point(thresholds, det.fa_per_hour[:, 0], det.frr[:, 0], target).frr


def test_bootstrap_replicate_is_the_det_of_a_resampled_test_set():
    """One replicate = compute_det + operating_point on the test set drawn with the same
    generator: negatives first, then positives."""
    probs, labels, durations = bootstrap_set(1)
    thresholds = threshold_grid(0.01)
    for seed in (3, 4):
        (ci,), = bootstrap_frr_intervals(probs, labels, durations, 1, thresholds, [20.0],
                                                 replicates=1, seed=seed, refractory_frames=30)
        rng = np.random.default_rng(seed)
        neg, pos = list(range(40, 100)), list(range(40))
        pick = [neg[i] for i in rng.integers(0, 60, 60)] + [pos[i] for i in rng.integers(0, 40, 40)]
        assert ci.low == ci.high == pytest.approx(
            frr_of_resample(probs, labels, durations, pick, thresholds))


def test_bootstrap_interval_brackets_the_estimate_and_narrows_with_more_data():
    probs, labels, durations = bootstrap_set(2)
    thresholds = threshold_grid(0.01)
    det = compute_det(probs, labels, durations, 1, thresholds)
    point = operating_point(thresholds, det.fa_per_hour[:, 0], det.frr[:, 0], 20.0).frr
    (small,), = bootstrap_frr_intervals(probs, labels, durations, 1, thresholds, [20.0],
                                                replicates=300, seed=0)
    assert small.low < point < small.high
    again = bootstrap_frr_intervals(probs, labels, durations, 1, thresholds, [20.0],
                                            replicates=300, seed=0)
    assert again[0][0] == small                               # seeded: reproducible
    # Four copies of every utterance: same estimate, about half the spread.
    (big,), = bootstrap_frr_intervals(probs * 4, labels * 4, durations * 4, 1, thresholds,
                                              [20.0], replicates=300, seed=0)
    assert big.low < point < big.high
    assert big.high - big.low < 0.75 * (small.high - small.low)
    # Separable scores: every replicate has FRR 0 at the target.
    clean = [spikes(120, {60: 0.95})] * 5 + [spikes(120, {20: 0.2})] * 5
    (sep,), = bootstrap_frr_intervals(clean, [0] * 5 + [-1] * 5, [2.0] * 5 + [60.0] * 5,
                                              1, thresholds, [1.0], replicates=50)
    assert sep.low == sep.high == 0.0


def test_speaker_bootstrap_replicate_is_the_det_of_resampled_speakers():
    """One replicate draws whole speakers with the same generator; every drawn speaker
    brings all its utterances, positives and negatives."""
    probs, labels, durations = bootstrap_set(1)
    speakers = [f"s{i % 7}" for i in range(len(probs))]   # 7 voices, mixed labels
    thresholds = threshold_grid(0.01)
    names = sorted(set(speakers))
    for seed in (3, 4):
        (ci,), = bootstrap_frr_intervals(probs, labels, durations, 1, thresholds, [20.0],
                                                 replicates=1, seed=seed, refractory_frames=30,
                                                 speakers=speakers)
        drawn = np.random.default_rng(seed).integers(0, len(names), len(names))
        pick = [i for d in drawn.tolist() for i, s in enumerate(speakers) if s == names[d]]
        assert ci.low == ci.high == pytest.approx(
            frr_of_resample(probs, labels, durations, pick, thresholds))


def test_speaker_bootstrap_is_wider_when_errors_cluster_by_voice():
    """Every miss belongs to voice v0 (one of 20): drawing utterances keeps the FRR near
    5 %, drawing voices brings v0 zero to three times, i.e. FRR 0 to about 15 %."""
    rng = np.random.default_rng(0)
    probs, labels, speakers = [], [], []
    for v in range(20):
        for _ in range(20):
            peak = rng.uniform(0.1, 0.3) if v == 0 else rng.uniform(0.8, 1.0)
            probs.append(spikes(120, {60: float(peak)}))
            labels.append(0)
            speakers.append(f"v{v}")
        probs.append(spikes(120, {20: float(rng.uniform(0.4, 0.5))}))
        labels.append(-1)
        speakers.append(f"v{v}")
    # 10 h of negatives, each firing below 0.5: 2 FA/h, so 1 FA/h needs a threshold
    # above them, where v0's keywords (0.1-0.3) are missed and the others (0.8-1) hit.
    durations = [2.0 if lab == 0 else 1800.0 for lab in labels]
    thresholds = threshold_grid(0.01)
    (by_utt,), = bootstrap_frr_intervals(probs, labels, durations, 1, thresholds,
                                                 [1.0], replicates=300, seed=0)
    (by_spk,), = bootstrap_frr_intervals(probs, labels, durations, 1, thresholds,
                                                 [1.0], replicates=300, seed=0,
                                                 speakers=speakers)
    assert by_utt.low < 0.05 < by_utt.high and by_spk.low == 0.0
    assert by_spk.high - by_spk.low > 2 * (by_utt.high - by_utt.low)
    with pytest.raises(ValueError, match="one entry per utterance"):
        bootstrap_frr_intervals(probs, labels, durations, 1, thresholds, [1.0],
                                        speakers=speakers[:-1])


def test_cli_speaker_bootstrap_needs_speakers(tmp_path, capsys):
    probs, labels, durations = bootstrap_set(5)
    speakers = [f"s{i % 5}" for i in range(len(probs))]
    data, ark, kws = write_inputs(tmp_path, probs, labels, durations, speakers=speakers)
    assert score_kws.main(["--data-list", data, "--posteriors", ark, "--inventory", kws,
                           "--out-dir", str(tmp_path / "s"), "--fa-targets", "20",
                           "--bootstrap", "100", "--bootstrap-unit", "speaker"]) == 0
    doc = json.loads((tmp_path / "s" / "det.json").read_text())
    assert doc["bootstrap"]["unit"] == "speaker" and doc["config"]["bootstrap_unit"] == "speaker"
    bare = tmp_path / "bare"
    bare.mkdir()
    data, ark, kws = write_inputs(bare, probs, labels, durations)
    rc = score_kws.main(["--data-list", data, "--posteriors", ark, "--inventory", kws,
                         "--out-dir", str(bare / "s"), "--bootstrap-unit", "speaker"])
    err = capsys.readouterr().err
    assert rc == 2 and "needs a 'spk' field" in err and "utt000" in err


def test_cli_reports_bootstrap_intervals(tmp_path):
    data, ark, kws = write_inputs(tmp_path, *bootstrap_set(5))
    assert score_kws.main(["--data-list", data, "--posteriors", ark, "--inventory", kws,
                           "--out-dir", str(tmp_path / "s"), "--fa-targets", "20",
                           "--bootstrap", "200"]) == 0
    doc = json.loads((tmp_path / "s" / "det.json").read_text())
    boot = doc["bootstrap"]
    assert boot["replicates"] == 200 and boot["level"] == 0.95
    for ci, op in zip(boot["frr_intervals"]["hey snips"],
                      doc["curves"]["hey snips"]["operating_points"]):
        assert ci["target_fa_per_hour"] == op["target_fa_per_hour"]
        assert ci["low"] <= op["frr"] <= ci["high"]
    line = (tmp_path / "s" / "summary.txt").read_text()
    assert "@20 FA/h (thr " in line and ", 95% CI " in line


def test_threshold_tail_places_an_operating_point_above_0999():
    """Negatives at 0.9995 and 0.999945, positives at 0.99999 and 0.5: the uniform grid's
    last threshold below 1 (0.999) fires on both negatives, so 1 FA/h is only met at 1.0
    (FRR 100 %); the tail grid finds 0.99995 with one positive kept."""
    probs = [spikes(100, {50: 0.99999}), spikes(100, {50: 0.5}),
             spikes(100, {30: 0.9995}), spikes(100, {30: 0.999945})]
    args = (probs, [0, 0, -1, -1], [1.0, 1.0, 1800.0, 1800.0])
    plain = compute_det(*args, num_keywords=1, thresholds=threshold_grid())
    op = operating_point(plain.thresholds, plain.fa_per_hour[:, 0], plain.frr[:, 0], 0.0)
    assert op.threshold == 1.0 and op.frr == 1.0
    grid = threshold_grid(tail_decades=4)
    assert np.all(np.diff(grid) > 0) and grid[0] == 0.0 and grid[-1] == 1.0
    assert 0.9991 in grid and 0.9999999 in grid and grid.size == 1037
    tail = compute_det(*args, num_keywords=1, thresholds=grid)
    op = operating_point(tail.thresholds, tail.fa_per_hour[:, 0], tail.frr[:, 0], 0.0)
    assert op.threshold == pytest.approx(0.99995) and op.frr == 0.5
    assert scoring.format_threshold(op.threshold) == "0.99995"
    assert scoring.format_threshold(0.5) == "0.500" and scoring.format_threshold(1.0) == "1.000"
    with pytest.raises(ValueError, match="tail_decades"):
        threshold_grid(tail_decades=-1)


def test_scp_input_and_missing_keys(tmp_path, caplog):
    probs, labels, durations = hand_made()
    data, ark, kws = write_inputs(tmp_path, probs, labels, durations, scp=True)
    res = scoring.score(data, str(tmp_path / "probs.scp"), kws, refractory_frames=20)
    assert res.summary == [EXPECTED_SUMMARY]

    # 1 of 6 missing: over 1% -> error; allowed fraction raised -> warning, scored without it.
    with open(data, "a") as f:
        f.write(json.dumps({"key": "gone", "duration": 1.0, "label": 0}) + "\n")
    with pytest.raises(ValueError, match="1 of 7 utterances"):
        scoring.score(data, ark, kws)
    with caplog.at_level(logging.WARNING):
        res = scoring.score(data, ark, kws, refractory_frames=20, max_missing_fraction=0.2)
    assert res.missing_keys == 1 and "1 of 7" in caplog.text
    assert res.summary == [EXPECTED_SUMMARY]

    # 1 of 101 missing (<= 1%): only a warning with the default limit.
    big = tmp_path / "big"
    big.mkdir()
    data, ark, kws = write_inputs(big, [spikes(5, {})] * 100, [-1] * 100, [1.0] * 100)
    with open(data, "a") as f:
        f.write(json.dumps({"key": "gone", "duration": 1.0, "label": -1}) + "\n")
    assert scoring.score(data, ark, kws).missing_keys == 1


@pytest.mark.parametrize("bad,message", [
    ('{"key": "b", "duration": 1.0, "label": 0', "malformed JSON"),
    ('{"key": "b", "label": 0}', "missing field(s) duration"),
    ('{"key": "b", "duration": 1.0, "label": 3}', "'label' must be an integer in [-1, 0]"),
    ('{"key": "b", "duration": -1, "label": 0}', "'duration' must be a positive"),
    ('{"key": "b", "duration": 1.0, "label": 0, "spk": 7}', "'spk' must be a string"),
])
def test_malformed_data_list_names_the_line(tmp_path, capsys, bad, message):
    data, ark, kws = write_inputs(tmp_path, *hand_made())
    lines = open(data).read().splitlines()
    lines.insert(2, bad)
    with open(data, "w") as f:
        f.write("\n".join(lines) + "\n")
    with pytest.raises(ValueError) as err:
        scoring.read_data_list(data, num_keywords=1)
    assert f"{data}:3:" in str(err.value) and message in str(err.value)
    rc = score_kws.main(["--data-list", data, "--posteriors", ark, "--inventory", kws,
                         "--out-dir", str(tmp_path / "out")])
    assert rc == 2 and f"{data}:3:" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_bad_posteriors_and_keywords(tmp_path):
    probs, labels, durations = hand_made()
    probs[0] = np.log(probs[0] + 1e-3)  # log-probabilities by mistake
    data, ark, kws = write_inputs(tmp_path, probs, labels, durations)
    with pytest.raises(ValueError, match="outside \\[0, 1\\]"):
        scoring.score(data, ark, kws)
    (tmp_path / "kw2.txt").write_text("a\n\nb\n")
    with pytest.raises(ValueError, match="kw2.txt:2: blank line"):
        scoring.read_keywords(str(tmp_path / "kw2.txt"))


def test_help_runs():
    with pytest.raises(SystemExit) as exit_:
        score_kws.get_args(["--help"])
    assert exit_.value.code == 0
