"""Store the recommended detection threshold in exported models (ONNX, TorchScript,
safetensors config.json): given explicitly, or read from a scoring dir's det.json
(the threshold meeting the target false alarms per hour)."""
import argparse
import json
import logging
import os
import sys

from toolkit.logging_utils import setup_logging
from toolkit.errors import cli


def get_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--export-dir", required=True)
    group = p.add_mutually_exclusive_group(required=True)
    group.add_argument("--threshold", type=float)
    group.add_argument("--score-dir", help="scoring output dir with det.json")
    p.add_argument("--fused", action="store_true",
                   help="the threshold of the head fused with zero-shot search (stored as "
                        "fused_threshold; compute_posteriors --fuse-zero-shot)")
    return p.parse_args(argv)


def threshold_from_scores(score_dir: str) -> float:
    with open(os.path.join(score_dir, "det.json"), encoding="utf-8") as f:
        det = json.load(f)
    chosen = [curve["selected"]["threshold"] for curve in det["curves"].values()
              if curve["selected"].get("threshold") is not None]
    if not chosen:
        raise ValueError(f"{score_dir}/det.json: no threshold meets the target false-alarm rate")
    # One threshold for all keywords: the strictest one keeps every keyword within target.
    return max(chosen)


@cli
def main(argv=None):
    args = get_args(argv)
    setup_logging()
    from toolkit.tasks.kws.export import set_threshold
    threshold = args.threshold if args.threshold is not None else threshold_from_scores(args.score_dir)
    key = "fused_threshold" if args.fused else "threshold"
    set_threshold(args.export_dir, threshold, key)
    logging.getLogger("set_threshold").info("recommended %s %.3f stored in %s", key,
                                            threshold, args.export_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
