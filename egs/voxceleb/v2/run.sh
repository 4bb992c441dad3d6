#!/usr/bin/env bash
# Speaker verification on VoxCeleb: train on VoxCeleb2 dev (5,994 speakers), score
# VoxCeleb1-O (cleaned), -E and -H, with and without AS-Norm, before and after
# large-margin fine-tuning. ResNet34 (default) or ECAPA-TDNN C=1024.
#
#   bash run.sh --voxceleb1 /corpora/voxceleb1 --voxceleb2 /corpora/voxceleb2 --gpus 0,1,2,3,4,5,6,7
#   bash run.sh --config conf/ecapa_c1024.yaml --stage 1 ...   # the second model (exp/ecapa_c1024)
#   bash run.sh --stage 2 --stop-stage 2 --gpus 0,1             # only training (resumes)
#
# Stages (each rerunnable; outputs under $data and $exp):
#  -1 MUSAN + RIRS_NOISES: downloaded into $download_dir unless already extracted in
#     $noise_corpus_dir, md5-checked (local/checksums.txt), extracted, MUSAN cut into 8 s
#     pieces; data lists $data/noise/{musan,rirs}.list (skipped with augment=false)
#   0 Kaldi dirs $data/{vox2_dev,vox1,vox1_test} from the audio (counts checked against
#     the published ones) and the trial lists $data/trials/vox1_{O,E,H}.txt
#   1 data lists, speaker inventory (optional features + speed copies, shards)
#   2 training through torchrun into $exp
#   3 average the last $average_num epochs -> $exp/avg_${average_num}.pt
#   4 large-margin fine-tuning (conf/lm.yaml) into ${exp}_lm, averaged likewise
#   5 export of both (ONNX, TorchScript, safetensors; parity-checked)
#   6 embeddings of all of VoxCeleb1 and of the cohort (VoxCeleb2 dev speaker means)
#   7 Vox1-O/E/H scoring with and without AS-Norm -> <exp>/score/summary.txt
# Stages 1-7 are utils/sv_stages.sh, shared with the other speaker recipes.
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
stop_stage=7

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

train_set=vox2_dev
dev_set=vox1_test      # unseen speakers; monitoring only (stage 3 averages the last epochs)
test_set=vox1
trials="$data/trials/vox1_O.txt $data/trials/vox1_E.txt $data/trials/vox1_H.txt"
if [ "$augment" = true ]; then
  noise_list=$data/noise/musan.list
  rir_list=$data/noise/rirs.list
fi
embed_nj=$nj
. utils/sv_stages.sh
