#!/usr/bin/env bash
# Two wake words, "hi xiaowen" and "nihao wenwen", on the Mobvoi hotword corpus
# (OpenSLR 87), DS-TCN or MDTC with the max-pooling loss; FRR vs FA/h per keyword.
#
#   bash run.sh --corpus-dir /path/holding/mobvoi_hotword_dataset{,_resources}
#   bash run.sh --stage 3 --stop-stage 3 --gpus 0,1    # only training, on two GPUs
#   bash run.sh --config conf/mdtc.yaml                # MDTC instead (exp dir exp/mdtc)
#
# Stages (each rerunnable; outputs under $data and $exp):
#  -1 the corpus in $corpus_dir: skipped when present; otherwise the two OpenSLR 87 archives
#     are downloaded (or taken from $corpus_dir), checked against local/checksums.sha256 and
#     extracted; offline, a message says where to put them
#   0 $data/{train,dev,test} Kaldi dirs (text = keyword phrase or "<filler>") + dict/keywords.txt
#   1 data lists $data/*/data.list (+ fbank $data/*/fbank/ when precompute_feats)
#   2 global CMVN $data/train/global_cmvn.{json,ark}
#   3 training through torchrun into $exp (resumes when rerun)
#   4 average the best $average_num checkpoints by dev loss -> $exp/avg_$average_num.pt
#   5 export TorchScript/ONNX/safetensors -> $exp/export/ (parity-checked)
#   6 the shipped threshold at $target_fa_per_hour FA/h of the dev set ($exp/score_dev/), then
#     FRR vs false alarms per hour for each keyword -> $exp/score/ (summary printed)
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

config=conf/ds_tcn.yaml  # the model; conf/mdtc.yaml for MDTC
data=data
exp=""             # default exp/<config name>, e.g. exp/ds_tcn
precompute_feats=true  # compute fbank once (no waveform augmentation then)
train_speed_copies=""  # with precompute_feats, e.g. 0.9,1.1: speed-perturbed training copies
train_overrides=""     # extra config overrides, e.g. "training.max_epoch=2 dataset.batch_size=64"
average_num=5
target_fa_per_hour=1.0
ctc_unit=""  # char (or phone): CTC targets for configs with a ctc loss component

help_message="Usage: $0 [--corpus-dir DIR] [--stage N] [--stop-stage M] [--gpus 0,1] ..."
. utils/parse_options.sh

exp=${exp:-exp/$(basename "$config" .yaml)}
dict=$data/dict/keywords.txt
# What training reads: precomputed fbank, or the audio (waveform augmentation).
list=data.list
[ "$precompute_feats" = true ] && list=fbank/data.list

# --- corpus: stages -1 and 0 ---
corpus_dir=${corpus_dir:-$data/download}

if [ "$stage" -le -1 ] && [ "$stop_stage" -ge -1 ]; then
  echo "stage -1: corpus in $corpus_dir"
  # Every archive is looked at (and its sha256 printed) even when an earlier one failed;
  # a failure falls through to the message below.
  fetch_failed=0
  for part in mobvoi_hotword_dataset mobvoi_hotword_dataset_resources; do
    python -m toolkit.bin.fetch_corpus --url "$download_url/$part.tgz" \
      --archive "$corpus_dir/$part.tgz" --corpus-dir "$corpus_dir" --marker "$part" \
      --checksums "$checksum_file" --verify "$verify_checksum" || fetch_failed=1
  done
  if [ ! -f "$corpus_dir/mobvoi_hotword_dataset_resources/p_train.json" ] \
     || [ ! -d "$corpus_dir/mobvoi_hotword_dataset" ]; then
    cat >&2 <<EOT
error: the Mobvoi hotword corpus is not in $corpus_dir (expected
mobvoi_hotword_dataset/*.wav and mobvoi_hotword_dataset_resources/{p,n}_{train,dev,test}.json).
Download the two archives of OpenSLR 87 (https://www.openslr.org/87/):
  https://www.openslr.org/resources/87/mobvoi_hotword_dataset.tgz
  https://www.openslr.org/resources/87/mobvoi_hotword_dataset_resources.tgz
and either put both .tgz files into $corpus_dir and rerun (stage -1 extracts them), or
extract them side by side anywhere and pass --corpus-dir <that dir>.
EOT
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
# --- end of the corpus stages ---

if [ "$stage" -le 1 ] && [ "$stop_stage" -ge 1 ]; then
  echo "stage 1: data lists (keyword labels) and fbank"
  [ -f "$dict" ] || { echo "$0: inventory $dict not found: run stage 0 first" >&2; exit 1; }
  ctc_args=()
  if [ -n "$ctc_unit" ]; then
    python -m toolkit.bin.make_lexicon --unit "$ctc_unit" "$data/train" "$data/dev" "$data/test" \
      --lexicon "$data/dict/lexicon.txt" --units "$data/dict/units.txt"
    ctc_args=(--lexicon "$data/dict/lexicon.txt" --units "$data/dict/units.txt")
  fi
  # One process for all three sets: its start-up (torch import) costs more than a small
  # set's work.
  python -m toolkit.bin.make_datalist "$data/train" "$data/train/data.list" \
    "$data/dev" "$data/dev/data.list" "$data/test" "$data/test/data.list" \
    --inventory "$dict" --label-mode keyword --nj "$nj" "${ctc_args[@]}"
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
    --inventory "$dict" --cmvn "$data/train/global_cmvn.json" \
    ${ctc_unit:+--units "$data/dict/units.txt"} $train_overrides
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
  echo "stage 6: scoring the test set with the ONNX model"
  # FRR intervals resample whole voices (errors cluster by voice), or utterances where
  # the test set names no speakers.
  bootstrap_unit=speaker
  if [ ! -s "$data/test/utt2spk" ]; then
    echo "stage 6: $data/test has no utt2spk: FRR intervals resample utterances"
    bootstrap_unit=utterance
  fi
  # The threshold the models ship with meets target_fa_per_hour on the dev set; the test
  # set reports its own operating points and what a user gets at that threshold.
  utils/kws_score.sh --nj "$nj" --target-fa-per-hour "$target_fa_per_hour" \
    --bootstrap-unit "$bootstrap_unit" \
    "$exp/export/model.onnx" "$data/dev/$list" "$dict" "$exp/score_dev"
  python -m toolkit.bin.set_threshold --export-dir "$exp/export" --score-dir "$exp/score_dev"
  utils/kws_score.sh --nj "$nj" --target-fa-per-hour "$target_fa_per_hour" \
    --bootstrap-unit "$bootstrap_unit" \
    --deployed threshold "$exp/export/model.onnx" "$data/test/$list" "$dict" "$exp/score"
  echo "summary ($exp/score/summary.txt):"
  cat "$exp/score/summary.txt"
  echo "false alarms, per-speaker misses and missed utterances at that threshold:" \
    "$exp/score/errors_*.txt"
fi
