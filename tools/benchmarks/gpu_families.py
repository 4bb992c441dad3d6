"""Each family's recipe config through the real trainer on a GPU: steps/s, items/s, CUDA
peak memory and the share of the step spent waiting for data, per AMP dtype. About 4
minutes on one H200 with the defaults (6 runs of 40 steps; start-up included).

  python tools/benchmarks/gpu_families.py [--dtypes bfloat16,float16] [--steps 40] \\
      [--families kws,speaker,codec] [--work DIR] [--device cuda]

Each run is `toolkit.bin.train` through torchrun (one process, NCCL) on a synthetic corpus
written first (keyword chirps in noise; formant voices for the speaker and codec
families): egs/wake_word/s0/conf/ds_tcn.yaml, egs/voxceleb/v2/conf/ecapa_c1024.yaml and
egs/tts_codec/s0/conf/codec_gpu.yaml, each with its loader workers. Rates come from the
trainer's own log lines after the first one (warm-up and compilation excluded); the
loader-wait share is their mean. --device cpu runs the same on CPU (fp32 only; the suite
runs it that way on a tiny corpus, with --tiny, so the script cannot rot). --check-configs
only validates every family's config with the overrides of every run (GPU and tiny ones)
and exits: a config change that would break the GPU runs shows here without a GPU.
"""
import argparse
import json
import os
import re
import statistics
import sys
import tempfile
from typing import Dict, List

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path[:0] = [HERE, os.path.join(ROOT, "tests")]
from trainer_memory import train_and_measure  # noqa: E402

FAMILIES = {
    "kws": {"config": "egs/wake_word/s0/conf/ds_tcn.yaml", "items": "utt",
            "overrides": ["dataset.num_workers=4"],
            "tiny": ["model.hidden_dim=8", "model.num_layers=2", "model.dilations=[1,2]",
                     "model.frontend_channels=4", "dataset.batch_size=16",
                     "dataset.num_workers=1"]},
    "speaker": {"config": "egs/voxceleb/v2/conf/ecapa_c1024.yaml", "items": "chunk",
                "overrides": ["dataset.num_workers=4"],
                "tiny": ["model.channels=16", "dataset.batch_size=8", "dataset.num_workers=1"]},
    "codec": {"config": "egs/tts_codec/s0/conf/codec_gpu.yaml", "items": "segment",
              "overrides": ["dataset.num_workers=8", "training.val_interval_steps=0"],
              "tiny": ["model.channels=4", "model.decoder_channels=16", "model.n_codebooks=2",
                       "model.codebook_size=16", "dataset.batch_size=4",
                       "dataset.num_workers=1", "discriminator.use_mpd=false",
                       "task.eval_seconds=0.5"]},
}
RATE = re.compile(r"\| (\d+) utt/s \d+ audio-s/s loader wait (\d+)% ")
CUDA_PEAK = re.compile(r"CUDA peak memory ([\d.]+) GB allocated, ([\d.]+) GB reserved")


def get_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--dtypes", default="bfloat16,float16",
                   help="comma list of float32, bfloat16, float16 (AMP autocast dtypes)")
    p.add_argument("--families", default="kws,speaker,codec")
    p.add_argument("--steps", type=int, default=40, help="optimizer steps per run")
    p.add_argument("--work", help="corpus and exp dirs (default: a fresh temporary dir)")
    p.add_argument("--tiny", action="store_true",
                   help="tiny corpus and models: checks the script, measures nothing")
    p.add_argument("--check-configs", action="store_true",
                   help="validate each family's config and overrides, then exit")
    args = p.parse_args(argv)
    args.dtypes = args.dtypes.split(",")
    args.families = args.families.split(",")
    for name in args.families:
        if name not in FAMILIES:
            p.error(f"--families: unknown {name!r} (known: {', '.join(FAMILIES)})")
    for dtype in args.dtypes:
        if dtype not in ("float32", "bfloat16", "float16"):
            p.error(f"--dtypes: unknown {dtype!r}")
        if args.device == "cpu" and dtype != "float32":
            p.error("--device cpu measures float32 only (CPU autocast is not what GPUs run)")
    return args


def write_corpora(work: str, tiny: bool, families: List[str]) -> Dict[str, List[str]]:
    """Trainer arguments naming the data of each of `families`; only their corpora are
    written (the speaker and codec families read the same formant voices)."""
    from kws_data import make_datalist, write_keywords
    from speaker_data import speaker_list
    out: Dict[str, List[str]] = {}
    n_kws, n_spk, n_utt = (12, 4, 4) if tiny else (512, 64, 12)
    if "kws" in families:
        kws = os.path.join(work, "kws")
        os.makedirs(kws, exist_ok=True)
        train = make_datalist(kws, "train", n_kws // 4, n_kws - n_kws // 4, 1)
        out["kws"] = ["--train-data", train,
                      "--dev-data", make_datalist(kws, "dev", 4, 12, 2),
                      "--inventory", write_keywords(kws, ["hey chirp"])]
    if {"speaker", "codec"} & set(families):
        spk = os.path.join(work, "speakers")
        os.makedirs(spk, exist_ok=True)
        names = [f"spk{s:03d}" for s in range(n_spk)]
        inventory = os.path.join(spk, "speakers.txt")
        with open(inventory, "w") as f:
            f.writelines(n + "\n" for n in names)
        index = {n: i for i, n in enumerate(names)}
        train = speaker_list(spk, "train", range(n_spk), n_utt, 1, index)
        dev = speaker_list(spk, "dev", range(100, 104), 4, 2, index)
        out["speaker"] = ["--train-data", train, "--dev-data", dev, "--inventory", inventory]
        out["codec"] = ["--train-data", train, "--dev-data", dev]
    return out


def overrides(family: str, dtype: str, steps: int, tiny: bool) -> List[str]:
    spec = FAMILIES[family]
    amp = ["training.use_amp=false"] if dtype == "float32" else \
        ["training.use_amp=true", f"training.amp_dtype={dtype}"]
    return [f"training.max_steps={steps}", "training.max_epoch=1000",
            f"training.log_interval={max(1, steps // 8)}",
            "training.save_interval_steps=100000", "training.tensorboard=false",
            *spec["overrides"], *(spec["tiny"] if tiny else []), *amp]


def check_configs() -> None:
    """Every family's config with the overrides of each run it can make, validated as the
    trainer validates them (one line per combination)."""
    import toolkit.tasks  # noqa: F401  (registers the tasks)
    from toolkit.config import load_config
    for family, spec in FAMILIES.items():
        for dtype in ("float32", "bfloat16", "float16"):
            for tiny in (False, True):
                load_config(os.path.join(ROOT, spec["config"]),
                            overrides(family, dtype, 40, tiny))
                print(f"config ok: {family} {dtype}{' tiny' if tiny else ''}")


def measure(family: str, dtype: str, data: List[str], args) -> Dict:
    spec = FAMILIES[family]
    exp = os.path.join(args.work, f"exp_{family}_{dtype}")
    trainer = ["--config", os.path.join(ROOT, spec["config"]), "--exp-dir", exp, *data,
               *overrides(family, dtype, args.steps, args.tiny)]
    if args.device == "cuda":
        trainer += ["--num-gpus", "1"]
    r = train_and_measure(trainer, torchrun=True)
    with open(os.path.join(exp, "log", "train.rank0.log"), encoding="utf-8") as f:
        log = f.read()
    rates = [(int(a), int(b)) for a, b in RATE.findall(log)][1:]   # the first is warm-up
    peak = CUDA_PEAK.search(log)
    items = statistics.median(a for a, _ in rates) if rates else None
    return {"family": family, "dtype": dtype, "steps": r["steps"], "train_s": r["train_s"],
            "items_per_s": items, "items": spec["items"],
            "loader_wait_pct": round(statistics.mean(b for _, b in rates), 1) if rates else None,
            "cuda_peak_gb": float(peak.group(1)) if peak else None,
            "cuda_reserved_gb": float(peak.group(2)) if peak else None,
            "host_rss_gb": r["peak_rss_trainer_gb"], "checksum": r["checksum"]}


def main(argv=None):
    args = get_args(argv)
    if args.check_configs:
        check_configs()
        return 0
    args.work = os.path.abspath(args.work or tempfile.mkdtemp(prefix="gpu_families_"))
    data = write_corpora(args.work, args.tiny, args.families)
    rows = [measure(f, d, data[f], args) for f in args.families for d in args.dtypes]
    print(f"{args.device}; {args.steps} steps per run; work dir {args.work}")
    print("| family | dtype | steps | train s | items/s (median) | loader wait % | "
          "CUDA peak / reserved GB | host RSS GB |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['family']} | {r['dtype']} | {r['steps']} | {r['train_s']} | "
              f"{r['items_per_s']} {r['items']} | {r['loader_wait_pct']} | "
              f"{r['cuda_peak_gb']} / {r['cuda_reserved_gb']} | {r['host_rss_gb']} |")
    print(json.dumps(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
