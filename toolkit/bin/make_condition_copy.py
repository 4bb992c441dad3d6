"""A condition copy of a Kaldi data dir: every utterance once, under one seeded random chain
of the conditions a product meets, with the same utterance ids, speakers and texts (so
phone targets stay valid). Per utterance, independently:
  a room (image method; small/medium/large, the microphone 0.5-4 m away) with prob. 0.5;
  noise (white/pink/brown, or babble of other utterances of the dir) at 0-25 dB SNR, 0.6;
  one channel, 0.7: the telephone band with G.711 mu-law, Codec2 (3200/2400/1600/1200/700C),
    Opus (6-24 kbit/s) or microphone colouring (a random EQ), which also comes before a
    telephone/codec channel with prob. 0.3;
  clipping of 1-10 % of the samples, 0.1;
  whispering (off by default; --whisper-prob), before all of them: each frame's formants
    over noise, mixed with --breath of it;
then the input's active level, peak-safe, as 16-bit WAVs. Writes OUT/{wav.scp, text,
utt2spk, spk2utt, utt2dur, utt2cond} and OUT/wavs/; utt2cond names each chain, e.g.
`room:medium/2.1m+noise:babble/8.3dB+codec2:1600` (`clean`: none drawn).
The output is byte-identical for any --nj; a finished copy of the same arguments is left
alone, a killed run resumes (whole WAVs kept), other arguments remake only this writer's
files. Unreadable source audio is logged and skipped; more than 1 % is an error.
Codec2 and Opus need the codec extra (pycodec2==4.1.1, av==18.1.0: pip install -e .[codec]).

Examples:
  python -m toolkit.bin.make_condition_copy --src DATA/train --out DATA/train_cond \\
      --seed 1234 --nj 2
  python -m toolkit.bin.make_condition_copy --src DATA/dev --out DATA/dev_phone \\
      --room-prob 0 --noise-prob 0 --channel-prob 1 --channels telephone,codec2
  python -m toolkit.bin.make_condition_copy --src DATA/test --out DATA/test_noisy_rooms \\
      --room-prob 1 --noise-prob 1 --snr-db 0,10 --channel-prob 0 --seed 7
"""
import argparse
import dataclasses
import logging
import sys

from toolkit.cli import low_high
from toolkit.errors import cli

# Option help of each ConditionSettings field (its default is appended).
_HELP = {
    "room_prob": "probability of a room", "room_sizes": "room sizes drawn from",
    "distance_m": "talker-microphone distance range, m", "noise_prob": "probability of noise",
    "noise_kinds": "noise kinds drawn from (babble: other utterances of --src)",
    "snr_db": "SNR range, dB", "channel_prob": "probability of one channel",
    "channels": "channels drawn from, alike (telephone: 300-3400 Hz with G.711 mu-law)",
    "mic_also_prob": "probability of mic colouring before a telephone/codec channel",
    "codec2_modes": "Codec2 modes drawn from", "opus_kbps": "Opus bitrate range, kbit/s",
    "mic_bands": "EQ bands of mic colouring (range)",
    "mic_gain_db": "each EQ band's gain range, dB (either sign)",
    "clip_prob": "probability of clipping", "clip_fraction": "fraction of samples clipped (range)",
    "whisper_prob": "probability of whispering (the voice turned to noise under its formants)",
    "breath": "the noise's share of a whispered voice (range)",
}


def _option(field: dataclasses.Field):
    """(argparse type, metavar, default text) of one settings field."""
    default = field.default
    if isinstance(default, float):
        return float, "P", f"{default:g}"
    kind = type(default[0]) if default else str
    if kind is str:
        return (lambda text: tuple(x.strip() for x in text.split(",") if x.strip())), \
            "A,B", ",".join(default)
    return low_high(kind), "LOW,HIGH", ",".join(f"{v:g}" for v in default)


def get_args(argv=None):
    from toolkit.voicebank.channel import ConditionSettings
    p = argparse.ArgumentParser(prog="python -m toolkit.bin.make_condition_copy",
                                description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--src", required=True, metavar="DIR",
                   help="source Kaldi data dir (wav.scp, utt2spk, optional text, segments)")
    p.add_argument("--out", required=True, metavar="DIR", help="output data dir")
    p.add_argument("--seed", type=int, default=1234, help="random seed >= 0 (default %(default)s)")
    p.add_argument("--nj", type=int, default=2,
                   help="parallel processes; does not change the output (default %(default)s)")
    group = p.add_argument_group("conditions (toolkit.voicebank.channel.ConditionSettings)")
    for field in dataclasses.fields(ConditionSettings):
        kind, metavar, shown = _option(field)
        group.add_argument("--" + field.name.replace("_", "-"), dest=field.name, type=kind,
                           metavar=metavar, default=field.default,
                           help=f"{_HELP[field.name]} (default {shown})")
    args = p.parse_args(argv)
    if args.nj < 1:
        p.error(f"--nj {args.nj}: must be >= 1")
    args.settings = ConditionSettings(**{f.name: getattr(args, f.name)
                                         for f in dataclasses.fields(ConditionSettings)})
    return args


@cli
def main(argv=None):
    args = get_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s make_condition_copy %(levelname)s %(message)s")
    from toolkit.voicebank.conditions import write_condition_copy
    summary = write_condition_copy(args.src, args.out, args.seed, args.nj, args.settings)
    print(f"{args.out}: {summary['utts']} utterances ({summary['hours']:.2f} h), "
          f"{summary['skipped']} skipped; conditions {summary['conditions']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
