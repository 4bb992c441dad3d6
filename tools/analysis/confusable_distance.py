"""How close near-homophones sound to the keyword, voice by voice (espeak-ng).

For each voice, renders the keyword and each phrase with the same prosody, and prints the
DTW distance (length-normalised, Euclidean over per-utterance mean-removed log-mel frames)
from the keyword to each phrase, and to the keyword itself at another speaking rate. A
phrase nearer than the rate change is, for that voice, about as close to the keyword as
natural variation: a detector cannot reject it without also missing the keyword.

    tools/venv/bin/python tools/analysis/confusable_distance.py \\
        --voices en-gb-x-gbcwmd+david,en+f1 --phrases "hey sneps,hey slips"
"""
import argparse
import sys

import numpy as np

from toolkit.data.audio import resample
from toolkit.data.features import compute_fbank, fbank_options
from toolkit.voicebank.espeak import Espeak

RATE = 16000


def get_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--keyword", default="hey snips")
    parser.add_argument("--phrases", default="hey sneps,hey slips,hey snieps",
                        help="comma-separated near-homophones")
    parser.add_argument("--voices", default="en-gb-x-gbcwmd+david,en-gb-scotland+f1,en+f1",
                        help="comma-separated espeak-ng voices (accent+variant)")
    parser.add_argument("--rate", type=int, default=175, help="words per minute (espeak: 175)")
    parser.add_argument("--other-rate", type=int, default=150,
                        help="the keyword's reference variation: the same voice at this rate")
    parser.add_argument("--num-mel-bins", type=int, default=40)
    return parser.parse_args(argv)


def dtw_distance(a: np.ndarray, b: np.ndarray) -> float:
    """Cumulative Euclidean frame distance on the best monotone path / (len(a) + len(b))."""
    cost = np.sqrt(((a[:, None, :] - b[None, :, :]) ** 2).sum(-1))
    acc = np.full((len(a) + 1, len(b) + 1), np.inf)
    acc[0, 0] = 0.0
    for i in range(1, len(a) + 1):
        for j in range(1, len(b) + 1):
            acc[i, j] = cost[i - 1, j - 1] + min(acc[i - 1, j], acc[i, j - 1], acc[i - 1, j - 1])
    return float(acc[-1, -1] / (len(a) + len(b)))


def main(argv=None) -> int:
    args = get_args(argv)
    phrases = [p.strip() for p in args.phrases.split(",") if p.strip()]
    voices = [v.strip() for v in args.voices.split(",") if v.strip()]
    opts = fbank_options(args.num_mel_bins, 25.0, 10.0, 0.0, RATE)
    engine = Espeak()

    def features(text: str, voice: str, rate: int) -> np.ndarray:
        engine.seed(1)  # espeak's noise sources: the same for every rendering
        wave = resample(engine.synth(text, voice, rate=rate), engine.rate, RATE)
        feats = compute_fbank(wave, opts)
        return feats - feats.mean(axis=0)

    columns = phrases + [f"{args.keyword} @{args.other_rate}"]
    print("voice\t" + "\t".join(columns))
    for voice in voices:
        keyword = features(args.keyword, voice, args.rate)
        row = [dtw_distance(keyword, features(p, voice, args.rate)) for p in phrases]
        row.append(dtw_distance(keyword, features(args.keyword, voice, args.other_rate)))
        print(voice + "\t" + "\t".join(f"{d:.2f}" for d in row))
    return 0


if __name__ == "__main__":
    sys.exit(main())
