#!/usr/bin/env bash
# Stages 1-7 shared by every speaker-verification recipe once its own stages have written
# Kaldi data dirs $data/{$train_set,$dev_set,$test_set} (wav.scp, utt2spk) and the trial
# lists $trials. Sourced by a recipe's run.sh after `. utils/parse_options.sh`:
#
#   train_set=train dev_set=dev test_set=test trials="$data/test/trials"
#   . utils/sv_stages.sh
#
# It reads the recipe's variables (the same names in every recipe):
#   stage stop_stage data exp config nj average_num train_overrides
#   gpus num_procs num_nodes node_rank rdzv_endpoint master_port
# and optionally
#   train_set dev_set test_set   data dir names under $data (train, dev, test). Dev
#                      speakers may be unseen: training validates by their EER.
#   test_sets          every data dir under $data whose utterances trials name, spaces
#                      between them (default $test_set; the first is the export's check
#                      set), e.g. "test outside/test"
#   trials             trial lists (VoxCeleb `1 a b` or Kaldi `a b target` form), spaces
#                      between them; default $data/$test_set/trials. `SET:FILE` scores FILE
#                      on the embeddings of test set SET, a plain FILE on the first set
#   precompute_feats   false (default): train from audio (waveform augmentation works);
#                      true: fbank once into $data/{$train_set,$dev_set}/fbank/
#   train_speed_copies e.g. 0.9,1.1 (needs precompute_feats): copies of every training
#                      utterance at these speeds, each copy a new speaker sp0.9-<spk>
#   use_shards         true: train from tar shards of $train_set ($utts_per_shard each)
#   noise_list rir_list data lists for dataset.noise / dataset.reverb (MUSAN, RIRS_NOISES);
#                      the config holds their probabilities and SNRs
#   lm_config          large-margin fine-tuning overlay (e.g. conf/lm.yaml): a second
#                      training from the averaged model into $lm_exp; empty: none
#   lm_exp lm_average_num lm_train_overrides   its exp dir (${exp}_lm), averaging, overrides
#   cohort_utts_per_spk  AS-Norm cohort = training speakers' mean embeddings over at most
#                      this many utterances each (0, default: all)
#   as_norm_top        cohort scores kept per side (300)
#   pretrained         a shipped pretrained encoder (toolkit/pretrained/NAME) scored beside
#                      the recipe's own as the system $pretrained_exp (exp/NAME): exported
#                      from the shipped weights in stage 5, then embedded and scored alike
#   resemblyzer        true: Resemblyzer (tools/install_resemblyzer.sh) on the same trial
#                      lists after stage 7, its table beside every system's
#   embed_nj           parallel extraction jobs ($nj)
#   num_check          utterances the export's parity check runs (20)
#
# Stages (each rerunnable):
#   1 speaker inventory $data/dict/speakers.txt, data lists $data/*/data.list (labels from
#     utt2spk; dev/test lists are labelled against their own speakers), optional fbank
#     features + speed copies (inventory rewritten with the copies as speakers), shards
#   2 training through torchrun into $exp (resumes when rerun)
#   3 average the last $average_num checkpoints -> $exp/avg_${average_num}.pt
#   4 large-margin fine-tuning from it into $lm_exp (when lm_config), averaged likewise
#   5 export each system (ONNX, TorchScript, safetensors; parity-checked) -> <exp>/export/
#   6 embeddings of each test set and of the cohort -> <exp>/embeddings/{<set>,cohort}/
#   7 cosine scoring of each trial list with and without AS-Norm -> <exp>/score/<name>/
#     (<name>: the list's file name, prefixed by its set's name with `/` as `_` and a
#     trailing /test dropped when the set is not the first, e.g. outside_trials_kokoro),
#     summary lines printed and collected in <exp>/score/summary.txt

_sv_stages_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

for _v in stage stop_stage data exp config nj average_num train_overrides \
          gpus num_procs num_nodes node_rank rdzv_endpoint master_port; do
  if [ -z "${!_v+x}" ]; then
    echo "$0: utils/sv_stages.sh needs the recipe variable '$_v' (set it before sourcing)" >&2
    exit 1
  fi
done
train_set=${train_set:-train}
dev_set=${dev_set:-dev}
test_set=${test_set:-test}
test_sets=${test_sets:-$test_set}
test_set=${test_sets%% *}
trials=${trials:-$data/$test_set/trials}
precompute_feats=${precompute_feats:-false}
train_speed_copies=${train_speed_copies:-}
use_shards=${use_shards:-false}
utts_per_shard=${utts_per_shard:-1000}
noise_list=${noise_list:-}
rir_list=${rir_list:-}
lm_config=${lm_config:-}
lm_exp=${lm_exp:-${exp}_lm}
lm_average_num=${lm_average_num:-$average_num}
lm_train_overrides=${lm_train_overrides:-}
cohort_utts_per_spk=${cohort_utts_per_spk:-0}
as_norm_top=${as_norm_top:-300}
embed_nj=${embed_nj:-$nj}
pretrained=${pretrained:-}
pretrained_exp=${pretrained_exp:-$(dirname "$exp")/$pretrained}
resemblyzer=${resemblyzer:-false}
num_check=${num_check:-20}
dict=$data/dict/speakers.txt

if [ -n "$train_speed_copies" ] && [ "$precompute_feats" != true ]; then
  echo "$0: train_speed_copies needs precompute_feats=true (the copies are computed once)" >&2
  exit 1
fi
if [ "$use_shards" = true ] && [ "$precompute_feats" = true ]; then
  echo "$0: use_shards and precompute_feats exclude each other (shards hold audio)" >&2
  exit 1
fi

train_list=$data/$train_set/data.list
dev_list=$data/$dev_set/data.list
if [ "$precompute_feats" = true ]; then
  train_list=$data/$train_set/fbank/data.list
  dev_list=$data/$dev_set/fbank/data.list
fi
[ "$use_shards" = true ] && train_list=$data/$train_set/shards/shards.list
_aug_overrides=()
[ -n "$noise_list" ] && _aug_overrides+=("dataset.noise.noise_list=$noise_list")
[ -n "$rir_list" ] && _aug_overrides+=("dataset.reverb.rir_list=$rir_list")

# The systems later stages export, embed and score, with their averaged models.
_systems=("$exp")
_models=("$exp/avg_${average_num}.pt")
if [ -n "$lm_config" ]; then
  _systems+=("$lm_exp")
  _models+=("$lm_exp/avg_${lm_average_num}.pt")
fi
if [ -n "$pretrained" ]; then
  _systems+=("$pretrained_exp")
  _models+=("pretrained:$pretrained")
fi

_sv_train() {   # _sv_train EXP_DIR CONFIG [overrides...]
  local exp_dir=$1 conf=$2
  shift 2
  "$_sv_stages_dir/torchrun.sh" ${master_port:+--master-port $master_port} \
    "$gpus" "$num_procs" "$num_nodes" "$node_rank" "$rdzv_endpoint" \
    -m toolkit.bin.train --config "$conf" --exp-dir "$exp_dir" \
    --train-data "$train_list" --dev-data "$dev_list" --inventory "$dict" \
    "${_aug_overrides[@]}" "$@"
}

_sv_average() {   # _sv_average EXP_DIR NUM OUTPUT
  python -m toolkit.bin.average_model --exp-dir "$1" --output "$3" --num "$2" --mode last
}

if [ "$stage" -le 1 ] && [ "$stop_stage" -ge 1 ]; then
  echo "stage 1: speaker inventory and data lists"
  python -m toolkit.bin.make_inventory "$dict" --utt2spk "$data/$train_set/utt2spk"
  # $test_sets is split into separate set names on purpose.
  # shellcheck disable=SC2086
  for x in $(printf '%s\n' "$train_set" "$dev_set" $test_sets | awk '!seen[$0]++'); do
    inventory=$dict
    if [ "$x" != "$train_set" ]; then
      # Speakers outside training: labelled against their own list, which nothing trains on.
      inventory=$data/$x/speakers.txt
      python -m toolkit.bin.make_inventory "$inventory" --utt2spk "$data/$x/utt2spk"
    fi
    python -m toolkit.bin.make_datalist "$data/$x" "$data/$x/data.list" --inventory "$inventory" \
      --label-mode speaker --nj "$nj"
  done
  if [ "$precompute_feats" = true ]; then
    for x in "$train_set" "$dev_set"; do
      _speed_args=()
      [ "$x" = "$train_set" ] && [ -n "$train_speed_copies" ] && \
        _speed_args=(--speed-copies "$train_speed_copies")
      python -m toolkit.bin.compute_feats "$data/$x/data.list" "$data/$x/fbank" --config "$config" \
        --nj "$nj" "${_speed_args[@]}"
    done
    if [ -n "$train_speed_copies" ]; then
      python -m toolkit.bin.make_inventory "$dict" --data-list "$train_list" --relabel
    fi
  fi
  if [ "$use_shards" = true ]; then
    python -m toolkit.bin.make_shards "$data/$train_set/data.list" "$data/$train_set/shards" \
      --utts-per-shard "$utts_per_shard" --nj "$nj" --prefix "$train_set"
  fi
fi

if [ "$stage" -le 2 ] && [ "$stop_stage" -ge 2 ]; then
  echo "stage 2: training in $exp"
  # $train_overrides is split into separate key=value words on purpose.
  # shellcheck disable=SC2086
  _sv_train "$exp" "$config" $train_overrides
fi

if [ "$stage" -le 3 ] && [ "$stop_stage" -ge 3 ]; then
  echo "stage 3: averaging the last $average_num checkpoints"
  _sv_average "$exp" "$average_num" "$exp/avg_${average_num}.pt"
fi

if [ "$stage" -le 4 ] && [ "$stop_stage" -ge 4 ] && [ -n "$lm_config" ]; then
  echo "stage 4: large-margin fine-tuning in $lm_exp from $exp/avg_${average_num}.pt"
  mkdir -p "$lm_exp"
  # The base run's resolved config (its overrides included) with the overlay on top: the
  # architecture matches the averaged weights whatever the base config was.
  _lm_source=$lm_exp/lm_source.yaml
  printf '%s\n' "# utils/sv_stages.sh stage 4: the base training's config, then the overlay" \
    "defaults: [\"$(cd "$exp" && pwd)/config.yaml\", \"$(cd "$(dirname "$lm_config")" && pwd)/$(basename "$lm_config")\"]" \
    > "$_lm_source"
  # shellcheck disable=SC2086
  _sv_train "$lm_exp" "$_lm_source" "training.init_checkpoint=$exp/avg_${average_num}.pt" \
    $lm_train_overrides
  _sv_average "$lm_exp" "$lm_average_num" "$lm_exp/avg_${lm_average_num}.pt"
fi

if [ "$stage" -le 5 ] && [ "$stop_stage" -ge 5 ]; then
  for i in "${!_systems[@]}"; do
    echo "stage 5: export of ${_models[$i]}"
    case ${_models[$i]} in
      pretrained:*)
        python -m toolkit.bin.export_model --pretrained "${_models[$i]#pretrained:}" \
          --out-dir "${_systems[$i]}/export" --test-data "$data/$test_set/data.list" \
          --num-check "$num_check" ;;
      *)
        python -m toolkit.bin.export_model --checkpoint "${_models[$i]}" \
          --exp-dir "${_systems[$i]}" --out-dir "${_systems[$i]}/export" \
          --test-data "$data/$test_set/data.list" --num-check "$num_check" ;;
    esac
  done
fi

if [ "$stage" -le 6 ] && [ "$stop_stage" -ge 6 ]; then
  _cohort_list=$data/$train_set/data.list
  if [ "$cohort_utts_per_spk" -gt 0 ]; then
    _cohort_list=$data/$train_set/cohort_${cohort_utts_per_spk}.list
    # The first N entries of each speaker (data lists are sorted by utterance).
    awk -v n="$cohort_utts_per_spk" 'match($0, /"spk": "[^"]*"/) {
        s = substr($0, RSTART, RLENGTH); if (++count[s] <= n) print }' \
      "$data/$train_set/data.list" > "$_cohort_list.tmp"
    # Replaced only when it changed: a newer list means the cohort is extracted again.
    if cmp -s "$_cohort_list.tmp" "$_cohort_list"; then rm "$_cohort_list.tmp"
    else mv "$_cohort_list.tmp" "$_cohort_list"; fi
  fi
  _parts=()
  for x in $test_sets; do _parts+=("$x:$data/$x/data.list"); done
  _parts+=("cohort:$_cohort_list")
  for sys in "${_systems[@]}"; do
    echo "stage 6: embeddings of $test_sets and of the cohort with $sys/export/model.onnx"
    for part in "${_parts[@]}"; do
      out=$sys/embeddings/${part%%:*}
      # The extraction resumes from finished parts: those of an earlier export or list go.
      _stamp=$out/.source
      if [ -d "$out" ] && { [ ! -f "$_stamp" ] || [ "$sys/export/model.onnx" -nt "$_stamp" ] \
          || [ "${part#*:}" -nt "$_stamp" ] || [ "$(cat "$_stamp")" != "${part#*:}" ]; }; then
        rm -rf "$out"
      fi
      mkdir -p "$out"
      echo "${part#*:}" > "$_stamp"
      python -m toolkit.bin.extract_embeddings --model "$sys/export/model.onnx" \
        --data-list "${part#*:}" --out-dir "$out" --nj "$embed_nj"
    done
  done
fi

if [ "$stage" -le 7 ] && [ "$stop_stage" -ge 7 ]; then
  for sys in "${_systems[@]}"; do
    echo "stage 7: scoring with $sys"
    mkdir -p "$sys/score"
    : > "$sys/score/summary.txt"
    for t in $trials; do
      _tset=$test_set
      case $t in *:*) _tset=${t%%:*}; t=${t#*:} ;; esac
      case " $test_sets " in *" $_tset "*) ;;
        *) echo "$0: trials $t name the test set '$_tset', not one of test_sets ($test_sets)" >&2
           exit 1 ;;
      esac
      name=$(basename "$t")
      name=${name%.txt}
      if [ "$_tset" != "$test_set" ]; then
        _prefix=${_tset%/test}
        name=${_prefix//\//_}_$name
      fi
      python -m toolkit.bin.score_speaker --trials "$t" \
        --embeddings "$sys/embeddings/$_tset/embeddings.scp" \
        --cohort "$sys/embeddings/cohort/speaker_embeddings.scp" --as-norm-top "$as_norm_top" \
        --out-dir "$sys/score/$name" --name "$(basename "$sys") $name" > /dev/null
      cat "$sys/score/$name/summary.txt" >> "$sys/score/summary.txt"
    done
  done
  for sys in "${_systems[@]}"; do
    echo "summary ($sys/score/summary.txt):"
    cat "$sys/score/summary.txt"
  done
  if [ "$resemblyzer" = true ]; then
    echo "stage 7: Resemblyzer on the same trial lists -> $(dirname "$exp")/resemblyzer"
    bash "$_sv_stages_dir/../tools/install_resemblyzer.sh"
    _exp_args=()
    for sys in "${_systems[@]}"; do _exp_args+=(--exp "$sys"); done
    python "$_sv_stages_dir/../tools/benchmarks/resemblyzer_compare.py" --data "$data" \
      --test-sets "$test_sets" "${_exp_args[@]}" --out-dir "$(dirname "$exp")/resemblyzer" \
      --nj "$embed_nj"
  fi
fi
