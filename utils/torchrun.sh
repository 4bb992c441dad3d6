#!/usr/bin/env bash
# Launches a training binary through torchrun from a recipe's gpus= setting.
#   utils/torchrun.sh [--master-port P] GPUS NUM_PROCS NUM_NODES NODE_RANK RDZV_ENDPOINT \
#       -m toolkit.bin.train ARGS...
# GPUS "0,1" -> CUDA_VISIBLE_DEVICES=0,1, 2 processes per node, NCCL; "-1" or "" -> CPU with
# NUM_PROCS gloo ranks. NUM_NODES > 1 uses c10d rendezvous at RDZV_ENDPOINT (host:port; run the
# same command on every node with its NODE_RANK). The binary gets --num-gpus, so a mismatch
# between the recipe and what torchrun launched is an error before any work starts.
# --master-port is passed to torchrun only when given (one node: a fixed port instead of
# --standalone's free one).
set -euo pipefail
master_port=""
if [ "${1:-}" = "--master-port" ]; then
  master_port=$2
  shift 2
fi
if [ $# -lt 6 ]; then
  echo "usage: $0 GPUS NUM_PROCS NUM_NODES NODE_RANK RDZV_ENDPOINT -m MODULE ARGS..." >&2
  exit 1
fi
gpus=$1 num_procs=$2 num_nodes=$3 node_rank=$4 endpoint=$5
shift 5
if [ -z "$gpus" ] || [ "$gpus" = "-1" ]; then
  num_gpus=0
  nproc=$num_procs
else
  if ! [[ "$gpus" =~ ^[0-9]+(,[0-9]+)*$ ]]; then
    echo "error: gpus=$gpus: expected GPU indices like 0 or 0,1 (or -1 for CPU)" >&2
    exit 2
  fi
  # The devices must exist before torchrun starts workers that would each fail.
  visible=$(python -c 'import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)' 2>/dev/null || echo 0)
  for g in ${gpus//,/ }; do
    if [ "$g" -ge "$visible" ]; then
      if [ "$visible" -eq 0 ]; then
        echo "error: gpus=$gpus but this machine has no usable CUDA device; set gpus=-1 in run.sh (or pass --gpus -1) to train on CPU" >&2
      else
        echo "error: gpus=$gpus but only $visible CUDA device(s) are visible (indices 0-$((visible - 1)))" >&2
      fi
      exit 2
    fi
  done
  export CUDA_VISIBLE_DEVICES=$gpus
  num_gpus=$(echo "$gpus" | awk -F, '{print NF}')
  nproc=$num_gpus
fi
if [ "$num_nodes" -gt 1 ]; then
  rdzv=(--nnodes="$num_nodes" --node-rank="$node_rank" --rdzv-backend=c10d
        --rdzv-endpoint="$endpoint" --rdzv-id="${TOOLKIT_RDZV_ID:-toolkit}")
elif [ -n "$master_port" ]; then
  rdzv=(--nnodes=1 --master-addr=127.0.0.1 --master-port="$master_port")
else
  rdzv=(--standalone --nnodes=1)
fi
# Each rendezvous round (first start and every --max-restarts restart, passed through
# TORCHRUN_EXTRA) gets its own store: a shared one keeps the dead round's addresses.
export TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1
echo "torchrun ${rdzv[*]} --nproc-per-node=$nproc $* --num-gpus $num_gpus" >&2
exec torchrun "${rdzv[@]}" --nproc-per-node="$nproc" ${TORCHRUN_EXTRA:-} "$@" --num-gpus "$num_gpus"
