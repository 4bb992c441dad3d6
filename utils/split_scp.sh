#!/usr/bin/env bash
# Kaldi's utils/split_scp.pl: splits the lines of IN into contiguous parts OUT1..OUTn, in
# order, sizes differing by at most one. With --utt2spk each speaker's lines stay in one
# part (IN must keep each speaker's utterances together, as Kaldi data dirs sorted by
# speaker-prefixed utterance ids do). Uses `python` from PATH (path.sh).
#   utils/split_scp.sh [--utt2spk FILE] IN OUT1 [OUT2 ...]
set -euo pipefail
usage="usage: $0 [--utt2spk FILE] IN OUT1 [OUT2 ...]"
opts=()
while [ $# -gt 0 ]; do
  case "$1" in
    --utt2spk) [ $# -ge 2 ] || { echo "$0: option --utt2spk needs a value" >&2; exit 1; }
               opts=(--utt2spk "$2"); shift 2 ;;
    --utt2spk=*) opts=(--utt2spk "${1#*=}"); shift ;;   # Kaldi's spelling
    -h|--help) echo "$usage"; exit 0 ;;
    -*) echo "$0: unknown option $1" >&2; echo "$usage" >&2; exit 1 ;;
    *) break ;;
  esac
done
if [ $# -lt 2 ]; then echo "$usage" >&2; exit 1; fi
command -v python >/dev/null || { echo "$0: python not on PATH (source path.sh)" >&2; exit 1; }
exec python -m toolkit.data.datadir split-scp "${opts[@]}" "$@"
