"""Generate a synthetic wake-word corpus (TTS speech + noise) as Kaldi data dirs.

Example:
  python -m toolkit.bin.synth_kws_data --keyword "hey snips" --out-dir data --seed 777 --nj 2
  python -m toolkit.bin.synth_kws_data --config conf/corpus.yaml --keyword "hey snips" --out-dir data
"""
import argparse
import logging
import sys

from toolkit.cli import parse_with_options_file
from toolkit.errors import cli
from toolkit.tasks.kws.corpus import (SPOKEN_KINDS, TRAIN_CONF_SHARE, TRAIN_HARD_SHARE,
                                      Sizes, generate_corpus)
from toolkit.voicebank.corpus import add_voice_bank_arguments

_DEFAULTS = Sizes()


def get_args(argv=None):
    p = argparse.ArgumentParser(
        prog="python -m toolkit.bin.synth_kws_data",
        description=(
            "Synthesize a wake-word corpus with espeak-ng (and the other TTS engines named in\n"
            "--engines): positives (the keyword alone or in carrier phrases) and negatives\n"
            "(random words, confusables built from the keyword, pure noise), all in white/pink/\n"
            "brown/babble noise. Writes <out-dir>/{train,dev,test}/ Kaldi data dirs (wav.scp\n"
            "text utt2dur utt2spk spk2utt utt2kind kw_times), WAVs under <out-dir>/wavs/<split>/,\n"
            "<out-dir>/dict/keywords.txt (line i = class i), <out-dir>/dict/tts_engines\n"
            "(`engine share` lines) and <out-dir>/voices.tsv (each voice that speaks: split,\n"
            "engine, engine voice, version). Train, dev and test use disjoint voices. The\n"
            "output is byte-identical for the same arguments whatever --nj and whatever else\n"
            "is installed, and rerunning a finished run with the same arguments does nothing.\n"
            "The general negatives are the same for every keyword (--neg-cache makes them\n"
            "once); those that hold the keyword are dropped, logged and counted.\n\n"
            "Options may also come from a YAML file (--config; the command line wins).\n\n"
            "example: %(prog)s --keyword 'hey snips' --out-dir data --seed 777 --nj 2\n"
            "needs espeak-ng: pip install -e .[tts]"),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--keyword", action="append", required=True, metavar="PHRASE",
                   help="keyword phrase; repeat for several keywords (order = class index)")
    p.add_argument("--out-dir", required=True, metavar="DIR", help="output directory (e.g. data)")
    p.add_argument("--seed", type=int, default=777, help="random seed >= 0 (default %(default)s)")
    for split in ("train", "dev", "test"):
        for kind, what in (("pos", "positive"), ("neg", "negative")):
            name = f"{split}_{kind}"
            p.add_argument(f"--num-{split}-{kind}", dest=name, type=int, metavar="N",
                           default=getattr(_DEFAULTS, name),
                           help=f"{what} utterances in {split} (default %(default)s)")
    p.add_argument("--nj", type=int, default=2,
                   help="parallel render processes; does not change the output (default %(default)s)")
    p.add_argument("--sample-rate", type=int, default=16000, metavar="HZ",
                   help="output sample rate (default %(default)s)")
    p.add_argument("--snr-min", type=float, default=5.0, metavar="DB",
                   help="lowest speech-to-noise ratio (default %(default)s)")
    p.add_argument("--snr-max", type=float, default=30.0, metavar="DB",
                   help="highest speech-to-noise ratio (default %(default)s)")
    p.add_argument("--train-conf-share", type=float, default=TRAIN_CONF_SHARE, metavar="F",
                   help="fraction of the training negatives that are confusables; dev/test "
                        "keep 0.3 (default %(default)s)")
    p.add_argument("--train-hard-share", type=float, default=TRAIN_HARD_SHARE, metavar="F",
                   help="fraction of the training confusables that are near-homophones of the "
                        "whole keyword ('hey snoops' for 'hey snips'); the rest cover every "
                        "confusable category in turn (default %(default)s)")
    add_voice_bank_arguments(
        p, engines_note="those besides espeak share --other-share of the utterances",
        blends_note="the blends are split across train/dev/test like other voices",
        test_only_note=" (and dict/), sized by --num-test-pos/--num-test-neg")
    p.add_argument("--other-kinds", default=",".join(SPOKEN_KINDS), metavar="LIST",
                   help="utterance kinds the engines besides espeak-ng may speak, of "
                        f"{','.join(SPOKEN_KINDS)} (positives, confusables, random words): "
                        "'pos' spends a neural engine's synthesis time on short keyword clips "
                        "alone (default %(default)s)")
    p.add_argument("--outside-dev", action="store_true",
                   help="write <out-dir>/dev alone (and dict/), sized by --num-dev-pos/"
                        "--num-dev-neg, spoken by every voice of --engines that no test "
                        "reserves and --exclude-voices does not name: a set to choose fusion "
                        "weights or a front end on, from voices no training corpus holds "
                        "(e.g. pico,rhvoice,mbrola less the voices the phone front end was "
                        "trained on), so that the choice sees voices unlike the training ones")
    p.add_argument("--exclude-voices", default="", metavar="LIST",
                   help="speaker ids (as in voices.tsv, e.g. pico_en-gb,rhvoice_bdl) that speak "
                        "in no split: with --outside-dev, the voices the front end was trained "
                        "on (its model card names them); an unknown id is an error")
    p.add_argument("--neg-cache", action="store_true",
                   help="take the general negatives (random words, noise alone: the same for "
                        "every keyword) from the negatives cache ($TOOLKIT_NEG_CACHE, else "
                        "kws_negatives in $TOOLKIT_CACHE or ~/.cache/toolkit), rendering them "
                        "there first when "
                        "it has none; the corpus is the same as without it. Each split's data "
                        "dir records them (neg_cache.json) for compute_feats --neg-cache")
    return parse_with_options_file(p, argv)


@cli
def main(argv=None):
    args = get_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s synth_kws_data %(levelname)s %(message)s")
    sizes = Sizes(**{f"{s}_{k}": getattr(args, f"{s}_{k}")
                     for s in ("train", "dev", "test") for k in ("pos", "neg")})
    # A SynthError is a UserError: @cli prints it as one `error:` line, exit status 2.
    summary = generate_corpus(args.keyword, args.out_dir, seed=args.seed, sizes=sizes,
                              nj=args.nj, sample_rate=args.sample_rate,
                              snr_db=(args.snr_min, args.snr_max),
                              engines=args.engines.split(","),
                              train_conf_share=args.train_conf_share,
                              train_hard_share=args.train_hard_share,
                              other_share=args.other_share, blends=args.blends,
                              test_only=args.test_only,
                              other_kinds=args.other_kinds.split(","),
                              neg_cache=args.neg_cache, outside_dev=args.outside_dev,
                              exclude_voices=[v for v in args.exclude_voices.split(",") if v])
    for split, info in summary.items():
        kinds = ", ".join(f"{k} {h:.2f} h" for k, h in info["hours_by_kind"].items())
        dropped = (f"; {info['dropped_negatives']} general negatives dropped (they hold the "
                   "keyword)") if info.get("dropped_negatives") else ""
        logging.info("%s: %d utterances, %.2f h (%s)%s", split, info["utts"], info["hours"],
                     kinds, dropped)
    return 0


if __name__ == "__main__":
    sys.exit(main())
