#!/usr/bin/env bash
# Train a wake-word detector from the keyword's text alone: synthetic speech (espeak-ng;
# Kokoro for 15 % of every kind with the default phone front end; flite or festival only when
# asked for in engines=), no corpus download, no recorded audio.
#
#   bash run.sh --keyword "hey snips"                 # all stages
#   bash run.sh --keyword "hey jarvis" --frontend fbank     # a model of its own on fbank
#   bash run.sh --stage 3 --stop-stage 3              # only training (resumes if killed)
#   bash run.sh --gpus 0,1                            # two GPUs (or edit gpus= below)
#   bash run.sh --frontend speech_embedding           # openWakeWord's front end (README.md, "Front ends")
#
# Stages (each rerunnable; outputs under $data and $exp):
#   0 synthesize $data/{train,dev,test} Kaldi dirs + $data/dict/keywords.txt (sizes and
#     mix: $corpus_config), and the outside test sets $data/outside_<engine>/test; the
#     general negatives from the negatives cache (neg_cache=true), those that hold the
#     keyword dropped (logged and counted)
#   1 data lists $data/*/data.list, the lexicon and CTC units $data/dict/{lexicon,units}.txt,
#     features $data/*/fbank/ (or speech_embedding/) when precompute_feats, the general
#     negatives' features from the cache (neg_cache=true)
#   2 global CMVN $data/train/global_cmvn.{json,ark} (global_cmvn_speech_embedding.* for
#     that front end)
#   3 training through torchrun into $exp (resumes when rerun)
#   4 average the best $average_num checkpoints by dev loss -> $exp/avg_$average_num.pt
#   5 export TorchScript/ONNX/safetensors -> $exp/export/ (parity-checked)
#   6 the threshold the models ship with: $target_fa_per_hour FA/h of the dev set's
#     general negatives ($exp/score_dev/); then the test set with the ONNX model ->
#     $exp/score/ (DET table, plot, summary): its own threshold at $target_fa_per_hour FA/h
#     of general negatives, at it the keyword's neighbours that fire and the accent variants
#     accepted (product.md), and the same at the shipped threshold; with fusion, its
#     weights and threshold chosen on the dev set first ($exp/fusion/fusion.md,
#     $exp/score_fused_dev/); each outside test set -> $exp/score_outside_<engine>/
#   7 personal wake word: on each outside test set, the detector's threshold set at
#     $target_fa_per_hour FA/h of its general negatives, every voice in turn enrolled from
#     $enrol_clips of its keyword clips, the detector gated by its voice (the speaker
#     encoder $speaker_model) -> $exp/score_personal_<engine>/ (FRR, impostors accepted,
#     FA/h, with and without the gate)
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
stop_stage=7

keyword="hey snips"
seed=777           # the corpus: its voices, texts and noise (one seed, one corpus)
corpus_config=""   # the corpus's sizes and mix (synth_kws_data options); default:
                   # conf/phone_corpus.yaml (phone_frontend), conf/corpus.yaml (the others)
corpus_opts=""     # generator options over $corpus_config, e.g. "--other-share 0.4 --blends 200"
# TTS engines that speak (comma list; the corpus config gives the share of those besides
# espeak-ng); stage 0 installs those that need it (tools/install_voices.sh). Default:
# espeak,kokoro (phone_frontend: Kokoro speaks a share of every kind), espeak (the others).
engines=""
# Outside test sets (comma list of engines): voices no training list or blend holds
# (Kokoro's seven reserved voices, festival's), written by stage 0 to $data/outside_<engine>
# (sizes: conf/outside_corpus.yaml) and scored by stage 6 beside the recipe's own test.
# festival needs apt (root).
outside_engines=""
nj=2
# The general negatives (random words, noise alone) are the same for every keyword: with
# neg_cache=true stage 0 takes them, and stage 1 their features, from the negatives cache
# ($TOOLKIT_NEG_CACHE, else kws_negatives in $TOOLKIT_CACHE or ~/.cache/toolkit), made
# there by the first run of these corpus settings and front end; a second keyword then
# synthesizes and featurizes only its own utterances. The same corpus and features either
# way.
neg_cache=true

# Front end: phone_frontend (the default and the best on voices no training heard: the
# toolkit's own pretrained phone front end, frozen, toolkit/pretrained/phone-voicebank-v5),
# fbank (kaldi-native-fbank: a model of its own from the mel bins) or speech_embedding
# (openWakeWord 0.5.1's frozen ONNX front end, installed on demand; its models are CC
# BY-NC-SA 4.0, non-commercial: README.md, "Front ends"). It picks the default config,
# corpus, engines and exp dir and where features go.
frontend=phone_frontend
config=""              # default: conf/phone_ds_tcn.yaml, conf/ds_tcn.yaml (fbank), conf/oww_ds_tcn.yaml (speech_embedding)
data=data
exp=""                 # default: exp/phone_ds_tcn, exp/ds_tcn (fbank), exp/oww_ds_tcn (speech_embedding)
precompute_feats=true  # compute features once (no waveform augmentation then)
train_speed_copies=""  # with precompute_feats, e.g. 0.9,1.1: speed-perturbed training copies
train_overrides=""     # extra config overrides, e.g. "training.max_epoch=2 dataset.batch_size=64"
average_num=5
target_fa_per_hour=1.0
# Stage 6 also scores a head on phone posteriors fused with zero-shot search of the keyword
# ($exp/score_fused; its threshold stored as fused_threshold): auto = whenever the model reads
# phone posteriors.
fuse_zero_shot=auto
ctc_unit=phone  # CTC targets (conf/*_ctc.yaml): espeak-ng phones
# Stage 7: the personal wake word (needs outside_engines): the encoder that gates, and how
# many keyword clips each test voice enrols with.
speaker_model=pretrained:ecapa-voicebank-v2
enrol_clips=3

help_message="Usage: $0 [--keyword \"hey snips\"] [--stage N] [--stop-stage M] [--gpus 0,1] ..."
. utils/parse_options.sh

dict=$data/dict/keywords.txt
# The front end names the features' dir and CMVN file, so that both share one corpus.
case "$frontend" in
  fbank)
    config=${config:-conf/ds_tcn.yaml}; exp=${exp:-exp/ds_tcn}
    feat_dir=fbank; cmvn=global_cmvn ;;
  phone_frontend)
    config=${config:-conf/phone_ds_tcn.yaml}; exp=${exp:-exp/phone_ds_tcn}
    engines=${engines:-espeak,kokoro}; corpus_config=${corpus_config:-conf/phone_corpus.yaml}
    feat_dir=phone_frontend; cmvn=global_cmvn_phone_frontend ;;
  speech_embedding)
    config=${config:-conf/oww_ds_tcn.yaml}; exp=${exp:-exp/oww_ds_tcn}
    feat_dir=speech_embedding; cmvn=global_cmvn_speech_embedding
    bash "$TOOLKIT_ROOT/tools/install_oww.sh" ;;
  *) echo "$0: --frontend must be fbank, phone_frontend or speech_embedding, got '$frontend'" >&2
     exit 1 ;;
esac
engines=${engines:-espeak}; corpus_config=${corpus_config:-conf/corpus.yaml}
# The config's feature type, and whether it reads phone posteriors (what fusion needs).
feature=$(python -c 'import sys, toolkit.tasks
from toolkit.config import load_config
f = load_config(sys.argv[1]).dataset.feature
print(f.type, str(f.type == "phone_frontend" and f.frontend_output == "posteriors").lower())' "$config")
read -r config_type reads_posteriors <<< "$feature"
if [ "$config_type" != "$frontend" ]; then
  echo "$0: $config computes dataset.feature.type $config_type, not --frontend $frontend" >&2
  exit 1
fi
[ "$fuse_zero_shot" = auto ] && fuse_zero_shot=$reads_posteriors
# What training reads: precomputed features, or the audio (waveform augmentation).
list=data.list
[ "$precompute_feats" = true ] && list=$feat_dir/data.list
neg_cache_opt=()
case "$neg_cache" in
  true) neg_cache_opt=(--neg-cache) ;;
  false) ;;
  *) echo "$0: --neg-cache must be true or false, got '$neg_cache'" >&2; exit 1 ;;
esac
outside_sets=""
for e in ${outside_engines//,/ }; do outside_sets="$outside_sets $data/outside_$e/test"; done

if [ "$stage" -le 0 ] && [ "$stop_stage" -ge 0 ]; then
  echo "stage 0: synthesizing data for \"$keyword\" into $data"
  needs_install=$(echo "$engines,$outside_engines" | tr ',' '\n' \
    | grep -xE 'kokoro|rhvoice|pico|mbrola|festival|flite' | sort -u | tr '\n' ' ' || true)
  # shellcheck disable=SC2086
  [ -z "$needs_install" ] || bash "$TOOLKIT_ROOT/tools/install_voices.sh" $needs_install
  # $corpus_opts is split into separate options on purpose.
  # shellcheck disable=SC2086
  python -m toolkit.bin.synth_kws_data --config "$corpus_config" $corpus_opts --keyword "$keyword" \
    --out-dir "$data" --seed "$seed" --engines "$engines" --nj "$nj" "${neg_cache_opt[@]}"
  for e in ${outside_engines//,/ }; do
    python -m toolkit.bin.synth_kws_data --config conf/outside_corpus.yaml --test-only \
      --keyword "$keyword" --out-dir "$data/outside_$e" --seed "$seed" --engines "$e" --nj "$nj" \
      "${neg_cache_opt[@]}"
  done
fi

if [ "$stage" -le 1 ] && [ "$stop_stage" -ge 1 ]; then
  echo "stage 1: data lists (keyword labels), lexicon and $feat_dir features"
  [ -f "$dict" ] || { echo "$0: inventory $dict not found: run stage 0 first" >&2; exit 1; }
  ctc_args=()
  if [ -n "$ctc_unit" ]; then
    python -m toolkit.bin.make_lexicon --unit "$ctc_unit" "$data/train" "$data/dev" "$data/test" \
      --lexicon "$data/dict/lexicon.txt" --units "$data/dict/units.txt"
    ctc_args=(--lexicon "$data/dict/lexicon.txt" --units "$data/dict/units.txt")
  fi
  # One process per binary for every set: its start-up (torch import) costs more than a
  # small set's work.
  list_pairs=() feat_pairs=()
  for x in "$data/train" "$data/dev" "$data/test" $outside_sets; do
    list_pairs+=("$x" "$x/data.list")
    feat_pairs+=("$x/data.list" "$x/$feat_dir")
  done
  python -m toolkit.bin.make_datalist "${list_pairs[@]}" --inventory "$dict" \
    --label-mode keyword --nj "$nj" "${ctc_args[@]}"
  if [ "$precompute_feats" = true ]; then
    if [ -n "$train_speed_copies" ]; then   # speed copies are for the training set only
      python -m toolkit.bin.compute_feats "$data/train/data.list" "$data/train/$feat_dir" \
        --config "$config" --nj "$nj" --speed-copies "$train_speed_copies"
      feat_pairs=("${feat_pairs[@]:2}")
    fi
    python -m toolkit.bin.compute_feats "${feat_pairs[@]}" --config "$config" --nj "$nj" \
      "${neg_cache_opt[@]}"
  fi
fi

if [ "$stage" -le 2 ] && [ "$stop_stage" -ge 2 ]; then
  echo "stage 2: global CMVN"
  python -m toolkit.bin.compute_cmvn "$data/train/$list" "$data/train/$cmvn.json" \
    --kaldi-out "$data/train/$cmvn.ark" --config "$config" --nj "$nj"
fi

if [ "$stage" -le 3 ] && [ "$stop_stage" -ge 3 ]; then
  echo "stage 3: training in $exp"
  # $train_overrides is split into separate key=value words on purpose.
  # shellcheck disable=SC2086
  utils/torchrun.sh ${master_port:+--master-port $master_port} \
    "$gpus" "$num_procs" "$num_nodes" "$node_rank" "$rdzv_endpoint" \
    -m toolkit.bin.train --config "$config" --exp-dir "$exp" \
    --train-data "$data/train/$list" --dev-data "$data/dev/$list" \
    --inventory "$dict" --cmvn "$data/train/$cmvn.json" \
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
  # set reports its own operating points and, at that threshold, what a user gets.
  utils/kws_score.sh --nj "$nj" --target-fa-per-hour "$target_fa_per_hour" \
    --bootstrap-unit "$bootstrap_unit" \
    "$exp/export/model.onnx" "$data/dev/$list" "$dict" "$exp/score_dev"
  python -m toolkit.bin.set_threshold --export-dir "$exp/export" --score-dir "$exp/score_dev"
  utils/kws_score.sh --nj "$nj" --target-fa-per-hour "$target_fa_per_hour" \
    --bootstrap-unit "$bootstrap_unit" \
    --deployed threshold "$exp/export/model.onnx" "$data/test/$list" "$dict" "$exp/score"
  echo "summary ($exp/score/summary.txt):"
  cat "$exp/score/summary.txt"
  if [ "$fuse_zero_shot" = true ]; then
    # The weights of head, search and verifier: chosen on the dev set, stored in the export.
    python -m toolkit.bin.compute_posteriors --model "$exp/export/model.onnx" \
      --data-list "$data/dev/$list" --output "$exp/fusion/dev_parts.ark" \
      --fuse-zero-shot --fusion-components --nj "$nj"
    # The dev set's fused scores come from those components: no second search of dev.
    python -m toolkit.bin.choose_fusion --components "$exp/fusion/dev_parts.ark" \
      --data-list "$data/dev/$list" --export-dir "$exp/export" --out-dir "$exp/fusion" \
      --target-fa-per-hour "$target_fa_per_hour" --fused-output "$exp/fusion/dev_fused.ark"
    utils/kws_score.sh --nj "$nj" --target-fa-per-hour "$target_fa_per_hour" \
      --bootstrap-unit "$bootstrap_unit" \
      --fuse-zero-shot true --posteriors "$exp/fusion/dev_fused.ark" \
      "$exp/export/model.onnx" "$data/dev/$list" "$dict" "$exp/score_fused_dev"
    python -m toolkit.bin.set_threshold --fused --export-dir "$exp/export" \
      --score-dir "$exp/score_fused_dev"
    utils/kws_score.sh --nj "$nj" --target-fa-per-hour "$target_fa_per_hour" \
      --bootstrap-unit "$bootstrap_unit" \
      --fuse-zero-shot true --deployed fused_threshold \
      "$exp/export/model.onnx" "$data/test/$list" "$dict" "$exp/score_fused"
    echo "fused with zero-shot search ($exp/score_fused/summary.txt):"
    cat "$exp/score_fused/summary.txt"
  fi
  for e in ${outside_engines//,/ }; do
    utils/kws_score.sh --nj "$nj" --target-fa-per-hour "$target_fa_per_hour" \
      --bootstrap-unit "$bootstrap_unit" \
      --deployed threshold \
      "$exp/export/model.onnx" "$data/outside_$e/test/$list" "$dict" "$exp/score_outside_$e"
    echo "outside test $data/outside_$e/test ($exp/score_outside_$e/summary.txt):"
    cat "$exp/score_outside_$e/summary.txt"
    if [ "$fuse_zero_shot" = true ]; then
      utils/kws_score.sh --nj "$nj" --target-fa-per-hour "$target_fa_per_hour" \
        --bootstrap-unit "$bootstrap_unit" \
        --fuse-zero-shot true --deployed fused_threshold \
        "$exp/export/model.onnx" "$data/outside_$e/test/$list" "$dict" "$exp/score_fused_outside_$e"
      echo "fused, outside test $data/outside_$e/test ($exp/score_fused_outside_$e/summary.txt):"
      cat "$exp/score_fused_outside_$e/summary.txt"
    fi
  done
  echo "false alarms, per-speaker misses and missed utterances at that threshold:" \
    "$exp/score/errors_*.txt"
fi

if [ "$stage" -le 7 ] && [ "$stop_stage" -ge 7 ]; then
  echo "stage 7: personal wake word (each outside voice enrolled in turn, $speaker_model)"
  [ -n "$outside_engines" ] || echo "stage 7: no outside_engines: nothing to measure"
  fuse_opts=()
  [ "$fuse_zero_shot" = true ] && fuse_opts=(--fuse-zero-shot)
  for e in ${outside_engines//,/ }; do
    python -m toolkit.bin.score_personal_kws --model "$exp/export/model.onnx" "${fuse_opts[@]}" \
      --test-dir "$data/outside_$e/test" --speaker-model "$speaker_model" \
      --enrol-clips "$enrol_clips" --seed "$seed" --name "$e" --fa-per-hour "$target_fa_per_hour" \
      --negative-reference "$data/dev/data.list" --out-dir "$exp/score_personal_$e"
    cat "$exp/score_personal_$e/results.md"
  done
fi
