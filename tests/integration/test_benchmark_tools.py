"""The training benchmarks (tools/benchmarks/kws_throughput.py, trainer_memory.py) run end
to end on tiny corpora, so that a change of the trainer's log lines cannot break them
unnoticed: each must train, parse the trainer's summary and print a complete table."""
import json
import os
import subprocess
import sys

import pytest


from speaker_data import SpeakerCorpus

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BENCH = os.path.join(ROOT, "tools", "benchmarks")
sys.path.insert(0, BENCH)
from trainer_memory import parse_finished  # noqa: E402


def run_tool(*args, timeout=600, tmp_dir=None):
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    if tmp_dir:
        env["TMPDIR"] = tmp_dir
    env.pop("GLIBC_TUNABLES", None)
    proc = subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc.stdout


def rows_of(stdout):
    """The JSON rows a tool prints last."""
    return json.loads(stdout.strip().splitlines()[-1])


def test_finished_line_of_either_form_parses():
    """The line before and after it named the limit that ended the run (benchmarks
    compare commits on both sides of that change)."""
    tail = ("; checkpointing 0.10 s = 0.10% of wall time; peak RSS 0.91 GB (loader workers "
            "0.00 GB); CPU user 185 s, system 58 s")
    old = "training finished: 64 steps, 0:02:10 this run (0.49 steps/s)" + tail
    new = ("training finished: 64 steps (training.max_epoch=2 reached at step 64), 0:02:10 "
           "this run (0.49 steps/s)" + tail)
    for line in (old, new):
        found = parse_finished("noise\n" + line + "\n")
        assert found and found.groups() == ("64", "0:02:10", "0.49", "0.91", "0.00", "185",
                                            "58")
    assert parse_finished("training finished: soon") is None


def test_kws_throughput_measures_raw_and_feature_runs(tmp_path):
    """Both runs of the benchmark on tiny lists (real WAVs and their fbank features);
    `--build` is the wake-word recipe's stages 0-2, tested with the recipe. The trainer is
    started directly (--no-torchrun): the torchrun path of the measuring code
    (trainer_memory.train_and_measure, shared) is run by the two tests below."""
    from kws_data import make_datalist, write_keywords
    root = str(tmp_path)
    train, dev = make_datalist(root, "train", 12, 36, 1), make_datalist(root, "dev", 4, 12, 2)
    feats = subprocess.run([sys.executable, "-m", "toolkit.bin.compute_feats", "--nj", "1",
                            train, f"{root}/fb_train", dev, f"{root}/fb_dev"], cwd=ROOT,
                           capture_output=True, text=True, timeout=300)
    assert feats.returncode == 0, feats.stderr[-2000:]
    out = run_tool(os.path.join(BENCH, "kws_throughput.py"), "--raw", train, "--dev-raw", dev,
                   "--feats", f"{root}/fb_train/data.list", "--dev-feats",
                   f"{root}/fb_dev/data.list", "--inventory", write_keywords(root, ["hey chirp"]),
                   "--epochs", "1", "--no-torchrun", "dataset.batch_size=16")
    rows = {r["run"]: r for r in rows_of(out)}
    assert set(rows) == {"raw", "feats"}
    for name, r in rows.items():
        # 48 train utterances in batches of 16, one epoch, dev once.
        assert r["steps"] == 3 and r["utterances"] == 64, r
        assert r["utt_per_s"] > 0 and r["x_wekws_utt"] > 0 and r["train_s"] > 0
        assert 0.1 < r["peak_rss_trainer_gb"] < 8 and r["peak_pss_sum_gb"] > 0.05
        assert r["user_s"] >= 1 and r["sys_s"] >= 0
        assert r["dev_loss"] and float(r["dev_loss"]) > 0 and len(r["checksum"]) == 16
        assert r["allocator"].startswith("mimalloc ("), r["allocator"]
        assert f"| {name} | 64 (" in out
    assert rows["raw"]["processes"] >= 3        # the trainer and its 2 loader workers
    assert "allocator mimalloc" in out


def test_kws_throughput_corpus_sizes():
    import argparse
    from kws_throughput import CORPUS, corpus_sizes
    sizes = corpus_sizes("train_pos=12, dev_neg=3")
    assert sizes == dict(CORPUS, num_train_pos=12, num_dev_neg=3)
    for bad in ("train_pos=x", "voices=3", "train_pos"):
        with pytest.raises(argparse.ArgumentTypeError, match="expected NAME=COUNT"):
            corpus_sizes(bad)


def test_trainer_memory_measures_a_speaker_run_on_two_ranks(tmp_path):
    import pathlib
    import shutil
    import tempfile
    corpus = SpeakerCorpus(str(tmp_path / "speakers"))
    # A TMPDIR of its own (short: worker sockets live under it) to see what the tool leaves.
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="tm", dir="/tmp"))
    try:
        out = run_tool(os.path.join(BENCH, "trainer_memory.py"), "--config", corpus.config,
                       "--items-per-step", "16", "--nproc", "2", "--", "--train-data",
                       corpus.train, "--dev-data", corpus.dev, "--inventory", corpus.inventory,
                       "training.max_epoch=1", tmp_dir=str(tmp))
        # The exp dir it made for the run (checkpoints) is gone with it.
        assert not [p.name for p in tmp.iterdir() if p.name.startswith("trainer_memory_")]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    r = rows_of(out)
    # 36 utterances, 18 per rank in batches of 8: 3 steps.
    assert r["steps"] == 3 and r["checksum"] and r["dev"].startswith("eer "), r
    assert r["processes"] > 2                   # 2 ranks and loader workers
    assert 0.1 < r["peak_rss_trainer_gb"] < 8 and r["user_s"] >= 1
    assert r["tree_user_s"] > r["user_s"]       # rank 1 and the launcher count too
    assert r["allocator"].startswith("mimalloc (")
    table = [line for line in out.splitlines() if line.startswith(f"| {r['steps']} |")]
    assert len(table) == 1 and r["checksum"] in table[0]


def test_gpu_family_check_validates_every_run_and_trains_on_cpu(tmp_path, capsys):
    """The GPU check (run only where a GPU is lent): each family's config with the
    overrides of every run it makes is valid, and a run goes through the trainer on CPU
    with a tiny model (the wake-word family), so the day a GPU comes the script works."""
    import gpu_families
    # --check-configs imports and validates, nothing more: its main() in this process.
    capsys.readouterr()
    assert gpu_families.main(["--check-configs"]) == 0
    out = capsys.readouterr().out
    assert out.count("config ok:") == 18, out
    out = run_tool(os.path.join(BENCH, "gpu_families.py"), "--device", "cpu", "--dtypes",
                   "float32", "--families", "kws", "--tiny", "--steps", "2", "--work",
                   str(tmp_path))
    [r] = rows_of(out)
    assert (r["family"], r["dtype"], r["steps"]) == ("kws", "float32", 2)
    assert r["train_s"] > 0 and r["host_rss_gb"] > 0.1 and len(r["checksum"]) == 16
    assert r["cuda_peak_gb"] is None        # no CUDA line on CPU
    assert not (tmp_path / "speakers").exists()      # only the asked family's corpus
