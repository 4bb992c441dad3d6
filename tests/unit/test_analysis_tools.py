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
