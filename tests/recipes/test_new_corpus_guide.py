"""docs/new_corpus.md, performed literally: copy the Hey Snips recipe, write
local/prepare_data.py from the guide, replace its corpus stages by the guide's stage 0,
run all stages."""
import json
import os
import re
import subprocess

import numpy as np
import soundfile as sf

from kws_data import make_wave
from process_tree import run_tree

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GUIDE = open(os.path.join(ROOT, "docs", "new_corpus.md"), encoding="utf-8").read()


def guide_block(after: str) -> str:
    """The first fenced code block after the heading that contains `after`."""
    start = GUIDE.index(after)
    match = re.search(r"```(?:python|bash)\n(.*?)```", GUIDE[start:], re.S)
    return match.group(1)


def make_user_corpus(root):
    """A folder of WAVs (22.05 kHz, some stereo) and a labels.tsv, as in the guide."""
    rng = np.random.default_rng(3)
    os.makedirs(os.path.join(root, "audio"))
    lines = []
    for split, n in (("train", 60), ("dev", 16), ("test", 20)):
        for i in range(n):
            positive = i % 3 == 0
            wave = make_wave(rng, positive, float(rng.uniform(0.9, 1.8)))
            name = f"audio/{split}{i:03d}.wav"
            data = np.stack([wave, wave], axis=1) if i % 5 == 0 else wave
            sf.write(os.path.join(root, name), data, 16000, subtype="PCM_16")
            text = "hey robot turn on the light" if positive else "what a lovely day"
            lines.append(f"{name}\t{split}\t{text}\n")
    with open(os.path.join(root, "labels.tsv"), "w") as f:
        f.writelines(lines)


def test_guide_walk(tmp_path):
    # A tree like the repo's: egs/<name>/s0 next to utils/ and tools/ (linked).
    tree = tmp_path / "repo"
    (tree / "egs").mkdir(parents=True)
    for name in ("utils", "tools", "toolkit", "setup.py"):
        os.symlink(os.path.join(ROOT, name), tree / name)
    corpus = tmp_path / "my_corpus"
    make_user_corpus(str(corpus))

    # 1. Copy the recipe (cp -r keeps the utils link as a link).
    (tree / "egs" / "my_corpus").mkdir()
    recipe = tree / "egs" / "my_corpus" / "s0"
    subprocess.run(["cp", "-r", os.path.join(ROOT, "egs", "hey_snips", "s0"), str(recipe)],
                   check=True)
    subprocess.run(["rm", "-rf", str(recipe / "data"), str(recipe / "exp"),
                    str(recipe / "RESULTS.md")], check=True)
    # 2. local/prepare_data.py, verbatim from the guide.
    (recipe / "local" / "prepare_data.py").write_text(guide_block("## 2. Write"))
    # 3. The options, and the guide's stage 0 in place of the corpus stages.
    run_sh = (recipe / "run.sh").read_text()
    run_sh, n = re.subn(r'^corpus_dir=.*$', f'corpus_dir={corpus}\nkeyword="hey robot"', run_sh,
                        count=1, flags=re.M)
    assert n == 1
    run_sh, n = re.subn(r"^download_dir=.*\n", "", run_sh, count=1, flags=re.M)
    assert n == 1
    run_sh, n = re.subn(r"# --- corpus: stages -1 and 0.*?# --- end of the corpus stages ---\n",
                        guide_block("## 3. Replace"), run_sh, flags=re.S)
    assert n == 1
    (recipe / "run.sh").write_text(run_sh)
    # 5. Run all stages (small training for the test).
    result = run_tree(["bash", "run.sh", "--train-overrides",
                       "training.max_epoch=4 dataset.batch_size=8 optim.lr=0.005 "
                       "optim.scheduler.warmup_steps=2", "--average-num", "2"],
                      600, cwd=recipe)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    assert re.findall(r"^stage (-?\d+):", result.stdout, flags=re.M) == [
        "0", "1", "2", "3", "4", "5", "6", "6"]     # stage 6 also says: no utt2spk
    data = recipe / "data"
    assert (data / "dict" / "keywords.txt").read_text() == "hey robot\n"
    assert len((data / "train" / "wav.scp").read_text().splitlines()) == 60
    labels = [line for line in (data / "train" / "data.list").read_text().splitlines()]
    assert sum('"label": 0' in line for line in labels) == 20
    assert (recipe / "exp" / "ds_tcn" / "export" / "model.onnx").exists()
    summary = (recipe / "exp" / "ds_tcn" / "score" / "summary.txt").read_text()
    assert summary.startswith("hey_robot: FRR") and summary.strip() in result.stdout
    # No utt2spk in this corpus: the FRR intervals resample utterances.
    det = json.loads((recipe / "exp" / "ds_tcn" / "score" / "det.json").read_text())
    assert det["bootstrap"]["unit"] == "utterance"
    # Something was learned: the dev loss ends well below its first value (an untrained
    # detector keeps it).
    log = (recipe / "exp" / "ds_tcn" / "log" / "train.rank0.log").read_text()
    losses = [float(v) for v in re.findall(r" dev: loss ([-0-9.]+)", log)]
    assert len(losses) == 4 and losses[-1] < 0.8 * losses[0], losses
