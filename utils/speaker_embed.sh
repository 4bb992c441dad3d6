#!/usr/bin/env bash
# Speaker embeddings of data lists with an exported model, one directory per list:
#   utils/speaker_embed.sh [--nj N] MODEL_ONNX OUT_DIR NAME=DATA_LIST...
# writes OUT_DIR/NAME/ (embeddings.scp, speaker_embeddings.scp: each speaker's mean) through
# toolkit.bin.extract_embeddings, which resumes from finished parts. What an older export
# or another (or a newer) list made goes first: OUT_DIR/NAME/.source names the list.
set -euo pipefail
nj=1
if [ "${1:-}" = --nj ]; then
  nj=$2
  shift 2
fi
if [ $# -lt 3 ]; then
  echo "usage: $0 [--nj N] MODEL_ONNX OUT_DIR NAME=DATA_LIST..." >&2
  exit 1
fi
model=$1 out_dir=$2
shift 2
for part in "$@"; do
  name=${part%%=*} list=${part#*=}
  out=$out_dir/$name
  stamp=$out/.source
  if [ -d "$out" ] && { [ ! -f "$stamp" ] || [ "$model" -nt "$stamp" ] \
      || [ "$list" -nt "$stamp" ] || [ "$(cat "$stamp")" != "$list" ]; }; then
    rm -rf "$out"
  fi
  mkdir -p "$out"
  echo "$list" > "$stamp"
  python -m toolkit.bin.extract_embeddings --model "$model" --data-list "$list" \
    --out-dir "$out" --nj "$nj"
done
