"""Checks a Kaldi data dir and prints every problem found, not just the first: files not
sorted in C order, duplicate keys, keys missing from some tables, lines without a value,
empty text, utt2spk/spk2utt disagreements, bad segments, and (unless --no-audio) every
recording in wav.scp that cannot be decoded. Exit status 1 when there is any problem.

Ordering, duplicate, missing-key and speaker-map problems are repaired by
utils/fix_data_dir.sh DIR (originals kept in DIR/.backup/); audio problems are not."""
import argparse
import sys

from toolkit.data.datadir import validate_data_dir
from toolkit.errors import cli


def get_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("data_dir", help="Kaldi data dir (wav.scp, text, utt2spk, ...)")
    p.add_argument("--no-audio", action="store_true",
                   help="skip decoding every recording (fast; table checks only)")
    p.add_argument("--nj", type=int, default=2, help="parallel audio decoders (default 2)")
    args = p.parse_args(argv)
    if args.nj < 1:
        p.error("--nj must be >= 1")
    return args


@cli
def main(argv=None):
    args = get_args(argv)
    problems = validate_data_dir(args.data_dir, check_audio=not args.no_audio, nj=args.nj)
    if problems:
        print(f"{args.data_dir}: {len(problems)} problem(s):", file=sys.stderr)
        for problem in problems:
            print(f"  {problem}", file=sys.stderr)
        return 1
    print(f"{args.data_dir}: OK" + (" (audio not checked)" if args.no_audio else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
