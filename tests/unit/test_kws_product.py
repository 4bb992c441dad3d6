"""Scoring a wake word as a product (toolkit.tasks.kws.product through scoring.score): the
threshold from general negatives, neighbours and accent variants measured apart at it;
the search's verifier and the fusion weights chosen on a dev set (toolkit.tasks.kws.fusion)."""
import json

import kaldiio
import numpy as np
import pytest

from toolkit.errors import DataError
from toolkit.tasks.kws import fusion, product, scoring
from toolkit.tasks.kws.search import KeywordSearch


def _clip_scores(peak, frames=40):
    x = np.full((frames, 1), 0.01, np.float32)
    x[frames // 2:frames // 2 + 8, 0] = peak
    return x


def _write(tmp_path, clips):
    """clips: (key, kind, category, label, peak) -> data list, ark, inventory paths."""
    lines, ark = [], {}
    for key, kind, cat, label, peak in clips:
        entry = {"key": key, "duration": 3600.0 / 40, "label": label, "spk": key[:2],
                 "txt": key, "kind": kind}
        if cat:
            entry["cat"] = cat
        lines.append(json.dumps(entry))
        ark[key] = _clip_scores(peak)
    (tmp_path / "data.list").write_text("\n".join(lines) + "\n")
    kaldiio.save_ark(str(tmp_path / "p.ark"), ark)
    (tmp_path / "kw.txt").write_text("hey jarvis\n")
    return str(tmp_path / "data.list"), str(tmp_path / "p.ark"), str(tmp_path / "kw.txt")


def test_neighbours_and_accents_never_set_the_threshold(tmp_path):
    clips = [(f"p{i:02d}", "pos", "", 0, 0.6 + 0.01 * i) for i in range(20)]
    clips += [(f"n{i:02d}", "neg", "", -1, 0.05 + 0.01 * i) for i in range(30)]   # 30 x 90 s
    clips += [(f"z{i:02d}", "noise", "", -1, 0.02) for i in range(10)]
    # neighbours scoring above every positive: as negatives they would set the threshold
    clips += [(f"c{i:02d}", "conf", "real_word", -1, 0.95) for i in range(4)]
    clips += [(f"c{i:02d}", "conf", "real_word", -1, 0.1) for i in range(4, 10)]
    clips += [(f"w{i:02d}", "conf", "inside_word", -1, 0.97) for i in range(3)]
    clips += [(f"a{i:02d}", "accent", "accent", -1, 0.7 if i < 8 else 0.1) for i in range(10)]
    data_list, ark, kw = _write(tmp_path, clips)
    result = scoring.score(data_list, ark, kw, target_fa_per_hour=1.0)
    sel = result.selected[0]
    # 40 general clips of 90 s = 1 h: one false alarm allowed, the top negative (0.34) fires
    assert result.det.negative_hours[0] == pytest.approx(1.0)
    assert 0.33 < sel.threshold <= 0.34 and sel.frr == 0.0
    rep = result.extra["product"]["hey jarvis"]
    assert rep["frr"] == 0.0 and rep["positives"] == 20
    assert rep["neighbours"] == {"clips": 10, "fired": 4, "share": 0.4}      # inside-word apart
    assert rep["categories"]["inside_word"] == {"clips": 3, "fired": 3, "share": 1.0}
    assert rep["accent"] == {"clips": 10, "accepted": 8, "share": 0.8}
    assert rep["top_phrases"][0]["fired"] == 1 and rep["phrases_firing"] == 7   # one a text
    assert "neighbours fire 40.0% (4/10; apart: inside_word 3/3)" in result.summary[-1]
    scoring.write_outputs(str(tmp_path / "out"), result, {})
    text = (tmp_path / "out" / "product.md").read_text()
    assert "| inside_word (apart) | 3 | 3 | 100.0% |" in text
    # the same list without kinds: every clip counts, and the neighbours set the threshold
    lines = [json.loads(l) for l in open(data_list)]
    for e in lines:
        e.pop("kind"), e.pop("cat", None)
    (tmp_path / "data.list").write_text("".join(json.dumps(e) + "\n" for e in lines))
    plain = scoring.score(data_list, ark, kw, target_fa_per_hour=1.0)
    assert plain.selected[0].frr == 1.0 and "product" not in plain.extra


def test_a_deployed_threshold_is_reported_beside_the_sets_own(tmp_path):
    """A threshold chosen on dev: this set's FRR, false alarms and neighbours at it (the
    lowest grid threshold at or above it), next to the set's own 1 FA/h point."""
    clips = [(f"p{i:02d}", "pos", "", 0, 0.6 + 0.01 * i) for i in range(20)]   # 0.60-0.79
    clips += [(f"n{i:02d}", "neg", "", -1, 0.05 + 0.01 * i) for i in range(40)]  # 1 h
    clips += [(f"c{i:02d}", "conf", "real_word", -1, 0.65) for i in range(5)]
    clips += [(f"a{i:02d}", "accent", "accent", -1, 0.75) for i in range(4)]
    data_list, ark, kw = _write(tmp_path, clips)
    # Dev chose 0.6945 (grid 0.695): the positives at 0.60-0.69 miss, nothing else fires.
    result = scoring.score(data_list, ark, kw, target_fa_per_hour=1.0,
                           deployed_threshold=0.6945)
    dep = result.extra["deployed"]
    assert dep["threshold"] == 0.695 and dep["requested"] == 0.6945
    at = dep["keywords"]["hey jarvis"]
    assert at["frr"] == pytest.approx(0.5) and at["fa_per_hour"] == 0.0
    assert at["product"]["neighbours"]["fired"] == 0 and at["product"]["accent"]["accepted"] == 4
    assert result.selected[0].frr == 0.0          # the set's own point is still reported
    assert result.summary[-1] == ("hey_jarvis at the deployed threshold 0.695 (chosen on dev): "
                                  "FRR 50.0%, 0.00 FA/h of general negatives; neighbours fire "
                                  "0.0% (0/5); accent variants accepted 100.0% (4/4)")
    # A low one: every negative above it fires.
    low = scoring.score(data_list, ark, kw, deployed_threshold=0.0)
    assert low.extra["deployed"]["keywords"]["hey jarvis"]["fa_per_hour"] == pytest.approx(40.0)
    with pytest.raises(ValueError, match="outside"):
        scoring.score(data_list, ark, kw, deployed_threshold=1.5)


def test_product_report_counts_voices_per_phrase():
    C = product.ClipOutcome
    rep = product.product_report([C("pos", True), C("pos", False),
                                  C("conf", True, "real_word", "say jarvis", "v1"),
                                  C("conf", True, "real_word", "say jarvis", "v2"),
                                  C("conf", False, "real_word", "say jarvis", "v3"),
                                  C("conf", False, "alone", "jarvis", "v1")], 0.5, 1.0)
    assert rep["frr"] == 0.5 and rep["neighbours"]["share"] == 0.5
    top = rep["top_phrases"][0]
    assert (top["text"], top["fired"], top["clips"], top["voices_fired"], top["voices"]) == \
        ("say jarvis", 2, 3, 2, 3)
    assert rep["accent"]["share"] is None
    none = product.product_report([C("pos", False)], None, 1.0)
    assert none["frr"] is None and "no threshold" in product.summary_line("kw", none)


def _posteriors(sequence, units=7, confidence=0.9):
    lp = np.full((len(sequence), units), np.log((1 - confidence) / (units - 1)))
    lp[np.arange(len(sequence)), sequence] = np.log(confidence)
    return lp


def test_the_verifier_drops_where_another_phone_wins():
    search = KeywordSearch([[1, 2, 3]], ["kw"], max_frames=50)
    search.step(_posteriors([0, 0, 1, 1, 0, 2, 2, 3, 3, 0]))
    at_peak = search.verifier[8, 0]
    assert at_peak > 0.95                          # every frame's best unit is on the path
    search.reset()
    # p2 heard at 0.3 under p4 at 0.6: the peaks' mean forgives it, the free loop does not
    frames = _posteriors([0, 0, 1, 1, 0, 4, 4, 3, 3, 0])
    frames[5:7, 2] = np.log(0.3)
    frames[5:7, 4] = np.log(0.6)
    scores = search.step(frames)[:, 0]
    assert scores[8] > 0.6 and search.verifier[8, 0] < 0.75


def test_fusion_weights_chosen_on_dev_and_checked():
    rng = np.random.default_rng(0)
    clips, parts = [], []
    for i in range(60):
        kind = ("pos", "neg", "conf")[i % 3]
        head = {"pos": 0.9, "neg": 0.05, "conf": 0.9}[kind] + 0.05 * rng.random()
        search = {"pos": 0.6, "neg": 0.05, "conf": 0.55}[kind] + 0.05 * rng.random()
        verifier = {"pos": 0.9, "neg": 0.5, "conf": 0.05}[kind]   # only it hears "travis"
        m = np.full((30, 3), 0.01, np.float32)
        m[10:20] = (head, search, verifier)
        parts.append(m)
        clips.append(fusion.DevClip(kind, 0 if kind == "pos" else -1, 90.0, "real_word"))
    best, candidates = fusion.choose_weights(parts, clips, 1.0, smooth_frames=1)
    assert best["verifier"] > 0
    chosen = next(c for c in candidates if c.weights == best)
    assert chosen.frr == 0.0 and chosen.neighbour_fa == 0.0
    default = candidates[0]
    assert default.weights == fusion.DEFAULT_WEIGHTS and default.neighbour_fa == 1.0
    # ties go to the default: a dev set where every candidate is perfect keeps it
    easy = [fusion.DevClip(c.kind, c.label, c.duration) for c in clips if c.kind != "conf"]
    kept = [p for p, c in zip(parts, clips) if c.kind != "conf"]
    assert fusion.choose_weights(kept, easy, 1.0, smooth_frames=1)[0] == fusion.DEFAULT_WEIGHTS
    with pytest.raises(DataError, match="fusion_weights.verifier"):
        fusion.check_weights({"head": 1, "verifier": -1})
    with pytest.raises(DataError, match="unknown component"):
        fusion.check_weights({"hed": 1})
    with pytest.raises(DataError, match="no general negatives"):
        fusion.choose_weights(kept[:1], easy[:1], 1.0)
    h, s, v = (np.array([[0.25]]),) * 3
    assert fusion.fuse(h, s, v, {"head": 0.5, "search": 0.5, "verifier": 0.0})[0, 0] == \
        pytest.approx(0.25)


def test_choose_fusion_stores_the_weights_and_names_a_list_without_kinds(tmp_path):
    from in_process import run_main
    from toolkit.bin import choose_fusion
    lines, ark = [], {}
    for i in range(30):
        kind = ("pos", "neg", "conf")[i % 3]
        m = np.full((20, 3), 0.01, np.float32)
        m[5:10] = {"pos": (0.9, 0.6, 0.9), "neg": (0.05, 0.05, 0.5), "conf": (0.9, 0.55, 0.05)}[kind]
        ark[f"u{i:02d}"] = m
        lines.append({"key": f"u{i:02d}", "duration": 90.0, "label": 0 if kind == "pos" else -1,
                      "kind": kind, "cat": "real_word" if kind == "conf" else ""})
    kaldiio.save_ark(str(tmp_path / "parts.ark"), ark)
    (tmp_path / "dev.list").write_text("".join(json.dumps(e) + "\n" for e in lines))
    export = tmp_path / "export"
    export.mkdir()
    (export / "config.json").write_text(json.dumps({"keywords": ["hey jarvis"]}))
    args = ["--components", tmp_path / "parts.ark", "--data-list", tmp_path / "dev.list",
            "--export-dir", export, "--out-dir", tmp_path / "fusion"]
    result = run_main(choose_fusion.main, args)
    assert result.returncode == 0, result.stderr
    stored = json.loads((export / "config.json").read_text())["fusion_weights"]
    assert stored["verifier"] > 0 and stored == json.loads(
        (tmp_path / "fusion" / "fusion.json").read_text())["chosen"]
    assert "chosen: head" in result.stdout
    # --fused-output: the dev scores at the chosen weights, for kws_score.sh --posteriors
    result = run_main(choose_fusion.main, args + ["--fused-output", tmp_path / "fused.ark"])
    assert result.returncode == 0, result.stderr
    fused = dict(kaldiio.load_ark(str(tmp_path / "fused.ark")))
    assert list(fused) == list(ark)
    for key, m in ark.items():
        assert np.array_equal(fused[key], fusion.fuse(m[:, :1], m[:, 1:2], m[:, 2:], stored))
    assert fused["u00"][7, 0] > 0.4 and fused["u01"][7, 0] < 0.1      # a positive, a negative
    for e in lines:
        e.pop("kind")
    (tmp_path / "dev.list").write_text("".join(json.dumps(e) + "\n" for e in lines))
    result = run_main(choose_fusion.main, args)
    assert result.returncode != 0 and "no 'kind' fields" in result.stderr
    assert "dev.list" in result.stderr
