#!/usr/bin/env bash
# Scores one test set of a keyword detector (stage 6 of the keyword recipes):
#   utils/kws_score.sh [options] MODEL DATA_LIST INVENTORY OUT_DIR
# MODEL is the exported model.onnx; posteriors of DATA_LIST go to OUT_DIR/test_probs.ark,
# then score_kws runs the streaming decision rule at every threshold: DET curves, FRR at
# --fa-targets with bootstrap intervals, and the threshold for --target-fa-per-hour, in
# OUT_DIR (det_<keyword>.txt, det.json, det.png, summary.txt, errors_<keyword>.txt).
# Options:
#   --target-fa-per-hour F   false alarms per hour of the chosen threshold (1.0)
#   --fa-targets LIST        operating points of the summary (0.5,1,2,5)
#   --bootstrap-unit U       what the FRR intervals resample: speaker (whole voices) or
#                            utterance (speaker)
#   --fuse-zero-shot B       true: score a head on phone posteriors fused with zero-shot
#                            search of its keywords (compute_posteriors --fuse-zero-shot) (false)
#   --deployed KEY           also report the set at the threshold MODEL ships with, stored
#                            under KEY (threshold or fused_threshold; set on a dev set by
#                            set_threshold) (none)
#   --posteriors ARK         score these posteriors of DATA_LIST, already computed from MODEL
#                            (choose_fusion --fused-output), instead of computing them (none)
#   --nj N                   processes computing the posteriors, each on a slice of the list
#                            (the same posteriors whatever N) (1)
set -euo pipefail
target_fa_per_hour=1.0
fa_targets=0.5,1,2,5
bootstrap_unit=speaker
fuse_zero_shot=false
deployed=none
posteriors=none
nj=1
. "$(dirname "$0")/parse_options.sh"
if [ $# -ne 4 ]; then
  echo "usage: $0 [--target-fa-per-hour F] [--fa-targets LIST] [--bootstrap-unit U] [--fuse-zero-shot B] [--deployed KEY] [--posteriors ARK] [--nj N] MODEL DATA_LIST INVENTORY OUT_DIR" >&2
  exit 1
fi
model=$1 data_list=$2 inventory=$3 out_dir=$4
fuse=""
[ "$fuse_zero_shot" = true ] && fuse=--fuse-zero-shot

probs=$out_dir/test_probs.ark
if [ "$posteriors" = none ]; then
  python -m toolkit.bin.compute_posteriors --model "$model" --data-list "$data_list" \
    --output "$probs" --nj "$nj" $fuse
else
  [ -s "$posteriors" ] || { echo "$0: --posteriors $posteriors: no such file" >&2; exit 1; }
  probs=$posteriors
fi
# The decision rule counts in the model's frames (10 ms fbank, 80 ms speech embeddings);
# with --deployed, the threshold stored under that key comes along (one metadata read).
read -r frame_shift_ms thr < <(python -c 'import sys; from toolkit.export import read_metadata
meta = read_metadata(sys.argv[1])
key = sys.argv[2]
if key != "none" and key not in meta:
    sys.exit(f"{sys.argv[1]}: no {key} stored (python -m toolkit.bin.set_threshold)")
print(meta["feature"]["frame_shift_ms"], meta[key] if key != "none" else "")' "$model" "$deployed")
[ -n "${frame_shift_ms:-}" ] || exit 1
deployed_opt=()
[ "$deployed" != none ] && deployed_opt=(--deployed-threshold "$thr")
python -m toolkit.bin.score_kws "${deployed_opt[@]}" --data-list "$data_list" --posteriors "$probs" \
  --inventory "$inventory" --out-dir "$out_dir" --frame-shift-ms "$frame_shift_ms" \
  --target-fa-per-hour "$target_fa_per_hour" --fa-targets "$fa_targets" \
  --bootstrap-unit "$bootstrap_unit"
