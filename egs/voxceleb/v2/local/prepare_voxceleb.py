#!/usr/bin/env python3
"""Stage 0 of egs/voxceleb/v2: Kaldi data dirs and trial lists from VoxCeleb1 and 2.

VoxCeleb audio is released on request at the official site (see README.md); put it as

  <voxceleb1>/wav/<spk>/<youtube id>/<nnnnn>.wav          (dev and test in one tree), or
  <voxceleb1>/dev/wav/...  and  <voxceleb1>/test/wav/...  (the two archives apart)
  <voxceleb2>/dev/aac/<spk>/<youtube id>/<nnnnn>.wav      (the m4a files converted in place), or
  <voxceleb2>/dev/wav/<spk>/<youtube id>/<nnnnn>.wav      (converted into a tree of their own)

VoxCeleb2 is distributed as m4a (AAC); training reads WAV. When only m4a files are found
this script stops with the ffmpeg command that converts them.

The trial lists (Vox1-O cleaned `veri_test2.txt`, Vox1-E `list_test_all2.txt`, Vox1-H
`list_test_hard2.txt`) are taken from --trials-dir when there, else downloaded from the
official meta directory into it.

Writes (keys are `<spk>-<youtube id>-<nnnnn>`, as Kaldi's VoxCeleb recipe names them):
  <out>/vox2_dev/    VoxCeleb2 dev: the training speakers
  <out>/vox1/        all of VoxCeleb1 (dev + test): what Vox1-E and Vox1-H score
  <out>/vox1_test/   the 40 Vox1-O speakers (the official test split): the dev set
  <out>/trials/vox1_{O,E,H}.txt   the official lists (VoxCeleb form `1 a.wav b.wav`)
each dir with wav.scp, utt2spk, spk2utt. Counts are checked against the published ones;
a mismatch stops here unless --allow-partial (then trials whose audio is absent are left
out, and said so).
"""
import argparse
import os
import sys
import urllib.error
import urllib.request
from typing import Dict, List, Tuple

from toolkit.data import kaldi

META_URL = "https://mm.kaist.ac.kr/datasets/voxceleb/meta/"
TRIALS = {"vox1_O": "veri_test2.txt", "vox1_E": "list_test_all2.txt",
          "vox1_H": "list_test_hard2.txt"}
# Published sizes (VoxCeleb1: Nagrani et al. 2017, VoxCeleb2: Chung et al. 2018).
EXPECTED = {"vox1": (1251, 153516), "vox1_test": (40, 4874), "vox2_dev": (5994, 1092009)}
CONVERT_HINT = (
    "convert them to 16 kHz mono WAV beside the m4a files with ffmpeg (apt-get install "
    "ffmpeg), e.g. 16 at a time:\n"
    "  find {aac} -name '*.m4a' -print0 | xargs -0 -P 16 -I{{}} sh -c "
    "'ffmpeg -nostdin -loglevel error -y -i \"$1\" -ac 1 -ar 16000 \"${{1%.m4a}}.wav\"' _ {{}}\n"
    "then rerun this stage (the m4a files may be deleted afterwards)")


def say(message: str) -> None:
    print(f"[voxceleb] {message}", file=sys.stderr, flush=True)


def scan_tree(root: str, ext: str) -> Dict[str, Tuple[str, str]]:
    """key -> (path, speaker) for every <spk>/<video>/<name>.<ext> under root."""
    out = {}
    for spk in sorted(os.listdir(root)):
        spk_dir = os.path.join(root, spk)
        if not os.path.isdir(spk_dir):
            continue
        for video in sorted(os.listdir(spk_dir)):
            video_dir = os.path.join(spk_dir, video)
            if not os.path.isdir(video_dir):
                continue
            for name in sorted(os.listdir(video_dir)):
                if name.endswith(ext):
                    out[f"{spk}-{video}-{name[:-len(ext)]}"] = (os.path.join(video_dir, name), spk)
    return out


def count_files(root: str, ext: str, limit: int = 1) -> int:
    n = 0
    for _, _, files in os.walk(root):
        n += sum(1 for f in files if f.endswith(ext))
        if n >= limit:
            break
    return n


def voxceleb1_roots(vox1: str) -> List[str]:
    for roots in ([os.path.join(vox1, "wav")],
                  [os.path.join(vox1, "dev", "wav"), os.path.join(vox1, "test", "wav")]):
        present = [r for r in roots if os.path.isdir(r)]
        if present:
            return present
    raise SystemExit(f"error: no VoxCeleb1 audio under {vox1}: expected {vox1}/wav/<spk>/... or "
                     f"{vox1}/dev/wav and {vox1}/test/wav (README.md says where to get it)")


def voxceleb2_tree(vox2: str) -> str:
    """The directory holding the VoxCeleb2 dev WAVs; stops with the ffmpeg command when
    there are only m4a files."""
    for sub in ("dev/wav", "dev/aac"):
        root = os.path.join(vox2, sub)
        if os.path.isdir(root) and count_files(root, ".wav"):
            return root
    aac = os.path.join(vox2, "dev", "aac")
    if os.path.isdir(aac) and count_files(aac, ".m4a"):
        raise SystemExit(f"error: {aac} holds m4a files only; " + CONVERT_HINT.format(aac=aac))
    raise SystemExit(f"error: no VoxCeleb2 dev audio under {vox2}: expected {vox2}/dev/aac/<spk>/... "
                     f"(README.md says where to get it)")


def check_counts(name: str, entries: Dict[str, Tuple[str, str]], allow_partial: bool) -> bool:
    speakers = len({spk for _, spk in entries.values()})
    want_spk, want_utts = EXPECTED[name]
    ok = (speakers, len(entries)) == (want_spk, want_utts)
    say(f"{name}: {speakers:,} speakers, {len(entries):,} utterances "
        f"(published: {want_spk:,} / {want_utts:,}){'' if ok else ' -- MISMATCH'}")
    if not ok and not allow_partial:
        raise SystemExit(f"error: {name} is incomplete or not the published release; finish the "
                         f"download (or convert the rest), or pass --allow-partial to go on")
    return ok


def fetch_trials(trials_dir: str, name: str, timeout: float) -> str:
    path = os.path.join(trials_dir, name)
    if os.path.isfile(path):
        return path
    os.makedirs(trials_dir, exist_ok=True)
    url = META_URL + name
    say(f"downloading {url}")
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            data = response.read()
    except (urllib.error.URLError, OSError, ValueError) as err:
        raise SystemExit(f"error: cannot download {url}: {getattr(err, 'reason', err)}; fetch it "
                         f"elsewhere and put it at {path}") from None
    with open(path + ".part", "wb") as f:
        f.write(data)
    os.replace(path + ".part", path)
    return path


def read_voxceleb_trials(path: str) -> List[Tuple[str, str, str]]:
    rows = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            fields = line.split()
            if not fields:
                continue
            if len(fields) != 3 or fields[0] not in ("0", "1"):
                raise SystemExit(f"error: {path}:{number}: expected '1|0 spk/video/n.wav "
                                 f"spk/video/n.wav', got {line.strip()!r}")
            rows.append((fields[0], fields[1], fields[2]))
    return rows


def trial_key(name: str) -> str:
    return (name[:-4] if name.endswith(".wav") else name).replace("/", "-")


def write_dir(path: str, entries: Dict[str, Tuple[str, str]]) -> None:
    kaldi.write_data_dir(path, {"wav.scp": {k: p for k, (p, _) in entries.items()},
                                "utt2spk": {k: s for k, (_, s) in entries.items()}})
    say(f"wrote {path}")


def get_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--voxceleb1", required=True, help="VoxCeleb1 root (wav/ or dev/wav + test/wav)")
    p.add_argument("--voxceleb2", required=True, help="VoxCeleb2 root (dev/aac or dev/wav)")
    p.add_argument("--out-dir", required=True, help="data dir of the recipe")
    p.add_argument("--trials-dir", required=True,
                   help="where the official trial lists are, or are downloaded to")
    p.add_argument("--allow-partial", action="store_true",
                   help="go on when the counts differ from the published ones")
    p.add_argument("--timeout", type=float, default=30.0, help="network timeout (s)")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = get_args(argv)
    vox1: Dict[str, Tuple[str, str]] = {}
    for root in voxceleb1_roots(args.voxceleb1):
        vox1.update(scan_tree(root, ".wav"))
    vox2 = scan_tree(voxceleb2_tree(args.voxceleb2), ".wav")
    m4a_left = count_files(os.path.join(args.voxceleb2, "dev", "aac"), ".m4a", 10 ** 9) \
        if os.path.isdir(os.path.join(args.voxceleb2, "dev", "aac")) else 0
    if m4a_left > len(vox2):
        say(f"{m4a_left:,} m4a files but {len(vox2):,} WAVs: the conversion is unfinished")
    overlap = {s for _, s in vox1.values()} & {s for _, s in vox2.values()}
    if overlap:
        raise SystemExit(f"error: speakers in both VoxCeleb1 and VoxCeleb2 dev "
                         f"({', '.join(sorted(overlap)[:3])}): the trees are mixed up")
    check_counts("vox1", vox1, args.allow_partial)
    check_counts("vox2_dev", vox2, args.allow_partial)

    trials_out = os.path.join(args.out_dir, "trials")
    os.makedirs(trials_out, exist_ok=True)
    o_speakers = set()
    for name, file_name in TRIALS.items():
        rows = read_voxceleb_trials(fetch_trials(args.trials_dir, file_name, args.timeout))
        kept = [r for r in rows if trial_key(r[1]) in vox1 and trial_key(r[2]) in vox1]
        if len(kept) < len(rows):
            missing = sorted({n for r in rows for n in r[1:] if trial_key(n) not in vox1})
            message = (f"{file_name}: {len(rows) - len(kept):,} of {len(rows):,} trials name "
                       f"utterances not in VoxCeleb1 here (e.g. {', '.join(missing[:3])})")
            if not args.allow_partial:
                raise SystemExit(f"error: {message}; pass --allow-partial to score the rest")
            say(f"warning: {message}; they are left out")
        if not kept:
            raise SystemExit(f"error: {file_name}: no trial left to score")
        with open(os.path.join(trials_out, name + ".txt"), "w", encoding="utf-8") as f:
            f.writelines(" ".join(r) + "\n" for r in kept)
        say(f"{name}: {len(kept):,} trials ({sum(r[0] == '1' for r in kept):,} target) "
            f"-> {trials_out}/{name}.txt")
        if name == "vox1_O":
            o_speakers = {n.split("/")[0] for r in kept for n in r[1:]}
    vox1_test = {k: v for k, v in vox1.items() if v[1] in o_speakers}
    check_counts("vox1_test", vox1_test, args.allow_partial)

    write_dir(os.path.join(args.out_dir, "vox2_dev"), vox2)
    write_dir(os.path.join(args.out_dir, "vox1"), vox1)
    write_dir(os.path.join(args.out_dir, "vox1_test"), vox1_test)
    return 0


if __name__ == "__main__":
    sys.exit(main())
