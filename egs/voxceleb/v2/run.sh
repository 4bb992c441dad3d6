#!/usr/bin/env bash
# Speaker verification on VoxCeleb: train on VoxCeleb2 dev (5,994 speakers), score
# VoxCeleb1-O (cleaned), -E and -H, with and without AS-Norm, before and after
# large-margin fine-tuning. ResNet34 (default) or ECAPA-TDNN C=1024.
#
#   bash run.sh --voxceleb1 /corpora/voxceleb1 --voxceleb2 /corpora/voxceleb2 --gpus 0,1,2,3,4,5,6,7
#   bash run.sh --config conf/ecapa_c1024.yaml --stage 1 ...   # the second model (exp/ecapa_c1024)
#   bash run.sh --stage 3 --stop-stage 3 --gpus 0,1             # only training (resumes)
#
# Stages (each rerunnable; outputs under $data and $exp; README.md: what each writes):
#  -1 MUSAN + RIRS_NOISES: downloaded into $download_dir unless already extracted in
#     $noise_corpus_dir, md5-checked (local/checksums.txt), extracted, MUSAN cut into 8 s
#     pieces; data lists $data/noise/{musan,rirs}.list (skipped with augment=false)
#   0 Kaldi dirs $data/{vox2_dev,vox1,vox1_test} from the audio (counts checked against
#     the published ones) and the trial lists $data/trials/vox1_{O,E,H}.txt
#   1 speaker inventory, data lists (optional features + speed copies, shards)
#   2 (unused: no global CMVN, the speaker models normalise each utterance)
#   3 training through torchrun into $exp
#   4 average the last $average_num epochs -> $exp/avg_${average_num}.pt; large-margin
#     fine-tuning from it (conf/lm.yaml) into ${exp}_lm, averaged likewise
#   5 export of both (ONNX, TorchScript, safetensors; parity-checked)
#   6 scoring: embeddings of all of VoxCeleb1 and of the cohort (VoxCeleb2 dev speaker
#     means), Vox1-O/E/H with and without AS-Norm -> <exp>/score/summary.txt
set -euo pipefail
cd "$(dirname "$0")"
. ./path.sh

gpus=-1            # GPUs to use, e.g. "0,1,2,3,4,5,6,7"; -1 or empty -> CPU
num_procs=1        # CPU only: number of gloo ranks
num_nodes=1        # multi-node: number of nodes, this node's rank, rendezvous host:port
node_rank=0
rdzv_endpoint=127.0.0.1:29400
master_port=""     # one node: fixed torchrun port (default: a free one)
stage=-1
stop_stage=6

voxceleb1=""       # VoxCeleb1 root: wav/<spk>/... or dev/wav + test/wav (README.md)
voxceleb2=""       # VoxCeleb2 root: dev/aac/<spk>/... converted to WAV, or dev/wav/<spk>/...
trials_dir=""      # official trial lists (downloaded here when absent); default $data/local/meta
allow_partial=false    # true: go on when counts differ from the published ones
augment=true       # MUSAN + RIR augmentation (stage -1 and the noise/rir lists)
download_dir=""    # where musan.tar.gz / rirs_noises.zip are or go; default $data/download
noise_corpus_dir=""    # where musan/ and RIRS_NOISES/ are or are extracted; default $download_dir
musan_url=https://www.openslr.org/resources/17/musan.tar.gz
rirs_url=https://www.openslr.org/resources/28/rirs_noises.zip
checksum_file=local/checksums.txt
verify_checksum=true
musan_segment_seconds=8
nj=16

config=conf/resnet34.yaml
data=data
exp=""             # default exp/<config name>, e.g. exp/resnet34
precompute_feats=false # true: fbank once (then no noise/reverb augmentation)
train_speed_copies=""  # with precompute_feats, e.g. 0.9,1.1: speed copies as new speakers
use_shards=false       # true: train from tar shards (object stores, slow shared disks)
train_overrides=""     # extra config overrides, e.g. "training.max_epoch=2"
average_num=10
lm_config=conf/lm.yaml # empty: no large-margin fine-tuning
lm_train_overrides=""
lm_average_num=2
cohort_utts_per_spk=10 # cohort means over 10 utterances of each VoxCeleb2 speaker
as_norm_top=300

help_message="Usage: $0 --voxceleb1 DIR --voxceleb2 DIR [--gpus 0,1] [--stage N] [--stop-stage M] ..."
. utils/parse_options.sh

exp=${exp:-exp/$(basename "$config" .yaml)}
lm_exp=${exp}_lm
download_dir=${download_dir:-$data/download}
noise_corpus_dir=${noise_corpus_dir:-$download_dir}
trials_dir=${trials_dir:-$data/local/meta}

if [ "$stage" -le -1 ] && [ "$stop_stage" -ge -1 ] && [ "$augment" = true ]; then
  echo "stage -1: MUSAN and RIRS_NOISES in $noise_corpus_dir, lists in $data/noise"
  python local/prepare_noise.py --download-dir "$download_dir" --corpus-dir "$noise_corpus_dir" \
    --out-dir "$data/noise" --checksums "$checksum_file" --verify "$verify_checksum" \
    --musan-url "$musan_url" --rirs-url "$rirs_url" --segment-seconds "$musan_segment_seconds"
fi

if [ "$stage" -le 0 ] && [ "$stop_stage" -ge 0 ]; then
  echo "stage 0: VoxCeleb data dirs and trial lists into $data"
  if [ -z "$voxceleb1" ] || [ -z "$voxceleb2" ]; then
    echo "$0: stage 0 needs --voxceleb1 DIR and --voxceleb2 DIR (README.md: where to get them)" >&2
    exit 1
  fi
  _partial=()
  [ "$allow_partial" = true ] && _partial=(--allow-partial)
  python local/prepare_voxceleb.py --voxceleb1 "$voxceleb1" --voxceleb2 "$voxceleb2" \
    --out-dir "$data" --trials-dir "$trials_dir" "${_partial[@]}"
  for x in vox2_dev vox1 vox1_test; do
    utils/validate_data_dir.sh --no-audio "$data/$x"
  done
fi

# Training reads vox2_dev; the dev set vox1_test (unseen speakers) is for monitoring only:
# stage 4 averages the last epochs. Test: all of VoxCeleb1.
dict=$data/dict/speakers.txt
train_list=$data/vox2_dev/data.list
dev_list=$data/vox1_test/data.list
if [ "$precompute_feats" = true ]; then
  if [ "$use_shards" = true ]; then
    echo "$0: use_shards and precompute_feats exclude each other (shards hold audio)" >&2
    exit 1
  fi
  train_list=$data/vox2_dev/fbank/data.list
  dev_list=$data/vox1_test/fbank/data.list
elif [ -n "$train_speed_copies" ]; then
  echo "$0: train_speed_copies needs precompute_feats=true (the copies are computed once)" >&2
  exit 1
fi
[ "$use_shards" = true ] && train_list=$data/vox2_dev/shards/shards.list
# Waveform augmentation: the noise and RIR lists of stage -1 (the config holds their
# probabilities and SNRs).
aug_overrides=()
if [ "$augment" = true ]; then
  aug_overrides=("dataset.noise.noise_list=$data/noise/musan.list"
                 "dataset.reverb.rir_list=$data/noise/rirs.list")
fi
# The AS-Norm cohort: each VoxCeleb2 dev speaker's first $cohort_utts_per_spk utterances.
cohort_list=$data/vox2_dev/data.list
[ "$cohort_utts_per_spk" -gt 0 ] && cohort_list=$data/vox2_dev/cohort_${cohort_utts_per_spk}.list
# The models stages 5 and 6 export and score, with their averages.
systems=("$exp")
models=("$exp/avg_${average_num}.pt")
if [ -n "$lm_config" ]; then
  systems+=("$lm_exp")
  models+=("$lm_exp/avg_${lm_average_num}.pt")
fi

if [ "$stage" -le 1 ] && [ "$stop_stage" -ge 1 ]; then
  echo "stage 1: speaker inventory and data lists"
  python -m toolkit.bin.make_inventory "$dict" --utt2spk "$data/vox2_dev/utt2spk"
  python -m toolkit.bin.make_datalist "$data/vox2_dev" "$data/vox2_dev/data.list" \
    --inventory "$dict" --label-mode speaker --nj "$nj"
  for x in vox1_test vox1; do
    # Speakers outside training: labelled against their own list, which nothing trains on.
    python -m toolkit.bin.make_inventory "$data/$x/speakers.txt" --utt2spk "$data/$x/utt2spk"
    python -m toolkit.bin.make_datalist "$data/$x" "$data/$x/data.list" \
      --inventory "$data/$x/speakers.txt" --label-mode speaker --nj "$nj"
  done
  if [ "$precompute_feats" = true ]; then
    speed_args=()
    [ -n "$train_speed_copies" ] && speed_args=(--speed-copies "$train_speed_copies")
    python -m toolkit.bin.compute_feats "$data/vox2_dev/data.list" "$data/vox2_dev/fbank" \
      --config "$config" --nj "$nj" "${speed_args[@]}"
    python -m toolkit.bin.compute_feats "$data/vox1_test/data.list" "$data/vox1_test/fbank" \
      --config "$config" --nj "$nj"
    if [ -n "$train_speed_copies" ]; then
      # Each speed copy is a new speaker: the inventory is rewritten with them.
      python -m toolkit.bin.make_inventory "$dict" --data-list "$train_list" --relabel
    fi
  fi
  if [ "$use_shards" = true ]; then
    python -m toolkit.bin.make_shards "$data/vox2_dev/data.list" "$data/vox2_dev/shards" \
      --utts-per-shard 1000 --nj "$nj" --prefix vox2_dev
  fi
fi

# Stage 2 is unused: no global CMVN, the speaker models normalise each utterance.

if [ "$stage" -le 3 ] && [ "$stop_stage" -ge 3 ]; then
  echo "stage 3: training in $exp"
  # $train_overrides is split into separate key=value words on purpose.
  # shellcheck disable=SC2086
  utils/torchrun.sh ${master_port:+--master-port $master_port} \
    "$gpus" "$num_procs" "$num_nodes" "$node_rank" "$rdzv_endpoint" \
    -m toolkit.bin.train --config "$config" --exp-dir "$exp" \
    --train-data "$train_list" --dev-data "$dev_list" --inventory "$dict" \
    "${aug_overrides[@]}" $train_overrides
fi

if [ "$stage" -le 4 ] && [ "$stop_stage" -ge 4 ]; then
  echo "stage 4: averaging the last $average_num checkpoints"
  python -m toolkit.bin.average_model --exp-dir "$exp" --output "$exp/avg_${average_num}.pt" \
    --num "$average_num" --mode last
  if [ -n "$lm_config" ]; then
    echo "stage 4: large-margin fine-tuning in $lm_exp from $exp/avg_${average_num}.pt"
    mkdir -p "$lm_exp"
    # The base run's resolved config (its overrides included) with the overlay on top: the
    # architecture matches the averaged weights whatever the base config was.
    printf '%s\n' "# run.sh stage 4: the base training's config, then the overlay" \
      "defaults: [\"$(cd "$exp" && pwd)/config.yaml\", \"$(cd "$(dirname "$lm_config")" && pwd)/$(basename "$lm_config")\"]" \
      > "$lm_exp/lm_source.yaml"
    # shellcheck disable=SC2086
    utils/torchrun.sh ${master_port:+--master-port $master_port} \
      "$gpus" "$num_procs" "$num_nodes" "$node_rank" "$rdzv_endpoint" \
      -m toolkit.bin.train --config "$lm_exp/lm_source.yaml" --exp-dir "$lm_exp" \
      --train-data "$train_list" --dev-data "$dev_list" --inventory "$dict" \
      "${aug_overrides[@]}" "training.init_checkpoint=$exp/avg_${average_num}.pt" \
      $lm_train_overrides
    python -m toolkit.bin.average_model --exp-dir "$lm_exp" \
      --output "$lm_exp/avg_${lm_average_num}.pt" --num "$lm_average_num" --mode last
  fi
fi

if [ "$stage" -le 5 ] && [ "$stop_stage" -ge 5 ]; then
  for i in "${!systems[@]}"; do
    echo "stage 5: export of ${models[$i]}"
    python -m toolkit.bin.export_model --checkpoint "${models[$i]}" --exp-dir "${systems[$i]}" \
      --out-dir "${systems[$i]}/export" --test-data "$data/vox1/data.list" --num-check 20
  done
fi

if [ "$stage" -le 6 ] && [ "$stop_stage" -ge 6 ]; then
  if [ "$cohort_utts_per_spk" -gt 0 ]; then
    utils/speaker_cohort_list.sh "$cohort_utts_per_spk" "$data/vox2_dev/data.list" "$cohort_list"
  fi
  for sys in "${systems[@]}"; do
    echo "stage 6: embeddings of vox1 and of the cohort with $sys/export/model.onnx"
    utils/speaker_embed.sh --nj "$nj" "$sys/export/model.onnx" "$sys/embeddings" \
      "vox1=$data/vox1/data.list" "cohort=$cohort_list"
  done
  for sys in "${systems[@]}"; do
    echo "stage 6: Vox1-O/E/H scoring with $sys"
    utils/speaker_score.sh --as-norm-top "$as_norm_top" "$sys" "vox1=$data/trials/vox1_O.txt" \
      "vox1=$data/trials/vox1_E.txt" "vox1=$data/trials/vox1_H.txt"
  done
  for sys in "${systems[@]}"; do
    echo "summary ($sys/score/summary.txt):"
    cat "$sys/score/summary.txt"
  done
fi
