#!/usr/bin/env bash
# Two wake words, "hi xiaowen" and "nihao wenwen", on the Mobvoi hotword corpus
# (OpenSLR 87), DS-TCN or MDTC with the max-pooling loss; FRR vs FA/h per keyword.
#
#   bash run.sh --corpus-dir /path/holding/mobvoi_hotword_dataset{,_resources}
#   bash run.sh --stage 3 --stop-stage 3 --gpus 0,1    # only training, on two GPUs
#
# Stages (each rerunnable; outputs under $data and $exp):
#  -1 the corpus in $corpus_dir: skipped when present; otherwise the two OpenSLR 87 archives
#     are downloaded (or taken from $corpus_dir), checked against local/checksums.sha256 and
#     extracted; offline, a message says where to put them
#   0 $data/{train,dev,test} Kaldi dirs (text = keyword phrase or "<filler>") + keywords.txt
#   1-5 lists, CMVN, training, averaging, export: utils/kws_stages.sh
#   6 FRR vs false alarms per hour for each keyword -> $exp/score/ (summary printed)
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

corpus_dir=""      # holds mobvoi_hotword_dataset/ and mobvoi_hotword_dataset_resources/;
                   # default $data/download
nj=2
download_url=https://www.openslr.org/resources/87   # OpenSLR 87: the two .tgz archives
checksum_file=local/checksums.sha256
verify_checksum=true

config=conf/ds_tcn.yaml
data=data
exp=""             # default exp/<config name>, e.g. exp/ds_tcn
precompute_feats=true  # compute fbank once (no waveform augmentation then)
train_overrides=""     # extra config overrides, e.g. "training.max_epoch=2 dataset.batch_size=64"
average_num=5
target_fa_per_hour=1.0
ctc_unit=""  # char (or phone): CTC targets for configs with a ctc loss component

help_message="Usage: $0 [--corpus-dir DIR] [--stage N] [--stop-stage M] [--gpus 0,1] ..."
. utils/parse_options.sh

corpus_dir=${corpus_dir:-$data/download}
exp=${exp:-exp/$(basename "$config" .yaml)}
dict=$data/dict/keywords.txt
task_type=detection

if [ "$stage" -le -1 ] && [ "$stop_stage" -ge -1 ]; then
  echo "stage -1: corpus in $corpus_dir"
  # Every archive is looked at (and its sha256 printed) even when an earlier one failed;
  # a failure falls through to the message below.
  _fetch_failed=0
  for part in mobvoi_hotword_dataset mobvoi_hotword_dataset_resources; do
    python -m toolkit.bin.fetch_corpus --url "$download_url/$part.tgz" \
      --archive "$corpus_dir/$part.tgz" --corpus-dir "$corpus_dir" --marker "$part" \
      --checksums "$checksum_file" --verify "$verify_checksum" || _fetch_failed=1
  done
  if [ ! -f "$corpus_dir/mobvoi_hotword_dataset_resources/p_train.json" ] \
     || [ ! -d "$corpus_dir/mobvoi_hotword_dataset" ]; then
    cat >&2 <<EOF
error: the Mobvoi hotword corpus is not in $corpus_dir (expected
mobvoi_hotword_dataset/*.wav and mobvoi_hotword_dataset_resources/{p,n}_{train,dev,test}.json).
Download the two archives of OpenSLR 87 (https://www.openslr.org/87/):
  https://www.openslr.org/resources/87/mobvoi_hotword_dataset.tgz
  https://www.openslr.org/resources/87/mobvoi_hotword_dataset_resources.tgz
and either put both .tgz files into $corpus_dir and rerun (stage -1 extracts them), or
extract them side by side anywhere and pass --corpus-dir <that dir>.
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
