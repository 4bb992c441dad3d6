"""Repairs a Kaldi data dir in place, like Kaldi's utils/fix_data_dir.sh: sorts every table
in C order, drops duplicate keys (keeps the first), blank/malformed lines and utterances
not present in every per-utterance table, keeps only recordings and speakers still used,
regenerates spk2utt from utt2spk. Each rewritten file's original goes to DIR/.backup/
(a rerun on a fixed dir rewrites nothing, so the first backup stays). Audio is not
checked: run utils/validate_data_dir.sh afterwards."""
import argparse
import sys

from toolkit.data.datadir import fix_data_dir
from toolkit.errors import cli


def get_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("data_dir", help="Kaldi data dir to repair in place")
    return p.parse_args(argv)


@cli
def main(argv=None):
    args = get_args(argv)
    try:
        report = fix_data_dir(args.data_dir)
    except (ValueError, OSError) as err:
        print(f"fix_data_dir: error: {err}", file=sys.stderr)
        return 1
    for line in report:
        print(f"{args.data_dir}: {line}")
    if not report:
        print(f"{args.data_dir}: nothing to fix")
    return 0


if __name__ == "__main__":
    sys.exit(main())
