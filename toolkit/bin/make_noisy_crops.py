"""A test set of short noisy crops from a Kaldi data dir: every utterance cut to --seconds
inside its speech and mixed with white or pink noise at an SNR drawn from --snr-db
against its active speech level; the same utterance ids and speakers, its trials* lists
copied, each crop's noise in utt2noise. Seeded per utterance.

  python -m toolkit.bin.make_noisy_crops data/outside/test data/outside/test_short \\
      --seconds 1.5 --noise white,pink --snr-db 5,15 --seed 777
"""
import argparse
import sys

from toolkit.errors import cli
from toolkit.logging_utils import setup_logging


def get_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("in_dir", help="Kaldi data dir (wav.scp, utt2spk, optional trials*)")
    p.add_argument("out_dir")
    p.add_argument("--seconds", type=float, default=1.5)
    p.add_argument("--noise", default="white,pink", help="comma list of white, pink, brown")
    p.add_argument("--snr-db", default="5,15", help="low,high")
    p.add_argument("--seed", type=int, default=777)
    args = p.parse_args(argv)
    try:
        low, high = (float(x) for x in args.snr_db.split(","))
    except ValueError:
        p.error(f"--snr-db {args.snr_db!r}: expected low,high in dB, e.g. 5,15")
    if low > high:
        p.error(f"--snr-db {args.snr_db!r}: low above high")
    args.snr_db = (low, high)
    args.noise = [k.strip() for k in args.noise.split(",") if k.strip()]
    if not args.noise:
        p.error("--noise names no noise kind")
    if args.seconds <= 0:
        p.error("--seconds must be > 0")
    return args


@cli
def main(argv=None):
    args = get_args(argv)
    setup_logging()
    from toolkit.voicebank.augment_bank import write_noisy_crops
    write_noisy_crops(args.in_dir, args.out_dir, args.seconds, args.noise, args.snr_db, args.seed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
