#!/usr/bin/env bash
# Command-word classification on Google Speech Commands v0.02 (BC-ResNet or MDTC).
#
#   bash run.sh                                        # all stages, 12-class task
#   bash run.sh --task 35 --data data_35               # all 35 words
#   bash run.sh --corpus-dir /export/speech_commands_v0.02 --stage 0
#   bash run.sh --stage 3 --stop-stage 3 --gpus 0,1    # only training, on two GPUs
#
# Stages (each rerunnable; outputs under $data and $exp):
#  -1 download speech_commands_v0.02.tar.gz into $download_dir (skipped when the corpus is
#     there), verify its sha256 against local/checksums.sha256, extract into $corpus_dir
#   0 $data/{train,dev,test} Kaldi dirs (text = class name) + $data/dict/classes.txt
#   1-5 lists (class labels), CMVN, training, averaging, export: utils/kws_stages.sh
#   6 accuracy and confusion matrix of the test set with the ONNX model -> $exp/score/
# The model config is the `config=` line below (edit it for conf/mdtc.yaml; `--config`
# on the command line is taken by parse_options.sh for a file of shell variables).
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

config=conf/bcresnet.yaml
data=data
exp=""             # default exp/<config name>_<task>, e.g. exp/bcresnet_12
precompute_feats=true
train_overrides=""     # extra config overrides, e.g. "training.max_epoch=2 dataset.batch_size=64"
average_num=5

help_message="Usage: $0 [--corpus-dir DIR] [--task 12|35] [--stage N] [--stop-stage M] [--gpus 0,1] ..."
. utils/parse_options.sh

download_dir=${download_dir:-$data/download}
archive=$download_dir/$(basename "$download_url")
corpus_dir=${corpus_dir:-$download_dir/speech_commands_v0.02}
exp=${exp:-exp/$(basename "$config" .yaml)_$task}
dict=$data/dict/classes.txt
task_type=classification

if [ "$stage" -le -1 ] && [ "$stop_stage" -ge -1 ]; then
  echo "stage -1: corpus in $corpus_dir"
  python -m toolkit.bin.fetch_corpus --url "$download_url" --archive "$archive" \
    --corpus-dir "$corpus_dir" --marker validation_list.txt --checksums "$checksum_file" \
    --verify "$verify_checksum"
fi

if [ "$stage" -le 0 ] && [ "$stop_stage" -ge 0 ]; then
  echo "stage 0: $task-class data dirs from $corpus_dir into $data"
  python local/prepare_data.py --root "$corpus_dir" --out-dir "$data" --task "$task" \
    --silence-fraction "$silence_fraction" --unknown-fraction "$unknown_fraction" --seed "$seed"
  for x in train dev test; do
    utils/validate_data_dir.sh --no-audio "$data/$x"
  done
fi

. utils/kws_stages.sh
