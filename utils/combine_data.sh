#!/usr/bin/env bash
# Kaldi's utils/combine_data.sh: concatenates the tables of data dirs IN1.. into OUT, sorted
# in C order, spk2utt regenerated. The same utterance in two inputs is an error; a table
# missing from some input is left out (and said so). Uses `python` from PATH (path.sh).
#   utils/combine_data.sh OUT IN1 [IN2 ...]
set -euo pipefail
usage="usage: $0 OUT IN1 [IN2 ...]"
case "${1:-}" in
  -h|--help) echo "$usage"; exit 0 ;;
  -*) echo "$0: unknown option $1" >&2; echo "$usage" >&2; exit 1 ;;
esac
if [ $# -lt 2 ]; then echo "$usage" >&2; exit 1; fi
for d in "${@:2}"; do
  [ -d "$d" ] || { echo "$0: input data dir $d does not exist" >&2; exit 1; }
done
command -v python >/dev/null || { echo "$0: python not on PATH (source path.sh)" >&2; exit 1; }
exec python -m toolkit.data.datadir combine "$@"
