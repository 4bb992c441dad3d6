#!/usr/bin/env python3
"""Google Speech Commands (v0.02) -> Kaldi data dirs data/{train,dev,test} and
data/dict/classes.txt.

The corpus root holds `<word>/<speaker>_nohash_<n>.wav`, `validation_list.txt`,
`testing_list.txt` (paths relative to the root) and `_background_noise_/*.wav`.
A clip listed in validation_list.txt is dev, one in testing_list.txt is test, every
other clip is train (the official split, by speaker hash).

--task 12: yes no up down left right on off stop go, `_silence_` and `_unknown_`
  (any other word). As in TensorFlow's reference pipeline, each split gets
  ceil(fraction x its command-word clips) unknown clips (sampled from the other
  words; --unknown-fraction -1 keeps them all) and as many silence clips, cut as
  1 s segments at random offsets from _background_noise_. Each noise file is divided
  in time, 80 % train / 10 % dev / 10 % test, so no noise sample is in two splits.
--task 35: the 35 words of v0.02, one class each; no silence, no unknown.

Kaldi files: wav.scp (absolute paths), text (the class name), utt2spk, spk2utt and
utt2word (the spoken word, or `silence`). Deterministic for a given --seed.
"""
import argparse
import logging
import math
import os
import shutil
import sys
from collections import Counter

import numpy as np
import soundfile as sf

from toolkit.data.kaldi import write_data_dir

logger = logging.getLogger("prepare_data")

WORDS_V2 = [
    "backward", "bed", "bird", "cat", "dog", "down", "eight", "five", "follow", "forward",
    "four", "go", "happy", "house", "learn", "left", "marvin", "nine", "no", "off", "on",
    "one", "right", "seven", "sheila", "six", "stop", "three", "tree", "two", "up",
    "visual", "wow", "yes", "zero"]
COMMANDS = ["yes", "no", "up", "down", "left", "right", "on", "off", "stop", "go"]
SILENCE, UNKNOWN = "_silence_", "_unknown_"
NOISE_DIR = "_background_noise_"
SPLITS = ("train", "dev", "test")
# Part of each background-noise recording that each split cuts its silence from.
NOISE_REGIONS = {"train": (0.0, 0.8), "dev": (0.8, 0.9), "test": (0.9, 1.0)}
SPLIT_SEED = {"train": 0, "dev": 1, "test": 2}


def get_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--root", required=True, help="corpus root (holds validation_list.txt)")
    p.add_argument("--out-dir", required=True, help="recipe data dir (e.g. data)")
    p.add_argument("--task", choices=["12", "35"], default="12")
    p.add_argument("--silence-fraction", type=float, default=0.1,
                   help="task 12: silence clips per command-word clip of a split")
    p.add_argument("--unknown-fraction", type=float, default=0.1,
                   help="task 12: unknown clips per command-word clip (-1: all of them)")
    p.add_argument("--silence-seconds", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=777)
    return p.parse_args(argv)


def fail(message: str) -> None:
    logger.error("%s", message)
    sys.exit(1)


def read_list(root: str, name: str) -> set:
    path = os.path.join(root, name)
    if not os.path.isfile(path):
        fail(f"{path} not found: --root must be the Speech Commands directory that holds "
             f"validation_list.txt, testing_list.txt and one directory per word")
    with open(path, encoding="utf-8") as f:
        return {line.strip().replace("\\", "/") for line in f if line.strip()}


def scan_words(root: str) -> dict:
    """word -> sorted relative paths `word/file.wav`."""
    words = {}
    for entry in sorted(os.scandir(root), key=lambda e: e.name):
        if entry.is_dir() and not entry.name.startswith((".", "_")):
            clips = sorted(f"{entry.name}/{f.name}" for f in os.scandir(entry.path)
                           if f.is_file() and f.name.lower().endswith(".wav"))
            if clips:
                words[entry.name] = clips
    return words


def utt_of(rel: str) -> tuple:
    """`word/<spk>_nohash_<n>.wav` -> (utt id, speaker)."""
    word, name = rel.split("/")
    stem = os.path.splitext(name)[0]
    if "_nohash_" in stem:
        spk, n = stem.split("_nohash_", 1)
    else:
        spk, n = stem, "0"
    return f"{spk}-{word}-{n}", spk


def cut_silence(root: str, out_wav_dir: str, counts: dict, seconds: float, seed: int) -> dict:
    """split -> list of (utt, spk, path) of `seconds`-long noise clips."""
    noise_dir = os.path.join(root, NOISE_DIR)
    names = sorted(f for f in os.listdir(noise_dir) if f.lower().endswith(".wav")) \
        if os.path.isdir(noise_dir) else []
    if not names:
        fail(f"no {NOISE_DIR}/*.wav under {root}: silence clips are cut from them "
             f"(or use --silence-fraction 0)")
    noises = []
    for name in names:
        audio, rate = sf.read(os.path.join(noise_dir, name), dtype="float32", always_2d=True)
        noises.append((os.path.splitext(name)[0], audio.mean(axis=1), rate))
    if os.path.isdir(out_wav_dir):
        shutil.rmtree(out_wav_dir)
    result = {}
    for split in SPLITS:
        n = counts.get(split, 0)
        result[split] = []
        if n == 0:
            continue
        lo, hi = NOISE_REGIONS[split]
        # Files whose region of this split holds a whole clip, weighted by region length.
        spans = []
        for name, wave, rate in noises:
            a, b = int(lo * len(wave)), int(hi * len(wave))
            need = int(round(seconds * rate))
            if b - a >= need:
                spans.append((name, wave, rate, a, b - need))
        if not spans:
            fail(f"no background-noise file has {seconds:g} s in its {split} part "
                 f"({lo:.0%}-{hi:.0%} of its length)")
        weights = np.array([s[4] - s[3] + 1 for s in spans], dtype=np.float64)
        rng = np.random.default_rng([seed, SPLIT_SEED[split]])
        os.makedirs(os.path.join(out_wav_dir, split), exist_ok=True)
        for i in range(n):
            name, wave, rate, first, last = spans[rng.choice(len(spans), p=weights / weights.sum())]
            start = int(rng.integers(first, last + 1))
            clip = wave[start:start + int(round(seconds * rate))] * rng.uniform(0.1, 1.0)
            spk = f"noise-{name}"
            utt = f"{spk}-{split}-{i:05d}"
            path = os.path.join(out_wav_dir, split, utt + ".wav")
            sf.write(path, np.clip(clip, -1.0, 1.0), rate, subtype="PCM_16")
            result[split].append((utt, spk, path))
    return result


def write_kaldi_dir(data_dir: str, rows: list) -> None:
    """rows: (utt, path, class, spk, word), written sorted by utt (C order)."""
    write_data_dir(data_dir, {"wav.scp": {u: p for u, p, _, _, _ in rows},
                              "text": {u: c for u, _, c, _, _ in rows},
                              "utt2spk": {u: s for u, _, _, s, _ in rows},
                              "utt2word": {u: w for u, _, _, _, w in rows}})


def main(argv=None):
    args = get_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    root = os.path.abspath(args.root)
    valid, test = read_list(root, "validation_list.txt"), read_list(root, "testing_list.txt")
    both = sorted(valid & test)
    if both:
        fail(f"{len(both)} clips are in both validation_list.txt and testing_list.txt "
             f"(e.g. {both[0]})")
    words = scan_words(root)
    on_disk = {rel for clips in words.values() for rel in clips}
    for name, listed in (("validation_list.txt", valid), ("testing_list.txt", test)):
        missing = sorted(listed - on_disk)
        if missing:
            logger.warning("%d clips of %s are not on disk (e.g. %s)", len(missing), name,
                           missing[0])

    if args.task == "12":
        classes = COMMANDS + [SILENCE, UNKNOWN]
        required = COMMANDS
    else:
        classes = list(WORDS_V2)
        required = WORDS_V2
    absent = [w for w in required if w not in words]
    if absent:
        fail(f"task {args.task} needs word directories that {root} lacks: {', '.join(absent)}"
             + (" (task 35 needs Speech Commands v0.02)" if args.task == "35" else ""))
    extra = [w for w in words if w not in WORDS_V2]
    if extra:
        logger.warning("directories that are not Speech Commands v0.02 words: %s (%s)",
                       ", ".join(extra), "treated as _unknown_" if args.task == "12" else "skipped")

    def split_of(rel: str) -> str:
        return "dev" if rel in valid else "test" if rel in test else "train"

    rows = {s: [] for s in SPLITS}
    unknown = {s: [] for s in SPLITS}
    for word, clips in words.items():
        for rel in clips:
            utt, spk = utt_of(rel)
            row = (utt, os.path.join(root, rel), word, spk, word)
            if word in classes:
                rows[split_of(rel)].append(row)
            elif args.task == "12":
                unknown[split_of(rel)].append(row[:2] + (UNKNOWN,) + row[3:])
    seen = Counter(r[0] for s in SPLITS for r in rows[s] + unknown[s])
    dup = [u for u, n in seen.items() if n > 1]
    if dup:
        fail(f"{len(dup)} clips map to the same utterance id (e.g. {dup[0]})")

    if args.task == "12":
        known = {s: len(rows[s]) for s in SPLITS}
        for s in SPLITS:
            pool = sorted(unknown[s])
            if args.unknown_fraction >= 0:
                n = min(len(pool), math.ceil(known[s] * args.unknown_fraction))
                rng = np.random.default_rng([args.seed, 10 + SPLIT_SEED[s]])
                pool = [pool[i] for i in sorted(rng.choice(len(pool), n, replace=False))]
            rows[s].extend(pool)
        counts = {s: math.ceil(known[s] * args.silence_fraction) for s in SPLITS} \
            if args.silence_fraction > 0 else {}
        silence = cut_silence(root, os.path.join(os.path.abspath(args.out_dir), "local", "silence"),
                              counts, args.silence_seconds, args.seed) if counts else {}
        for s, clips in silence.items():
            rows[s].extend((utt, path, SILENCE, spk, "silence") for utt, spk, path in clips)

    for s in SPLITS:
        if not rows[s]:
            fail(f"no clips for the {s} split")
        write_kaldi_dir(os.path.join(args.out_dir, s), rows[s])
        per_class = Counter(r[2] for r in rows[s])
        logger.info("%s: %d clips, %d classes (%s)", s, len(rows[s]), len(per_class),
                    ", ".join(f"{c}={per_class[c]}" for c in classes if per_class[c]))
    os.makedirs(os.path.join(args.out_dir, "dict"), exist_ok=True)
    with open(os.path.join(args.out_dir, "dict", "classes.txt"), "w", encoding="utf-8") as f:
        f.write("".join(c + "\n" for c in classes))
    logger.info("task %s: %d classes in %s", args.task, len(classes),
                os.path.join(args.out_dir, "dict", "classes.txt"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
