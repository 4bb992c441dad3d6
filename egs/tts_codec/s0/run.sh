#!/usr/bin/env bash
# A 16 kHz neural speech codec trained on synthetic read speech from the voice bank
# (espeak-ng voices, Kokoro's neural voices and blends of them; flite only when named in
# engines=), measured on voices it never heard (Kokoro's reserved voices, held-out
# espeak-ng voices) against Codec2, Opus and naive codecs.
#
#   bash run.sh                                       # all stages, CPU-sized config
#   bash run.sh --stage 3 --stop-stage 3              # only training (resumes if killed)
#   bash run.sh --gpus 0 --config conf/codec_gpu.yaml --exp exp/codec_gpu   # published scale
#
# Stages (each rerunnable; outputs under data/ and $exp; README.md: what each writes):
#   0 synthesize data/{train,dev,test} Kaldi dirs (+ *_noisy with noisy=true), data/voices.tsv
#     (sizes: conf/corpus.yaml), and the outside test sets data/reserved/test (Kokoro's
#     voices reserved for evaluation) and data/festival/test (test_engines=); installs
#     the engines that engines= or test_engines= names beyond espeak-ng first
#   1 data lists data/*/data.list and of the outside test sets
#   2 (unused: no global CMVN, the codec reads waveforms)
#   3 training through torchrun into $exp
#   4 averaging of the last $average_num checkpoints -> $exp/avg_${average_num}.pt
#   5 export encoder/decoder ONNX + TorchScript + safetensors -> $exp/export/ (parity-checked)
#   6 evaluation on each of eval_sets against the baselines -> $exp/eval/<set>/ (tables printed)
#   7 (unused: the peers, Codec2 and Opus, are in stage 6's tables)
#   8 packaging: $exp/export as a pretrained codec with its model card (conf/card.md; the
#     tables of stage 6 quoted) in $exp/pretrained/$pretrained_name; only --ship true replaces
#     the shipped toolkit/pretrained/$pretrained_name in the checkout (--pretrained-root DIR:
#     DIR/$pretrained_name, never over a model already there); only when asked for:
#     bash run.sh --config conf/codec_bank.yaml ... --stage 0 --stop-stage 8 (conf/codec_bank.yaml)
set -euo pipefail
# The model card's command (stage 8): this call's options from stage 0 to 8; where the
# files go (--pretrained-root, --ship) does not change them.
card_command="bash egs/tts_codec/s0/run.sh"
skip_value=false
for arg in "$@"; do
  if [ "$skip_value" = true ]; then skip_value=false; continue; fi
  case $arg in --stage|--stop-stage|--pretrained-root|--ship) skip_value=true; continue ;; esac
  if [[ $arg =~ ^[A-Za-z0-9_./:=,+-]+$ ]]; then card_command+=" $arg"
  else card_command+=" '${arg//\'/\'\\\'\'}'"; fi
done
card_command+=" --stage 0 --stop-stage 8"
cd "$(dirname "$0")"
. ./path.sh

gpus=-1            # GPUs to use, e.g. "0,1" -> 2 processes; -1 or empty -> CPU
num_procs=2        # CPU only: gloo ranks, one thread each (the config's batch is per rank)
num_nodes=1        # multi-node: number of nodes, this node's rank, rendezvous host:port
node_rank=0
rdzv_endpoint=127.0.0.1:29400
master_port=""     # one node: fixed torchrun port (default: a free one)
stage=0
stop_stage=6

# Stage 0's training corpus: sizes and shares in $corpus_config (conf/corpus.yaml). The
# voice pool (seed, random_voices, max_voices) is passed to both corpora: the outside test
# set's held-out espeak-ng voices are those of data/test.
corpus_config=conf/corpus.yaml
corpus_opts=""     # generator options over $corpus_config, e.g. "--num-train 20000"
seed=1234
random_voices=60   # procedural espeak-ng voices added to its 224 fixed ones before the split
max_voices=0       # > 0: at most this many voices in all (0: every voice)
engines=espeak     # TTS engines that speak (comma list); one named but missing stops stage 0
blends=0           # blended voices of each engine that mixes voices (kokoro), besides its own
test_engines=""    # engines of the outside test sets: data/reserved/test (kokoro: its 7 reserved
                   # voices, and the held-out voices of espeak) and data/festival/test (festival:
                   # all its voices, an engine no codec trains on); empty: no outside test set
num_test_reserved=60   # utterances of each outside test set
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
eval_n_q="3 4 6"     # 1.5, 2 and 3 kbit/s of a 12-codebook codec
# The input itself (the row DNSMOS, which needs no reference, scores the speech by), naive
# mel + Griffin-Lim, and the classic codecs the targets name.
baselines="original melgl:12:50:4 codec2:2400 opus:6"
eval_metrics=mel_distance,stft_distance,si_sdr,stoi,pesq_wb,pesq_nb,visqol,dnsmos_ovrl
eval_max_utts=0      # 0: the whole test set
eval_sets=""   # reserved: data/reserved/test, festival: data/festival/test (each needs its
               # engine in test_engines=); test: data/$test_set (held-out voices of the
               # training engines); default: the outside sets there are, then test

pretrained_name=codec-voicebank-v1   # stage 8: the model's name
card=conf/card.md                    # stage 8: the model card's template
pretrained_root=""                   # stage 8: where it goes (empty: $exp/pretrained)
ship=false                           # stage 8: true replaces the shipped toolkit/pretrained/<name>

help_message="Usage: $0 [--stage N] [--stop-stage M] [--gpus 0,1] [--config conf/codec_gpu.yaml] ..."
. utils/parse_options.sh

# Checked before any stage runs, not after training at stage 8.
case $ship in true|false) ;; *) echo "$0: --ship $ship: expected true or false" >&2; exit 1 ;; esac
if [ "$ship" = true ] && [ -n "$pretrained_root" ]; then
  echo "$0: --ship true writes the installed toolkit/pretrained: drop --pretrained-root" >&2
  exit 1
fi

# The outside test sets: festival speaks data/festival alone (none of its voices trains
# anything); the other engines of test_engines speak data/reserved.
reserved_engines=$(echo ",$test_engines," | sed 's/,festival,/,/g; s/^,*//; s/,*$//')
festival_test=false
case ",$test_engines," in *,festival,*) festival_test=true ;; esac

# The evaluation sets by name (stage 5 checks its export on the first): test is
# data/$test_set, reserved and festival the outside test sets.
if [ -z "$eval_sets" ]; then
  [ -z "$reserved_engines" ] || eval_sets+="reserved "
  [ "$festival_test" = false ] || eval_sets+="festival "
  eval_sets+=test
fi
eval_names=()
eval_dirs=()
for name in $eval_sets; do
  case $name in
    test) eval_dirs+=("$data/$test_set") ;;
    reserved|festival)
      if { [ "$name" = reserved ] && [ -z "$reserved_engines" ]; } ||
         { [ "$name" = festival ] && [ "$festival_test" = false ]; }; then
        echo "$0: eval_sets names $name but test_engines ('$test_engines') has no engine" \
          "for it (reserved: kokoro or espeak; festival: festival)" >&2
        exit 1
      fi
      eval_dirs+=("$data/$name/test") ;;
    *) echo "$0: unknown eval set '$name' in eval_sets (known: test reserved festival)" >&2
       exit 1 ;;
  esac
  eval_names+=("$name")
done
[ "${#eval_dirs[@]}" -gt 0 ] || { echo "$0: eval_sets is empty" >&2; exit 1; }

if [ "$stage" -le 0 ] && [ "$stop_stage" -ge 0 ]; then
  echo "stage 0: synthesizing speech into $data"
  # Kokoro's model and voices are downloaded and checked once, into the cache outside the
  # repository; the Debian engines (festival) need apt, as root.
  needs_install=$(echo "$engines,$test_engines" | tr ',' '\n' \
    | grep -xE 'kokoro|rhvoice|pico|mbrola|festival|flite' | sort -u | tr '\n' ' ' || true)
  # shellcheck disable=SC2086
  [ -z "$needs_install" ] || bash "$TOOLKIT_ROOT/tools/install_voices.sh" $needs_install
  noisy_arg=()
  [ "$noisy" = true ] || noisy_arg=(--no-noisy)
  # $corpus_opts is split into separate options on purpose.
  # shellcheck disable=SC2086
  python -m toolkit.bin.synth_codec_data --config "$corpus_config" $corpus_opts \
    --out-dir "$data" --seed "$seed" --random-voices "$random_voices" \
    --max-voices "$max_voices" --engines "$engines" --blends "$blends" --nj "$nj" \
    "${noisy_arg[@]}"
  if [ -n "$reserved_engines" ]; then
    # The same seed (and voice pool): the held-out voices of an engine that reserves none
    # (espeak-ng) are those of data/test; an engine that reserves voices speaks with those.
    pool=(--max-voices "$max_voices")
    case ",$reserved_engines," in *,espeak,*) pool+=(--random-voices "$random_voices") ;; esac
    python -m toolkit.bin.synth_codec_data --test-only --out-dir "$data/reserved" \
      --seed "$seed" --num-test "$num_test_reserved" --engines "$reserved_engines" \
      "${pool[@]}" --nj "$nj" --no-noisy
  fi
  if [ "$festival_test" = true ]; then
    python -m toolkit.bin.synth_codec_data --test-only --out-dir "$data/festival" \
      --seed "$seed" --num-test "$num_test_reserved" --engines festival --nj "$nj" --no-noisy
  fi
fi

if [ "$stage" -le 1 ] && [ "$stop_stage" -ge 1 ]; then
  echo "stage 1: data lists"
  # The codec reads no label, but make_datalist labels every entry: each dir is labelled
  # by its own speakers (spk2utt), which keeps every utterance in the list.
  for x in "$data/$train_set" "$data/$dev_set" "${eval_dirs[@]}"; do
    cut -d' ' -f1 "$x/spk2utt" > "$x/speakers.txt"
    python -m toolkit.bin.make_datalist "$x" "$x/data.list" \
      --inventory "$x/speakers.txt" --label-mode speaker --nj "$nj"
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
    --train-data "$data/$train_set/data.list" --dev-data "$data/$dev_set/data.list" \
    $train_overrides
fi

if [ "$stage" -le 4 ] && [ "$stop_stage" -ge 4 ]; then
  echo "stage 4: averaging the last $average_num checkpoints"
  python -m toolkit.bin.average_model --exp-dir "$exp" --output "$exp/avg_${average_num}.pt" \
    --num "$average_num" --mode last
fi

if [ "$stage" -le 5 ] && [ "$stop_stage" -ge 5 ]; then
  echo "stage 5: export"
  python -m toolkit.bin.export_model --checkpoint "$exp/avg_${average_num}.pt" --exp-dir "$exp" \
    --out-dir "$exp/export" --test-data "${eval_dirs[0]}/data.list"
fi

if [ "$stage" -le 6 ] && [ "$stop_stage" -ge 6 ]; then
  eval_args=()
  for q in $eval_n_q; do eval_args+=(--n-q "$q"); done
  for b in $baselines; do eval_args+=(--baseline "$b"); done
  [ -z "$eval_metrics" ] || eval_args+=(--metrics "$eval_metrics")
  for i in "${!eval_names[@]}"; do
    name=${eval_names[$i]}
    echo "stage 6: evaluating $exp/export on ${eval_dirs[$i]} ($name)"
    python -m toolkit.bin.evaluate_codec --model "$exp/export" \
      --test-data "${eval_dirs[$i]}/data.list" --out-dir "$exp/eval/$name" \
      --max-utts "$eval_max_utts" --threads "$nj" --jobs "$nj" "${eval_args[@]}"
    echo "table: $exp/eval/$name/results.md, spectrograms: $exp/eval/$name/spectrograms.png"
  done
fi

# Stage 7 is unused: the peers (Codec2, Opus) are evaluated beside the codec in stage 6.

if [ "$stage" -le 8 ] && [ "$stop_stage" -ge 8 ]; then
  # The shipped model in the checkout is replaced only when asked (--ship true).
  ship_opts=(--out-root "${pretrained_root:-$exp/pretrained}")
  [ "$ship" = true ] && ship_opts=(--overwrite)
  echo "stage 8: packaging $exp/export as $pretrained_name (${ship_opts[*]})"
  # The card quotes stage 6's tables of the eval sets it names ({{eval_reserved}}, ...).
  tables=()
  for name in reserved festival test; do
    grep -q "{{eval_$name}}" "$card" || continue
    [ -f "$exp/eval/$name/results.md" ] || {
      echo "$0: stage 8: $card quotes $exp/eval/$name/results.md, which stage 6 has not" \
        "written (the outside sets: --test-engines kokoro,festival; eval_sets empty)" >&2
      exit 1
    }
    tables+=(--set-file "eval_$name=$exp/eval/$name/results.md")
  done
  python -m toolkit.bin.package_pretrained --export-dir "$exp/export" \
    --name "$pretrained_name" "${ship_opts[@]}" --card "$card" "${tables[@]}" \
    --set "command=$card_command" --set "config=$config" \
    --set "train_log=$(grep -h 'training finished' "$exp/log/train.rank0.log" | tail -1 | sed 's/.*training finished: //')"
fi
