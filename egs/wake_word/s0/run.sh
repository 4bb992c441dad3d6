#!/usr/bin/env bash
# Train a wake-word detector from the keyword's text alone: synthetic speech (espeak-ng,
# plus flite when installed), no corpus download, no recorded audio.
#
#   bash run.sh --keyword "hey snips"                 # all stages
#   bash run.sh --stage 3 --stop-stage 3              # only training (resumes if killed)
#   bash run.sh --gpus 0,1                            # two GPUs (or edit gpus= below)
#
# Stages (each rerunnable; outputs under data/ and $exp):
#   0 synthesize data/{train,dev,test} Kaldi dirs + data/dict/keywords.txt
#   1 data lists data/*/data.list (+ fbank features data/*/fbank/ when precompute_feats)
#   2 global CMVN data/train/global_cmvn.{json,ark}
#   3 training through torchrun into $exp
#   4 checkpoint averaging -> $exp/avg_${average_num}.pt
#   5 export TorchScript/ONNX/safetensors -> $exp/export/ (parity-checked)
#   6 score the test set with the ONNX model -> $exp/score/ (DET table, plot, summary)
set -euo pipefail
cd "$(dirname "$0")"
. ./path.sh

gpus=-1            # GPUs to use, e.g. "0,1" -> 2 processes; -1 or empty -> CPU
num_procs=1        # CPU only: number of gloo ranks
num_nodes=1        # multi-node: number of nodes, this node's rank, rendezvous host:port
node_rank=0
rdzv_endpoint=127.0.0.1:29400
master_port=""     # one node: fixed torchrun port (default: a free one)
stage=0
stop_stage=6

keyword="hey snips"
seed=777
num_train_pos=2000
num_train_neg=6000
num_dev_pos=300
num_dev_neg=900
num_test_pos=400
num_test_neg=1800
nj=2

config=conf/ds_tcn.yaml
data=data
exp=exp/ds_tcn
precompute_feats=true  # compute fbank once (no waveform augmentation then)
train_overrides=""     # extra config overrides, e.g. "training.max_epoch=2 dataset.batch_size=64"
average_num=5
target_fa_per_hour=1.0

help_message="Usage: $0 [--keyword \"hey snips\"] [--stage N] [--stop-stage M] [--gpus 0,1] ..."
. utils/parse_options.sh

dict=$data/dict/keywords.txt
list_name=data.list
[ "$precompute_feats" = true ] && list_name=fbank/data.list

if [ "$stage" -le 0 ] && [ "$stop_stage" -ge 0 ]; then
  echo "stage 0: synthesizing data for \"$keyword\" into $data"
  python -m toolkit.bin.synth_kws_data --keyword "$keyword" --out-dir "$data" --seed "$seed" \
    --num-train-pos $num_train_pos --num-train-neg $num_train_neg \
    --num-dev-pos $num_dev_pos --num-dev-neg $num_dev_neg \
    --num-test-pos $num_test_pos --num-test-neg $num_test_neg --nj $nj
fi

if [ "$stage" -le 1 ] && [ "$stop_stage" -ge 1 ]; then
  echo "stage 1: data lists"
  for x in train dev test; do
    python -m toolkit.bin.make_datalist $data/$x $data/$x/data.list --inventory $dict --nj $nj
    if [ "$precompute_feats" = true ]; then
      python -m toolkit.bin.compute_feats $data/$x/data.list $data/$x/fbank --config $config --nj $nj
    fi
  done
fi

if [ "$stage" -le 2 ] && [ "$stop_stage" -ge 2 ]; then
  echo "stage 2: global CMVN"
  python -m toolkit.bin.compute_cmvn $data/train/$list_name $data/train/global_cmvn.json \
    --kaldi-out $data/train/global_cmvn.ark --config $config --nj $nj
fi

if [ "$stage" -le 3 ] && [ "$stop_stage" -ge 3 ]; then
  echo "stage 3: training in $exp"
  # shellcheck disable=SC2086
  utils/torchrun.sh ${master_port:+--master-port $master_port} "$gpus" "$num_procs" "$num_nodes" "$node_rank" "$rdzv_endpoint" \
    -m toolkit.bin.train --config $config --exp-dir $exp \
    --train-data $data/train/$list_name --dev-data $data/dev/$list_name \
    --inventory $dict --cmvn $data/train/global_cmvn.json $train_overrides
fi

if [ "$stage" -le 4 ] && [ "$stop_stage" -ge 4 ]; then
  echo "stage 4: averaging the best $average_num checkpoints by dev loss"
  python -m toolkit.bin.average_model --exp-dir $exp --output $exp/avg_${average_num}.pt \
    --num $average_num --mode best
fi

if [ "$stage" -le 5 ] && [ "$stop_stage" -ge 5 ]; then
  echo "stage 5: export"
  python -m toolkit.bin.export_model --checkpoint $exp/avg_${average_num}.pt --exp-dir $exp \
    --out-dir $exp/export --test-data $data/test/$list_name
fi

if [ "$stage" -le 6 ] && [ "$stop_stage" -ge 6 ]; then
  echo "stage 6: scoring the test set with the ONNX model"
  python -m toolkit.bin.compute_posteriors --model $exp/export/model.onnx \
    --data-list $data/test/$list_name --output $exp/score/test_probs.ark
  python -m toolkit.bin.score_kws --data-list $data/test/$list_name \
    --posteriors $exp/score/test_probs.ark --keywords $dict --out-dir $exp/score \
    --target-fa-per-hour $target_fa_per_hour
  python -m toolkit.bin.set_threshold --export-dir $exp/export --score-dir $exp/score
  echo "summary ($exp/score/summary.txt):"
  cat $exp/score/summary.txt
fi
