"""Average model weights of checkpoints in an experiment dir (best N by dev loss, or the
last N by step) into one checkpoint that export and scoring read."""
import argparse
import io
import sys

import torch

from toolkit.trainer.average import average_checkpoints
from toolkit.fileio import atomic_write_bytes
from toolkit.logging_utils import setup_logging
from toolkit.errors import cli


def get_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--exp-dir", required=True)
    p.add_argument("--output", required=True, help="averaged checkpoint (.pt) to write")
    p.add_argument("--num", type=int, default=5, help="how many checkpoints to average")
    p.add_argument("--mode", choices=["best", "last"], default="best",
                   help="best: lowest dev loss; last: highest step")
    return p.parse_args(argv)


@cli
def main(argv=None):
    args = get_args(argv)
    setup_logging()
    result = average_checkpoints(args.exp_dir, args.num, args.mode)
    buf = io.BytesIO()
    torch.save(result, buf)
    atomic_write_bytes(args.output, buf.getvalue())
    return 0


if __name__ == "__main__":
    sys.exit(main())
