#!/usr/bin/env bash
# Stages 1-5 shared by every codec recipe once its own stages have written Kaldi data dirs
# (wav.scp, utt2spk, spk2utt) under $data. Sourced by a recipe's run.sh after
# `. utils/parse_options.sh`:
#
#   test_sets="test=test"
#   . utils/codec_stages.sh
#
# It reads the recipe's variables (the same names in every recipe):
#   stage stop_stage data exp config nj average_num train_overrides
#   gpus num_procs num_nodes node_rank rdzv_endpoint master_port
#   eval_n_q baselines eval_max_utts
# and optionally
#   train_set dev_set  data dir names under $data (default train, dev)
#   test_sets          evaluation sets, spaces between them, each NAME=DIR with DIR under
#                      $data; the first is the export's parity-check set; stage 5 writes
#                      $exp/eval/NAME/ for each (default "test=test")
#   eval_metrics       comma list for evaluate_codec --metrics (default: its own)
#
#   1 data lists $data/<dir>/data.list for the training, dev and every test dir
#   2 training through torchrun into $exp
#   3 average of the last $average_num checkpoints -> $exp/avg_${average_num}.pt
#   4 export (encoder/decoder ONNX + TorchScript, safetensors; parity-checked) -> $exp/export
#   5 evaluation of each test set against the baselines -> $exp/eval/NAME/ (table printed)

train_set=${train_set:-train}
dev_set=${dev_set:-dev}
test_sets=${test_sets:-test=test}
eval_metrics=${eval_metrics:-}

_codec_test_names=()
_codec_test_dirs=()
for _entry in $test_sets; do
  case "$_entry" in
    ?*=?*) _codec_test_names+=("${_entry%%=*}"); _codec_test_dirs+=("$data/${_entry#*=}") ;;
    *) echo "$0: test_sets entry '$_entry' is not NAME=DIR" >&2; exit 1 ;;
  esac
done
[ "${#_codec_test_dirs[@]}" -gt 0 ] || { echo "$0: test_sets is empty" >&2; exit 1; }

if [ "$stage" -le 1 ] && [ "$stop_stage" -ge 1 ]; then
  echo "stage 1: data lists"
  # The codec reads no label, but make_datalist labels every entry: each dir is labelled
  # by its own speakers (spk2utt), which keeps every utterance in the list.
  for x in "$data/$train_set" "$data/$dev_set" "${_codec_test_dirs[@]}"; do
    cut -d' ' -f1 "$x/spk2utt" > "$x/speakers.txt"
    python -m toolkit.bin.make_datalist "$x" "$x/data.list" \
      --inventory "$x/speakers.txt" --label-mode speaker --nj "$nj"
  done
fi

if [ "$stage" -le 2 ] && [ "$stop_stage" -ge 2 ]; then
  echo "stage 2: training in $exp"
  # $train_overrides is split into separate key=value words on purpose.
  # shellcheck disable=SC2086
  utils/torchrun.sh ${master_port:+--master-port $master_port} \
    "$gpus" "$num_procs" "$num_nodes" "$node_rank" "$rdzv_endpoint" \
    -m toolkit.bin.train --config "$config" --exp-dir "$exp" \
    --train-data "$data/$train_set/data.list" --dev-data "$data/$dev_set/data.list" \
    $train_overrides
fi

if [ "$stage" -le 3 ] && [ "$stop_stage" -ge 3 ]; then
  echo "stage 3: averaging the last $average_num checkpoints"
  python -m toolkit.bin.average_model --exp-dir "$exp" --output "$exp/avg_${average_num}.pt" \
    --num "$average_num" --mode last
fi

if [ "$stage" -le 4 ] && [ "$stop_stage" -ge 4 ]; then
  echo "stage 4: export"
  python -m toolkit.bin.export_model --checkpoint "$exp/avg_${average_num}.pt" --exp-dir "$exp" \
    --out-dir "$exp/export" --test-data "${_codec_test_dirs[0]}/data.list"
fi

if [ "$stage" -le 5 ] && [ "$stop_stage" -ge 5 ]; then
  _eval_args=()
  for q in $eval_n_q; do _eval_args+=(--n-q "$q"); done
  for b in $baselines; do _eval_args+=(--baseline "$b"); done
  [ -z "$eval_metrics" ] || _eval_args+=(--metrics "$eval_metrics")
  for i in "${!_codec_test_names[@]}"; do
    _name=${_codec_test_names[$i]}
    echo "stage 5: evaluating $exp/export on ${_codec_test_dirs[$i]} ($_name)"
    python -m toolkit.bin.evaluate_codec --model "$exp/export" \
      --test-data "${_codec_test_dirs[$i]}/data.list" --out-dir "$exp/eval/$_name" \
      --max-utts "$eval_max_utts" --threads "$nj" --jobs "$nj" "${_eval_args[@]}"
    echo "table: $exp/eval/$_name/results.md, spectrograms: $exp/eval/$_name/spectrograms.png"
  done
fi
