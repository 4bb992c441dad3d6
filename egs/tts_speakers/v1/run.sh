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
#   bash run.sh --config conf/resnet.yaml --stage 3   # small ResNet on the same data (exp/resnet)
#   bash run.sh --stage 3 --stop-stage 3              # only training (resumes if killed)
#   bash run.sh --lm-config conf/lm.yaml              # + large-margin fine-tuning (exp/<name>_lm)
#   bash run.sh --corpus-opts "--num-train-speakers 100"  # fewer speakers (conf/corpus.yaml)
#   bash run.sh --gpus 0                              # on a GPU
#
# Stages (each rerunnable; outputs under $data and $exp; README.md: what each writes):
#   0 install the named engines (tools/install_voices.sh), synthesize $data/{train,dev,test}
#     Kaldi dirs (+ $data/test/trials*) and the outside test set $data/outside/test
#     (synth_speaker_data --test-only; trials, trials_<engine>), each validated
#   1 speaker inventory, data lists, fbank features (precompute_feats)
#   2 (unused: no global CMVN, the speaker models normalise each utterance)
#   3 training through torchrun into $exp
#   4 average the last $average_num checkpoints; with --lm-config, large-margin fine-tuning
#     from that average into ${exp}_lm, averaged likewise
#   5 export of each model (ONNX, TorchScript, safetensors; parity-checked)
#   6 scoring: embeddings of both test sets and of the cohort (training speaker means),
#     every trial list scored with and without AS-Norm -> <exp>/score/summary.txt
#   7 the peers on the same lists: the shipped pretrained encoder (exp/$pretrained,
#     exported, embedded and scored alike) and Resemblyzer (exp/resemblyzer/results.md:
#     every system side by side)
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

# Stage 0's corpus: the seed and the sizes of espeak-ng's speakers are in $corpus_config,
# read by the corpus and the outside test set alike; options here are what a run turns.
corpus_config=conf/corpus.yaml
corpus_opts=""     # generator options over $corpus_config, e.g. "--num-train-speakers 100"
# TTS engines that speak (comma list), their voices on top of espeak-ng's speakers:
# Kokoro's unreserved voices train, with $blends blends of them as speakers (5 % of the
# blends held out for dev, 5 % for test). "espeak,kokoro,flite,rhvoice" adds those
# engines' voices (tools/install_voices.sh installs them; apt needs root).
engines=espeak,kokoro
blends=0           # the shipped encoder has heard 800; fine-tuning needs none
# A Kokoro clip costs about a CPU-second where espeak-ng takes a millisecond: its
# speakers get fewer training utterances, of fewer words (ENGINE=VALUE comma lists; only
# the items of the engines $engines names are passed on).
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
cohort_utts_per_spk=4  # cohort = training speakers' means over 4 utterances each (0: all)

help_message="Usage: $0 [--config conf/resnet.yaml] [--stage N] [--stop-stage M] [--gpus 0] ..."
. utils/parse_options.sh

exp=${exp:-exp/$(basename "$config" .yaml)}
lm_exp=${exp}_lm
pretrained_exp=$(dirname "$exp")/$pretrained
dict=$data/dict/speakers.txt
# What training reads: the fbank lists of stage 1, or the audio lists.
train_list=$data/train/data.list
dev_list=$data/dev/data.list
if [ "$precompute_feats" = true ]; then
  train_list=$data/train/fbank/data.list
  dev_list=$data/dev/fbank/data.list
elif [ -n "$train_speed_copies" ]; then
  echo "$0: train_speed_copies needs precompute_feats=true (the copies are computed once)" >&2
  exit 1
fi
# The AS-Norm cohort: each training speaker's first $cohort_utts_per_spk utterances.
cohort_list=$data/train/data.list
[ "$cohort_utts_per_spk" -gt 0 ] && cohort_list=$data/train/cohort_${cohort_utts_per_spk}.list
# The models stages 5 and 6 export and score.
systems=("$exp")
[ -n "$lm_config" ] && systems+=("$lm_exp")

if [ "$stage" -le 0 ] && [ "$stop_stage" -ge 0 ]; then
  outside_all=$(printf '%s\n' ${engines//,/ } ${outside_engines//,/ } | awk '!seen[$0]++' |
                paste -sd,)
  install=$(printf '%s\n' ${outside_all//,/ } | grep -vx espeak | paste -sd' ' || true)
  if [ -n "$install" ]; then
    echo "stage 0: installing the TTS engines $install (tools/install_voices.sh)"
    # shellcheck disable=SC2086
    bash "$TOOLKIT_ROOT/tools/install_voices.sh" $install
  fi
  named() {   # ENGINE=VALUE,... -> the items of the engines $engines names
    local item out=()
    for item in ${1//,/ }; do
      case ",$engines," in *",${item%%=*},"*) out+=("$item") ;; esac
    done
    (IFS=,; echo "${out[*]}")
  }
  echo "stage 0: synthesizing TTS speakers into $data"
  # $corpus_opts is split into separate options on purpose.
  # shellcheck disable=SC2086
  python -m toolkit.bin.synth_speaker_data --config "$corpus_config" $corpus_opts \
    --out-dir "$data" --engines "$engines" --blends "$blends" \
    --engine-train-utts "$(named "$engine_train_utts")" \
    --engine-words "$(named "$engine_words")" --nj "$nj"
  # Blends and training sizes change nothing there: Kokoro speaks through its reserved
  # voices alone, every other engine through its held-out voices.
  echo "stage 0: synthesizing the outside test set into $data/outside ($outside_all)"
  # shellcheck disable=SC2086
  python -m toolkit.bin.synth_speaker_data --config "$corpus_config" $corpus_opts \
    --out-dir "$data/outside" --test-only --test-utts "$outside_utts" \
    --engines "$outside_all" --nj "$nj"
  for x in train dev test outside/test; do
    utils/validate_data_dir.sh --no-audio "$data/$x"
  done
fi

if [ "$stage" -le 1 ] && [ "$stop_stage" -ge 1 ]; then
  echo "stage 1: speaker inventory, data lists, fbank of train and dev"
  python -m toolkit.bin.make_inventory "$dict" --utt2spk "$data/train/utt2spk"
  python -m toolkit.bin.make_datalist "$data/train" "$data/train/data.list" \
    --inventory "$dict" --label-mode speaker --nj "$nj"
  for x in dev test outside/test; do
    # Speakers outside training: labelled against their own list, which nothing trains on.
    python -m toolkit.bin.make_inventory "$data/$x/speakers.txt" --utt2spk "$data/$x/utt2spk"
    python -m toolkit.bin.make_datalist "$data/$x" "$data/$x/data.list" \
      --inventory "$data/$x/speakers.txt" --label-mode speaker --nj "$nj"
  done
  if [ "$precompute_feats" = true ]; then
    speed_args=()
    [ -n "$train_speed_copies" ] && speed_args=(--speed-copies "$train_speed_copies")
    python -m toolkit.bin.compute_feats "$data/train/data.list" "$data/train/fbank" \
      --config "$config" --nj "$nj" "${speed_args[@]}"
    python -m toolkit.bin.compute_feats "$data/dev/data.list" "$data/dev/fbank" \
      --config "$config" --nj "$nj"
    if [ -n "$train_speed_copies" ]; then
      # Each speed copy is a new speaker: the inventory is rewritten with them.
      python -m toolkit.bin.make_inventory "$dict" --data-list "$train_list" --relabel
    fi
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
    --train-data "$train_list" --dev-data "$dev_list" --inventory "$dict" $train_overrides
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
      "training.init_checkpoint=$exp/avg_${average_num}.pt" $lm_train_overrides
    python -m toolkit.bin.average_model --exp-dir "$lm_exp" \
      --output "$lm_exp/avg_${average_num}.pt" --num "$average_num" --mode last
  fi
fi

if [ "$stage" -le 5 ] && [ "$stop_stage" -ge 5 ]; then
  for sys in "${systems[@]}"; do
    echo "stage 5: export of $sys/avg_${average_num}.pt"
    python -m toolkit.bin.export_model --checkpoint "$sys/avg_${average_num}.pt" \
      --exp-dir "$sys" --out-dir "$sys/export" --test-data "$data/test/data.list" \
      --num-check 20
  done
fi

# The sets stages 6 and 7 embed, and every trial list of both test sets (all pairs, and
# the pairs within each engine) as SET=FILE: utils/speaker_score.sh names those of the outside
# set outside_<file>.
embed_sets=("test=$data/test/data.list" "outside/test=$data/outside/test/data.list"
            "cohort=$cohort_list")
trials=()
for x in test outside/test; do
  for t in "$data/$x"/trials "$data/$x"/trials_*; do
    [ -f "$t" ] && trials+=("$x=$t")
  done
done

if [ "$stage" -le 6 ] && [ "$stop_stage" -ge 6 ]; then
  if [ "$cohort_utts_per_spk" -gt 0 ]; then
    utils/speaker_cohort_list.sh "$cohort_utts_per_spk" "$data/train/data.list" "$cohort_list"
  fi
  for sys in "${systems[@]}"; do
    echo "stage 6: embeddings of test, outside/test and the cohort with $sys/export/model.onnx"
    utils/speaker_embed.sh --nj "$nj" "$sys/export/model.onnx" "$sys/embeddings" "${embed_sets[@]}"
  done
  for sys in "${systems[@]}"; do
    echo "stage 6: scoring with $sys"
    utils/speaker_score.sh --as-norm-top "$as_norm_top" "$sys" "${trials[@]}"
  done
  for sys in "${systems[@]}"; do
    echo "summary ($sys/score/summary.txt):"
    cat "$sys/score/summary.txt"
  done
fi

if [ "$stage" -le 7 ] && [ "$stop_stage" -ge 7 ]; then
  if [ -n "$pretrained" ]; then
    echo "stage 7: the shipped encoder $pretrained, exported, embedded and scored in $pretrained_exp"
    python -m toolkit.bin.export_model --pretrained "$pretrained" \
      --out-dir "$pretrained_exp/export" --test-data "$data/test/data.list" --num-check 20
    utils/speaker_embed.sh --nj "$nj" "$pretrained_exp/export/model.onnx" \
      "$pretrained_exp/embeddings" "${embed_sets[@]}"
    utils/speaker_score.sh --as-norm-top "$as_norm_top" "$pretrained_exp" "${trials[@]}"
    echo "summary ($pretrained_exp/score/summary.txt):"
    cat "$pretrained_exp/score/summary.txt"
  fi
  if [ "$resemblyzer" = true ]; then
    echo "stage 7: Resemblyzer on the same trial lists -> $(dirname "$exp")/resemblyzer"
    bash "$TOOLKIT_ROOT/tools/install_resemblyzer.sh"
    exp_args=()
    for sys in "${systems[@]}" ${pretrained:+"$pretrained_exp"}; do
      exp_args+=(--exp "$sys")
    done
    python "$TOOLKIT_ROOT/tools/benchmarks/resemblyzer_compare.py" --data "$data" \
      --test-sets "test outside/test" "${exp_args[@]}" \
      --out-dir "$(dirname "$exp")/resemblyzer" --nj "$nj"
  fi
fi
