#!/usr/bin/env python3
"""Stage 0 of egs/libritts/codec: a Kaldi data dir from one LibriTTS subset.

LibriTTS (OpenSLR 60, CC BY 4.0) unpacks to

  <corpus>/LibriTTS/<subset>/<speaker>/<chapter>/<speaker>_<chapter>_<para>_<sent>.wav
      (24 kHz 16-bit mono) with .normalized.txt and .original.txt beside each WAV, and
      <speaker>_<chapter>.book.tsv / .trans.tsv per chapter;

this writes <out>/{wav.scp, text, utt2spk, spk2utt} (keys are the file names, which start
with the speaker, so utterances sort by speaker as Kaldi wants; text is the normalized
transcript, the original where a normalized one is missing). --max-utts keeps that many
utterances spread evenly over the sorted list (every speaker stays represented), for a
small dev set. An utterance whose WAV is absent or empty is left out and counted; a
subset with none stops here.
"""
import argparse
import os
import sys
from typing import Dict, List, Tuple

from toolkit.data import kaldi

SUBSETS = ("train-clean-100", "train-clean-360", "train-other-500", "dev-clean", "dev-other",
           "test-clean", "test-other")


def say(message: str) -> None:
    print(f"[libritts] {message}", file=sys.stderr, flush=True)


def get_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corpus-dir", required=True, help="directory holding LibriTTS/")
    p.add_argument("--subset", required=True, choices=SUBSETS)
    p.add_argument("--out-dir", required=True, help="Kaldi data dir to write")
    p.add_argument("--max-utts", type=int, default=0,
                   help="keep at most this many utterances, evenly spread (0: all)")
    return p.parse_args(argv)


def read_text(path: str) -> str:
    with open(path, encoding="utf-8", errors="replace") as f:
        return " ".join(f.read().split())


def scan_subset(root: str) -> Tuple[Dict[str, Tuple[str, str, str]], Dict[str, int]]:
    """key -> (wav path, speaker, transcript), and counts of what was left out."""
    found: Dict[str, Tuple[str, str, str]] = {}
    skipped = {"empty_wav": 0, "no_transcript": 0}
    for speaker in sorted(os.listdir(root)):
        speaker_dir = os.path.join(root, speaker)
        if not os.path.isdir(speaker_dir):
            continue
        for chapter in sorted(os.listdir(speaker_dir)):
            chapter_dir = os.path.join(speaker_dir, chapter)
            if not os.path.isdir(chapter_dir):
                continue
            for name in sorted(os.listdir(chapter_dir)):
                if not name.endswith(".wav"):
                    continue
                key = name[:-4]
                wav = os.path.join(chapter_dir, name)
                if os.path.getsize(wav) <= 44:
                    skipped["empty_wav"] += 1
                    continue
                text = ""
                for ext in (".normalized.txt", ".original.txt"):
                    side = os.path.join(chapter_dir, key + ext)
                    if os.path.exists(side):
                        text = read_text(side)
                        break
                if not text:
                    skipped["no_transcript"] += 1
                    text = "<unk>"
                found[key] = (os.path.abspath(wav), speaker, text)
    return found, skipped


def spread(keys: List[str], limit: int) -> List[str]:
    if limit <= 0 or limit >= len(keys):
        return keys
    return [keys[(i * len(keys)) // limit] for i in range(limit)]


def main(argv=None) -> int:
    args = get_args(argv)
    root = os.path.join(args.corpus_dir, "LibriTTS", args.subset)
    if not os.path.isdir(root):
        say(f"error: {root} not found: run stage -1 (download) or pass --corpus-dir DIR, the "
            f"directory holding LibriTTS/{args.subset}")
        return 2
    found, skipped = scan_subset(root)
    if not found:
        say(f"error: no utterances (<speaker>/<chapter>/*.wav) under {root}")
        return 2
    keys = spread(sorted(found, key=kaldi.c_order), args.max_utts)
    kaldi.write_data_dir(args.out_dir, {
        "wav.scp": {k: found[k][0] for k in keys},
        "text": {k: found[k][2] for k in keys},
        "utt2spk": {k: found[k][1] for k in keys},
    })
    speakers = len({found[k][1] for k in keys})
    notes = []
    if skipped["empty_wav"]:
        notes.append(f"{skipped['empty_wav']} empty WAVs left out")
    if skipped["no_transcript"]:
        notes.append(f"{skipped['no_transcript']} without a transcript")
    say(f"{args.subset}: {len(keys)} utterances of {speakers} speakers -> {args.out_dir}"
        + (f" ({'; '.join(notes)})" if notes else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
