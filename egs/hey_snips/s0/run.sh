#!/usr/bin/env bash
# "Hey Snips" wake-word detection on the Snips corpus (DS-TCN or MDTC, max-pooling loss).
#
#   bash run.sh --corpus-dir /path/to/hey_snips_research_6k_en_train_eval_clean_ter
#   bash run.sh --stage 3 --stop-stage 3 --gpus 0,1    # only training, on two GPUs
#
# The corpus is distributed on request only (see README.md); nothing is downloaded.
# Stages (each rerunnable; outputs under $data and $exp):
#  -1 check the corpus is in $corpus_dir; extract $download_dir/hey_snips_kws_4.0.tar.gz
#     there when only the archive is present
#   0 $data/{train,dev,test} Kaldi dirs (text "hey snips" or "<filler>") + keywords.txt
#   1-5 lists, CMVN, training, averaging, export: utils/kws_stages.sh
#   6 FRR vs false alarms per hour on the test set -> $exp/score/ (summary printed)
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

corpus_dir=""      # default $download_dir/hey_snips_research_6k_en_train_eval_clean_ter
download_dir=""    # where hey_snips_kws_4.0.tar.gz may be placed; default $data/download
nj=2

config=conf/ds_tcn.yaml
data=data
exp=""             # default exp/<config name>, e.g. exp/ds_tcn
precompute_feats=true  # compute fbank once (no waveform augmentation then)
train_overrides=""     # extra config overrides, e.g. "training.max_epoch=2 dataset.batch_size=64"
average_num=5
target_fa_per_hour=1.0
ctc_unit=""  # phone (espeak-ng) or char: CTC targets for configs with a ctc loss component

help_message="Usage: $0 [--corpus-dir DIR] [--stage N] [--stop-stage M] [--gpus 0,1] ..."
. utils/parse_options.sh

archive_name=hey_snips_kws_4.0.tar.gz
download_dir=${download_dir:-$data/download}
corpus_dir=${corpus_dir:-$download_dir/hey_snips_research_6k_en_train_eval_clean_ter}
exp=${exp:-exp/$(basename "$config" .yaml)}
dict=$data/dict/keywords.txt
task_type=detection

if [ "$stage" -le -1 ] && [ "$stop_stage" -ge -1 ]; then
  echo "stage -1: corpus in $corpus_dir"
  if [ ! -f "$corpus_dir/train.json" ] && [ -f "$download_dir/$archive_name" ]; then
    echo "extracting $download_dir/$archive_name into $download_dir"
    tar -xzf "$download_dir/$archive_name" -C "$download_dir"
  fi
  if [ ! -f "$corpus_dir/train.json" ] || [ ! -d "$corpus_dir/audio_files" ]; then
    cat >&2 <<EOF
error: the Hey Snips corpus is not in $corpus_dir (no train.json / audio_files/ there).
It cannot be downloaded automatically: Sonos/Snips grant it on request for research use
(request form linked from https://github.com/sonos/keyword-spotting-research-datasets).
Then either
  - put $archive_name into $download_dir and rerun: stage -1 extracts it, or
  - extract it anywhere and pass --corpus-dir <dir holding train.json, dev.json, test.json
    and audio_files/> (its top directory is hey_snips_research_6k_en_train_eval_clean_ter).
EOF
    exit 1
  fi
  echo "found $corpus_dir"
fi

if [ "$stage" -le 0 ] && [ "$stop_stage" -ge 0 ]; then
  echo "stage 0: data dirs from $corpus_dir into $data"
  python local/prepare_data.py --root "$corpus_dir" --out-dir "$data"
  for x in train dev test; do
    utils/validate_data_dir.sh --no-audio "$data/$x"
  done
fi

. utils/kws_stages.sh
