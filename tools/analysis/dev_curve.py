"""The dev metric of training runs against their updates, as one markdown table: how far
each run got per update, read from the trainer's own log (<exp>/log/train.rank0.log,
its `dev:` lines). For the phone front end the metric is `per`; any metric the task
logs on those lines can be named.

    python tools/analysis/dev_curve.py --metric per A=exp/ds_tcn_phone B=exp/ds_tcn10_phone
    python tools/analysis/dev_curve.py --metric loss --every 200 exp/run1 exp/run2
"""
import argparse
import os
import re
import sys
from typing import Dict, List, Tuple

DEV_LINE = re.compile(r"dev: (?P<metrics>.*?) over \d+ utterances \(step (?P<step>\d+)")


def read_curve(exp_dir: str, metric: str) -> List[Tuple[int, float]]:
    """(step, value) of every validation in the run's log, in order; a rerun's repeated
    steps keep the last value (a resumed run validates again where it left off)."""
    path = os.path.join(exp_dir, "log", "train.rank0.log")
    if not os.path.exists(path):
        raise SystemExit(f"error: {path} not found (is {exp_dir} a training exp dir?)")
    points: Dict[int, float] = {}
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            match = DEV_LINE.search(line)
            if not match:
                continue
            words = match.group("metrics").split()
            values = dict(zip(words[::2], words[1::2]))
            if metric in values:
                points[int(match.group("step"))] = float(values[metric])
    if not points:
        raise SystemExit(f"error: {path} has no dev line with metric {metric!r}")
    return sorted(points.items())


def table(curves: Dict[str, List[Tuple[int, float]]], every: int) -> str:
    steps = sorted({s for c in curves.values() for s, _ in c if every <= 0 or s % every == 0})
    lines = ["| step | " + " | ".join(curves) + " |",
             "|---:|" + "---:|" * len(curves)]
    for step in steps:
        cells = [f"{dict(c)[step]:.4f}" if step in dict(c) else "" for c in curves.values()]
        lines.append(f"| {step} | " + " | ".join(cells) + " |")
    best = [f"{min(v for _, v in c):.4f}" for c in curves.values()]
    lines.append("| best | " + " | ".join(best) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="+", metavar="[LABEL=]EXP_DIR", help="training exp dirs")
    p.add_argument("--metric", default="per", help="dev metric to read (default %(default)s)")
    p.add_argument("--every", type=int, default=0, metavar="N",
                   help="only steps that are multiples of N (default: every validation)")
    args = p.parse_args(argv)
    curves = {}
    for run in args.runs:
        label, _, path = run.rpartition("=")
        curves[label or path] = read_curve(path, args.metric)
    print(table(curves, args.every))
    return 0


if __name__ == "__main__":
    sys.exit(main())
