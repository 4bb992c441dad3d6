#!/usr/bin/env bash
# Kaldi's utils/fix_data_dir.sh: sorts the tables of DIR, drops duplicate keys (keeps the
# first) and utterances missing from some per-utterance table, regenerates spk2utt.
# Originals of rewritten files are kept in DIR/.backup/. Uses `python` from PATH (path.sh).
#   utils/fix_data_dir.sh DIR
set -euo pipefail
usage="usage: $0 DIR   (repairs the Kaldi data dir DIR in place; backup in DIR/.backup/)"
case "${1:-}" in
  -h|--help) echo "$usage"; exit 0 ;;
  -*) echo "$0: unknown option $1" >&2; echo "$usage" >&2; exit 1 ;;
esac
if [ $# -ne 1 ]; then echo "$usage" >&2; exit 1; fi
command -v python >/dev/null || { echo "$0: python not on PATH (source path.sh)" >&2; exit 1; }
exec python -m toolkit.bin.fix_data_dir "$1"
