"""Keyword-spotting training throughput and memory with the real trainer binary, comparable
with other toolkits on the same data and machine: a WeKws-sized DS-TCN (64 channels, 4
layers, kernel 8, 40 fbank bins, batches of 256) trained for 2 epochs, dev included,
through torchrun (one process), once from raw WAVs (fbank on the fly, loader workers) and
once from precomputed features (in the training process).

  python tools/benchmarks/kws_throughput.py --build /tmp/kws_corpus      # everything
  python tools/benchmarks/kws_throughput.py --raw data/train/data.list \\
      --feats data/train/fbank/data.list --dev-raw data/dev/data.list \\
      --dev-feats data/dev/fbank/data.list --inventory data/dict/keywords.txt \\
      [--cmvn data/train/global_cmvn.json] [--workers 2] [--epochs 2] [overrides ...]
  python tools/benchmarks/kws_throughput.py --build /tmp/kws_corpus \
      --toolkit-root /tmp/before      # the trainer of another commit's worktree

--build DIR synthesizes the corpus of issue 28 into DIR first (the wake-word recipe's stages
0-2: 8,000 train and 1,000 dev utterances of "hey snips", a quarter positives, fbank and
CMVN), or reuses it when DIR already holds it; it takes about 7 minutes on 2 cores.
--corpus train_pos=N,train_neg=N,dev_pos=N,dev_neg=N builds a corpus of other sizes
(the test suite runs the tool on a tiny one).

Printed per run: utterances/s and audio seconds/s over the trainer's own training time
(start-up excluded) and over the wall time of the command, both against WeKws on this
machine type (issue 28: 52.8 utt/s on utterances of 2.876 s on average); the peak RSS of
the trainer alone (its own getrusage) and the peak of the trainer and its loader workers
together, sampled from /proc every 20 ms as the sum of their RSS (shared pages counted in
each process) and every 200 ms as the sum of their PSS (shared pages split among the
processes sharing them: the memory the machine actually gives them); user and system CPU
seconds of the trainer and its workers; the final dev loss and parameter checksum (equal
before and after a change that must not change results). Each run trains into a fresh
temporary exp dir. Extra `section.key=value` arguments go to both runs.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from typing import Dict

import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from trainer_memory import train_and_measure  # noqa: E402  (this folder's sibling tool)

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
# WeKws on issue 28's corpus (9,000 utterances, 7.19 h) and this machine type.
WEKWS_UTT_PER_S = 52.8
WEKWS_SECONDS_PER_UTT = 7.19 * 3600 / 9000
CORPUS = {"num_train_pos": 2000, "num_train_neg": 6000, "num_dev_pos": 250,
          "num_dev_neg": 750, "num_test_pos": 20, "num_test_neg": 20}


def get_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build", metavar="DIR", help="synthesize (or reuse) the corpus in DIR "
                   "and take every list from it")
    p.add_argument("--raw", help="training data list with wav entries")
    p.add_argument("--feats", help="the same list with precomputed feat entries")
    p.add_argument("--dev-raw")
    p.add_argument("--dev-feats")
    p.add_argument("--inventory")
    p.add_argument("--cmvn", help="global CMVN JSON (same for both runs)")
    p.add_argument("--workers", type=int, default=2, help="loader workers for the raw run")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--runs", default="raw,feats", help="comma list of raw, feats")
    p.add_argument("--no-torchrun", action="store_true",
                   help="start the trainer directly instead of through torchrun")
    p.add_argument("--corpus", type=corpus_sizes, default=dict(CORPUS), metavar="SIZES",
                   help="with --build: comma list of train_pos=N, train_neg=N, dev_pos=N, "
                   "dev_neg=N replacing issue 28's sizes")
    p.add_argument("--toolkit-root", default=ROOT, metavar="DIR",
                   help="checkout whose toolkit trains (default: this one)")
    p.add_argument("overrides", nargs="*")
    args = p.parse_args(argv)
    if args.build:
        data = os.path.join(os.path.abspath(args.build), "data")
        args.raw, args.dev_raw = f"{data}/train/data.list", f"{data}/dev/data.list"
        args.feats, args.dev_feats = f"{data}/train/fbank/data.list", f"{data}/dev/fbank/data.list"
        args.inventory, args.cmvn = f"{data}/dict/keywords.txt", f"{data}/train/global_cmvn.json"
    elif not (args.raw and args.dev_raw and args.inventory):
        p.error("give --build DIR, or --raw, --dev-raw and --inventory")
    return args


def corpus_sizes(text: str) -> Dict[str, int]:
    sizes = dict(CORPUS)
    for item in text.split(","):
        name, _, value = item.partition("=")
        key = f"num_{name.strip()}"
        if key not in sizes or not value.strip().isdigit():
            raise argparse.ArgumentTypeError(
                f"{item!r}: expected NAME=COUNT with NAME one of "
                f"{', '.join(k[4:] for k in CORPUS)}")
        sizes[key] = int(value)
    return sizes


def build_corpus(out_dir: str, sizes: Dict[str, int] = CORPUS) -> None:
    """The wake-word recipe's stages 0-2 with the given sizes into out_dir/data."""
    data = os.path.join(os.path.abspath(out_dir), "data")
    if os.path.exists(f"{data}/train/global_cmvn.json"):
        return
    # The recipe's corpus settings with these sizes (run.sh takes them as a file).
    recipe = os.path.join(ROOT, "egs", "wake_word", "s0")
    with open(os.path.join(recipe, "conf", "corpus.yaml"), encoding="utf-8") as f:
        settings = yaml.safe_load(f)
    settings.update(sizes)
    os.makedirs(out_dir, exist_ok=True)
    corpus_config = os.path.join(os.path.abspath(out_dir), "corpus.yaml")
    with open(corpus_config, "w", encoding="utf-8") as f:
        yaml.safe_dump(settings, f)
    cmd = ["bash", "run.sh", "--stage", "0", "--stop-stage", "2", "--data", data,
           "--corpus-config", corpus_config]
    print("building the corpus:", " ".join(cmd), flush=True)
    subprocess.run(cmd, cwd=recipe, check=True)


def count_and_seconds(path: str):
    n, seconds = 0, 0.0
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                n += 1
                seconds += float(json.loads(line)["duration"])
    return n, seconds


def run(name: str, train: str, dev: str, workers: int, args, config_path: str) -> Dict:
    trainer = ["--config", config_path, "--train-data", train, "--dev-data", dev,
               "--inventory", args.inventory, f"training.max_epoch={args.epochs}",
               f"dataset.num_workers={workers}", *args.overrides]
    if args.cmvn:
        trainer += ["--cmvn", args.cmvn]
    r = train_and_measure(trainer, torchrun=not args.no_torchrun, cwd=args.toolkit_root)
    n_train, sec_train = count_and_seconds(train)
    n_dev, sec_dev = count_and_seconds(dev)
    utts, audio = args.epochs * (n_train + n_dev), args.epochs * (sec_train + sec_dev)
    train_s = max(r["train_s"], 1)
    dev_loss = re.search(r"loss ([\d.]+)", r["dev"] or "")
    return dict(r, run=name, utterances=utts, audio_h=round(audio / 3600, 2),
                utt_per_s=round(utts / train_s, 1), utt_per_s_wall=round(utts / r["wall_s"], 1),
                x_wekws_utt=round(utts / train_s / WEKWS_UTT_PER_S, 2),
                x_wekws_audio=round(audio / train_s / (WEKWS_UTT_PER_S * WEKWS_SECONDS_PER_UTT), 2),
                dev_loss=dev_loss.group(1) if dev_loss else None)


def main(argv=None):
    args = get_args(argv)
    if args.build:
        build_corpus(args.build, args.corpus)
    import yaml
    config_path = os.path.join(tempfile.mkdtemp(prefix="kws_bench_conf_"), "ds_tcn_wekws.yaml")
    with open(config_path, "w") as f:
        yaml.safe_dump(CONFIG, f)
    wanted = args.runs.split(",")
    rows = []
    if "raw" in wanted:
        rows.append(run("raw", args.raw, args.dev_raw, args.workers, args, config_path))
    if "feats" in wanted and args.feats:
        rows.append(run("feats", args.feats, args.dev_feats or args.dev_raw, 0, args,
                        config_path))
    print(f"DS-TCN 64x4, kernel 8, 40 fbank, batch 256, {args.epochs} epochs, dev included; "
          f"toolkit {args.toolkit_root}; {os.cpu_count()} CPUs; "
          f"{'direct' if args.no_torchrun else 'torchrun'}; allocator "
          f"{rows[0]['allocator'] if rows else '-'}")
    print("| input | utts (h) | train s / wall s | utt/s (x WeKws) | audio s/s x WeKws | "
          "peak RSS trainer / a worker GB | trainer+workers RSS / PSS GB | user / sys s | "
          "dev loss | checksum |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for r in rows:
        print(f"| {r['run']} | {r['utterances']} ({r['audio_h']}) | {r['train_s']} / "
              f"{r['wall_s']} | {r['utt_per_s']} ({r['x_wekws_utt']}) | {r['x_wekws_audio']} | "
              f"{r['peak_rss_trainer_gb']} / {r['peak_rss_worker_gb']} | "
              f"{r['peak_rss_sum_gb']} / {r['peak_pss_sum_gb']} | {r['user_s']} / {r['sys_s']} | "
              f"{r['dev_loss']} | {r['checksum']} |")
    print(json.dumps(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
