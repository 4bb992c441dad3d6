#!/usr/bin/env bash
# A 16 kHz neural speech codec trained on synthetic read speech from the voice bank
# (espeak-ng voices, Kokoro's neural voices and blends of them; flite only when named in
# engines=), measured on voices it never heard (Kokoro's reserved voices, held-out
# espeak-ng voices) against Codec2, Opus and naive codecs.
#
#   bash run.sh                                       # all stages, CPU-sized config
#   bash run.sh --stage 2 --stop-stage 2              # only training (resumes if killed)
#   bash run.sh --gpus 0 --config conf/codec_gpu.yaml --exp exp/codec_gpu   # published scale
#
# Stages (each rerunnable; outputs under data/ and $exp):
#   0 synthesize data/{train,dev,test} Kaldi dirs (+ *_noisy with noisy=true), data/voices.tsv,
#     and the outside test set data/reserved/test (the voices reserved for evaluation);
#     installs Kokoro first when engines= or test_engines= names it
#   1 data lists data/*/data.list, data/reserved/test/data.list
#   2 training through torchrun into $exp
#   3 averaging of the last $average_num checkpoints -> $exp/avg_${average_num}.pt
#   4 export encoder/decoder ONNX + TorchScript + safetensors -> $exp/export/ (parity-checked)
#   5 evaluation on each of eval_sets against the baselines -> $exp/eval/<set>/ (tables printed)
set -euo pipefail
cd "$(dirname "$0")"
. ./path.sh

gpus=-1            # GPUs to use, e.g. "0,1" -> 2 processes; -1 or empty -> CPU
num_procs=2        # CPU only: gloo ranks, one thread each (the config's batch is per rank)
num_nodes=1        # multi-node: number of nodes, this node's rank, rendezvous host:port
node_rank=0
rdzv_endpoint=127.0.0.1:29400
master_port=""     # one node: fixed torchrun port (default: a free one)
stage=0
stop_stage=5

seed=1234
num_train=1200     # about 2 h of speech (5 s per utterance on average)
num_dev=40
num_test=60
random_voices=60   # procedural espeak-ng voices added to its 224 fixed ones before the split
max_voices=0       # > 0: at most this many voices in all (0: every voice)
engines=espeak     # TTS engines that speak (comma list); one named but missing stops stage 0
other_share=0.2    # share of the utterances spoken by the engines besides espeak-ng
blends=0           # blended voices of each engine that mixes voices (kokoro), besides its own
test_engines=""    # engines of the outside test set data/reserved/test: their voices reserved
                   # for evaluation (kokoro: its 7; festival: all) and the held-out voices of the
                   # others; empty: no outside test set
num_test_reserved=60
noisy=false        # also write data/*_noisy (the same utterances in noise at 5-25 dB SNR)
nj=2

config=conf/codec_cpu.yaml
data=data
exp=exp/codec_cpu
train_set=train
dev_set=dev
test_set=test
train_overrides=""   # extra config overrides, e.g. "training.max_steps=4000"
average_num=3
# Evaluation: the codec with all its codebooks and with the first n_q of them (rates of
# one model, from quantizer dropout), naive codecs at about the same bitrates, and the real
# speech codecs Codec2 and Opus (toolkit.bin.evaluate_codec --help lists every system and
# metric). Each system's delay is estimated and removed before the metrics.
eval_n_q="2 4"
baselines="mulaw:1200:2 melgl:4:50:4 melgl:8:50:4 melgl:12:50:4"
baselines+=" codec2:3200 codec2:2400 codec2:1600 codec2:700C opus:6 opus:8"
eval_metrics=mel_distance,stft_distance,si_sdr,stoi,pesq_wb,pesq_nb,visqol
eval_max_utts=0      # 0: the whole test set
eval_sets=""   # reserved: data/reserved/test (needs test_engines=); test: data/$test_set
               # (held-out voices of the training engines); default: both, or test alone
               # when there is no outside test set

help_message="Usage: $0 [--stage N] [--stop-stage M] [--gpus 0,1] [--config conf/codec_gpu.yaml] ..."
. utils/parse_options.sh

# The test sets of stages 1, 4 and 5 by name (set after option parsing).
[ -n "$eval_sets" ] || eval_sets=${test_engines:+reserved }test
declare -A test_dirs
test_dirs[test]=$test_set
[ -z "$test_engines" ] || test_dirs[reserved]=reserved/test
test_sets=""
for _set in $eval_sets; do
  if [ -z "${test_dirs[$_set]:-}" ]; then
    if [ "$_set" = reserved ]; then
      echo "$0: eval_sets names reserved but test_engines is empty (no outside test set)" >&2
    else
      echo "$0: unknown eval set '$_set' in eval_sets (known: ${!test_dirs[*]})" >&2
    fi
    exit 1
  fi
  test_sets+=" $_set=${test_dirs[$_set]}"
done

if [ "$stage" -le 0 ] && [ "$stop_stage" -ge 0 ]; then
  echo "stage 0: synthesizing speech into $data"
  # Kokoro's model and voices are downloaded and checked once, into the cache outside the
  # repository; an engine other than Kokoro that is missing stops synthesis with one error.
  case ",$engines,$test_engines," in
    *,kokoro,*) bash "$TOOLKIT_ROOT/tools/install_voices.sh" kokoro ;;
  esac
  _noisy_arg=()
  [ "$noisy" = true ] || _noisy_arg=(--no-noisy)
  python -m toolkit.bin.synth_codec_data --out-dir "$data" --seed "$seed" \
    --num-train "$num_train" --num-dev "$num_dev" --num-test "$num_test" \
    --random-voices "$random_voices" --max-voices "$max_voices" --engines "$engines" \
    --other-share "$other_share" --blends "$blends" --nj "$nj" "${_noisy_arg[@]}"
  if [ -n "$test_engines" ]; then
    # The same seed (and voice pool): the held-out voices of an engine that reserves none
    # (espeak-ng) are those of data/test; an engine that reserves voices speaks with those.
    _pool=(--max-voices "$max_voices")
    case ",$test_engines," in *,espeak,*) _pool+=(--random-voices "$random_voices") ;; esac
    python -m toolkit.bin.synth_codec_data --test-only --out-dir "$data/reserved" \
      --seed "$seed" --num-test "$num_test_reserved" --engines "$test_engines" \
      "${_pool[@]}" --nj "$nj" --no-noisy
  fi
fi

# Stages 1-5 are utils/codec_stages.sh, shared with the other codec recipes.
. utils/codec_stages.sh
