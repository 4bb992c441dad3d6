#!/usr/bin/env bash
# A pretrained acoustic front end from the voice bank: a small streaming encoder trained
# with CTC on espeak-ng phones (task phone_ctc), on read speech from espeak-ng's voices
# and Kokoro's unreserved voices and blends; measured by phone error rate on voices no
# training list or blend holds (Kokoro's seven reserved ones, festival's). Wake-word heads
# train on its frozen outputs (egs/wake_word/s0 --frontend phone_frontend) and keywords can
# be searched in its posteriors with no training (toolkit.bin.kws --keywords).
#
#   bash run.sh                                  # stages 0-6 on CPU
#   bash run.sh --stage 3 --stop-stage 3         # only training (resumes if killed)
#   bash run.sh --gpus 0 --train-overrides "training.use_amp=true training.amp_dtype=bfloat16"
#   bash run.sh --stage 0 --stop-stage 8         # also package it into $exp/pretrained/
#   bash run.sh --stage 8 --stop-stage 8 --ship true   # replace the shipped model of that name
#
# Stages (each rerunnable; outputs under $data and $exp):
#   0 synthesize $data/{train,dev,test} (sizes: conf/corpus.yaml), each also in noise
#     ({train,dev,test}_noisy: white/pink/brown/babble at 5-25 dB SNR, as wake-word audio
#     is), and the outside test sets $data/reserved/test (Kokoro's reserved voices) and
#     $data/festival/test, with their _noisy copies
#   1 lexicon and phone list $data/dict/{lexicon,units}.txt (espeak-ng, en-us), data lists
#     with phone targets $data/*/data.list; training and dev read clean and noisy copies
#     together ($data/{train,dev}/both.list)
#   2 global CMVN $data/train/global_cmvn.json
#   3 training through torchrun into $exp (resumes when rerun)
#   4 average of the best $average_num checkpoints by dev PER -> $exp/avg_$average_num.pt
#   5 export TorchScript/ONNX/safetensors -> $exp/export/ (parity-checked, log posteriors)
#   6 phone error rate on every test set and the streaming real-time factor -> $exp/eval/
#   7 (unused)
#   8 packaging: $exp/export with its card (conf/card.md) as $exp/pretrained/$pretrained_name;
#     only --ship true replaces toolkit/pretrained/$pretrained_name in the checkout
#     (--pretrained-root DIR: DIR/$pretrained_name, never over a model already there)
set -euo pipefail
# The model card's command (stage 8): this call's options from stage 0 to 8; where the
# files go (--data, --exp, --pretrained-root, --ship) does not change them.
card_command="bash egs/voice_bank/phone_frontend/run.sh"
skip_value=false
for arg in "$@"; do
  if [ "$skip_value" = true ]; then skip_value=false; continue; fi
  case $arg in --stage|--stop-stage|--pretrained-root|--ship|--data|--exp) skip_value=true; continue ;; esac
  if [[ $arg =~ ^[A-Za-z0-9_./:=,+-]+$ ]]; then card_command+=" $arg"
  else card_command+=" '${arg//\'/\'\\\'\'}'"; fi
done
card_command+=" --stage 0 --stop-stage 8"
cd "$(dirname "$0")"
. ./path.sh

gpus=-1            # GPUs to use, e.g. "0,1" -> 2 processes; -1 or empty -> CPU
num_procs=1        # CPU only: gloo ranks
num_nodes=1        # multi-node: number of nodes, this node's rank, rendezvous host:port
node_rank=0
rdzv_endpoint=127.0.0.1:29400
master_port=""     # one node: fixed torchrun port (default: a free one)
stage=0
stop_stage=6

corpus_config=conf/corpus.yaml
corpus_opts=""     # generator options over $corpus_config, e.g. "--num-train 20000"
seed=1234
engines=espeak,kokoro   # TTS engines of the training corpus (comma list)
num_test_reserved=40    # utterances of Kokoro's reserved voices
num_test_outside=60     # utterances of festival's voices
nj=2

config=conf/ds_tcn_phone.yaml
data=data
exp=exp/ds_tcn_phone
train_overrides=""   # extra config overrides, e.g. "training.max_epoch=40"
average_num=5

pretrained_name=phone-voicebank-v2   # stage 8: the model's name
pretrained_root=""                   # stage 8: where it goes (empty: $exp/pretrained)
ship=false                           # stage 8: true replaces the shipped toolkit/pretrained/<name>

help_message="Usage: $0 [--stage N] [--stop-stage M] [--gpus 0,1] [--engines espeak,kokoro] ..."
. utils/parse_options.sh

# Checked before any stage runs, not hours later at stage 8.
case $ship in true|false) ;; *) echo "$0: --ship $ship: expected true or false" >&2; exit 1 ;; esac
if [ "$ship" = true ] && [ -n "$pretrained_root" ]; then
  echo "$0: --ship true writes the installed toolkit/pretrained: drop --pretrained-root" >&2
  exit 1
fi

test_sets="$data/test $data/reserved/test $data/festival/test"
noisy_sets="$data/train_noisy $data/dev_noisy $data/test_noisy $data/reserved/test_noisy $data/festival/test_noisy"

if [ "$stage" -le 0 ] && [ "$stop_stage" -ge 0 ]; then
  echo "stage 0: synthesizing read speech into $data"
  # Kokoro and festival whatever --engines says: the outside test sets are theirs.
  bash "$TOOLKIT_ROOT/tools/install_voices.sh" kokoro festival
  if [ -n "$gpus" ] && [ "$gpus" != -1 ]; then
    # Kokoro on the GPU too, where onnxruntime offers CUDA (onnxruntime-gpu), in float32.
    export TOOLKIT_KOKORO_PROVIDER=${TOOLKIT_KOKORO_PROVIDER:-auto}
    python -m toolkit.bin.install_kokoro --graphs int8,float32
  fi
  # $corpus_opts is split into separate options on purpose.
  # shellcheck disable=SC2086
  python -m toolkit.bin.synth_codec_data --config "$corpus_config" $corpus_opts \
    --out-dir "$data" --seed "$seed" --engines "$engines" --nj "$nj"
  # Voices reserved for evaluation: Kokoro's seven and all of festival's.
  python -m toolkit.bin.synth_codec_data --test-only --out-dir "$data/reserved" --seed "$seed" \
    --num-test "$num_test_reserved" --engines kokoro --nj "$nj"
  python -m toolkit.bin.synth_codec_data --test-only --out-dir "$data/festival" --seed "$seed" \
    --num-test "$num_test_outside" --engines festival --nj "$nj"
fi

if [ "$stage" -le 1 ] && [ "$stop_stage" -ge 1 ]; then
  echo "stage 1: lexicon, phone list and data lists with phone targets"
  # shellcheck disable=SC2086
  python -m toolkit.bin.make_lexicon --unit phone "$data/train" "$data/dev" $test_sets \
    --lexicon "$data/dict/lexicon.txt" --units "$data/dict/units.txt"
  pairs=()
  for x in "$data/train" "$data/dev" $test_sets $noisy_sets; do pairs+=("$x" "$x/data.list"); done
  python -m toolkit.bin.make_datalist "${pairs[@]}" --label-mode none \
    --lexicon "$data/dict/lexicon.txt" --units "$data/dict/units.txt" --nj "$nj"
  for x in train dev; do
    cat "$data/$x/data.list" "$data/${x}_noisy/data.list" > "$data/$x/both.list"
  done
fi

if [ "$stage" -le 2 ] && [ "$stop_stage" -ge 2 ]; then
  echo "stage 2: global CMVN"
  python -m toolkit.bin.compute_cmvn "$data/train/both.list" "$data/train/global_cmvn.json" \
    --config "$config" --nj "$nj"
fi

if [ "$stage" -le 3 ] && [ "$stop_stage" -ge 3 ]; then
  echo "stage 3: training in $exp"
  # $train_overrides is split into separate key=value words on purpose.
  # shellcheck disable=SC2086
  utils/torchrun.sh ${master_port:+--master-port $master_port} \
    "$gpus" "$num_procs" "$num_nodes" "$node_rank" "$rdzv_endpoint" \
    -m toolkit.bin.train --config "$config" --exp-dir "$exp" \
    --train-data "$data/train/both.list" --dev-data "$data/dev/both.list" \
    --inventory "$data/dict/units.txt" --cmvn "$data/train/global_cmvn.json" $train_overrides
fi

if [ "$stage" -le 4 ] && [ "$stop_stage" -ge 4 ]; then
  echo "stage 4: averaging the best $average_num checkpoints by dev PER"
  python -m toolkit.bin.average_model --exp-dir "$exp" --output "$exp/avg_$average_num.pt" \
    --num "$average_num" --mode best
fi

if [ "$stage" -le 5 ] && [ "$stop_stage" -ge 5 ]; then
  echo "stage 5: export"
  python -m toolkit.bin.export_model --checkpoint "$exp/avg_$average_num.pt" --exp-dir "$exp" \
    --out-dir "$exp/export" --test-data "$data/test/data.list"
fi

if [ "$stage" -le 6 ] && [ "$stop_stage" -ge 6 ]; then
  echo "stage 6: phone error rate and streaming speed -> $exp/eval"
  python -m toolkit.bin.evaluate_frontend --frontend "$exp/export" \
    --data "espeak-ng held out=$data/test/data.list" \
    --data "Kokoro reserved=$data/reserved/test/data.list" \
    --data "festival=$data/festival/test/data.list" \
    --data "espeak-ng held out, in noise=$data/test_noisy/data.list" \
    --data "Kokoro reserved, in noise=$data/reserved/test_noisy/data.list" \
    --data "festival, in noise=$data/festival/test_noisy/data.list" --out-dir "$exp/eval"
fi

# Stage 7 is unused.

if [ "$stage" -le 8 ] && [ "$stop_stage" -ge 8 ]; then
  # The shipped model in the checkout is replaced only when asked (--ship true); by
  # default the package is this run's own output under $exp, replaced on a rerun; a
  # --pretrained-root that already holds the name is refused by the packager.
  if [ "$ship" = true ]; then
    package_opts=(--overwrite)
    where="the shipped toolkit/pretrained/$pretrained_name (replacing it)"
  elif [ -z "$pretrained_root" ]; then
    package_opts=(--out-root "$exp/pretrained" --overwrite)
    where="$exp/pretrained/$pretrained_name"
  else
    package_opts=(--out-root "$pretrained_root")
    where="$pretrained_root/$pretrained_name"
  fi
  echo "stage 8: packaging $exp/export as $where"
  [ -f "$exp/eval/results.md" ] || { echo "$0: stage 8 quotes $exp/eval/results.md: run stage 6" >&2; exit 1; }
  python -m toolkit.bin.package_pretrained --export-dir "$exp/export" \
    --name "$pretrained_name" "${package_opts[@]}" \
    --card conf/card.md --set-file "eval=$exp/eval/results.md" \
    --set "command=$card_command" --set "config=$config" \
    --set "units=$(( $(grep -c . "$data/dict/units.txt") - 1 ))" \
    --set "train_log=$(grep -h 'training finished' "$exp/log/train.rank0.log" | tail -1 | sed 's/.*training finished: //')"
fi
