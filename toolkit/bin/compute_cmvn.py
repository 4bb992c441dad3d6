"""Global CMVN statistics from a training data list (wav or precomputed feats), computed
in parallel; written as JSON and, with --kaldi-out, as Kaldi-format stats (kaldiio)."""
import argparse
import logging
import sys

from toolkit.data.cmvn import compute_global_cmvn, write_cmvn
import toolkit.tasks  # noqa: F401  (the task names a config may give)
from toolkit.config import DatasetConfig
from toolkit.config import load_dataset_config
from toolkit.logging_utils import setup_logging
from toolkit.errors import cli


def get_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("data_list")
    p.add_argument("output", help="CMVN JSON to write")
    p.add_argument("--kaldi-out", help="also write Kaldi stats here (e.g. cmvn.ark)")
    p.add_argument("--config", help="training config: its dataset.feature section is used")
    p.add_argument("--num-mel-bins", type=int, default=40, help="when no --config")
    p.add_argument("--nj", type=int, default=2)
    return p.parse_args(argv)


@cli
def main(argv=None):
    args = get_args(argv)
    setup_logging()
    if args.config:
        dataset_cfg = load_dataset_config(args.config)
    else:
        dataset_cfg = DatasetConfig()
        dataset_cfg.feature.num_mel_bins = args.num_mel_bins
    cmvn = compute_global_cmvn(args.data_list, dataset_cfg, args.nj)
    write_cmvn(cmvn, args.output, args.kaldi_out)
    logging.getLogger("compute_cmvn").info("wrote %s from %d frames", args.output, cmvn["frames"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
