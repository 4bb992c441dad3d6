#!/usr/bin/env bash
# Speaker verification without any download: the speakers are TTS voices (espeak-ng
# accents x variants, and procedural espeak-ng voices beyond those), train/dev/test
# speakers disjoint; EER and minDCF on voices never heard in training, with and without
# AS-Norm. The defaults run end to end on 2 CPU cores in about 15 minutes, install included.
#
#   bash run.sh                                       # all stages, small ECAPA-TDNN
#   bash run.sh --config conf/resnet.yaml --stage 2   # small ResNet on the same data (exp/resnet)
#   bash run.sh --stage 2 --stop-stage 2              # only training (resumes if killed)
#   bash run.sh --lm-config conf/lm.yaml              # + large-margin fine-tuning (exp/<name>_lm)
#   bash run.sh --gpus 0                              # on a GPU
#
# Stages (each rerunnable; outputs under $data and $exp):
#   0 synthesize $data/{train,dev,test} Kaldi dirs (+ $data/test/trials), each validated
#   1 data lists, speaker inventory, fbank features (precompute_feats)
#   2 training through torchrun into $exp
#   3 average the last $average_num checkpoints
#   4 large-margin fine-tuning into ${exp}_lm (only with --lm-config)
#   5 export (ONNX, TorchScript, safetensors; parity-checked)
#   6 embeddings of the test set and of the cohort (training speaker means)
#   7 scoring of $data/test/trials with and without AS-Norm -> $exp/score/summary.txt
# Stages 1-7 are utils/sv_stages.sh, shared with the other speaker recipes.
set -euo pipefail
cd "$(dirname "$0")"
. ./path.sh

gpus=-1            # GPUs to use, e.g. "0,1" -> 2 processes; -1 or empty -> CPU
num_procs=2        # CPU only: gloo ranks (two of one thread each use two cores best)
num_nodes=1        # multi-node: number of nodes, this node's rank, rendezvous host:port
node_rank=0
rdzv_endpoint=127.0.0.1:29400
master_port=""     # one node: fixed torchrun port (default: a free one)
stage=0
stop_stage=7

seed=777
# Speakers per split and utterances per speaker. 224 fixed espeak-ng voices (8 accents x
# 28 variants) less the dev and test families leave 160 for training; procedural voices
# make up the rest (at most 300 of them).
num_train_speakers=300
train_utts=12
num_dev_speakers=24
dev_utts=6
num_test_speakers=40
test_utts=10
# TTS engines that speak (comma list): espeak alone by default; "espeak,flite" adds
# flite's voices as speakers. Festival is reserved for evaluation (synth_speaker_data
# --test-only writes a test set of its voices alone).
engines=espeak
nj=2

config=conf/ecapa.yaml  # conf/resnet.yaml: the small ResNet (RESULTS.md compares them)
data=data
exp=""             # default exp/<config name>, e.g. exp/ecapa
precompute_feats=true  # fbank once; the TTS corpus has its noise already
train_speed_copies=""  # e.g. 0.9,1.1: speed-perturbed copies as new speakers
train_overrides=""     # extra config overrides, e.g. "training.max_epoch=2"
average_num=3
lm_config=""           # e.g. conf/lm.yaml: large-margin fine-tuning after averaging
lm_train_overrides=""
as_norm_top=100        # of the training speakers (300 by default)
cohort_utts_per_spk=4  # cohort = training speakers' means over 4 utterances each

help_message="Usage: $0 [--config conf/resnet.yaml] [--stage N] [--stop-stage M] [--gpus 0] ..."
. utils/parse_options.sh

exp=${exp:-exp/$(basename "$config" .yaml)}

if [ "$stage" -le 0 ] && [ "$stop_stage" -ge 0 ]; then
  echo "stage 0: synthesizing TTS speakers into $data"
  python -m toolkit.bin.synth_speaker_data --out-dir "$data" --seed "$seed" \
    --num-train-speakers "$num_train_speakers" --train-utts "$train_utts" \
    --num-dev-speakers "$num_dev_speakers" --dev-utts "$dev_utts" \
    --num-test-speakers "$num_test_speakers" --test-utts "$test_utts" \
    --engines "$engines" --nj "$nj"
  for x in train dev test; do
    utils/validate_data_dir.sh --no-audio "$data/$x"
  done
fi

train_set=train
dev_set=dev
test_set=test
trials=$data/test/trials
. utils/sv_stages.sh
