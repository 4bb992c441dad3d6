#!/usr/bin/env python3
"""Stage -1 of egs/voxceleb/v2: the augmentation corpora and their data lists.

MUSAN (OpenSLR 17) and RIRS_NOISES (OpenSLR 28) are fetched through
toolkit.bin.fetch_corpus: skipped when already extracted in --corpus-dir, else the
archive in --download-dir is used (or downloaded), its md5 checked against --checksums
(local/checksums.txt), and extracted. Then:

  <out>/musan.list   MUSAN noise/, music/ and speech/ as data-list entries with `kind`
                     noise | music | babble (the keys of dataset.noise.snr_db_by_kind)
  <out>/rirs.list    RIRS_NOISES simulated_rirs/{smallroom,mediumroom} impulse responses

MUSAN's music and speech files run for minutes, and the loader decodes a noise file whole
for every chunk it noises: with --segment-seconds (default 8) they are cut once into
pieces of that length under <out>/musan_segments/ (16-bit WAV, about 12 GB for all of
MUSAN), which the list names instead. 0 keeps the files whole.
"""
import argparse
import json
import os
import sys
from typing import List

import soundfile as sf

from toolkit.bin import fetch_corpus

MUSAN_URL = "https://www.openslr.org/resources/17/musan.tar.gz"
RIRS_URL = "https://www.openslr.org/resources/28/rirs_noises.zip"
MUSAN_KINDS = {"noise": "noise", "music": "music", "speech": "babble"}
RIR_ROOMS = ("smallroom", "mediumroom")
MIN_SEGMENT_S = 1.0      # a shorter tail of a long file is dropped


def say(message: str) -> None:
    print(f"[noise] {message}", file=sys.stderr, flush=True)


def wavs_under(root: str) -> List[str]:
    out = []
    for d, _, files in os.walk(root):
        out += [os.path.join(d, f) for f in files if f.lower().endswith(".wav")]
    return sorted(out)


def key_of(path: str, root: str) -> str:
    return os.path.relpath(path, root)[:-4].replace(os.sep, "-")


def segment(path: str, key: str, out_dir: str, seconds: float) -> List[dict]:
    """Pieces of `seconds` of one recording written as WAVs (done once: a piece already
    there is kept), as data-list entries."""
    info = sf.info(path)
    step = int(round(seconds * info.samplerate))
    entries = []
    if info.frames <= step * 1.5:
        return [{"key": key, "wav": os.path.abspath(path),
                 "duration": round(info.frames / info.samplerate, 3)}]
    with sf.SoundFile(path) as f:
        for i, start in enumerate(range(0, info.frames, step)):
            n = min(step, info.frames - start)
            if n < MIN_SEGMENT_S * info.samplerate:
                break
            target = os.path.join(out_dir, f"{key}-{i:04d}.wav")
            if not os.path.exists(target):
                f.seek(start)
                audio = f.read(n, dtype="int16", always_2d=True)
                sf.write(target + ".tmp.wav", audio, info.samplerate, subtype="PCM_16")
                os.replace(target + ".tmp.wav", target)
            entries.append({"key": f"{key}-{i:04d}", "wav": os.path.abspath(target),
                            "duration": round(n / info.samplerate, 3)})
    return entries


def write_list(path: str, entries: List[dict]) -> None:
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        f.writelines(json.dumps(e) + "\n" for e in entries)
    os.replace(path + ".tmp", path)


def get_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--download-dir", required=True, help="where the archives are (or go)")
    p.add_argument("--corpus-dir", required=True,
                   help="where musan/ and RIRS_NOISES/ are (or are extracted to)")
    p.add_argument("--out-dir", required=True, help="where the lists (and segments) go")
    p.add_argument("--checksums", required=True, help="md5/sha256 lines of the archives")
    p.add_argument("--verify", choices=["true", "false"], default="true")
    p.add_argument("--musan-url", default=MUSAN_URL)
    p.add_argument("--rirs-url", default=RIRS_URL)
    p.add_argument("--segment-seconds", type=float, default=8.0,
                   help="cut MUSAN files into pieces of this length (0: keep whole)")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = get_args(argv)
    for url, marker in ((args.musan_url, "musan/noise"),
                        (args.rirs_url, "RIRS_NOISES/simulated_rirs")):
        archive = os.path.join(args.download_dir, os.path.basename(url))
        rc = fetch_corpus.main(["--url", url, "--archive", archive, "--corpus-dir",
                                args.corpus_dir, "--marker", marker, "--checksums",
                                args.checksums, "--verify", args.verify])
        if rc:
            return rc
    os.makedirs(args.out_dir, exist_ok=True)
    musan = os.path.join(args.corpus_dir, "musan")
    entries, counts = [], {}
    for folder, kind in MUSAN_KINDS.items():
        files = wavs_under(os.path.join(musan, folder))
        if not files:
            raise SystemExit(f"error: no WAVs under {musan}/{folder}")
        seg_dir = os.path.join(args.out_dir, "musan_segments", folder)
        os.makedirs(seg_dir, exist_ok=True)
        for path in files:
            key = key_of(path, args.corpus_dir)
            if args.segment_seconds > 0:
                pieces = segment(path, key, seg_dir, args.segment_seconds)
            else:
                info = sf.info(path)
                pieces = [{"key": key, "wav": os.path.abspath(path),
                           "duration": round(info.frames / info.samplerate, 3)}]
            for e in pieces:
                e["kind"] = kind
            entries += pieces
        counts[kind] = (len(files), sum(e["kind"] == kind for e in entries),
                        sum(e["duration"] for e in entries if e["kind"] == kind) / 3600)
    write_list(os.path.join(args.out_dir, "musan.list"), entries)
    for kind, (files, pieces, hours) in counts.items():
        say(f"musan {kind}: {files} files, {pieces} list entries, {hours:.2f} h")
    rirs = []
    for room in RIR_ROOMS:
        files = wavs_under(os.path.join(args.corpus_dir, "RIRS_NOISES", "simulated_rirs", room))
        if not files:
            raise SystemExit(f"error: no impulse responses under "
                             f"{args.corpus_dir}/RIRS_NOISES/simulated_rirs/{room}")
        for path in files:
            info = sf.info(path)
            rirs.append({"key": key_of(path, args.corpus_dir), "wav": os.path.abspath(path),
                         "duration": round(info.frames / info.samplerate, 3)})
        say(f"rirs {room}: {len(files)} impulse responses")
    write_list(os.path.join(args.out_dir, "rirs.list"), rirs)
    say(f"wrote {args.out_dir}/musan.list ({len(entries)} entries) and rirs.list ({len(rirs)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
