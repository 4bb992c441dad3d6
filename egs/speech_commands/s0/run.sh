#!/usr/bin/env bash
# Command-word classification on Google Speech Commands v0.02 (BC-ResNet or MDTC).
#
#   bash run.sh                                        # all stages, 12-class task
#   bash run.sh --task 35 --data data_35               # all 35 words
#   bash run.sh --corpus-dir /export/speech_commands_v0.02 --stage 0
#   bash run.sh --stage 3 --stop-stage 3 --gpus 0,1    # only training, on two GPUs
#   bash run.sh --config conf/mdtc.yaml                # MDTC instead (exp dir exp/mdtc_12)
#
# Stages (each rerunnable; outputs under $data and $exp):
#  -1 download speech_commands_v0.02.tar.gz into $download_dir (skipped when the corpus is
#     there), verify its sha256 against local/checksums.sha256, extract into $corpus_dir
#   0 $data/{train,dev,test} Kaldi dirs (text = class name) + $data/dict/classes.txt
#   1 data lists with class labels $data/*/data.list (+ fbank $data/*/fbank/)
#   2 global CMVN $data/train/global_cmvn.{json,ark}
#   3 training through torchrun into $exp (resumes when rerun)
#   4 average the best $average_num checkpoints by dev loss -> $exp/avg_$average_num.pt
#   5 export TorchScript/ONNX/safetensors -> $exp/export/ (parity-checked)
#   6 accuracy and confusion matrix of the test set with the ONNX model -> $exp/score/
set -euo pipefail
cd "$(dirname "$0")"
. ./path.sh

gpus=-1            # GPUs to use, e.g. "0,1" -> 2 processes; -1 or empty -> CPU
num_procs=1        # CPU only: number of gloo ranks
num_nodes=1        # multi-node: number of nodes, this node's rank, rendezvous host:port
node_rank=0
rdzv_endpoint=127.0.0.1:29400
master_port=""     # one node: fixed torchrun port (default: a free one)
stage=-1
stop_stage=6

corpus_dir=""      # extracted corpus (holds validation_list.txt); default $download_dir/speech_commands_v0.02
download_dir=""    # where the archive goes; default $data/download
download_url=http://download.tensorflow.org/data/speech_commands_v0.02.tar.gz
checksum_file=local/checksums.sha256
verify_checksum=true
task=12            # 12: 10 commands + _silence_ + _unknown_; 35: every word
silence_fraction=0.1   # task 12: silence / unknown clips per command-word clip of a split
unknown_fraction=0.1   # (-1: every clip of the other words)
seed=777
nj=2

config=conf/bcresnet.yaml  # the model; conf/mdtc.yaml for MDTC
data=data
exp=""             # default exp/<config name>_<task>, e.g. exp/bcresnet_12
precompute_feats=true  # compute fbank once (no waveform augmentation then)
train_speed_copies=""  # with precompute_feats, e.g. 0.9,1.1: speed-perturbed training copies
train_overrides=""     # extra config overrides, e.g. "training.max_epoch=2 dataset.batch_size=64"
average_num=5

help_message="Usage: $0 [--corpus-dir DIR] [--task 12|35] [--stage N] [--stop-stage M] [--gpus 0,1] ..."
. utils/parse_options.sh

exp=${exp:-exp/$(basename "$config" .yaml)_$task}
dict=$data/dict/classes.txt
# What training reads: precomputed fbank, or the audio (waveform augmentation).
list=data.list
[ "$precompute_feats" = true ] && list=fbank/data.list

# --- corpus: stages -1 and 0 ---
download_dir=${download_dir:-$data/download}
corpus_dir=${corpus_dir:-$download_dir/speech_commands_v0.02}

if [ "$stage" -le -1 ] && [ "$stop_stage" -ge -1 ]; then
  echo "stage -1: corpus in $corpus_dir"
  python -m toolkit.bin.fetch_corpus --url "$download_url" \
    --archive "$download_dir/$(basename "$download_url")" --corpus-dir "$corpus_dir" \
    --marker validation_list.txt --checksums "$checksum_file" --verify "$verify_checksum"
fi

if [ "$stage" -le 0 ] && [ "$stop_stage" -ge 0 ]; then
  echo "stage 0: $task-class data dirs from $corpus_dir into $data"
  python local/prepare_data.py --root "$corpus_dir" --out-dir "$data" --task "$task" \
    --silence-fraction "$silence_fraction" --unknown-fraction "$unknown_fraction" --seed "$seed"
  for x in train dev test; do
    utils/validate_data_dir.sh --no-audio "$data/$x"
  done
fi
# --- end of the corpus stages ---

if [ "$stage" -le 1 ] && [ "$stop_stage" -ge 1 ]; then
  echo "stage 1: data lists (class labels) and fbank"
  [ -f "$dict" ] || { echo "$0: inventory $dict not found: run stage 0 first" >&2; exit 1; }
  # One process for all three sets: its start-up (torch import) costs more than a small
  # set's work.
  python -m toolkit.bin.make_datalist "$data/train" "$data/train/data.list" \
    "$data/dev" "$data/dev/data.list" "$data/test" "$data/test/data.list" \
    --inventory "$dict" --label-mode class --nj "$nj"
  if [ "$precompute_feats" = true ]; then
    feat_sets=(train dev test)
    if [ -n "$train_speed_copies" ]; then   # speed copies are for the training set only
      python -m toolkit.bin.compute_feats "$data/train/data.list" "$data/train/fbank" \
        --config "$config" --nj "$nj" --speed-copies "$train_speed_copies"
      feat_sets=(dev test)
    fi
    feat_pairs=()
    for x in "${feat_sets[@]}"; do feat_pairs+=("$data/$x/data.list" "$data/$x/fbank"); done
    python -m toolkit.bin.compute_feats "${feat_pairs[@]}" --config "$config" --nj "$nj"
  fi
fi

if [ "$stage" -le 2 ] && [ "$stop_stage" -ge 2 ]; then
  echo "stage 2: global CMVN"
  python -m toolkit.bin.compute_cmvn "$data/train/$list" "$data/train/global_cmvn.json" \
    --kaldi-out "$data/train/global_cmvn.ark" --config "$config" --nj "$nj"
fi

if [ "$stage" -le 3 ] && [ "$stop_stage" -ge 3 ]; then
  echo "stage 3: training in $exp"
  # $train_overrides is split into separate key=value words on purpose.
  # shellcheck disable=SC2086
  utils/torchrun.sh ${master_port:+--master-port $master_port} \
    "$gpus" "$num_procs" "$num_nodes" "$node_rank" "$rdzv_endpoint" \
    -m toolkit.bin.train --config "$config" --exp-dir "$exp" \
    --train-data "$data/train/$list" --dev-data "$data/dev/$list" \
    --inventory "$dict" --cmvn "$data/train/global_cmvn.json" $train_overrides
fi

if [ "$stage" -le 4 ] && [ "$stop_stage" -ge 4 ]; then
  echo "stage 4: averaging the best $average_num checkpoints by dev loss"
  python -m toolkit.bin.average_model --exp-dir "$exp" --output "$exp/avg_$average_num.pt" \
    --num "$average_num" --mode best
fi

if [ "$stage" -le 5 ] && [ "$stop_stage" -ge 5 ]; then
  echo "stage 5: export"
  python -m toolkit.bin.export_model --checkpoint "$exp/avg_$average_num.pt" --exp-dir "$exp" \
    --out-dir "$exp/export" --test-data "$data/test/$list"
fi

if [ "$stage" -le 6 ] && [ "$stop_stage" -ge 6 ]; then
  echo "stage 6: classifying the test set with the ONNX model"
  python -m toolkit.bin.score_commands --model "$exp/export/model.onnx" \
    --data-list "$data/test/$list" --inventory "$dict" --out-dir "$exp/score"
  echo "per-class report: $exp/score/accuracy.txt, confusion matrix: $exp/score/confusion.{txt,png}"
fi
