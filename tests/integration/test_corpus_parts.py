"""A corpus grows by parts (toolkit.bin.synth_codec_data --part K): a part holds training
speech alone, spoken by the training voices of the corpus of the same seed (never one it
holds out), with texts and utterance ids of its own; a finished part is left alone when
the corpus grows again; a part of a test-only corpus is refused."""
import os
import subprocess
import sys

from toolkit.data import kaldi
from toolkit.tasks.codec import corpus as codec
from toolkit.voicebank.corpus import open_engines

ARGS = ["--seed", "7", "--random-voices", "4", "--sentences", "1,1", "--no-noisy", "--nj", "1"]


def synth(out, *extra):
    return subprocess.run([sys.executable, "-m", "toolkit.bin.synth_codec_data", "--out-dir",
                           str(out), *ARGS, *extra], capture_output=True, text=True)


def inventory(path):
    with open(os.path.join(path, "voices.tsv"), encoding="utf-8") as f:
        rows = [line.rstrip("\n").split("\t") for line in f][1:]
    return {row[0]: row[1] for row in rows}


def test_parts_add_training_speech_from_the_training_voices(tmp_path):
    base, part1, part2 = tmp_path / "data", tmp_path / "part_1", tmp_path / "part_2"
    assert synth(base, "--num-train", "12", "--num-dev", "3", "--num-test", "3").returncode == 0
    for k, out in ((1, part1), (2, part2)):
        res = synth(out, "--part", str(k), "--num-train", "12")
        assert res.returncode == 0, res.stderr
    # the voice split of the corpus of seed 7, as its own planning makes it
    _, by_split, _ = codec.plan_corpus(7, codec.Sizes(12, 3, 3), (5.0, 25.0),
                                       open_engines(["espeak"]), 4, 0, (1, 1),
                                       str(tmp_path / "plan"))
    held_out = {v.spk for split in ("dev", "test") for v in by_split[split]}
    assert len(held_out) >= 8
    assert {s for s, split in inventory(base).items() if split != "train"} <= held_out
    texts = {}
    for out in (base, part1, part2):
        text = kaldi.read_table(os.path.join(out, "train", "text"))
        spk = kaldi.read_table(os.path.join(out, "train", "utt2spk"))
        assert len(text) == 12
        # no voice the corpus holds out speaks in any part
        assert not held_out & set(spk.values()), (out, spk)
        texts[str(out)] = text
    for out in (part1, part2):
        assert sorted(os.listdir(out)) == [".synth_codec_data.json", "train", "voices.tsv",
                                           "wavs"]
        assert set(inventory(out).values()) == {"train"}
    ids = [set(t) for t in texts.values()]
    assert not (ids[0] & ids[1]) and not (ids[0] & ids[2]) and not (ids[1] & ids[2])
    sentences = [set(t.values()) for t in texts.values()]
    assert len(sentences[1] - sentences[0]) >= 8 and sentences[1] != sentences[2]

    # growing again: the finished parts are not made again
    wav = os.path.join(part1, "wavs", "train", sorted(os.listdir(part1 / "wavs" / "train"))[0])
    before = os.stat(wav).st_mtime_ns
    res = synth(part1, "--part", "1", "--num-train", "12")
    assert res.returncode == 0 and "nothing to do" in res.stderr
    assert os.stat(wav).st_mtime_ns == before


def test_a_part_is_training_speech_only(tmp_path):
    res = synth(tmp_path / "p", "--part", "1", "--test-only")
    assert res.returncode == 2 and "part 1" in res.stderr
    res = synth(tmp_path / "p", "--part", "-1")
    assert res.returncode == 2 and "part -1" in res.stderr
