"""Synthesize read speech from many TTS voices as Kaldi data dirs, noise-free and in noise.

Writes <out-dir>/{train,dev,test}/ (wav.scp text utt2spk spk2utt utt2dur) of noise-free
speech and, unless --no-noisy, <out-dir>/{train,dev,test}_noisy/ with the same utterances
in white/pink/brown/babble noise (plus utt2noise, utt2snr); WAVs (16-bit) under
<out-dir>/wavs/<dir>/, and <out-dir>/voices.tsv (each voice that speaks: split, engine,
engine voice, version). Train, dev and test use disjoint voices.
The output is byte-identical for the same arguments whatever --nj, and rerunning a
finished run with the same arguments does nothing.

Examples:
  python -m toolkit.bin.synth_codec_data --out-dir data --num-train 2000 --nj 2
  python -m toolkit.bin.synth_codec_data --out-dir data --engines espeak,kokoro \
      --blends 100 --other-share 0.5            # Kokoro's voices and blends speak half
  python -m toolkit.bin.synth_codec_data --out-dir data_kokoro --test-only \
      --engines kokoro --num-test 60 --no-noisy  # the 7 reserved Kokoro voices alone
  python -m toolkit.bin.synth_codec_data --config egs/tts_codec/s0/conf/corpus.yaml \
      --out-dir data --seed 1234                # sizes and shares from a file (--help: keys)
  python -m toolkit.bin.synth_codec_data --out-dir data/part_1 --part 1 --num-train 2000
                                                # 2000 more training utterances, same voices
needs espeak-ng: pip install -e .[tts]; Kokoro: bash tools/install_voices.sh kokoro
"""
import argparse
import logging
import sys

from toolkit.cli import low_high, parse_with_options_file
from toolkit.errors import cli
from toolkit.tasks.codec.corpus import SENTENCES, Sizes, generate_speech
from toolkit.voicebank.corpus import add_voice_bank_arguments

_DEFAULTS = Sizes()


def get_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m toolkit.bin.synth_codec_data",
                                description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out-dir", required=True, metavar="DIR", help="output directory")
    p.add_argument("--seed", type=int, default=1234, help="random seed >= 0 (default %(default)s)")
    for split in ("train", "dev", "test"):
        p.add_argument(f"--num-{split}", dest=split, type=int, metavar="N",
                       default=getattr(_DEFAULTS, split),
                       help=f"utterances in {split} (default %(default)s)")
    p.add_argument("--random-voices", type=int, default=0, metavar="N",
                   help="procedural espeak-ng voices (random vocal tracts and voice sources) "
                        "added to the fixed ones before the split; at most 300 (default 0)")
    p.add_argument("--max-voices", type=int, default=0, metavar="N",
                   help="use at most N voices in all, 10%% each (at least one) for dev and "
                        "test (default 0: every voice)")
    add_voice_bank_arguments(
        p, engines_note="those besides espeak share --other-share of the utterances",
        blends_note="the blends are split across train/dev/test like other voices",
        test_only_note=" (and test_noisy), sized by --num-test")
    p.add_argument("--snr", type=low_high(float), default=(5.0, 25.0), metavar="LOW,HIGH",
                   help="SNR range in dB of the noisy versions (default 5,25)")
    p.add_argument("--sentences", type=low_high(int), default=SENTENCES, metavar="LOW,HIGH",
                   help="sentences per utterance (default %d,%d)" % SENTENCES)
    p.add_argument("--no-noisy", dest="noisy", action="store_false",
                   help="write the noise-free dirs only")
    p.add_argument("--sample-rate", type=int, default=16000, metavar="HZ",
                   help="output sample rate (default %(default)s)")
    p.add_argument("--part", type=int, default=0, metavar="K",
                   help="K > 0: more training speech for the corpus of this --seed, in an "
                        "--out-dir of its own: train (and train_noisy) alone, the same voice "
                        "split, texts and conditions of its own, sized by --num-train; a "
                        "corpus grows by parts, and finished ones are never made again "
                        "(default 0: the corpus itself)")
    p.add_argument("--nj", type=int, default=2,
                   help="parallel render processes; does not change the output (default 2)")
    return parse_with_options_file(p, argv)


@cli
def main(argv=None):
    args = get_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s synth_codec_data %(levelname)s %(message)s")
    sizes = Sizes(train=args.train, dev=args.dev, test=args.test)
    # A SynthError is a UserError: @cli prints it as one `error:` line, exit status 2.
    summary = generate_speech(args.out_dir, seed=args.seed, sizes=sizes, nj=args.nj,
                              sample_rate=args.sample_rate, engines=args.engines.split(","),
                              n_random_voices=args.random_voices, max_voices=args.max_voices,
                              snr_db=args.snr, noisy=args.noisy, sentences=args.sentences,
                              test_only=args.test_only, other_share=args.other_share,
                              blends=args.blends, part=args.part)
    for name, info in summary.items():
        logging.info("%s: %d utterances, %.2f h, %d voices", name, info["utts"], info["hours"],
                     info["voices"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
