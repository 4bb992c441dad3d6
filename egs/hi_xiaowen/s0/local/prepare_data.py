#!/usr/bin/env python3
"""Mobvoi hotwords (OpenSLR 87) -> Kaldi data dirs data/{train,dev,test} and
data/dict/keywords.txt ("hi xiaowen", "nihao wenwen").

The corpus directory holds mobvoi_hotword_dataset/<utt_id>.wav and
mobvoi_hotword_dataset_resources/{p,n}_{train,dev,test}.json: JSON lists of objects with
`utt_id`, `speaker_id` and `keyword_id` (0 = "hi xiaowen", 1 = "nihao wenwen", -1 =
negative); p_* hold the keyword utterances, n_* the negatives.

Transcripts are the keyword phrase (pinyin, matched word by word against keywords.txt)
or "<filler>" for negatives. Entries with an unknown keyword_id or a missing file are
reported and left out; an utterance listed twice is an error.
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

KEYWORDS = ["hi xiaowen", "nihao wenwen"]      # line k = keyword_id k
FILLER = "<filler>"
SPLITS = ("train", "dev", "test")
WAV_DIR = "mobvoi_hotword_dataset"
RESOURCES = "mobvoi_hotword_dataset_resources"


def get_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--root", required=True,
                   help=f"dir holding {WAV_DIR}/ and {RESOURCES}/")
    p.add_argument("--out-dir", required=True, help="recipe data dir (e.g. data)")
    return p.parse_args(argv)


def clean_id(value) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", str(value)) or "unknown"


def load_split(root: str, split: str):
    rows, skipped, seen = [], defaultdict(list), set()
    for kind in ("p", "n"):
        path = os.path.join(root, RESOURCES, f"{kind}_{split}.json")
        if not os.path.isfile(path):
            raise SystemExit(f"error: {path} not found: --root must hold {WAV_DIR}/ and "
                             f"{RESOURCES}/ (the two OpenSLR 87 archives extracted side by side)")
        with open(path, encoding="utf-8") as f:
            entries = json.load(f)
        if not isinstance(entries, list):
            raise SystemExit(f"error: {path}: expected a JSON list of utterances")
        for i, e in enumerate(entries):
            if not isinstance(e, dict) or "utt_id" not in e or "keyword_id" not in e:
                skipped["entry without utt_id/keyword_id"].append(f"{kind}_{split}.json[{i}]")
                continue
            try:
                kw = int(e["keyword_id"])
            except (TypeError, ValueError):
                kw = None
            if kw is None or not -1 <= kw < len(KEYWORDS) or (kw == -1) != (kind == "n"):
                skipped[f"keyword_id {e['keyword_id']!r} unexpected in {kind}_{split}.json"] \
                    .append(str(e["utt_id"]))
                continue
            wav = os.path.join(root, WAV_DIR, f"{e['utt_id']}.wav")
            if not os.path.isfile(wav):
                skipped["audio file missing"].append(f"{WAV_DIR}/{e['utt_id']}.wav")
                continue
            # No speaker id: the utterance is its own speaker (as Kaldi's and lhotse's
            # Mobvoi preparations do); pooling them under one id would make per-speaker
            # statistics (stage 6's bootstrap over voices) look far more certain than they are.
            spk = (clean_id(e["speaker_id"]) if e.get("speaker_id") is not None
                   else f"nospk_{clean_id(e['utt_id'])}")
            utt = f"{spk}-{clean_id(e['utt_id'])}"
            if utt in seen:
                raise SystemExit(f"error: {e['utt_id']} is listed twice in the {split} metadata")
            seen.add(utt)
            rows.append((utt, wav, KEYWORDS[kw] if kw >= 0 else FILLER, spk))
    for reason, keys in skipped.items():
        logger.warning("%s: %d entries skipped: %s (e.g. %s)", split, len(keys), reason,
                       ", ".join(keys[:3]))
    return rows


def write_kaldi_dir(data_dir: str, rows) -> None:
    """rows: (utt, wav path, text, speaker), written sorted by utt."""
    write_data_dir(data_dir, {"wav.scp": {u: w for u, w, _, _ in rows},
                              "text": {u: t for u, _, t, _ in rows},
                              "utt2spk": {u: s for u, _, _, s in rows}})


def main(argv=None):
    args = get_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    root = os.path.abspath(args.root)
    for split in SPLITS:
        rows = load_split(root, split)
        if not rows:
            raise SystemExit(f"error: no usable utterance in the {split} metadata")
        write_kaldi_dir(os.path.join(args.out_dir, split), rows)
        counts = defaultdict(int)
        for r in rows:
            counts[r[2]] += 1
        logger.info("%s: %d utterances (%s), %d speakers", split, len(rows),
                    ", ".join(f"{k}={counts[k]}" for k in KEYWORDS + [FILLER]),
                    len({r[3] for r in rows}))
    os.makedirs(os.path.join(args.out_dir, "dict"), exist_ok=True)
    with open(os.path.join(args.out_dir, "dict", "keywords.txt"), "w", encoding="utf-8") as f:
        f.write("".join(k + "\n" for k in KEYWORDS))
    return 0


if __name__ == "__main__":
    sys.exit(main())
