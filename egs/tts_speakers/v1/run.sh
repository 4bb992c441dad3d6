#!/usr/bin/env bash
# Speaker verification without any download of data: the speakers are TTS voices of the
# voice bank (toolkit/voicebank): espeak-ng accents x variants and procedural espeak-ng voices,
# Kokoro's 21 unreserved neural voices and hundreds of blends of them, and any other
# engine named; train/dev/test speakers disjoint. EER and minDCF, with and without
# AS-Norm, on the recipe's own test (voices never heard in training) and on an outside
# test set: the seven Kokoro voices reserved for evaluation (toolkit.voicebank.RESERVED_VOICES),
# the held-out espeak-ng voices, and festival/flite voices when named (outside_engines).
# Timings: RESULTS.md.
#
#   bash run.sh                                       # all stages: the shipped encoder fine-tuned
#   bash run.sh --config conf/ecapa.yaml --blends 150 # a small ECAPA-TDNN from scratch on 150 blends
#   bash run.sh --outside-engines ""                  # no festival/flite (their apt needs root)
#   bash run.sh --engines espeak                      # espeak-ng alone (no Kokoro install)
#   bash run.sh --config conf/resnet.yaml --stage 2   # small ResNet on the same data (exp/resnet)
#   bash run.sh --stage 2 --stop-stage 2              # only training (resumes if killed)
#   bash run.sh --lm-config conf/lm.yaml              # + large-margin fine-tuning (exp/<name>_lm)
#   bash run.sh --gpus 0                              # on a GPU
#
# Stages (each rerunnable; outputs under $data and $exp):
#   0 install the named engines (tools/install_voices.sh), synthesize $data/{train,dev,test}
#     Kaldi dirs (+ $data/test/trials*) and the outside test set $data/outside/test
#     (synth_speaker_data --test-only; trials, trials_<engine>), each validated
#   1 data lists, speaker inventory, fbank features (precompute_feats)
#   2 training through torchrun into $exp
#   3 average the last $average_num checkpoints
#   4 large-margin fine-tuning into ${exp}_lm (only with --lm-config)
#   5 export (ONNX, TorchScript, safetensors; parity-checked)
#   6 embeddings of both test sets and of the cohort (training speaker means)
#   7 scoring of every trial list with and without AS-Norm -> $exp/score/summary.txt, the
#     same for the shipped pretrained encoder (exp/$pretrained), then Resemblyzer on the
#     same lists (exp/resemblyzer/results.md: every system side by side)
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
# espeak-ng speakers per split and utterances per speaker. 224 fixed espeak-ng voices
# (8 accents x 28 variants) less the dev and test families leave 160 for training;
# procedural voices make up the rest (at most 300 of them).
num_train_speakers=300
train_utts=8
num_dev_speakers=24
dev_utts=6
num_test_speakers=40
test_utts=10
# TTS engines that speak (comma list), their voices on top of espeak-ng's speakers:
# Kokoro's unreserved voices train, with $blends blends of them as speakers (5 % of the
# blends held out for dev, 5 % for test). "espeak,kokoro,flite,rhvoice" adds those
# engines' voices (tools/install_voices.sh installs them; apt needs root).
engines=espeak,kokoro
blends=0           # the shipped encoder has heard 800; fine-tuning needs none
# A Kokoro clip costs about a CPU-second where espeak-ng takes a millisecond: its
# speakers get fewer training utterances, of fewer words (ENGINE=VALUE comma lists).
engine_train_utts=kokoro=4
engine_words=kokoro=3-6
# The outside test set ($data/outside/test): the test speakers the corpus above holds
# out of the engines that reserve no voice, the voices reserved for evaluation of
# $engines (Kokoro's seven), and those of $outside_engines: festival (every voice, never
# trained on) and flite (Debian packages: tools/install_voices.sh needs root or sudo).
outside_engines=festival,flite
outside_utts=20        # utterances per outside test speaker
nj=2

# conf/ecapa_ft.yaml fine-tunes the shipped encoder (toolkit/pretrained/ecapa-voicebank-v1);
# conf/ecapa.yaml and conf/resnet.yaml train small models from scratch (RESULTS.md).
config=conf/ecapa_ft.yaml
data=data
exp=""             # default exp/<config name>, e.g. exp/ecapa
precompute_feats=true  # fbank once; the TTS corpus has its noise already
train_speed_copies=""  # e.g. 0.9,1.1: speed-perturbed copies as new speakers
train_overrides=""     # extra config overrides, e.g. "training.max_epoch=2"
average_num=3
lm_config=""           # e.g. conf/lm.yaml: large-margin fine-tuning after averaging
lm_train_overrides=""
as_norm_top=100        # of the training speakers (300 by default)
# Scored beside this recipe's own model on every list: the speaker encoder the toolkit
# ships (toolkit/pretrained/, made by egs/voice_bank/speaker_encoder; empty: none) and
# Resemblyzer, a GE2E encoder trained on real speech (tools/install_resemblyzer.sh).
pretrained=ecapa-voicebank-v1
resemblyzer=true
cohort_utts_per_spk=4  # cohort = training speakers' means over 4 utterances each

help_message="Usage: $0 [--config conf/resnet.yaml] [--stage N] [--stop-stage M] [--gpus 0] ..."
. utils/parse_options.sh

exp=${exp:-exp/$(basename "$config" .yaml)}

outside_all=$(printf '%s\n' ${engines//,/ } ${outside_engines//,/ } | awk '!seen[$0]++' | paste -sd,)
_named() {   # ENGINE=VALUE,... -> the items of the engines $engines names
  local item out=()
  for item in ${1//,/ }; do
    case ",$engines," in *",${item%%=*},"*) out+=("$item") ;; esac
  done
  (IFS=,; echo "${out[*]}")
}

if [ "$stage" -le 0 ] && [ "$stop_stage" -ge 0 ]; then
  _install=$(printf '%s\n' ${outside_all//,/ } | grep -vx espeak | paste -sd' ' || true)
  if [ -n "$_install" ]; then
    echo "stage 0: installing the TTS engines $_install (tools/install_voices.sh)"
    # shellcheck disable=SC2086
    bash "$TOOLKIT_ROOT/tools/install_voices.sh" $_install
  fi
  echo "stage 0: synthesizing TTS speakers into $data"
  _synth=(python -m toolkit.bin.synth_speaker_data --seed "$seed" --nj "$nj"
          --num-train-speakers "$num_train_speakers" --train-utts "$train_utts"
          --num-dev-speakers "$num_dev_speakers" --dev-utts "$dev_utts"
          --num-test-speakers "$num_test_speakers")
  "${_synth[@]}" --out-dir "$data" --test-utts "$test_utts" --engines "$engines" \
    --blends "$blends" --engine-train-utts "$(_named "$engine_train_utts")" \
    --engine-words "$(_named "$engine_words")"
  # Blends and training sizes change nothing there: Kokoro speaks through its reserved
  # voices alone, every other engine through its held-out voices.
  echo "stage 0: synthesizing the outside test set into $data/outside ($outside_all)"
  "${_synth[@]}" --out-dir "$data/outside" --test-only --test-utts "$outside_utts" \
    --engines "$outside_all"
  for x in train dev test outside/test; do
    utils/validate_data_dir.sh --no-audio "$data/$x"
  done
fi

train_set=train
dev_set=dev
test_sets="test outside/test"
# Every trial list of both test sets: all pairs, and the pairs within each engine.
trials=""
for x in $test_sets; do
  for t in "$data/$x"/trials "$data/$x"/trials_*; do
    [ -f "$t" ] && trials="$trials $x:$t"
  done
done
. utils/sv_stages.sh
