#!/usr/bin/env bash
# Checkpoint overhead and steps/s of the wake-word recipe's training (stage 3), at the
# default save interval and at a dense one. Needs stages 0-2 done in egs/wake_word/s0.
#   bash tools/benchmarks/checkpoint_overhead.sh [EPOCHS]
set -euo pipefail
epochs=${1:-2}
cd "$(dirname "$0")/../../egs/wake_word/s0"
for interval in 1000 20; do
  exp=exp/bench_ckpt_$interval
  rm -rf "$exp"
  bash run.sh --stage 3 --stop-stage 3 --exp "$exp" \
    --train-overrides "training.max_epoch=$epochs training.save_interval_steps=$interval" 2>&1 |
    grep "training finished" | sed "s/^/save_interval_steps=$interval: /"
done
