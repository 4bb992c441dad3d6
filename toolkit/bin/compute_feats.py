"""Precompute fbank features for a data list into Kaldi feats.ark/feats.scp (kaldiio),
and write a data list whose entries point at them (`feat`). Training from such a list
skips decoding and featurization every epoch; waveform augmentations are then off.
Work is split over --nj processes; entries that fail are reported and left out. Several
DATA_LIST OUT_DIR pairs in one call share one start-up. With --neg-cache, the general
negatives of a synthetic wake-word corpus made with synth_kws_data --neg-cache (its data
dir, DATA_LIST's folder, holds neg_cache.json) take their features from a cache computed
once per front end and corpus settings (<toolkit cache>/kws_negatives/feats, keyed by the
front end's sha256); the output is the same."""
import argparse
import sys

from toolkit.cli import path_pairs
import toolkit.tasks  # noqa: F401  (the task names a config may give)
from toolkit.config import DatasetConfig
from toolkit.config import load_dataset_config
from toolkit.data.features_store import compute_features_for_list
from toolkit.logging_utils import setup_logging
from toolkit.errors import cli


def get_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("pairs", nargs="+", metavar="DATA_LIST OUT_DIR",
                   help="input data list (with wav), then where feats.ark / feats.scp / "
                   "data.list go (repeatable as pairs)")
    p.add_argument("--config", help="training config: its dataset section (sample rate, "
                   "feature options) is used; default: 40-bin fbank at 16 kHz")
    p.add_argument("--nj", type=int, default=2)
    p.add_argument("--speed-copies", default="",
                   help="comma-separated speed factors, e.g. 0.9,1.1: each utterance also gets "
                   "copies played that much faster (keys sp0.9-<key>), as in Kaldi's 3-way speed "
                   "perturbation; for training lists")
    p.add_argument("--neg-cache", action="store_true",
                   help="features of the general negatives a corpus took from the negatives "
                   "cache (neg_cache.json beside DATA_LIST) from the features cache, computed "
                   "there first when missing; other lists are computed as without it")
    args = p.parse_args(argv)
    args.pairs = path_pairs(p, args.pairs, "DATA_LIST OUT_DIR")
    try:
        args.speed_copies = [float(f) for f in args.speed_copies.split(",") if f.strip()]
    except ValueError:
        p.error(f"--speed-copies: expected numbers like 0.9,1.1, got {args.speed_copies!r}")
    return args


@cli
def main(argv=None):
    args = get_args(argv)
    setup_logging()
    cfg = load_dataset_config(args.config) if args.config else DatasetConfig()
    try:
        compute = compute_features_for_list
        if args.neg_cache:
            from toolkit.tasks.kws.neg_feats import compute_features_cached as compute
        for data_list, out_dir in args.pairs:
            compute(data_list, out_dir, cfg, args.nj, args.speed_copies)
    except ValueError as err:
        print(f"compute_feats: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
