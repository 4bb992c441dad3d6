#!/usr/bin/env bash
# Stages 1-6 shared by every recipe once its stage 0 has written Kaldi data dirs
# $data/{train,dev,test} (wav.scp, text[, utt2spk, utt2dur]) and the inventory $dict.
# Sourced by a recipe's run.sh after `. utils/parse_options.sh` (and after its stage 0):
#
#   task_type=detection          # or classification
#   dict=$data/dict/keywords.txt
#   . utils/kws_stages.sh
#
# It reads the recipe's variables (the same names in every recipe):
#   stage stop_stage data exp config dict nj average_num train_overrides
#   gpus num_procs num_nodes node_rank rdzv_endpoint master_port
# and optionally
#   task_type          detection (default): transcripts containing line k of $dict are
#                      keyword k, everything else filler; max-pooling style detectors;
#                      stage 6 = DET curves (FRR vs false alarms per hour) + threshold.
#                      classification: the transcript IS the class name (one line of
#                      $dict); stage 6 = accuracy and confusion matrix.
#   precompute_feats   true (default): features once into $data/*/$feat_dir/ and train from it
#   feat_dir           where stage 1 puts them (fbank by default); one per feature type, so
#                      front ends sharing a data dir do not overwrite each other
#   cmvn_name          $data/train/$cmvn_name.{json,ark} (global_cmvn by default), likewise
#   target_fa_per_hour detection only: FA/h at which the deployment threshold is chosen (1.0)
#   score_bootstrap_unit detection only: what the FRR intervals resample, speaker (default:
#                      whole voices, as errors cluster by voice) or utterance
#   train_speed_copies e.g. 0.9,1.1: with precompute_feats, the training features also get
#                      copies of every utterance at these speeds (Kaldi's 3-way speed
#                      perturbation, computed once). Empty: none.
#   outside_sets       detection only: data dirs of outside test sets (voices and engines
#                      training never heard, e.g. $data/outside_kokoro/test): stage 1 makes
#                      their lists and features, stage 6 scores each into $exp/score_<name>
#                      at the FA targets, with the deployment threshold of the own test.
#   ctc_unit           phone or char: stage 1 also writes $data/dict/{lexicon,units}.txt
#                      and CTC targets into the data lists, for configs whose loss has a
#                      ctc component (phone: espeak-ng pronunciations). Empty: none.
#
# Stages (each rerunnable):
#   1 data lists $data/*/data.list (+ features $data/*/$feat_dir/ when precompute_feats)
#   2 global CMVN $data/train/$cmvn_name.{json,ark}
#   3 training through torchrun into $exp (resumes when rerun)
#   4 average the best $average_num checkpoints by dev loss -> $exp/avg_${average_num}.pt
#   5 export TorchScript/ONNX/safetensors -> $exp/export/ (parity-checked)
#   6 score the test set with the ONNX model -> $exp/score/

_kws_stages_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

for _v in stage stop_stage data exp config dict nj average_num train_overrides \
          gpus num_procs num_nodes node_rank rdzv_endpoint master_port; do
  if [ -z "${!_v+x}" ]; then
    echo "$0: utils/kws_stages.sh needs the recipe variable '$_v' (set it before sourcing)" >&2
    exit 1
  fi
done
task_type=${task_type:-detection}
precompute_feats=${precompute_feats:-true}
target_fa_per_hour=${target_fa_per_hour:-1.0}
score_bootstrap_unit=${score_bootstrap_unit:-speaker}
ctc_unit=${ctc_unit:-}
train_speed_copies=${train_speed_copies:-}
outside_sets=${outside_sets:-}
feat_dir=${feat_dir:-fbank}
cmvn_name=${cmvn_name:-global_cmvn}
case "$task_type" in
  detection) _label_mode=keyword ;;
  classification) _label_mode=class ;;
  *) echo "$0: task_type must be detection or classification, got '$task_type'" >&2; exit 1 ;;
esac

list_name=data.list
[ "$precompute_feats" = true ] && list_name=$feat_dir/data.list

if [ "$stage" -le 1 ] && [ "$stop_stage" -ge 1 ]; then
  echo "stage 1: data lists (label mode $_label_mode)"
  [ -f "$dict" ] || { echo "$0: inventory $dict not found: run stage 0 first" >&2; exit 1; }
  _ctc_args=()
  if [ -n "$ctc_unit" ]; then
    python -m toolkit.bin.make_lexicon --unit "$ctc_unit" "$data/train" "$data/dev" "$data/test" \
      --lexicon "$data/dict/lexicon.txt" --units "$data/dict/units.txt"
    _ctc_args=(--lexicon "$data/dict/lexicon.txt" --units "$data/dict/units.txt")
  fi
  # One process per binary for all three sets: start-up (torch import) costs more than
  # a small set's work.
  _list_pairs=()
  for _o in $outside_sets; do _list_pairs+=("$_o" "$_o/data.list"); done
  python -m toolkit.bin.make_datalist "$data/train" "$data/train/data.list" "$data/dev" \
    "$data/dev/data.list" "$data/test" "$data/test/data.list" "${_list_pairs[@]}" \
    --inventory "$dict" --label-mode $_label_mode --nj "$nj" "${_ctc_args[@]}"
  if [ "$precompute_feats" = true ]; then
    # One call for every set, except that speed copies are for the training set only.
    _feat_pairs=("$data/dev/data.list" "$data/dev/$feat_dir" "$data/test/data.list" "$data/test/$feat_dir")
    for _o in $outside_sets; do _feat_pairs+=("$_o/data.list" "$_o/$feat_dir"); done
    if [ -n "$train_speed_copies" ]; then
      python -m toolkit.bin.compute_feats "$data/train/data.list" "$data/train/$feat_dir" \
        --config "$config" --nj "$nj" --speed-copies "$train_speed_copies"
    else
      _feat_pairs=("$data/train/data.list" "$data/train/$feat_dir" "${_feat_pairs[@]}")
    fi
    python -m toolkit.bin.compute_feats "${_feat_pairs[@]}" --config "$config" --nj "$nj"
  fi
fi

if [ "$stage" -le 2 ] && [ "$stop_stage" -ge 2 ]; then
  echo "stage 2: global CMVN"
  python -m toolkit.bin.compute_cmvn "$data/train/$list_name" "$data/train/$cmvn_name.json" \
    --kaldi-out "$data/train/$cmvn_name.ark" --config "$config" --nj "$nj"
fi

if [ "$stage" -le 3 ] && [ "$stop_stage" -ge 3 ]; then
  echo "stage 3: training in $exp"
  # $train_overrides is split into separate key=value words on purpose.
  # shellcheck disable=SC2086
  "$_kws_stages_dir/torchrun.sh" ${master_port:+--master-port $master_port} \
    "$gpus" "$num_procs" "$num_nodes" "$node_rank" "$rdzv_endpoint" \
    -m toolkit.bin.train --config "$config" --exp-dir "$exp" \
    --train-data "$data/train/$list_name" --dev-data "$data/dev/$list_name" \
    --inventory "$dict" --cmvn "$data/train/$cmvn_name.json" \
    ${ctc_unit:+--units "$data/dict/units.txt"} $train_overrides
fi

if [ "$stage" -le 4 ] && [ "$stop_stage" -ge 4 ]; then
  echo "stage 4: averaging the best $average_num checkpoints by dev loss"
  python -m toolkit.bin.average_model --exp-dir "$exp" --output "$exp/avg_${average_num}.pt" \
    --num "$average_num" --mode best
fi

if [ "$stage" -le 5 ] && [ "$stop_stage" -ge 5 ]; then
  echo "stage 5: export"
  python -m toolkit.bin.export_model --checkpoint "$exp/avg_${average_num}.pt" --exp-dir "$exp" \
    --out-dir "$exp/export" --test-data "$data/test/$list_name"
fi

if [ "$stage" -le 6 ] && [ "$stop_stage" -ge 6 ]; then
  if [ "$task_type" = detection ]; then
    echo "stage 6: scoring the test set with the ONNX model"
    _bootstrap_unit=$score_bootstrap_unit
    if [ "$_bootstrap_unit" = speaker ] && [ ! -s "$data/test/utt2spk" ]; then
      echo "stage 6: $data/test has no utt2spk: FRR intervals resample utterances"
      _bootstrap_unit=utterance
    fi
    python -m toolkit.bin.compute_posteriors --model "$exp/export/model.onnx" \
      --data-list "$data/test/$list_name" --output "$exp/score/test_probs.ark"
    # The decision rule counts in the model's frames (10 ms fbank, 80 ms embeddings).
    _shift_ms=$(python -c 'import sys; from toolkit.export import read_metadata
print(read_metadata(sys.argv[1])["feature"]["frame_shift_ms"])' "$exp/export/model.onnx")
    python -m toolkit.bin.score_kws --data-list "$data/test/$list_name" \
      --posteriors "$exp/score/test_probs.ark" --inventory "$dict" --out-dir "$exp/score" \
      --frame-shift-ms "$_shift_ms" \
      --target-fa-per-hour "$target_fa_per_hour" --fa-targets 0.5,1,2,5 \
      --bootstrap-unit "$_bootstrap_unit"
    python -m toolkit.bin.set_threshold --export-dir "$exp/export" --score-dir "$exp/score"
    echo "summary ($exp/score/summary.txt):"
    cat "$exp/score/summary.txt"
    for _o in $outside_sets; do
      # outside_kokoro/test -> score_outside_kokoro
      _name=score_$(basename "$(dirname "$_o")")
      python -m toolkit.bin.compute_posteriors --model "$exp/export/model.onnx" \
        --data-list "$_o/$list_name" --output "$exp/$_name/test_probs.ark"
      python -m toolkit.bin.score_kws --data-list "$_o/$list_name" \
        --posteriors "$exp/$_name/test_probs.ark" --inventory "$dict" --out-dir "$exp/$_name" \
        --frame-shift-ms "$_shift_ms" --target-fa-per-hour "$target_fa_per_hour" \
        --fa-targets 0.5,1,2,5 --bootstrap-unit "$_bootstrap_unit"
      echo "outside test $_o ($exp/$_name/summary.txt):"
      cat "$exp/$_name/summary.txt"
    done
    echo "false alarms, per-speaker misses and missed utterances at that threshold:" \
      "$exp/score/errors_*.txt"
  else
    echo "stage 6: classifying the test set with the ONNX model"
    python -m toolkit.bin.score_commands --model "$exp/export/model.onnx" \
      --data-list "$data/test/$list_name" --inventory "$dict" --out-dir "$exp/score"
    echo "per-class report: $exp/score/accuracy.txt, confusion matrix: $exp/score/confusion.{txt,png}"
  fi
fi
