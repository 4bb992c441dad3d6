"""egs/voice_bank/speaker_encoder end to end at a tiny size through the real run.sh (stages
0-8), its default (v2) path: espeak-ng speakers, one outside engine (so no trials_<engine>
list exists: stage 6 scores the lists that are there) and its short noisy crops, the room
and noise banks, training on audio augmented on the fly through torchrun (from scratch at
this width: v1's weights do not fit it), averaging, export, scoring with and without
AS-Norm, Resemblyzer beside it, and packaging with the cohort into the run's own exp dir,
never over the shipped toolkit/pretrained model unless asked (--ship true)."""
import json
import os
import re

import numpy as np
import pytest

from process_tree import run_tree

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RECIPE = os.path.join(ROOT, "egs", "voice_bank", "speaker_encoder")
NAME = "ecapa-voicebank-v2"
ENV = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
# The recipe's v2 config at a tiny width, from scratch (a higher rate, no margin), fewer crops
# in rooms and noise:
# 50 short epochs (450 steps) are seconds and enough to separate the training speakers.
TINY_TRAIN = ("model.channels=32 model.mfa_channels=64 model.se_bottleneck=8 "
              "model.attention_bottleneck=8 model.embed_dim=32 task.chunk_frames=100 "
              "task.eval_max_frames=300 dataset.batch_size=16 training.max_epoch=50 "
              "optim.scheduler.warmup_steps=5 training.log_interval=5 "
              "training.init_checkpoint= dataset.reverb.prob=0.2 dataset.noise.prob=0.2 "
              "optim.lr=0.005 head.margin=0.0")
TINY = ["--engines", "espeak", "--blends", "0", "--espeak-utts", "6",
        "--corpus-opts", "--num-train-speakers 24 --num-dev-speakers 3 --dev-utts 2 "
                         "--num-test-speakers 6 --test-utts 2",
        "--outside-engines", "espeak", "--outside-utts", "4",
        "--outside-opts", "--num-test-speakers 6",
        "--num-procs", "1", "--average-num", "2", "--as-norm-top", "8",
        "--num-rirs", "6", "--num-noise", "6",
        "--cohort-utts-per-spk", "2", "--train-overrides", TINY_TRAIN]


def run_recipe(tmp, *args, timeout=600):
    cmd = ["bash", os.path.join(RECIPE, "run.sh"), "--data", str(tmp / "data"),
           "--exp", str(tmp / "exp"), *TINY, *args]
    return run_tree(cmd, timeout, env=ENV)


def shipped_state(name="ecapa-voicebank-v1"):
    """What the checkout ships: the model names and each file of `name` (size, mtime)."""
    from toolkit import pretrained
    model = os.path.join(pretrained.ROOT, name)
    return sorted(os.listdir(pretrained.ROOT)), {
        f: (os.stat(os.path.join(model, f)).st_size, os.stat(os.path.join(model, f)).st_mtime_ns)
        for f in sorted(os.listdir(model))}


def read_table(path):
    with open(path) as f:
        return dict(line.split(None, 1) for line in f if line.strip())


@pytest.fixture(scope="module")
def recipe_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("voice_bank_speaker")
    before = shipped_state()
    result = run_recipe(tmp)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    return tmp, result, before


def test_every_stage_runs_with_one_outside_engine(recipe_run):
    tmp, result, _ = recipe_run
    data, exp = tmp / "data", tmp / "exp"
    assert re.findall(r"^stage (\d+):", result.stdout, flags=re.M) == \
        [str(s) for s in (0, 1, 3, 4, 5, 6, 7, 8)]
    # One engine outside: `trials` alone, the case where trials_* matched nothing.
    outside = data / "outside" / "test"
    assert (outside / "trials").exists() and not list(outside.glob("trials_*"))
    utt2spk = {k: v.strip() for k, v in read_table(outside / "utt2spk").items()}
    train = {v.strip() for v in read_table(data / "train" / "utt2spk").values()}
    assert len(utt2spk) == 6 * 4 and len(set(utt2spk.values())) == 6
    assert not set(utt2spk.values()) & train              # held-out voices only
    # The audio list's inventory: the training voices; the banks it is augmented with.
    assert len((data / "dict" / "speakers_audio.txt").read_text().split()) == len(train)
    assert len((data / "aug" / "rirs.list").read_text().splitlines()) == 6
    assert len((data / "aug" / "noise.list").read_text().splitlines()) == 6
    short = data / "outside_short" / "test"
    assert (short / "trials").read_text() == (outside / "trials").read_text()
    assert read_table(short / "utt2spk") == read_table(outside / "utt2spk")
    for f in ("model.onnx", "model.zip", "model.safetensors", "config.json"):
        assert (exp / "export" / f).exists(), f
    assert len((exp / "embeddings" / "outside" / "embeddings.scp").read_text().splitlines()) == 24
    summary = (exp / "score" / "summary.txt").read_text().splitlines()
    assert [line.split(":")[0] for line in summary] == [
        f"{NAME} outside_trials cosine", f"{NAME} outside_trials cosine + AS-Norm top 8",
        f"{NAME} outside_short_trials cosine", f"{NAME} outside_short_trials cosine + AS-Norm top 8"]
    for line in summary:
        assert re.search(r"EER \d+\.\d\d% minDCF\(0\.01\) \d\.\d{3} minDCF\(0\.05\) \d\.\d{3} "
                         r"over 276 trials \(36 target\)$", line), line
    table = (exp / "resemblyzer" / "results.md").read_text()
    assert "| trials | resemblyzer |" in table and "| trials | exp: cosine |" in table
    assert "| outside_short_trials | resemblyzer |" in table
    assert "| outside_short_trials | exp: cosine |" in table


def test_the_encoder_learned_its_training_speakers(recipe_run):
    """Cosine EER among the training speakers' cohort embeddings (stage 6): 25 % here, 34 %
    for the same network untrained (optim.lr=0), 50 % for a pipeline that lost the labels
    (21 % without rooms and noise: 1 s crops of 24 speakers at this width are few). And the
    AAM head's accuracy on the last augmented crops: 1/24 untrained, above 0.5 trained."""
    from toolkit.bin.score_speaker import load_vectors
    from toolkit.tasks.speaker.scoring import compute_eer
    tmp, result, _ = recipe_run
    log = (tmp / "exp" / "log" / "train.rank0.log").read_text()
    assert "training finished" in log
    accuracy = [float(a) for a in re.findall(r" acc (\d\.\d+) ", log)]
    assert accuracy and np.mean(accuracy[-3:]) > 0.5, accuracy[-3:]
    vectors = load_vectors(str(tmp / "exp" / "embeddings" / "cohort" / "embeddings.scp"))
    speaker = {k: v.strip() for k, v in read_table(tmp / "data" / "train" / "utt2spk").items()}
    keys = sorted(vectors)
    assert len(keys) == 24 * 2
    x = np.stack([vectors[k] for k in keys])
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    i, j = np.triu_indices(len(keys), 1)
    same = np.array([speaker[keys[a]] == speaker[keys[b]] for a, b in zip(i, j)], dtype=int)
    eer = compute_eer((x @ x.T)[i, j], same)[0]
    assert eer < 0.30, eer


def test_stage8_packages_into_exp_and_leaves_the_shipped_model(recipe_run):
    from toolkit import pretrained
    from toolkit.tasks.speaker.embed import Embedder
    tmp, result, before = recipe_run
    exp = tmp / "exp"
    out = exp / "pretrained" / NAME
    assert f"stage 8: packaging {NAME} into {out}" in result.stdout
    assert shipped_state() == before, "stage 8 touched the shipped model"
    # A model like a shipped one: the card's digests match (the cohort's too), and it embeds
    # as the export.
    pretrained.weights(NAME, root=str(exp / "pretrained"))
    pretrained.verify_files(NAME, str(exp / "pretrained"), (pretrained.COHORT,))
    from toolkit.tasks.kws.enrol import load_cohort
    cohort = load_cohort(str(out / "model.safetensors"))
    assert cohort.shape == (24, 32)
    wav = json.loads((tmp / "data" / "outside" / "test" / "data.list").read_text()
                     .splitlines()[0])["wav"]
    packaged = Embedder.from_path(str(out / "model.safetensors")).embed(wav)
    exported = Embedder.from_path(str(exp / "export" / "model.onnx")).embed(wav)
    np.testing.assert_allclose(packaged, exported, atol=1e-4)
    # A rerun replaces the run's own package; a root that holds the name already is refused
    # in one line; --ship takes true or false, and is checked before any stage runs.
    again = run_recipe(tmp, "--stage", "8", timeout=120)
    assert again.returncode == 0, again.stderr[-3000:]
    assert shipped_state() == before
    taken = run_recipe(tmp, "--stage", "8", "--pretrained-root", str(exp / "pretrained"),
                       timeout=120)
    assert taken.returncode != 0 and "Traceback" not in taken.stderr
    assert f"{out} exists" in taken.stderr, taken.stderr[-2000:]
    for bad, says in ((["--ship", "yes"], "--ship yes: expected true or false"),
                      (["--ship", "true", "--pretrained-root", str(tmp)], "drop --pretrained-root")):
        refused = run_recipe(tmp, "--stage", "8", *bad, timeout=60)
        assert refused.returncode == 1 and says in refused.stderr, refused.stderr
        assert "stage 8" not in refused.stdout
