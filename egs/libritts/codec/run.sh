#!/usr/bin/env bash
# A neural speech codec on LibriTTS (OpenSLR 60: 24 kHz read English, CC BY 4.0): trained on
# train-clean-100 (+ train-clean-360), validated on dev-clean, evaluated on test-clean's
# unseen speakers against baselines at the same bitrates. 24 kHz and 16 kHz variants (the
# 16 kHz ones resample on the fly), CPU-sized and published-scale configs.
#
#   bash run.sh                                            # 24 kHz, CPU-sized (conf/codec_24k.yaml)
#   bash run.sh --config conf/codec_16k.yaml               # the 16 kHz variant
#   bash run.sh --gpus 0,1,2,3 --config conf/codec_24k_gpu.yaml   # published scale
#   bash run.sh --stage 3 --stop-stage 3                   # only training (resumes if killed)
#
# Stages (each rerunnable; outputs under $corpus_dir, $data and $exp; README.md: what each
# writes):
#  -1 download of each subset's archive into $download_dir (continued where an interrupted
#     download stopped), sha256-checked (local/checksums.txt), extracted into $corpus_dir;
#     skipped for a subset already extracted there
#   0 Kaldi dirs $data/{<subset>,train,dev,test} (local/prepare_libritts.py; train = the
#     training subsets combined, dev = $dev_utts utterances of dev-clean)
#   1 data lists $data/*/data.list
#   2 (unused: no global CMVN, the codec reads waveforms)
#   3 training through torchrun into $exp
#   4 average of the last $average_num checkpoints -> $exp/avg_${average_num}.pt
#   5 export (encoder/decoder ONNX + TorchScript, safetensors; parity-checked) -> $exp/export
#   6 evaluation on test-clean against the baselines -> $exp/eval/test (table printed)
set -euo pipefail
cd "$(dirname "$0")"
. ./path.sh

gpus=-1            # GPUs to use, e.g. "0,1" -> 2 processes; -1 or empty -> CPU
num_procs=2        # CPU only: gloo ranks, one thread each (the config's batch is per rank)
num_nodes=1        # multi-node: number of nodes, this node's rank, rendezvous host:port
node_rank=0
rdzv_endpoint=127.0.0.1:29400
master_port=""     # one node: fixed torchrun port (default: a free one)
stage=-1
stop_stage=6

base_url=https://www.openslr.org/resources/60
download_dir=downloads           # where the archives are (or are downloaded to)
corpus_dir=corpus                # where LibriTTS/<subset> is (or is extracted to)
checksum_file=local/checksums.txt
verify_checksum=true
train_subsets="train-clean-100 train-clean-360"
dev_subset=dev-clean
test_subset=test-clean
dev_utts=400       # dev-clean utterances used for validation, spread over its speakers (0: all)
nj=4

config=conf/codec_24k.yaml
data=data
exp=""             # default exp/<config name>, e.g. exp/codec_24k
train_overrides="" # extra config overrides, e.g. "training.max_steps=4000"
average_num=3
# Evaluation: all codebooks and the first n_q of them (lower rates of the same model), and
# signal-processing baselines at about the same bitrates (toolkit.bin.evaluate_codec --help).
eval_n_q="2 4"
baselines="mulaw:1200:2 melgl:4:50:4 melgl:8:50:4 melgl:12:50:4"
eval_max_utts=0    # 0: all of test-clean

help_message="Usage: $0 [--stage N] [--stop-stage M] [--gpus 0,1] [--config conf/codec_16k.yaml] ..."
. utils/parse_options.sh

exp=${exp:-exp/$(basename "$config" .yaml)}

if [ "$stage" -le -1 ] && [ "$stop_stage" -ge -1 ]; then
  echo "stage -1: LibriTTS subsets into $corpus_dir"
  for subset in $train_subsets $dev_subset $test_subset; do
    python -m toolkit.bin.fetch_corpus --url "$base_url/$subset.tar.gz" \
      --archive "$download_dir/$subset.tar.gz" --corpus-dir "$corpus_dir" \
      --marker "LibriTTS/$subset" --checksums "$checksum_file" --verify "$verify_checksum"
  done
fi

if [ "$stage" -le 0 ] && [ "$stop_stage" -ge 0 ]; then
  echo "stage 0: Kaldi data dirs into $data"
  _train_dirs=()
  for subset in $train_subsets; do
    python local/prepare_libritts.py --corpus-dir "$corpus_dir" --subset "$subset" \
      --out-dir "$data/$subset"
    _train_dirs+=("$data/$subset")
  done
  utils/combine_data.sh "$data/train" "${_train_dirs[@]}"
  python local/prepare_libritts.py --corpus-dir "$corpus_dir" --subset "$dev_subset" \
    --out-dir "$data/dev" --max-utts "$dev_utts"
  python local/prepare_libritts.py --corpus-dir "$corpus_dir" --subset "$test_subset" \
    --out-dir "$data/test"
  for x in train dev test; do
    utils/validate_data_dir.sh --no-audio "$data/$x"
  done
fi

if [ "$stage" -le 1 ] && [ "$stop_stage" -ge 1 ]; then
  echo "stage 1: data lists"
  # The codec reads no label, but make_datalist labels every entry: each dir is labelled
  # by its own speakers (spk2utt), which keeps every utterance in the list.
  for x in train dev test; do
    cut -d' ' -f1 "$data/$x/spk2utt" > "$data/$x/speakers.txt"
    python -m toolkit.bin.make_datalist "$data/$x" "$data/$x/data.list" \
      --inventory "$data/$x/speakers.txt" --label-mode speaker --nj "$nj"
  done
fi

# Stage 2 is unused: no global CMVN, the codec reads waveforms.

if [ "$stage" -le 3 ] && [ "$stop_stage" -ge 3 ]; then
  echo "stage 3: training in $exp"
  # $train_overrides is split into separate key=value words on purpose.
  # shellcheck disable=SC2086
  utils/torchrun.sh ${master_port:+--master-port $master_port} \
    "$gpus" "$num_procs" "$num_nodes" "$node_rank" "$rdzv_endpoint" \
    -m toolkit.bin.train --config "$config" --exp-dir "$exp" \
    --train-data "$data/train/data.list" --dev-data "$data/dev/data.list" $train_overrides
fi

if [ "$stage" -le 4 ] && [ "$stop_stage" -ge 4 ]; then
  echo "stage 4: averaging the last $average_num checkpoints"
  python -m toolkit.bin.average_model --exp-dir "$exp" --output "$exp/avg_${average_num}.pt" \
    --num "$average_num" --mode last
fi

if [ "$stage" -le 5 ] && [ "$stop_stage" -ge 5 ]; then
  echo "stage 5: export"
  python -m toolkit.bin.export_model --checkpoint "$exp/avg_${average_num}.pt" --exp-dir "$exp" \
    --out-dir "$exp/export" --test-data "$data/test/data.list"
fi

if [ "$stage" -le 6 ] && [ "$stop_stage" -ge 6 ]; then
  echo "stage 6: evaluating $exp/export on $data/test (test-clean)"
  eval_args=()
  for q in $eval_n_q; do eval_args+=(--n-q "$q"); done
  for b in $baselines; do eval_args+=(--baseline "$b"); done
  python -m toolkit.bin.evaluate_codec --model "$exp/export" \
    --test-data "$data/test/data.list" --out-dir "$exp/eval/test" \
    --max-utts "$eval_max_utts" --threads "$nj" --jobs "$nj" "${eval_args[@]}"
  echo "table: $exp/eval/test/results.md, spectrograms: $exp/eval/test/spectrograms.png"
fi
