"""A training data list in which each utterance is, with probability --prob, heard as its
condition copy (toolkit.bin.make_condition_copy: a room, noise, a channel or clipping)
instead of as synthesized: the same keys, texts, labels and keyword times, so a run on it
has as many utterances per epoch as one on the source list. For measuring what training on
degraded audio does to a head (egs/wake_word/s0/RESULTS.md), not a recipe stage.

    python -m toolkit.bin.make_condition_copy --src data/train --out data/train_cond --nj 2
    python tools/analysis/mix_condition_copy.py --src data/train --cond data/train_cond \\
        --out data_mix/train --prob 0.5
    python -m toolkit.bin.compute_feats data_mix/train/data.list data_mix/train/phone_frontend \\
        --config conf/phone_ds_tcn.yaml --nj 2

Utterances whose drawn chain was `clean` (utt2cond) keep their audio. The choice is seeded
(--seed); --out gets data.list and links to the source's Kaldi files (utt2spk, text, ...).
"""
import argparse
import json
import os
import random
import sys

KALDI_FILES = ("utt2spk", "spk2utt", "text", "utt2kind", "utt2cat", "utt2dur", "kw_times")


def get_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--src", required=True, help="source dir with data.list")
    p.add_argument("--cond", required=True, help="its make_condition_copy (wav.scp, utt2cond)")
    p.add_argument("--out", required=True, help="dir to write data.list into")
    p.add_argument("--prob", type=float, default=0.5, help="share heard as the condition copy")
    p.add_argument("--seed", type=int, default=7)
    args = p.parse_args(argv)
    if not 0.0 <= args.prob <= 1.0:
        p.error(f"--prob {args.prob}: expected 0..1")
    return args


def main(argv=None) -> int:
    args = get_args(argv)
    from toolkit.data.kaldi import read_table
    wavs = read_table(os.path.join(args.cond, "wav.scp"))
    chains = read_table(os.path.join(args.cond, "utt2cond"))
    rng = random.Random(args.seed)
    os.makedirs(args.out, exist_ok=True)
    total = changed = 0
    with open(os.path.join(args.src, "data.list"), encoding="utf-8") as f, \
            open(os.path.join(args.out, "data.list"), "w", encoding="utf-8") as out:
        for n, line in enumerate(f, 1):
            entry = json.loads(line)
            total += 1
            if rng.random() < args.prob:
                if entry["key"] not in wavs:
                    raise SystemExit(f"error: {args.src}/data.list:{n}: {entry['key']} has no "
                                     f"condition copy in {args.cond}/wav.scp")
                if chains.get(entry["key"]) != "clean":
                    entry["wav"] = wavs[entry["key"]]
                    changed += 1
            out.write(json.dumps(entry) + "\n")
    for name in KALDI_FILES:
        src, dst = os.path.join(args.src, name), os.path.join(args.out, name)
        if os.path.exists(src) and not os.path.lexists(dst):
            os.symlink(os.path.abspath(src), dst)
    print(f"{args.out}/data.list: {changed} of {total} utterances heard as their condition copy")
    return 0


if __name__ == "__main__":
    sys.exit(main())
