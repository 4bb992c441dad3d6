#!/usr/bin/env bash
# Kaldi's utils/validate_data_dir.sh: checks a data dir and prints every problem at once
# (sorting, duplicates, keys missing from some tables, empty values/text, utt2spk vs
# spk2utt, segments, and each recording in wav.scp that cannot be decoded). Exit 1 if any.
#   utils/validate_data_dir.sh [--no-audio] [--nj N] DIR
# --no-feats / --no-text / --no-wav are accepted for Kaldi scripts and change nothing:
# here feats.scp and text are optional anyway. Uses `python` from PATH (path.sh).
set -euo pipefail
usage="usage: $0 [--no-audio] [--nj N] DIR   (--no-audio: skip decoding the audio)"
opts=() dirs=()
while [ $# -gt 0 ]; do
  case "$1" in
    --no-audio) opts+=(--no-audio); shift ;;
    --nj) [ $# -ge 2 ] || { echo "$0: option --nj needs a value" >&2; exit 1; }
          opts+=(--nj "$2"); shift 2 ;;
    --no-feats|--no-text|--no-wav|--non-print) shift ;;
    -h|--help) echo "$usage"; exit 0 ;;
    -*) echo "$0: unknown option $1" >&2; echo "$usage" >&2; exit 1 ;;
    *) dirs+=("$1"); shift ;;
  esac
done
if [ ${#dirs[@]} -ne 1 ]; then echo "$usage" >&2; exit 1; fi
command -v python >/dev/null || { echo "$0: python not on PATH (source path.sh)" >&2; exit 1; }
exec python -m toolkit.bin.validate_data_dir "${opts[@]}" "${dirs[0]}"
