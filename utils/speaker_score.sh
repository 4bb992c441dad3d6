#!/usr/bin/env bash
# Cosine scoring of trial lists, with and without AS-Norm, on the embeddings that
# utils/speaker_embed.sh wrote into SYS_DIR/embeddings/:
#   utils/speaker_score.sh [--as-norm-top N] SYS_DIR SET=TRIALS...
# TRIALS (VoxCeleb `1 a b` or Kaldi `a b target` lines) is scored on the embeddings of
# SYS_DIR/embeddings/SET, with SYS_DIR/embeddings/cohort's speaker means as the AS-Norm
# cohort (top N scores per side, default 300), into SYS_DIR/score/NAME/ (toolkit.bin.
# score_speaker: scores, result.json, DET plot). NAME is TRIALS's file name less .txt,
# prefixed by SET (`/` as `_`, a trailing /test dropped) when SET is not the set of the
# first list given: outside/test=.../trials -> outside_trials, as
# tools/benchmarks/resemblyzer_compare.py names them. The summary lines, labelled
# "<SYS_DIR's name> NAME", are collected in SYS_DIR/score/summary.txt (rewritten).
set -euo pipefail
as_norm_top=300
if [ "${1:-}" = --as-norm-top ]; then
  as_norm_top=$2
  shift 2
fi
if [ $# -lt 2 ]; then
  echo "usage: $0 [--as-norm-top N] SYS_DIR SET=TRIALS..." >&2
  exit 1
fi
sys=$1
shift
first_set=${1%%=*}
mkdir -p "$sys/score"
: > "$sys/score/summary.txt"
for item in "$@"; do
  set_name=${item%%=*} trials=${item#*=}
  name=$(basename "$trials")
  name=${name%.txt}
  if [ "$set_name" != "$first_set" ]; then
    prefix=${set_name%/test}
    name=${prefix//\//_}_$name
  fi
  python -m toolkit.bin.score_speaker --trials "$trials" \
    --embeddings "$sys/embeddings/$set_name/embeddings.scp" \
    --cohort "$sys/embeddings/cohort/speaker_embeddings.scp" --as-norm-top "$as_norm_top" \
    --out-dir "$sys/score/$name" --name "$(basename "$sys") $name" > /dev/null
  cat "$sys/score/$name/summary.txt" >> "$sys/score/summary.txt"
done
