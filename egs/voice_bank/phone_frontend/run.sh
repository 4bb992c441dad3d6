#!/usr/bin/env bash
# A pretrained acoustic front end from the voice bank: a small streaming encoder trained
# with CTC on espeak-ng phones (task phone_ctc), on read speech from espeak-ng's voices,
# Kokoro's unreserved voices and blends, and (--extra-engines) other free engines, each
# utterance heard clean, in noise and in a room or a channel (telephone band, codecs,
# microphone colouring, clipping); measured by phone error rate on voices no training list
# or blend holds (Kokoro's seven reserved ones, festival's). Wake-word heads train on its
# frozen outputs (egs/wake_word/s0 --frontend phone_frontend) and keywords can be searched
# in its posteriors with no training (toolkit.bin.kws --keywords).
#
#   bash run.sh                                  # stages 0-6 on CPU
#   bash run.sh --stage 3 --stop-stage 3         # only training (resumes if killed)
#   bash run.sh --num-parts 4                    # grow the corpus: parts 1-3 added, 0 kept
#   bash run.sh --gpus 0                         # one GPU: Kokoro on CUDA, training in bf16
#   bash run.sh --stage 0 --stop-stage 8         # also package it into $exp/pretrained/
#   bash run.sh --stage 8 --stop-stage 8 --ship true   # replace the shipped model of that name
#
# Stages (each rerunnable; outputs under $data and $exp):
#   0 synthesize $data/{train,dev,test} (sizes: conf/corpus.yaml), each also in noise
#     ({train,dev,test}_noisy: white/pink/brown/babble at 5-25 dB SNR, as wake-word audio
#     is); more training speech in parts $data/part_K/train (K = 1 .. num_parts-1: the same
#     voices, other texts; a finished part is never made again, a killed one resumes from
#     the clip cache); with --extra-engines, a corpus of each engine group
#     $data/extra_<group> (adding a group adds its corpus, the others stay); with
#     conditions=true a copy of every training dir in a room or a channel (<dir>_cond); the
#     outside test sets $data/reserved/test (Kokoro's reserved voices) and
#     $data/festival/test, with their _noisy, _cond and (conditions=true) _whisper copies
#     (every utterance whispered: the voice turned to noise under its formants)
#   1 lexicon and phone list $data/dict/{lexicon,units}.txt (espeak-ng, en-us), data lists
#     with phone targets $data/*/data.list; training reads every training dir and its
#     noisy and condition copies together ($data/train/all.list), dev its clean and noisy
#     copies ($data/dev/both.list)
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
num_parts=1             # parts of training speech (part 0 is the corpus itself)
# Corpora of other engines ($extra_config each; train and dev join): a comma list of groups,
# engines of one corpus joined by "+" (each corpus needs three voices for its train, dev and
# test splits), e.g. pico+rhvoice,mbrola -> $data/extra_pico_rhvoice and $data/extra_mbrola.
extra_engines=""
extra_config=conf/extra_corpus.yaml
nonfree=false           # true lets tools/install_voices.sh add Debian contrib/non-free (pico, rhvoice, mbrola)
conditions=true         # copies of the training dirs and outside tests in rooms and channels
num_test_reserved=40    # utterances of Kokoro's reserved voices
num_test_outside=60     # utterances of festival's voices
nj=2

config=conf/ds_tcn_phone.yaml
data=data
exp=exp/ds_tcn_phone
train_overrides=""   # extra config overrides, e.g. "training.max_epoch=40"
amp=auto             # auto: bf16 autocast on GPUs, fp32 on CPU (where bf16 is 10-60x slower); true | false
average_num=5

pretrained_name=phone-voicebank-v5   # stage 8: the model's name
pretrained_root=""                   # stage 8: where it goes (empty: $exp/pretrained)
ship=false                           # stage 8: true replaces the shipped toolkit/pretrained/<name>

help_message="Usage: $0 [--stage N] [--stop-stage M] [--gpus 0,1] [--engines espeak,kokoro] ..."
. utils/parse_options.sh

# Checked before any stage runs, not hours later at stage 8.
case $amp in
  auto) amp=false; [ -n "$gpus" ] && [ "$gpus" != -1 ] && amp=true ;;
  true|false) ;;
  *) echo "$0: --amp $amp: expected auto, true or false" >&2; exit 1 ;;
esac
for opt in ship=$ship nonfree=$nonfree conditions=$conditions; do
  case ${opt#*=} in true|false) ;;
    *) echo "$0: --${opt%%=*} ${opt#*=}: expected true or false" >&2; exit 1 ;; esac
done
if [ "$ship" = true ] && [ -n "$pretrained_root" ]; then
  echo "$0: --ship true writes the installed toolkit/pretrained: drop --pretrained-root" >&2
  exit 1
fi

# The training dirs: part 0, the other parts, each extra engine group's corpus.
train_dirs="$data/train"
for ((k = 1; k < num_parts; k++)); do train_dirs="$train_dirs $data/part_$k/train"; done
dev_dirs="$data/dev"
test_sets="$data/test $data/reserved/test $data/festival/test"
for g in ${extra_engines//,/ }; do
  x=$data/extra_${g//+/_}
  train_dirs="$train_dirs $x/train"; dev_dirs="$dev_dirs $x/dev"; test_sets="$test_sets $x/test"
done
noisy_sets="" cond_sets="" whisper_sets=""
for x in $train_dirs $dev_dirs $test_sets; do noisy_sets="$noisy_sets ${x}_noisy"; done
if [ "$conditions" = true ]; then
  for x in $train_dirs $data/reserved/test $data/festival/test; do cond_sets="$cond_sets ${x}_cond"; done
  whisper_sets="$data/reserved/test_whisper $data/festival/test_whisper"
fi

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
  for ((k = 1; k < num_parts; k++)); do
    # shellcheck disable=SC2086
    python -m toolkit.bin.synth_codec_data --config "$corpus_config" $corpus_opts --part "$k" \
      --out-dir "$data/part_$k" --seed "$seed" --engines "$engines" --nj "$nj"
  done
  if [ -n "$extra_engines" ]; then
    nonfree_opt=""; [ "$nonfree" = true ] && nonfree_opt=--enable-nonfree
    # shellcheck disable=SC2086
    bash "$TOOLKIT_ROOT/tools/install_voices.sh" $nonfree_opt ${extra_engines//[,+]/ }
    for g in ${extra_engines//,/ }; do
      python -m toolkit.bin.synth_codec_data --config "$extra_config" \
        --out-dir "$data/extra_${g//+/_}" --seed "$seed" --engines "${g//+/,}" --nj "$nj"
    done
  fi
  # Codec2 and Opus of the channel conditions (setup.py's `channels` extra, wheels only).
  [ -z "$cond_sets" ] || bash "$TOOLKIT_ROOT/tools/install.sh" channels
  for x in $cond_sets; do
    python -m toolkit.bin.make_condition_copy --src "${x%_cond}" --out "$x" --seed "$seed" --nj "$nj"
  done
  # Whispered outside tests: no synthesizer of the bank whispers (Kokoro's reserved af_nicole
  # breathes; RESULTS.md).
  for x in $whisper_sets; do
    python -m toolkit.bin.make_condition_copy --src "${x%_whisper}" --out "$x" --seed "$seed" \
      --nj "$nj" --whisper-prob 1 --room-prob 0 --noise-prob 0 --channel-prob 0 --clip-prob 0
  done
fi

if [ "$stage" -le 1 ] && [ "$stop_stage" -ge 1 ]; then
  echo "stage 1: lexicon, phone list and data lists with phone targets"
  # shellcheck disable=SC2086
  python -m toolkit.bin.make_lexicon --unit phone $train_dirs $dev_dirs $test_sets \
    --lexicon "$data/dict/lexicon.txt" --units "$data/dict/units.txt"
  pairs=()
  for x in $train_dirs $dev_dirs $test_sets $noisy_sets $cond_sets $whisper_sets; do
    pairs+=("$x" "$x/data.list")
  done
  python -m toolkit.bin.make_datalist "${pairs[@]}" --label-mode none \
    --lexicon "$data/dict/lexicon.txt" --units "$data/dict/units.txt" --nj "$nj"
  train_lists=() dev_lists=()
  for x in $train_dirs; do
    train_lists+=("$x/data.list" "${x}_noisy/data.list")
    [ "$conditions" = true ] && train_lists+=("${x}_cond/data.list")
  done
  for x in $dev_dirs; do dev_lists+=("$x/data.list" "${x}_noisy/data.list"); done
  cat "${train_lists[@]}" > "$data/train/all.list"
  cat "${dev_lists[@]}" > "$data/dev/both.list"
fi

if [ "$stage" -le 2 ] && [ "$stop_stage" -ge 2 ]; then
  echo "stage 2: global CMVN"
  python -m toolkit.bin.compute_cmvn "$data/train/all.list" "$data/train/global_cmvn.json" \
    --config "$config" --nj "$nj"
fi

if [ "$stage" -le 3 ] && [ "$stop_stage" -ge 3 ]; then
  echo "stage 3: training in $exp"
  # $train_overrides is split into separate key=value words on purpose.
  # shellcheck disable=SC2086
  utils/torchrun.sh ${master_port:+--master-port $master_port} \
    "$gpus" "$num_procs" "$num_nodes" "$node_rank" "$rdzv_endpoint" \
    -m toolkit.bin.train --config "$config" --exp-dir "$exp" \
    --train-data "$data/train/all.list" --dev-data "$data/dev/both.list" \
    --inventory "$data/dict/units.txt" --cmvn "$data/train/global_cmvn.json" \
    training.use_amp=$amp training.amp_dtype=bfloat16 $train_overrides
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
  sets=("espeak-ng held out=$data/test/data.list"
        "Kokoro reserved=$data/reserved/test/data.list"
        "festival=$data/festival/test/data.list"
        "espeak-ng held out, in noise=$data/test_noisy/data.list"
        "Kokoro reserved, in noise=$data/reserved/test_noisy/data.list"
        "festival, in noise=$data/festival/test_noisy/data.list")
  if [ "$conditions" = true ]; then
    sets+=("Kokoro reserved, in a room or channel=$data/reserved/test_cond/data.list"
           "festival, in a room or channel=$data/festival/test_cond/data.list"
           "Kokoro reserved, whispered=$data/reserved/test_whisper/data.list"
           "festival, whispered=$data/festival/test_whisper/data.list")
  fi
  for g in ${extra_engines//,/ }; do
    sets+=("${g//+/,} held out=$data/extra_${g//+/_}/test/data.list")
  done
  data_opts=()
  for x in "${sets[@]}"; do data_opts+=(--data "$x"); done
  python -m toolkit.bin.evaluate_frontend --frontend "$exp/export" "${data_opts[@]}" \
    --out-dir "$exp/eval"
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
