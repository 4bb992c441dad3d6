"""Data list -> shards: tar files of N utterances for streaming (local disk or object store).

Writes OUT_DIR/<prefix>-000000.tar ... (per utterance `<key>.wav`, 16-bit PCM at the
original rate, and `<key>.json`, the entry without `wav`), OUT_DIR/shards.list (absolute
tar paths; replace them with URLs after uploading) and OUT_DIR/shards.index.json (key,
duration, label per shard, so training plans batches without opening a tar). Entries
whose audio is bad are skipped and reported. Same input, same bytes.
"""
import argparse
import logging
import os
import sys

from toolkit.data.shard_tar import LIST_NAME, make_shards
from toolkit.data.shards import ShardIndex
from toolkit.logging_utils import setup_logging
from toolkit.errors import cli

logger = logging.getLogger("make_shards")


def get_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("data_list", help="JSON-lines data list (key, wav, duration, label, ...)")
    p.add_argument("out_dir", help="directory for the tars, shards.list and shards.index.json")
    p.add_argument("--utts-per-shard", type=int, default=1000)
    p.add_argument("--nj", type=int, default=2, help="shards written in parallel")
    p.add_argument("--prefix", default="shards", help="tar name prefix, e.g. train")
    return p.parse_args(argv)


@cli
def main(argv=None):
    args = get_args(argv)
    setup_logging()
    if args.utts_per_shard < 1:
        logger.error("--utts-per-shard must be positive")
        return 2
    paths, bad = make_shards(args.data_list, args.out_dir, args.utts_per_shard, args.nj,
                             args.prefix)
    index = ShardIndex.load(os.path.join(args.out_dir, LIST_NAME))
    if bad.total():
        logger.warning("%s: %d entries skipped: %s", args.data_list, bad.total(), bad.summary())
    logger.info("wrote %d shards with %d utterances (%.2f h) to %s", len(paths), len(index),
                index.total_hours(), args.out_dir)
    if len(index) == 0:
        logger.error("%s: no usable entries", args.data_list)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
