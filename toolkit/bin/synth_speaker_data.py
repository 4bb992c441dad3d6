"""Synthesize a speaker-verification corpus whose speakers are TTS voices, as Kaldi data dirs.

Example:
  python -m toolkit.bin.synth_speaker_data --out-dir data --seed 777 --nj 2
  python -m toolkit.bin.synth_speaker_data --config egs/tts_speakers/v1/conf/corpus.yaml \
      --out-dir data --engines espeak
"""
import argparse
import logging
import sys
from typing import Dict

from toolkit.cli import parse_with_options_file
from toolkit.errors import cli
from toolkit.tasks.speaker.corpus import (BLEND_SPLIT, SNR_DB, WORDS_PER_UTT,
                                          EngineSizing, Sizes, generate_corpus)
from toolkit.voicebank import SynthError
from toolkit.voicebank.corpus import add_voice_bank_arguments

_DEFAULTS = Sizes()


def get_args(argv=None):
    p = argparse.ArgumentParser(
        prog="python -m toolkit.bin.synth_speaker_data",
        description=(
            "Synthesize speakers from TTS voices: espeak-ng's accents x variants (the\n"
            "accents of one variant are one family, never split across train/dev/test),\n"
            "procedural espeak-ng voices when more speakers are asked for (the --num-*-speakers\n"
            "sizes count espeak-ng's speakers), and on top of them every unreserved voice of\n"
            "the other engines named in --engines (each engine holds out its own test and dev\n"
            "voices) and --blends blended Kokoro voices. Each speaker has its own rate, pitch\n"
            "and range, each utterance varies them and says random English words in\n"
            "white/pink/brown/babble noise. Writes <out-dir>/{train,dev,test}/ Kaldi data dirs\n"
            "(wav.scp text utt2spk spk2utt utt2dur spk2voice), WAVs under\n"
            "<out-dir>/wavs/<split>/, <out-dir>/test/trials (every test pair, Kaldi form;\n"
            "with several engines in test also test/trials_<engine>, the pairs within each)\n"
            "and <out-dir>/voices.tsv (each voice that speaks: split, engine, engine voice,\n"
            "blend weights, version).\n"
            "Byte-identical for the same arguments whatever --nj and whatever else is\n"
            "installed; rerunning a finished run with the same arguments does nothing.\n\n"
            "examples:\n"
            "  %(prog)s --out-dir data --seed 777 --nj 2\n"
            "  %(prog)s --out-dir data --engines espeak,kokoro --blends 200 \\\n"
            "      --engine-train-utts kokoro=8 --engine-words kokoro=5-10\n"
            "  %(prog)s --out-dir data/outside --test-only --engines espeak,kokoro,festival\n"
            "  %(prog)s --config egs/tts_speakers/v1/conf/corpus.yaml --out-dir data \\\n"
            "      --engines espeak          # sizes and seed from the file\n"
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
    add_voice_bank_arguments(
        p, other_share=False,
        engines_note="those besides espeak add every voice they have but the reserved ones",
        blends_note=f"each blend is a speaker, held out for dev and test by "
                    f"{BLEND_SPLIT['dev']:g}/{BLEND_SPLIT['test']:g}",
        test_only_note=" (and its trials), espeak-ng's part sized by --num-test-speakers, "
                       "every speaker by --test-utts")
    p.add_argument("--engine-train-utts", default="", metavar="ENGINE=N[,...]",
                   help="utterances per training speaker of that engine instead of "
                        "--train-utts, e.g. kokoro=8 (a slow engine)")
    p.add_argument("--engine-words", default="", metavar="ENGINE=LOW-HIGH[,...]",
                   help="words per utterance of that engine's speakers in every split instead "
                        f"of {WORDS_PER_UTT[0]}-{WORDS_PER_UTT[1]}, e.g. kokoro=5-10")
    return parse_with_options_file(p, argv)


def _engine_values(text: str, option: str) -> Dict[str, str]:
    out: Dict[str, str] = {}
    for item in filter(None, (x.strip() for x in text.split(","))):
        name, sep, value = item.partition("=")
        if not sep or not name.strip() or not value.strip():
            raise SynthError(f"{option}: expected ENGINE=VALUE items, got {item!r}")
        if name.strip() in out:
            raise SynthError(f"{option}: {name.strip()} given twice")
        out[name.strip()] = value.strip()
    return out


def engine_sizing(train_utts: str, words: str) -> Dict[str, EngineSizing]:
    """--engine-train-utts and --engine-words as EngineSizing per engine."""
    utts = {}
    for name, value in _engine_values(train_utts, "--engine-train-utts").items():
        try:
            utts[name] = int(value)
        except ValueError:
            raise SynthError(f"--engine-train-utts: {name}={value} is not a whole number") \
                from None
    ranges = {}
    for name, value in _engine_values(words, "--engine-words").items():
        low, sep, high = value.partition("-")
        try:
            ranges[name] = (int(low), int(high if sep else low))
        except ValueError:
            raise SynthError(f"--engine-words: {name}={value} is not a range LOW-HIGH") from None
    return {name: EngineSizing(utts.get(name), ranges.get(name))
            for name in sorted(set(utts) | set(ranges))}


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
                              engines=args.engines.split(","), test_only=args.test_only,
                              blends=args.blends,
                              engine_sizing=engine_sizing(args.engine_train_utts,
                                                          args.engine_words))
    for split in ("train", "dev", "test"):
        if split not in summary:
            continue
        info = summary[split]
        logging.info("%s: %d speakers, %d utterances, %.2f h", split, info["speakers"],
                     info["utts"], info["hours"])
    for name, info in summary.items():
        if name.startswith("trials"):
            logging.info("test/%s: %d trials (%d target)", name, info["trials"],
                         info["targets"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
