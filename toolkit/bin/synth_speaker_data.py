"""Synthesize a speaker-verification corpus whose speakers are TTS voices, as Kaldi data dirs.

Example:
  python -m toolkit.bin.synth_speaker_data --out-dir data --seed 777 --nj 2
"""
import argparse
import logging
import sys

from toolkit.errors import cli
from toolkit.tasks.speaker.corpus import SNR_DB, Sizes, generate_corpus
from toolkit.tts.corpus import TEST_ONLY_ENGINES
from toolkit.tts.engines import ENGINES

_DEFAULTS = Sizes()


def get_args(argv=None):
    p = argparse.ArgumentParser(
        prog="python -m toolkit.bin.synth_speaker_data",
        description=(
            "Synthesize speakers from TTS voices: espeak-ng's accents x variants (the\n"
            "accents of one variant are one family, never split across train/dev/test),\n"
            "procedural espeak-ng voices when more speakers are asked for, and the other\n"
            "engines named in --engines. Each speaker has its own rate, pitch and range, each\n"
            "utterance varies them and says random English words in white/pink/brown/babble\n"
            "noise. Writes <out-dir>/{train,dev,test}/ Kaldi data dirs (wav.scp text utt2spk\n"
            "spk2utt utt2dur spk2voice), WAVs under <out-dir>/wavs/<split>/,\n"
            "<out-dir>/test/trials (every test pair, Kaldi form) and <out-dir>/voices.tsv\n"
            "(each voice that speaks: split, engine, engine voice, version).\n"
            "Byte-identical for the same arguments whatever --nj and whatever else is\n"
            "installed; rerunning a finished run with the same arguments does nothing.\n\n"
            "example: %(prog)s --out-dir data --seed 777 --nj 2\n"
            "needs espeak-ng: pip install -e .[tts]"),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out-dir", required=True, metavar="DIR", help="output directory (e.g. data)")
    p.add_argument("--seed", type=int, default=777, help="random seed >= 0 (default %(default)s)")
    for split in ("train", "dev", "test"):
        p.add_argument(f"--num-{split}-speakers", dest=f"{split}_speakers", type=int, metavar="N",
                       default=_DEFAULTS.speakers(split),
                       help=f"speakers in {split} (default %(default)s)")
        p.add_argument(f"--{split}-utts", dest=f"{split}_utts", type=int, metavar="N",
                       default=_DEFAULTS.utts(split),
                       help=f"utterances per {split} speaker (default %(default)s)")
    p.add_argument("--nj", type=int, default=2,
                   help="parallel render processes; does not change the output (default %(default)s)")
    p.add_argument("--sample-rate", type=int, default=16000, metavar="HZ",
                   help="output sample rate (default %(default)s)")
    p.add_argument("--snr-min", type=float, default=SNR_DB[0], metavar="DB",
                   help="lowest speech-to-noise ratio (default %(default)s)")
    p.add_argument("--snr-max", type=float, default=SNR_DB[1], metavar="DB",
                   help="highest speech-to-noise ratio (default %(default)s)")
    p.add_argument("--engines", default="espeak", metavar="LIST",
                   help=f"comma-separated TTS engines that speak, of {','.join(ENGINES.names())}; "
                        "one asked for but not installed is an error; "
                        f"{','.join(TEST_ONLY_ENGINES)} (reserved for evaluation) only with "
                        "--test-only (default %(default)s)")
    p.add_argument("--test-only", action="store_true",
                   help="write <out-dir>/test alone (and its trials): an evaluation set from "
                        "--engines whose first speakers are the voices reserved for evaluation "
                        f"(all of {','.join(TEST_ONLY_ENGINES)}'s, refused without this), then "
                        "the test speakers the full corpus of this --seed holds out; sized by "
                        "--num-test-speakers/--test-utts. Use its own --out-dir")
    return p.parse_args(argv)


@cli
def main(argv=None):
    args = get_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s synth_speaker_data %(levelname)s %(message)s")
    sizes = Sizes(**{f"{s}_{k}": getattr(args, f"{s}_{k}")
                     for s in ("train", "dev", "test") for k in ("speakers", "utts")})
    # A SynthError is a UserError: @cli prints it as one `error:` line, exit status 2.
    summary = generate_corpus(args.out_dir, seed=args.seed, sizes=sizes, nj=args.nj,
                              sample_rate=args.sample_rate, snr_db=(args.snr_min, args.snr_max),
                              engines=args.engines.split(","), test_only=args.test_only)
    for split in ("train", "dev", "test"):
        if split not in summary:
            continue
        info = summary[split]
        logging.info("%s: %d speakers, %d utterances, %.2f h", split, info["speakers"],
                     info["utts"], info["hours"])
    logging.info("test trials: %d (%d target)", summary["trials"]["trials"],
                 summary["trials"]["targets"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
