"""egs/libritts/codec end to end on a miniature LibriTTS in the real layout, downloaded by
stage -1 from a local HTTP server as one sha256-checked .tar.gz per subset: the real
run.sh from stage -1 to 6 (24 kHz, a tiny codec on one process), a rerun that downloads
nothing, the 16 kHz variant training on the same 24 kHz data, the corpus fetcher
continuing an interrupted download (or starting over where the server ignores Range),
and the published-scale configs at the sizes the README gives."""
import json
import os
import re
import subprocess
import sys

import pytest

from libritts_data import (EMPTY_UTT, LAYOUT, ORIGINAL_ONLY_UTT, ArchiveServer,
                           build_libritts, libritts_archives)
from process_tree import run_tree

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RECIPE = os.path.join(ROOT, "egs", "libritts", "codec")
ENV = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
# conf/codec_24k.yaml shrunk: 4 steps (the adversarial phase in the last), a checkpoint per
# step for the averaging, 0.25 s segments.
TINY = " ".join([
    "training.max_steps=4", "training.save_interval_steps=1", "training.val_interval_steps=2",
    "training.log_interval=1", "model.channels=4", "model.dilations=[1]",
    "model.codebook_size=64", "task.segment_seconds=0.25", "task.eval_seconds=0.5",
    "dataset.batch_size=2", "dataset.num_workers=1", "discriminator.mpd.channels_scale=0.03"])


def subset_of(utt):
    speaker = utt.split("_")[0]
    return next(s for s, chapters in LAYOUT.items() if any(c[0] == speaker for c in chapters))


def read_table(path):
    with open(path) as f:
        return dict(line.rstrip("\n").split(" ", 1) for line in f if line.strip())


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("libritts")
    kept = build_libritts(str(tmp / "source"))
    digests = libritts_archives(str(tmp / "source"), str(tmp / "site"))
    checksums = tmp / "checksums.txt"
    checksums.write_text("".join(f"{d}  {n}\n" for n, d in sorted(digests.items())))
    server = ArchiveServer(str(tmp / "site"))
    yield tmp, kept, checksums, server
    server.close()


def run_recipe(tmp, server, checksums, *args, timeout=600):
    cmd = ["bash", os.path.join(RECIPE, "run.sh"), "--base-url", server.url,
           "--download-dir", tmp / "downloads", "--corpus-dir", tmp / "corpus",
           "--checksum-file", checksums, "--data", tmp / "data", "--nj", "1",
           "--num-procs", "1", "--dev-utts", "3", "--average-num", "2", "--eval-n-q", "2",
           "--eval-max-utts", "2", "--baselines", "mulaw:1200:2", *args]
    return run_tree(cmd, timeout, env=ENV)


@pytest.fixture(scope="module")
def recipe_run(served):
    tmp, kept, checksums, server = served
    result = run_recipe(tmp, server, checksums, "--exp", tmp / "exp", "--train-overrides", TINY)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    return tmp, kept, result


def test_stages_run_in_order_and_archives_are_verified(served, recipe_run):
    tmp, _, result = recipe_run
    stages = re.findall(r"^stage (-?\d+):", result.stdout, flags=re.M)
    # Stage 2 (global CMVN) is no step of a codec recipe.
    assert stages == [str(s) for s in (-1, 0, 1, 3, 4, 5, 6)], stages
    assert result.stderr.count("sha256 verified") == len(LAYOUT)
    for subset in LAYOUT:
        assert (tmp / "corpus" / "LibriTTS" / subset).is_dir()
        assert (tmp / "downloads" / f"{subset}.tar.gz").exists()


def test_kaldi_dirs_follow_the_corpus(recipe_run):
    tmp, kept, result = recipe_run
    data = tmp / "data"
    train = {**kept["train-clean-100"], **kept["train-clean-360"]}
    expected = {"train": train, "test": kept["test-clean"]}
    for name, utts in expected.items():
        check = subprocess.run([sys.executable, "-m", "toolkit.bin.validate_data_dir",
                                str(data / name)], capture_output=True, text=True, env=ENV)
        assert check.returncode == 0, check.stdout + check.stderr
        wavs, text, utt2spk = (read_table(data / name / f) for f in ("wav.scp", "text", "utt2spk"))
        assert sorted(wavs) == sorted(utts)
        for utt, (speaker, normalized) in utts.items():
            assert utt2spk[utt] == speaker
            chapter = utt.split("_")[1]
            assert wavs[utt].endswith(f"/LibriTTS/{subset_of(utt)}/{speaker}/{chapter}/{utt}.wav")
            assert text[utt] == normalized        # the original where no normalized exists
    assert ORIGINAL_ONLY_UTT in read_table(data / "train" / "text")
    assert EMPTY_UTT not in read_table(data / "train" / "wav.scp")
    assert "1 empty WAVs left out" in result.stderr
    # dev: 3 of dev-clean's 4 utterances, both speakers kept.
    dev = read_table(data / "dev" / "utt2spk")
    assert len(dev) == 3 and set(dev.values()) == {"84", "174"}
    entries = [json.loads(l) for l in (data / "train" / "data.list").read_text().splitlines()]
    assert len(entries) == len(train) and all(e["duration"] > 0.9 for e in entries)


def test_training_export_and_evaluation_at_24k(recipe_run):
    tmp, _, result = recipe_run
    exp = tmp / "exp"
    import yaml
    cfg = yaml.safe_load((exp / "config.yaml").read_text())
    assert cfg["dataset"]["sample_rate"] == cfg["model"]["sample_rate"] == 24000
    from toolkit.trainer.checkpoint import list_checkpoints
    assert max(c.step for c in list_checkpoints(str(exp))) == 4
    log = (exp / "log" / "train.rank0.log").read_text()
    # The adversarial phase begins at 70 % of 4 steps: the 4th step.
    assert "75 frames/s" in log and "d_loss" in log.split("step 4/4")[1].split("\n")[0]
    assert "d_loss" not in log.split("step 3/4")[1].split("\n")[0]
    from toolkit.export import read_metadata
    meta = read_metadata(str(exp / "export" / "encoder.onnx"))
    assert meta["sample_rate"] == 24000 and meta["bitrate"] == 3600.0   # 75 x 8 x 6 bits
    rows = [l for l in (exp / "eval" / "test" / "results.md").read_text().splitlines()
            if l.startswith("| ") and "---" not in l][1:]
    assert [r.split("|")[1].strip() for r in rows] == ["codec", "codec n_q=2",
                                                       "mu-law 1.2 kHz 2 bit"]
    assert [r.split("|")[2].strip() for r in rows] == ["3.6", "0.9", "2.4"]
    assert all(r in result.stdout for r in rows)


def test_rerun_downloads_nothing_and_16k_variant_trains(served, recipe_run):
    tmp, kept, checksums, server = served
    before = len(server.requests)
    again = run_recipe(tmp, server, checksums, "--stop-stage", "-1")
    assert again.returncode == 0, again.stderr[-3000:]
    assert len(server.requests) == before
    assert again.stderr.count("nothing to download") == len(LAYOUT)
    result = run_recipe(tmp, server, checksums, "--exp", tmp / "exp16", "--config",
                        "conf/codec_16k.yaml", "--stage", "3", "--stop-stage", "3",
                        "--train-overrides",
                        TINY.replace("training.max_steps=4", "training.max_steps=2"))
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    log = (tmp / "exp16" / "log" / "train.rank0.log").read_text()
    assert "50 frames/s" in log and "12 x 64 codes" in log
    assert "training finished: 2 steps" in log


@pytest.mark.parametrize("ranges", [True, False], ids=["range", "no-range"])
def test_fetch_continues_a_partial_download(served, tmp_path, ranges):
    tmp, _, checksums, _ = served
    server = ArchiveServer(str(tmp / "site"), ranges=ranges)
    try:
        name = "dev-clean.tar.gz"
        whole = (tmp / "site" / name).read_bytes()
        archive = tmp_path / "dl" / name
        archive.parent.mkdir()
        (tmp_path / "dl" / (name + ".part")).write_bytes(whole[:len(whole) // 3])
        result = subprocess.run(
            [sys.executable, "-m", "toolkit.bin.fetch_corpus", "--url", f"{server.url}/{name}",
             "--archive", str(archive), "--corpus-dir", str(tmp_path / "corpus"),
             "--marker", "LibriTTS/dev-clean", "--checksums", str(checksums)],
            capture_output=True, text=True, env=ENV, timeout=120)
        assert result.returncode == 0, result.stderr
        assert archive.read_bytes() == whole and "sha256 verified" in result.stderr
        assert server.requests == [(f"/{name}", f"bytes={len(whole) // 3}-")]
        assert ("resuming" in result.stderr) == ranges
        assert (tmp_path / "corpus" / "LibriTTS" / "dev-clean" / "84").is_dir()
    finally:
        server.close()


def test_gpu_configs_are_published_scale():
    import torch
    import toolkit.tasks  # noqa: F401  (registers the codec task)
    from toolkit.config import TASKS, load_config
    sizes = {}
    for name in ("codec_24k_gpu.yaml", "codec_16k_gpu.yaml"):
        cfg = load_config(os.path.join(RECIPE, "conf", name))
        task = TASKS.get("codec")
        with torch.device("meta"):
            modules = task(cfg, None).build_modules()
        sizes[name] = (sum(p.numel() for p in modules["generator"].parameters()),
                       modules["generator"].bitrate())
    readme = open(os.path.join(RECIPE, "README.md")).read()
    for name, (params, bitrate) in sizes.items():
        row = next(l for l in readme.splitlines() if f"`conf/{name}`" in l and "|" in l)
        assert f"{params:,}" in row and f"{bitrate / 1000:g} kbit/s" in row, (name, params, row)
        assert 70e6 < params < 78e6         # DAC's widths
