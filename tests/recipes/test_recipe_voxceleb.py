"""egs/voxceleb/v2 end to end on a miniature VoxCeleb in the real directory layout
(voxceleb1/wav/<spk>/<video>/<n>.wav, voxceleb2/dev/aac/... converted to WAV, the
official trial-list formats) with miniature MUSAN and RIRS_NOISES archives (a tar.gz and
a zip, md5-checked by stage -1): the real run.sh from stage -1 to 6 with a tiny model on
one process. Also fetch_corpus's md5 and zip handling and the corpus checks of stage 0."""
import hashlib
import json
import os
import re
import subprocess
import sys
import tarfile
import zipfile

import numpy as np
import pytest
import soundfile as sf

from speaker_data import RATE, speaker_params, voice_wave
from process_tree import run_tree

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RECIPE = os.path.join(ROOT, "egs", "voxceleb", "v2")
ENV = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")

VOX1_DEV = ["id10001", "id10002", "id10003"]
VOX1_TEST = ["id10270", "id10271", "id10272"]       # the Vox1-O speakers
VOX2 = [f"id{n:05d}" for n in (12, 15, 17, 19, 20, 21)]
TINY = ("model.num_blocks=[1,1] model.stage_strides=[1,2] model.base_channels=4 "
        "model.embed_dim=16 task.chunk_frames=50 task.eval_max_frames=200 "
        "dataset.batch_size=8 dataset.num_workers=0 training.max_epoch=2 "
        "optim.scheduler.warmup_steps=2 training.use_amp=false training.log_interval=2")
TINY_LM = "training.max_epoch=1 task.chunk_frames=100 dataset.batch_size=8"


def _wav(path, wave):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    sf.write(path, np.clip(wave, -1, 1).astype(np.float32), RATE, subtype="PCM_16")


def build_voxceleb(root, videos=2, utts=2):
    """voxceleb1/wav/... and voxceleb2/dev/aac/... (WAV, as after conversion); returns
    {speaker: [trial names spk/video/n.wav]} of VoxCeleb1."""
    rng = np.random.default_rng(5)
    vox1 = {}
    for i, spk in enumerate(VOX1_DEV + VOX1_TEST + VOX2):
        pitch, formants = speaker_params(i)
        tree = os.path.join(root, "voxceleb2", "dev", "aac") if spk in VOX2 else \
            os.path.join(root, "voxceleb1", "wav")
        for v in range(videos):
            video = f"{spk[-3:]}vid{v}XyZ"
            for u in range(1, utts + 1 + (spk in VOX2)):
                name = f"{spk}/{video}/{u:05d}.wav"
                _wav(os.path.join(tree, name), voice_wave(rng, pitch, formants,
                                                          float(rng.uniform(1.0, 2.0))))
                if spk not in VOX2:
                    vox1.setdefault(spk, []).append(name)
    return vox1


def write_trials(meta, vox1):
    """The three official lists, VoxCeleb form, over the miniature VoxCeleb1."""
    os.makedirs(meta, exist_ok=True)
    def pairs(speakers):
        names = [n for s in speakers for n in vox1[s]]
        return [f"{int(a.split('/')[0] == b.split('/')[0])} {a} {b}\n"
                for i, a in enumerate(names) for b in names[i + 1:]]
    lists = {"veri_test2.txt": pairs(VOX1_TEST), "list_test_all2.txt": pairs(VOX1_DEV + VOX1_TEST),
             "list_test_hard2.txt": pairs(VOX1_DEV)}
    for name, rows in lists.items():
        with open(os.path.join(meta, name), "w") as f:
            f.writelines(rows)
    return lists


def build_noise_archives(tmp):
    """musan.tar.gz (noise/, music/ with a 20 s file, speech/) and rirs_noises.zip (small,
    medium and large rooms) in tmp/download; a checksums file with their md5s."""
    rng = np.random.default_rng(9)
    src = tmp / "noise_src"
    _wav(str(src / "musan/noise/free-sound/noise-free-sound-0000.wav"),
         0.1 * rng.standard_normal(3 * RATE))
    _wav(str(src / "musan/music/fma/music-fma-0000.wav"),
         0.2 * np.sin(2 * np.pi * 440 * np.arange(20 * RATE) / RATE))
    _wav(str(src / "musan/speech/librivox/speech-librivox-0000.wav"),
         voice_wave(rng, 120.0, [500, 1500, 2500], 4.0))
    for room in ("smallroom", "mediumroom", "largeroom"):
        rir = np.zeros(RATE // 4)
        rir[0] = 1.0
        rir[1:] = 0.3 * rng.standard_normal(len(rir) - 1) * np.exp(-np.arange(1, len(rir)) / 800)
        _wav(str(src / f"RIRS_NOISES/simulated_rirs/{room}/Room001/Room001-00001.wav"), rir)
    dl = tmp / "download"
    dl.mkdir()
    with tarfile.open(dl / "musan.tar.gz", "w:gz") as tar:
        tar.add(src / "musan", arcname="musan")
    with zipfile.ZipFile(dl / "rirs_noises.zip", "w") as zf:
        for d, _, files in os.walk(src / "RIRS_NOISES"):
            for f in files:
                path = os.path.join(d, f)
                zf.write(path, os.path.relpath(path, src))
    checksums = tmp / "checksums.txt"
    checksums.write_text("".join(
        f"{hashlib.md5((dl / n).read_bytes()).hexdigest()}  {n}\n"
        for n in ("musan.tar.gz", "rirs_noises.zip")))
    return dl, checksums


def read_table(path):
    with open(path) as f:
        return dict(line.rstrip("\n").split(" ", 1) for line in f if line.strip())


@pytest.fixture(scope="module")
def recipe_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("voxceleb")
    vox1 = build_voxceleb(str(tmp / "corpora"))
    lists = write_trials(str(tmp / "meta"), vox1)
    dl, checksums = build_noise_archives(tmp)
    cmd = ["bash", os.path.join(RECIPE, "run.sh"),
           "--voxceleb1", tmp / "corpora" / "voxceleb1", "--voxceleb2", tmp / "corpora" / "voxceleb2",
           "--trials-dir", tmp / "meta", "--allow-partial", "true",
           "--download-dir", dl, "--noise-corpus-dir", tmp / "noise", "--checksum-file", checksums,
           "--data", tmp / "data", "--exp", tmp / "exp", "--nj", "2",
           "--average-num", "2", "--lm-average-num", "1", "--cohort-utts-per-spk", "2",
           "--as-norm-top", "3", "--train-overrides", TINY, "--lm-train-overrides", TINY_LM]
    result = run_tree(cmd, 900, env=ENV)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    return tmp, vox1, lists, result


def test_stages_run_in_order(recipe_run):
    _, _, _, result = recipe_run
    stages = re.findall(r"^stage (-?\d+):", result.stdout, flags=re.M)
    # Stage 2 (global CMVN) is no step of a speaker recipe.
    assert sorted(set(stages), key=int) == [str(s) for s in (-1, 0, 1, 3, 4, 5, 6)], stages


def test_kaldi_dirs_and_trial_lists(recipe_run):
    tmp, vox1, lists, _ = recipe_run
    data = tmp / "data"
    expected = {"vox2_dev": VOX2, "vox1": VOX1_DEV + VOX1_TEST, "vox1_test": VOX1_TEST}
    for name, speakers in expected.items():
        d = data / name
        check = subprocess.run([sys.executable, "-m", "toolkit.bin.validate_data_dir", str(d)],
                               capture_output=True, text=True, env=ENV)
        assert check.returncode == 0, check.stderr
        utt2spk = read_table(d / "utt2spk")
        assert sorted(set(utt2spk.values())) == sorted(speakers)
        wavs = read_table(d / "wav.scp")
        for utt, path in wavs.items():
            spk, video, n = utt.split("-")
            assert path.endswith(f"{spk}/{video}/{n}.wav") and utt2spk[utt] == spk
        assert read_table(d / "spk2utt").keys() == set(speakers)
    assert len(read_table(data / "vox1" / "wav.scp")) == sum(len(v) for v in vox1.values())
    for name, official in (("vox1_O", "veri_test2.txt"), ("vox1_E", "list_test_all2.txt"),
                           ("vox1_H", "list_test_hard2.txt")):
        assert (data / "trials" / f"{name}.txt").read_text() == "".join(lists[official])
    # Labels: training speakers against the inventory; the others against their own lists.
    inventory = (data / "dict" / "speakers.txt").read_text().split()
    assert inventory == sorted(VOX2)
    for e in map(json.loads, (data / "vox2_dev" / "data.list").read_text().splitlines()):
        assert inventory[e["label"]] == e["spk"]
    test_list = (data / "vox1" / "data.list").read_text().splitlines()
    assert len(test_list) == len(read_table(data / "vox1" / "wav.scp"))


def test_noise_and_rir_lists(recipe_run):
    tmp, _, _, result = recipe_run
    assert "md5 verified" in result.stderr
    musan = [json.loads(l) for l in (tmp / "data" / "noise" / "musan.list").read_text().splitlines()]
    kinds = {e["kind"] for e in musan}
    assert kinds == {"noise", "music", "babble"}
    music = [e for e in musan if e["kind"] == "music"]
    # The 20 s music file in 8 s pieces (the 4 s tail kept), written once.
    assert [e["duration"] for e in music] == [8.0, 8.0, 4.0]
    assert all(os.path.exists(e["wav"]) and "musan_segments" in e["wav"] for e in music)
    rirs = [json.loads(l) for l in (tmp / "data" / "noise" / "rirs.list").read_text().splitlines()]
    assert sorted(e["wav"].split(os.sep)[-3] for e in rirs) == ["mediumroom", "smallroom"]
    config = (tmp / "exp" / "config.yaml").read_text()
    assert "musan.list" in config and "rirs.list" in config


def test_training_averaging_and_large_margin_fine_tuning(recipe_run):
    tmp, _, _, result = recipe_run
    import torch
    exp, lm = tmp / "exp", tmp / "exp_lm"
    avg = torch.load(exp / "avg_2.pt", weights_only=True)
    last_two = sorted(int(p.name[5:-3]) for p in exp.glob("ckpt-*.pt"))[-2:]
    assert sorted(c["step"] for c in avg["averaged_from"]) == last_two
    assert avg["task_state"]["inventory"] == sorted(VOX2)
    # The fine-tuning started from the average with the trained head (same speakers).
    assert f"initialised model, head from {exp / 'avg_2.pt'}" in result.stderr
    assert "head is re-initialised" not in result.stderr
    import yaml
    lm_cfg = yaml.safe_load((lm / "config.yaml").read_text())
    assert lm_cfg["task"]["chunk_frames"] == 100               # the test's override on top
    assert lm_cfg["head"]["margin"]["initial"] == lm_cfg["head"]["margin"]["final"] == 0.5
    assert lm_cfg["model"]["base_channels"] == 4               # the base run's architecture
    assert lm_cfg["dataset"]["speed_perturb"] == []
    assert (lm / "avg_1.pt").exists()


def test_exports_embeddings_and_summary(recipe_run):
    tmp, vox1, _, result = recipe_run
    n_vox1 = sum(len(v) for v in vox1.values())
    for name in ("exp", "exp_lm"):
        sys_dir = tmp / name
        for f in ("model.onnx", "model.zip", "model.safetensors", "config.json"):
            assert (sys_dir / "export" / f).exists(), (name, f)
        emb = sys_dir / "embeddings"
        assert len((emb / "vox1" / "embeddings.scp").read_text().splitlines()) == n_vox1
        # Cohort: every training speaker, from at most 2 utterances each.
        assert len((emb / "cohort" / "speaker_embeddings.scp").read_text().splitlines()) == len(VOX2)
        assert len((emb / "cohort" / "embeddings.scp").read_text().splitlines()) == 2 * len(VOX2)
        summary = (sys_dir / "score" / "summary.txt").read_text().splitlines()
        assert len(summary) == 6
        for trials in ("vox1_O", "vox1_E", "vox1_H"):
            plain = f"{name} {trials} cosine: EER "
            normed = f"{name} {trials} cosine + AS-Norm top 3: EER "
            assert sum(l.startswith(plain) for l in summary) == 1
            assert sum(l.startswith(normed) for l in summary) == 1
            assert (sys_dir / "score" / trials / "det.png").exists()
        for line in summary:
            assert line in result.stdout and "minDCF(0.01)" in line
    assert result.stderr.count("parity onnx vs PyTorch") == 2


# ------------------------------------------------------------------ stage -1 and 0 checks

def fetch(tmp, archive, checksums, marker):
    return subprocess.run([sys.executable, "-m", "toolkit.bin.fetch_corpus", "--url",
                           "http://127.0.0.1:9/none", "--archive", str(archive), "--corpus-dir",
                           str(tmp / "out"), "--marker", marker, "--checksums", str(checksums)],
                          capture_output=True, text=True, env=ENV, timeout=60)


def test_fetch_corpus_md5_and_zip(tmp_path):
    src = tmp_path / "a.zip"
    with zipfile.ZipFile(src, "w") as zf:
        zf.writestr("RIRS/x.txt", "x")
    digest = hashlib.md5(src.read_bytes()).hexdigest()
    bad = tmp_path / "bad.txt"
    bad.write_text("0" * 32 + "  a.zip\n")
    result = fetch(tmp_path, src, bad, "RIRS/x.txt")
    assert result.returncode == 1 and "md5 mismatch" in result.stderr
    assert not (tmp_path / "out" / "RIRS").exists()
    good = tmp_path / "good.txt"
    good.write_text(f"{digest}  a.zip\n")
    result = fetch(tmp_path, src, good, "RIRS/x.txt")
    assert result.returncode == 0 and f"md5 verified: {digest}" in result.stderr
    assert (tmp_path / "out" / "RIRS" / "x.txt").read_text() == "x"
    # A member leaving the target directory is refused, nothing extracted.
    evil = tmp_path / "evil.zip"
    with zipfile.ZipFile(evil, "w") as zf:
        zf.writestr("ok.txt", "fine")
        zf.writestr("../escaped.txt", "no")
    (tmp_path / "evil.txt").write_text(f"{hashlib.md5(evil.read_bytes()).hexdigest()}  evil.zip\n")
    result = fetch(tmp_path, evil, tmp_path / "evil.txt", "ok.txt")
    assert result.returncode == 1 and "unsafe path" in result.stderr
    assert not (tmp_path / "escaped.txt").exists() and not (tmp_path / "out" / "ok.txt").exists()


def prepare(tmp, *extra):
    return subprocess.run([sys.executable, os.path.join(RECIPE, "local", "prepare_voxceleb.py"),
                           "--voxceleb1", str(tmp / "voxceleb1"), "--voxceleb2",
                           str(tmp / "voxceleb2"), "--out-dir", str(tmp / "data"),
                           "--trials-dir", str(tmp / "meta"), *extra],
                          capture_output=True, text=True, env=ENV, timeout=120)


def test_prepare_checks_counts_trials_and_m4a(tmp_path):
    vox1 = build_voxceleb(str(tmp_path), videos=1, utts=2)
    lists = write_trials(str(tmp_path / "meta"), vox1)
    result = prepare(tmp_path)
    assert result.returncode != 0
    assert "vox1: 6 speakers, 12 utterances (published: 1,251 / 153,516) -- MISMATCH" in result.stderr
    assert "--allow-partial" in result.stderr
    # A trial naming an utterance that is not there: an error, or left out when partial.
    with open(tmp_path / "meta" / "veri_test2.txt", "a") as f:
        f.write("0 id10270/absent/00001.wav id10271/270vid0XyZ/00001.wav\n")
    result = prepare(tmp_path, "--allow-partial")
    assert result.returncode == 0, result.stderr
    total = len(lists["veri_test2.txt"]) + 1
    assert f"1 of {total} trials name utterances not in VoxCeleb1 here" in result.stderr
    assert "absent" not in (tmp_path / "data" / "trials" / "vox1_O.txt").read_text()
    # VoxCeleb2 as downloaded (m4a only): stop with the conversion command.
    aac = tmp_path / "voxceleb2" / "dev" / "aac"
    for wav in list(aac.rglob("*.wav")):
        wav.with_suffix(".m4a").write_bytes(b"\0")
        wav.unlink()
    result = prepare(tmp_path, "--allow-partial")
    assert result.returncode != 0 and "m4a files only" in result.stderr
    assert "ffmpeg -nostdin" in result.stderr and "-ar 16000" in result.stderr


def test_recipe_needs_the_corpus_dirs(tmp_path):
    result = subprocess.run(["bash", os.path.join(RECIPE, "run.sh"), "--stage", "0",
                             "--data", str(tmp_path / "data")],
                            capture_output=True, text=True, env=ENV, timeout=120)
    assert result.returncode != 0 and "needs --voxceleb1 DIR and --voxceleb2 DIR" in result.stderr
