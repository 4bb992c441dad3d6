#!/usr/bin/env python3
"""Snips "Hey Snips" corpus -> Kaldi data dirs data/{train,dev,test} and
data/dict/keywords.txt ("hey snips").

The corpus directory (hey_snips_research_6k_en_train_eval_clean_ter after extracting
hey_snips_kws_4.0.tar.gz) holds audio_files/*.wav and train.json, dev.json, test.json:
JSON lists of objects with `id`, `is_hotword` (0/1), `worker_id` (the speaker),
`duration` (seconds) and `audio_file_path` (relative, e.g. audio_files/<id>.wav).

Hotword utterances get the transcript "hey snips", all others the filler transcript
"<filler>" (no keyword words, so the keyword labeler makes them label -1). Entries whose
duration is not positive (the metadata has some) or whose file is missing are reported
and left out. The metadata durations become utt2dur, which FA/h scoring uses.
"""
import argparse
import json
import logging
import os
import re
import sys
from collections import defaultdict

from toolkit.data.kaldi import write_data_dir

logger = logging.getLogger("prepare_data")

KEYWORD = "hey snips"
FILLER = "<filler>"
SPLITS = ("train", "dev", "test")


def get_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--root", required=True, help="corpus dir holding train.json and audio_files/")
    p.add_argument("--out-dir", required=True, help="recipe data dir (e.g. data)")
    return p.parse_args(argv)


def clean_id(value) -> str:
    """Kaldi ids must not hold whitespace; anything unusual becomes '_'."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", str(value)) or "unknown"


def load_split(root: str, split: str):
    path = os.path.join(root, f"{split}.json")
    if not os.path.isfile(path):
        raise SystemExit(f"error: {path} not found: --root must be the Hey Snips directory "
                         f"holding train.json, dev.json, test.json and audio_files/")
    with open(path, encoding="utf-8") as f:
        entries = json.load(f)
    if not isinstance(entries, list):
        raise SystemExit(f"error: {path}: expected a JSON list of utterances")
    rows, skipped = [], defaultdict(list)
    for i, e in enumerate(entries):
        if not isinstance(e, dict) or "id" not in e or "is_hotword" not in e:
            skipped["entry without id/is_hotword"].append(f"{split}.json[{i}]")
            continue
        utt_id = clean_id(e["id"])
        duration = e.get("duration")
        if not isinstance(duration, (int, float)) or isinstance(duration, bool) or duration <= 0:
            skipped["duration not positive"].append(utt_id)
            continue
        rel = e.get("audio_file_path") or f"audio_files/{e['id']}.wav"
        wav = os.path.join(root, rel)
        if not os.path.isfile(wav):
            skipped["audio file missing"].append(rel)
            continue
        spk = clean_id("unknown" if e.get("worker_id") is None else e["worker_id"])
        text = KEYWORD if int(e["is_hotword"]) == 1 else FILLER
        # Speaker-prefixed ids keep utt2spk and spk2utt in the same sorted order (Kaldi).
        rows.append((f"{spk}-{utt_id}", wav, text, spk, float(duration)))
    for reason, keys in skipped.items():
        logger.warning("%s: %d entries skipped: %s (e.g. %s)", split, len(keys), reason,
                       ", ".join(keys[:3]))
    return rows


def write_kaldi_dir(data_dir: str, rows) -> None:
    """rows: (utt, wav path, text, speaker, duration), written sorted by utt."""
    write_data_dir(data_dir, {"wav.scp": {u: w for u, w, _, _, _ in rows},
                              "text": {u: t for u, _, t, _, _ in rows},
                              "utt2spk": {u: s for u, _, _, s, _ in rows},
                              "utt2dur": {u: f"{d:.3f}" for u, _, _, _, d in rows}})


def main(argv=None):
    args = get_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    root = os.path.abspath(args.root)
    for split in SPLITS:
        rows = load_split(root, split)
        if not rows:
            raise SystemExit(f"error: no usable utterance in {split}.json")
        write_kaldi_dir(os.path.join(args.out_dir, split), rows)
        pos = sum(1 for r in rows if r[2] == KEYWORD)
        hours = sum(r[4] for r in rows if r[2] != KEYWORD) / 3600
        logger.info("%s: %d utterances, %d hotword, %d other (%.2f h), %d speakers", split,
                    len(rows), pos, len(rows) - pos, hours, len({r[3] for r in rows}))
    os.makedirs(os.path.join(args.out_dir, "dict"), exist_ok=True)
    with open(os.path.join(args.out_dir, "dict", "keywords.txt"), "w", encoding="utf-8") as f:
        f.write(KEYWORD + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
