"""tools/analysis scripts: the numbers the README quotes come from code that runs."""
import numpy as np

from tool_module import load_tool


def load(name):
    return load_tool(f"analysis/{name}.py")


def test_dtw_distance_aligns_time_stretched_sequences():
    cd = load("confusable_distance")
    rng = np.random.default_rng(0)
    a = rng.normal(size=(30, 5))
    assert cd.dtw_distance(a, a) == 0.0
    stretched = np.repeat(a, 2, axis=0)          # the same sequence, twice as slow
    assert cd.dtw_distance(a, stretched) == 0.0  # every frame finds its copy
    other = rng.normal(size=(30, 5))
    assert cd.dtw_distance(a, other) > 1.0
    # Normalised by the two lengths: one frame's difference of 3 over 30 + 30 frames.
    b = a.copy()
    b[10] += np.array([3.0, 0, 0, 0, 0])
    assert 0 < cd.dtw_distance(a, b) <= 3.0 / 60 + 1e-12


def test_confusable_distance_prints_a_row_per_voice(capsys):
    cd = load("confusable_distance")
    assert cd.main(["--voices", "en+f1,en-us+m3", "--phrases", "hey snoops"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split("\t") == ["voice", "hey snoops", "hey snips @150"]
    for line, voice in zip(lines[1:], ("en+f1", "en-us+m3")):
        name, *values = line.split("\t")
        assert name == voice and len(values) == 2
        assert all(0.5 < float(v) < 20 for v in values)


def test_dev_curve_reads_every_validation_and_the_last_of_a_resumed_step(tmp_path, capsys):
    dc = load("dev_curve")
    for name, lines in {
        "a": ["epoch 0 dev: loss 2.1 per 0.40000 over 80 utterances (step 100, 1.0 s)",
              "INFO toolkit.trainer.trainer: step 150 loss 1.9",
              "epoch 0 dev: loss 1.8 per 0.30000 over 80 utterances (step 200, 1.0 s)",
              # resumed at 200: validated again, the later value counts
              "epoch 0 dev: loss 1.7 per 0.29000 over 80 utterances (step 200, 1.0 s)"],
        "b": ["epoch 0 dev: loss 2.0 per 0.35000 over 80 utterances (step 100, 1.2 s)"],
    }.items():
        log = tmp_path / name / "log"
        log.mkdir(parents=True)
        (log / "train.rank0.log").write_text("\n".join(lines) + "\n")
    assert dc.read_curve(str(tmp_path / "a"), "per") == [(100, 0.4), (200, 0.29)]
    assert dc.main(["A=" + str(tmp_path / "a"), "B=" + str(tmp_path / "b")]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "| step | A | B |"
    assert out[2:] == ["| 100 | 0.4000 | 0.3500 |", "| 200 | 0.2900 |  |",
                       "| best | 0.2900 | 0.3500 |"]
    try:
        dc.read_curve(str(tmp_path / "a"), "wer")
    except SystemExit as err:
        assert "no dev line with metric 'wer'" in str(err)
    else:
        raise AssertionError("a missing metric must be an error")


def test_mix_condition_copy_swaps_a_seeded_share_and_keeps_clean_chains(tmp_path, capsys):
    import json
    import pytest
    mix = load("mix_condition_copy")
    src, cond = tmp_path / "src", tmp_path / "cond"
    src.mkdir(), cond.mkdir()
    keys = [f"u{i:03d}" for i in range(200)]
    (src / "data.list").write_text("".join(
        json.dumps({"key": k, "wav": f"/s/{k}.wav", "label": i % 2}) + "\n"
        for i, k in enumerate(keys)))
    (src / "text").write_text("".join(f"{k} hey\n" for k in keys))
    (cond / "wav.scp").write_text("".join(f"{k} /c/{k}.wav\n" for k in keys))
    (cond / "utt2cond").write_text("".join(
        f"{k} {'clean' if i % 10 == 0 else 'room:small/1.0m'}\n" for i, k in enumerate(keys)))

    def mixed(out, prob, seed=7):
        assert mix.main(["--src", str(src), "--cond", str(cond), "--out", str(out),
                         "--prob", str(prob), "--seed", str(seed)]) == 0
        return [json.loads(line) for line in (out / "data.list").read_text().splitlines()]

    half = mixed(tmp_path / "a", 0.5)
    assert [e["key"] for e in half] == keys and [e["label"] for e in half] == [i % 2 for i in
                                                                                range(200)]
    swapped = [e["key"] for e in half if e["wav"].startswith("/c/")]
    assert 70 < len(swapped) < 110                         # about half of the 180 not clean
    assert not [k for k in swapped if int(k[1:]) % 10 == 0]  # a clean chain keeps its audio
    assert mixed(tmp_path / "b", 0.5) == half               # seeded
    assert mixed(tmp_path / "c", 0.5, seed=8) != half
    assert all(e["wav"].startswith("/c/") == (int(e["key"][1:]) % 10 != 0)
               for e in mixed(tmp_path / "d", 1.0))
    assert (tmp_path / "a" / "text").read_text() == (src / "text").read_text()
    assert "utterances heard as their condition copy" in capsys.readouterr().out
    (cond / "wav.scp").write_text("u000 /c/u000.wav\n")     # copies missing
    with pytest.raises(SystemExit, match="has no condition copy"):
        mixed(tmp_path / "e", 1.0)
