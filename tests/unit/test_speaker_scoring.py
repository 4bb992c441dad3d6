"""Speaker-verification scoring: trial lists, cosine / AS-Norm scores, EER, minDCF, DET."""
import math
import statistics

import numpy as np
import pytest

from toolkit.tasks.speaker.scoring import (compute_eer, compute_min_dcf, det_curve,
                                           embedding_mean, error_rates, format_summary,
                                           plot_det, read_trials, score_trials, summarize)


def scored(targets, nontargets):
    scores = np.r_[np.asarray(targets, float), np.asarray(nontargets, float)]
    labels = np.r_[np.ones(len(targets), int), np.zeros(len(nontargets), int)]
    return scores, labels


# ------------------------------------------------------------------------------- EER

def test_perfect_separation_has_zero_eer_and_min_dcf():
    scores, labels = scored([0.9, 0.8, 0.75, 0.6], [0.5, 0.1, -0.3])
    eer, threshold = compute_eer(scores, labels)
    assert eer == 0.0
    assert 0.5 < threshold <= 0.6              # accepts every target, no nontarget
    for p in (0.01, 0.05, 0.5):
        assert compute_min_dcf(scores, labels, p)[0] == 0.0


@pytest.mark.parametrize("n_target,k,n_nontarget", [(10, 2, 7), (20, 1, 50), (8, 3, 3), (5, 4, 9)])
def test_k_targets_below_every_nontarget(n_target, k, n_nontarget):
    # n - k targets above every nontarget, k below every one. Lowering the threshold, the
    # miss rate falls to k/n with no false alarm, then stays at k/n while the false alarm
    # rate climbs through the nontargets; the ROC crosses p_miss = p_fa on that flat
    # stretch, so the EER is k/n exactly.
    rng = np.random.default_rng(k)
    high = 10 + rng.random(n_target - k)
    low = -10 - rng.random(k)
    nontargets = rng.uniform(-1, 1, n_nontarget)
    scores, labels = scored(np.r_[high, low], nontargets)
    eer, threshold = compute_eer(scores, labels)
    assert eer == pytest.approx(k / n_target, abs=1e-12)
    assert -1 <= threshold <= 1


def test_eer_interpolates_a_diagonal_step_through_a_tie():
    # targets {3, 2}, nontargets {2, 0}. ROC points (p_fa, p_miss): threshold +inf (0, 1),
    # 3 (0, 1/2), 2 (1/2, 0) since the tied target and nontarget at 2 are accepted together.
    # The step from (0, 1/2) to (1/2, 0) crosses p_miss = p_fa halfway: EER 1/4, threshold
    # halfway between 3 and 2.
    eer, threshold = compute_eer(*scored([3.0, 2.0], [2.0, 0.0]))
    assert eer == pytest.approx(0.25)
    assert threshold == pytest.approx(2.5)


def test_all_scores_tied_is_chance():
    scores, labels = scored([1.0] * 5, [1.0] * 9)
    assert compute_eer(scores, labels)[0] == pytest.approx(0.5)
    assert compute_min_dcf(scores, labels, 0.01)[0] == pytest.approx(1.0)


def test_eer_does_not_depend_on_trial_order():
    rng = np.random.default_rng(3)
    scores, labels = scored(rng.normal(1, 1, 300), rng.normal(-1, 1, 700))
    perm = rng.permutation(len(scores))
    assert compute_eer(scores, labels) == compute_eer(scores[perm], labels[perm])
    # two unit-variance Gaussians 2 apart: EER = Phi(-1) = 15.9 %, up to sampling
    assert compute_eer(scores, labels)[0] == pytest.approx(0.1587, abs=0.03)


def test_error_rates_are_monotone_and_start_and_end_at_the_extremes():
    rng = np.random.default_rng(4)
    p_miss, p_fa, thresholds = error_rates(*scored(rng.normal(size=40), rng.normal(size=60)))
    assert (p_miss[0], p_fa[0], p_miss[-1], p_fa[-1]) == (1.0, 0.0, 0.0, 1.0)
    assert (np.diff(p_miss) <= 0).all() and (np.diff(p_fa) >= 0).all()
    assert np.isinf(thresholds[0]) and (np.diff(thresholds[1:]) < 0).all()


def test_scoring_needs_both_classes():
    with pytest.raises(ValueError, match="both"):
        compute_eer([0.1, 0.2], [1, 1])


# ---------------------------------------------------------------------------- minDCF

def test_min_dcf_by_hand():
    # targets {0.9, 0.8, 0.6, 0.3}, nontargets {0.7, 0.4, 0.2, 0.1}; p_target 0.1, unit
    # costs. DCF = 0.1 P_miss + 0.9 P_fa, normalised by min(0.1, 0.9) = 0.1, so the
    # normalised cost is P_miss + 9 P_fa. Accept if score >=
    #   +inf: 1            0.9: 3/4          0.8: 1/2          0.7: 1/2 + 9/4 = 2.75
    #   0.6:  1/4 + 9/4    0.4: 1/4 + 9/2    0.3: 0 + 9/2      ... growing to 9 at 0.1
    # minimum 1/2, at threshold 0.8.
    scores, labels = scored([0.9, 0.8, 0.6, 0.3], [0.7, 0.4, 0.2, 0.1])
    min_dcf, threshold = compute_min_dcf(scores, labels, 0.1)
    assert min_dcf == pytest.approx(0.5)
    assert threshold == 0.8
    # p_target 0.5: normalised cost P_miss + P_fa, minimum 1/2 (e.g. threshold 0.8)
    assert compute_min_dcf(scores, labels, 0.5)[0] == pytest.approx(0.5)
    # c_miss 10 at p_target 0.1: normalised cost (P_miss + 0.9 P_fa) / min(1, 0.9), a miss
    # now weighing about as much as a false alarm. At 0.3 (P_miss 0, P_fa 1/2) it is
    # 0.45 / 0.9 = 1/2, at 0.8 (1/2, 0) 0.556, at 0.6 (1/4, 1/4) 0.528, elsewhere more:
    # the minimum moves to threshold 0.3.
    assert compute_min_dcf(scores, labels, 0.1, c_miss=10.0) == (pytest.approx(0.5), 0.3)


def test_min_dcf_never_exceeds_the_default_decision():
    # a system worse than chance still costs at most "always reject" (normalised 1)
    scores, labels = scored([-1.0, -2.0, -3.0], [1.0, 2.0, 3.0])
    assert compute_min_dcf(scores, labels, 0.01)[0] == pytest.approx(1.0)


# ---------------------------------------------------------------------------- trials

def test_read_both_trial_forms(tmp_path):
    vox = tmp_path / "vox.txt"
    vox.write_text("1 id10270/x6uYqmx31kE/00001.wav id10270/8jEAjG6SegY/00008.wav\n"
                   "0 id10270/x6uYqmx31kE/00001.wav id10300/ize_eiCFEg0/00003.wav\n\n")
    kaldi = tmp_path / "kaldi.txt"
    kaldi.write_text("id10270-x6uYqmx31kE-00001 id10270-8jEAjG6SegY-00008 target\n"
                     "id10270-x6uYqmx31kE-00001 id10300-ize_eiCFEg0-00003 nontarget\n")
    v, k = read_trials(str(vox)), read_trials(str(kaldi))
    assert v.enroll == ["id10270/x6uYqmx31kE/00001.wav"] * 2
    assert v.test[1] == "id10300/ize_eiCFEg0/00003.wav"
    assert k.enroll[0] == "id10270-x6uYqmx31kE-00001" and k.test[0] == "id10270-8jEAjG6SegY-00008"
    assert v.labels.tolist() == k.labels.tolist() == [1, 0]
    assert len(v) == len(k) == 2


@pytest.mark.parametrize("bad_line,message", [
    ("1 a.wav", "3 fields"),
    ("2 a.wav b.wav", "no trial label"),
    ("a.wav b.wav same", "no trial label"),
    ("a.wav b.wav target", "kaldi trial line"),
])
def test_bad_trial_line_names_file_and_line(tmp_path, bad_line, message):
    path = tmp_path / "trials.txt"
    path.write_text(f"1 a.wav b.wav\n0 a.wav c.wav\n{bad_line}\n1 d.wav e.wav\n")
    with pytest.raises(ValueError, match=message) as error:
        read_trials(str(path))
    assert f"{path}:3" in str(error.value)


# -------------------------------------------------------------------------- scoring

def unit(v):
    return v / np.linalg.norm(v)


def cosine(a, b):
    return float(np.dot(unit(a), unit(b)))


def trial_file(tmp_path, rows):
    path = tmp_path / "trials.txt"
    path.write_text("".join(f"{label} {e} {t}\n" for label, e, t in rows))
    return read_trials(str(path))


@pytest.fixture
def utterances(tmp_path):
    rng = np.random.default_rng(7)
    # a shared offset, as real embeddings have, which mean subtraction removes
    offset = rng.normal(size=6) * 3
    embeddings = {f"u{i}": offset + rng.normal(size=6) * (1 + i) for i in range(5)}
    cohort = offset + rng.normal(size=(40, 6)) * rng.uniform(0.5, 4, size=(40, 1))
    rows = [(1, "u0", "u1"), (0, "u0", "u2"), (1, "u3", "u4"), (0, "u4", "u1"),
            (0, "u2", "u3"), (1, "u1", "u0")]
    return trial_file(tmp_path, rows), embeddings, cohort


def test_plain_cosine_scores(utterances):
    trials, embeddings, _ = utterances
    expected = [cosine(embeddings[e], embeddings[t]) for e, t in zip(trials.enroll, trials.test)]
    assert np.allclose(score_trials(trials, embeddings), expected, atol=1e-12)


def test_mean_subtraction_and_length_norm(utterances):
    trials, embeddings, cohort = utterances
    pairs = list(zip(trials.enroll, trials.test))
    mean = cohort.mean(axis=0)
    centred = [cosine(embeddings[e] - mean, embeddings[t] - mean) for e, t in pairs]
    got = score_trials(trials, embeddings, mean=embedding_mean(cohort))
    assert np.allclose(got, centred, atol=1e-12)
    # length norm first: the mean is that of unit vectors, subtracted from unit vectors
    unit_mean = np.mean([unit(c) for c in cohort], axis=0)
    normed = [cosine(unit(embeddings[e]) - unit_mean, unit(embeddings[t]) - unit_mean)
              for e, t in pairs]
    got = score_trials(trials, embeddings, mean=embedding_mean(cohort, length_norm=True),
                       length_norm=True)
    assert np.allclose(got, normed, atol=1e-12)
    plain = [cosine(embeddings[e], embeddings[t]) for e, t in pairs]
    assert not np.allclose(centred, plain, atol=1e-3)
    assert not np.allclose(normed, centred, atol=1e-3)


def as_norm_reference(e, t, cohort, top_n):
    """One trial, written out: the raw score, then each side's top_n cohort scores."""
    raw = cosine(e, t)
    z = []
    for side in (e, t):
        top = sorted((cosine(side, c) for c in cohort), reverse=True)[:top_n]
        z.append((raw - statistics.fmean(top)) / statistics.pstdev(top))
    return 0.5 * (z[0] + z[1])


@pytest.mark.parametrize("top_n", [5, 17, 1000])      # 1000: more than the cohort
def test_as_norm_matches_a_per_trial_loop(utterances, top_n):
    trials, embeddings, cohort = utterances
    expected = [as_norm_reference(embeddings[e], embeddings[t], cohort, top_n)
                for e, t in zip(trials.enroll, trials.test)]
    got = score_trials(trials, embeddings, cohort=cohort, top_n=top_n)
    assert np.allclose(got, expected, atol=1e-9)
    assert not np.allclose(got, score_trials(trials, embeddings), atol=1e-2)


def test_as_norm_normalises_the_cohort_like_the_trials(utterances):
    trials, embeddings, cohort = utterances
    mean = embedding_mean(cohort, length_norm=True)
    prepared = lambda v: unit(v) - mean          # noqa: E731
    expected = [as_norm_reference(prepared(embeddings[e]), prepared(embeddings[t]),
                                  [prepared(c) for c in cohort], 10)
                for e, t in zip(trials.enroll, trials.test)]
    got = score_trials(trials, embeddings, mean=mean, length_norm=True, cohort=cohort, top_n=10)
    assert np.allclose(got, expected, atol=1e-9)


def test_missing_embedding_is_named(utterances):
    trials, embeddings, _ = utterances
    del embeddings["u3"]
    with pytest.raises(KeyError, match="u3"):
        score_trials(trials, embeddings)


# ----------------------------------------------------------------- DET and summary

def test_det_curve_points():
    p_fa, p_miss = det_curve(*scored([3.0, 2.0], [2.0, 0.0]))
    assert p_fa.tolist() == [0.0, 0.0, 0.5, 1.0]
    assert p_miss.tolist() == [1.0, 0.5, 0.0, 0.0]


def test_det_plot_is_a_png(tmp_path):
    rng = np.random.default_rng(5)
    systems = {"good": scored(rng.normal(2, 1, 500), rng.normal(-2, 1, 2000)),
               "weak": scored(rng.normal(0.5, 1, 500), rng.normal(-0.5, 1, 2000))}
    path = tmp_path / "plots" / "det.png"
    plot_det(str(path), systems, title="test systems")
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(data) > 10_000                 # axes, two curves and a legend drawn


def test_summary_and_its_line():
    # the k-of-n set: 8 targets above the 7 nontargets, 2 below. EER 2/10. minDCF: the
    # best threshold accepts the 8 high targets only (P_miss 0.2, P_fa 0), normalised
    # cost 0.2 for any small p_target.
    rng = np.random.default_rng(1)
    scores, labels = scored(np.r_[5 + rng.random(8), -5 - rng.random(2)], rng.random(7))
    summary = summarize(scores, labels)
    assert summary["eer_percent"] == pytest.approx(20.0)
    assert summary["min_dcf_0.01"] == pytest.approx(0.2)
    assert summary["min_dcf_0.05"] == pytest.approx(0.2)
    assert (summary["trials"], summary["targets"], summary["nontargets"]) == (17, 10, 7)
    assert format_summary(summary) == ("EER 20.00% minDCF(0.01) 0.200 minDCF(0.05) 0.200 "
                                       "over 17 trials (10 target)")


def test_probit_axis_extremes_do_not_break_the_plot(tmp_path):
    # perfect separation: every DET point has a rate of 0 or 1 (infinite deviates)
    path = tmp_path / "det.png"
    plot_det(str(path), {"perfect": scored([2.0, 3.0], [0.0, 1.0])})
    assert path.read_bytes()[:4] == b"\x89PNG"
    assert math.isfinite(compute_eer(*scored([2.0, 3.0], [0.0, 1.0]))[1])
