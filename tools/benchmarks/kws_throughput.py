"""Keyword-spotting training throughput with the real trainer binary, comparable with
other toolkits on the same data and machine: a WeKws-sized DS-TCN (64 channels, 4 layers,
kernel 8, 40 fbank bins, batches of 256) trained for 2 epochs, dev included, once from
raw WAVs (fbank on the fly, loader workers) and once from precomputed features. Prints
utterances/s, peak RSS and user/system CPU seconds of each run.

  python tools/benchmarks/kws_throughput.py --raw data/train/data.list \\
      --feats data/train/fbank/data.list --dev-raw data/dev/data.list \\
      --dev-feats data/dev/fbank/data.list --inventory data/dict/keywords.txt \\
      [--workers 2] [--epochs 2] [--cmvn data/train/global_cmvn.json] [overrides ...]

Each run trains into a fresh temporary exp dir. Extra `section.key=value` arguments go
to both runs (e.g. training.malloc_trim_interval=0 to see what trimming costs).
"""
import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIG = {
    "task": {"type": "kws"},
    "dataset": {"feature": {"num_mel_bins": 40}, "batch_size": 256, "sort_window": 2000,
                "num_workers": 2},
    "model": {"type": "ds_tcn", "hidden_dim": 64, "num_layers": 4, "kernel_size": 8,
              "dilations": [1, 2, 4, 8], "dropout": 0.1},
    "loss": {"type": "max_pooling", "min_duration": 30},
    "optim": {"type": "adam", "lr": 0.001},
    "training": {"max_epoch": 2, "log_interval": 50, "save_interval_steps": 100000,
                 "tensorboard": False},
}


def get_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--raw", required=True, help="training data list with wav entries")
    p.add_argument("--feats", help="the same list with precomputed feat entries")
    p.add_argument("--dev-raw", required=True)
    p.add_argument("--dev-feats")
    p.add_argument("--inventory", required=True)
    p.add_argument("--cmvn", help="global CMVN JSON (same for both runs)")
    p.add_argument("--workers", type=int, default=2, help="loader workers for the raw run")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("overrides", nargs="*")
    return p.parse_args(argv)


def count(path: str) -> int:
    with open(path, encoding="utf-8") as f:
        return sum(1 for line in f if line.strip())


def run(name, train, dev, workers, args, config_path):
    exp = tempfile.mkdtemp(prefix=f"kws_bench_{name}_")
    cmd = [sys.executable, "-m", "toolkit.bin.train", "--config", config_path, "--exp-dir", exp,
           "--train-data", train, "--dev-data", dev, "--inventory", args.inventory,
           f"training.max_epoch={args.epochs}", f"dataset.num_workers={workers}", *args.overrides]
    if args.cmvn:
        cmd += ["--cmvn", args.cmvn]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    wall = time.time() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        sys.exit(f"{name} run failed:\n{proc.stderr[-3000:]}")
    # The trainer reports its own peak RSS (and its loader workers'): per run, unlike
    # RUSAGE_CHILDREN's maximum over every child so far.
    final = [line for line in proc.stderr.splitlines() if "peak RSS" in line][-1]
    rss = float(final.split("peak RSS ")[1].split()[0])
    rss_workers = float(final.split("loader workers ")[1].split()[0])
    dev_loss = [line.split("dev: loss ")[1].split()[0] for line in proc.stderr.splitlines()
                if "dev: loss " in line]
    utts = args.epochs * (count(train) + count(dev))
    return {"run": name, "utterances": utts, "wall_s": round(wall, 1),
            "utt_per_s": round(utts / wall, 1),
            "peak_rss_gb": rss, "worker_rss_gb": rss_workers,
            "user_s": round(after.ru_utime - before.ru_utime, 1),
            "sys_s": round(after.ru_stime - before.ru_stime, 1),
            "last_dev_loss": dev_loss[-1] if dev_loss else None, "exp": exp}


def main(argv=None):
    args = get_args(argv)
    import yaml
    config_path = os.path.join(tempfile.mkdtemp(prefix="kws_bench_conf_"), "ds_tcn_wekws.yaml")
    with open(config_path, "w") as f:
        yaml.safe_dump(CONFIG, f)
    rows = [run("raw WAVs", args.raw, args.dev_raw, args.workers, args, config_path)]
    if args.feats:
        rows.append(run("precomputed", args.feats, args.dev_feats or args.dev_raw, 0, args,
                        config_path))
    print(f"DS-TCN 64x4, kernel 8, 40 fbank, batch 256, {args.epochs} epochs, dev included; "
          f"{os.cpu_count()} CPUs")
    print("| input | utterances | wall s | utt/s | peak RSS GB (trainer / a worker) | user s | "
          "sys s | last dev loss |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['run']} | {r['utterances']} | {r['wall_s']} | {r['utt_per_s']} | "
              f"{r['peak_rss_gb']} / {r['worker_rss_gb']} | {r['user_s']} | {r['sys_s']} | "
              f"{r['last_dev_loss']} |")
    print(json.dumps(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
