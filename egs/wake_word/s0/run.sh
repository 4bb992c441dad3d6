#!/usr/bin/env bash
# Train a wake-word detector from the keyword's text alone: synthetic speech (espeak-ng;
# flite or festival only when asked for in engines=), no corpus download, no recorded audio.
#
#   bash run.sh --keyword "hey snips"                 # all stages
#   bash run.sh --stage 3 --stop-stage 3              # only training (resumes if killed)
#   bash run.sh --gpus 0,1                            # two GPUs (or edit gpus= below)
#   bash run.sh --frontend speech_embedding           # openWakeWord's front end (README.md, "Front ends")
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
# 3.6 h of test negatives: 1 FA/h allows three false alarms, not one, so the operating
# point is not decided by a single utterance.
num_test_pos=1200
num_test_neg=5400
# Training negatives only: confusable share, and the share of those that are near-homophones
# of the whole keyword ("hey snoops"): the negatives a detector most easily fires on, which
# an in-turn walk over every confusable category would leave with a few copies each.
train_conf_share=0.5
train_hard_share=0.5
# TTS engines that speak (comma list); stage 0 installs those that need it
# (tools/install_voices.sh). Those besides espeak-ng speak other_share of the utterances;
# blends: that many mixed voices of each engine whose voices mix (Kokoro).
engines=espeak
other_share=0.2
blends=0
# Outside test sets (comma list of engines): voices no training list or blend holds
# (Kokoro's seven reserved voices, festival's), written by stage 0 to $data/outside_<engine>
# and scored by stage 6 beside the recipe's own test. festival needs apt (root).
outside_engines=""
num_outside_pos=300
num_outside_neg=1350
nj=2

# Front end: fbank (kaldi-native-fbank) or speech_embedding (openWakeWord 0.5.1's frozen
# ONNX front end, installed on demand; its models are CC BY-NC-SA 4.0, non-commercial:
# README.md, "Front ends"). It picks the default config and exp dir and where features go.
frontend=fbank
config=""              # default: conf/ds_tcn.yaml (fbank), conf/oww_ds_tcn.yaml (speech_embedding)
data=data
exp=""                 # default: exp/ds_tcn (fbank), exp/oww_ds_tcn (speech_embedding)
precompute_feats=true  # compute features once (no waveform augmentation then)
train_overrides=""     # extra config overrides, e.g. "training.max_epoch=2 dataset.batch_size=64"
average_num=5
target_fa_per_hour=1.0
ctc_unit=phone  # CTC targets (conf/*_ctc.yaml): espeak-ng phones

help_message="Usage: $0 [--keyword \"hey snips\"] [--stage N] [--stop-stage M] [--gpus 0,1] ..."
. utils/parse_options.sh

dict=$data/dict/keywords.txt
task_type=detection
case "$frontend" in
  fbank)
    config=${config:-conf/ds_tcn.yaml}; exp=${exp:-exp/ds_tcn}
    feat_dir=fbank; cmvn_name=global_cmvn ;;
  speech_embedding)
    config=${config:-conf/oww_ds_tcn.yaml}; exp=${exp:-exp/oww_ds_tcn}
    feat_dir=speech_embedding; cmvn_name=global_cmvn_speech_embedding
    bash "$TOOLKIT_ROOT/tools/install_oww.sh" ;;
  *) echo "$0: --frontend must be fbank or speech_embedding, got '$frontend'" >&2; exit 1 ;;
esac
_config_type=$(python -c 'import sys, toolkit.tasks; from toolkit.task import load_config
print(load_config(sys.argv[1]).dataset.feature.type)' "$config")
if [ "$_config_type" != "$frontend" ]; then
  echo "$0: $config computes dataset.feature.type $_config_type, not --frontend $frontend" >&2
  exit 1
fi

# --- stage 0: data preparation (a copy of this recipe for a new corpus replaces this block) ---
if [ "$stage" -le 0 ] && [ "$stop_stage" -ge 0 ]; then
  echo "stage 0: synthesizing data for \"$keyword\" into $data"
  _needs_install=$(echo "$engines,$outside_engines" | tr ',' '\n' | grep -xE 'kokoro|rhvoice|pico|mbrola|festival|flite' | sort -u | tr '\n' ' ' || true)
  [ -z "$_needs_install" ] || bash "$TOOLKIT_ROOT/tools/install_voices.sh" $_needs_install
  python -m toolkit.bin.synth_kws_data --keyword "$keyword" --out-dir "$data" --seed "$seed" \
    --num-train-pos $num_train_pos --num-train-neg $num_train_neg \
    --num-dev-pos $num_dev_pos --num-dev-neg $num_dev_neg \
    --num-test-pos $num_test_pos --num-test-neg $num_test_neg \
    --train-conf-share $train_conf_share --train-hard-share $train_hard_share \
    --engines "$engines" --other-share "$other_share" --blends "$blends" --nj $nj
  for _e in ${outside_engines//,/ }; do
    python -m toolkit.bin.synth_kws_data --keyword "$keyword" --out-dir "$data/outside_$_e" \
      --seed "$seed" --test-only --engines "$_e" --num-test-pos $num_outside_pos \
      --num-test-neg $num_outside_neg --nj $nj
  done
fi
outside_sets=""
for _e in ${outside_engines//,/ }; do outside_sets="$outside_sets $data/outside_$_e/test"; done
# --- end of stage 0 ---

# Stages 1-6 are shared by every keyword recipe.
. utils/kws_stages.sh
