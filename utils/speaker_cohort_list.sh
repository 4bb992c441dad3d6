#!/usr/bin/env bash
# The AS-Norm cohort's data list: the first N utterances of each speaker of a data list.
#   utils/speaker_cohort_list.sh N DATA_LIST OUT_LIST
# Data lists are sorted by utterance, so the choice is fixed. OUT_LIST is replaced only when
# it changes: a newer list tells utils/speaker_embed.sh to extract the cohort again.
set -euo pipefail
if [ $# -ne 3 ]; then
  echo "usage: $0 N DATA_LIST OUT_LIST" >&2
  exit 1
fi
n=$1 list=$2 out=$3
awk -v n="$n" 'match($0, /"spk": "[^"]*"/) {
    s = substr($0, RSTART, RLENGTH); if (++count[s] <= n) print }' "$list" > "$out.tmp"
if cmp -s "$out.tmp" "$out"; then rm "$out.tmp"; else mv "$out.tmp" "$out"; fi
