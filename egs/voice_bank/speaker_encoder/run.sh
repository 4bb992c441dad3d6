#!/usr/bin/env bash
# Pretrains the speaker encoders the toolkit ships on the voice bank: ecapa-voicebank-v2 (the
# default: v1 fine-tuned on 1.5 s crops in simulated rooms and noise, what a wake-word gate
# hears) and ecapa-voicebank-v1 (from scratch on whole utterances; the line below) on
# the voice bank: espeak-ng accents x variants and procedural voices, Kokoro's 21 unreserved
# voices and $blends blends of them (each a speaker), every utterance in noise. It is scored
# on voices no training of it ever heard: Kokoro's seven reserved voices, the held-out
# espeak-ng voices, festival's and flite's voices, and all of them together (cross-engine
# pairs). Results and timings: RESULTS.md; the model card: conf/card.md.
#
#   bash run.sh                          # everything (v2), about 1 h 30 on 2 CPU cores
#   bash run.sh --config conf/ecapa_c192.yaml --exp exp/ecapa_c192 --name ecapa-voicebank-v1 \
#     --train-input fbank --card conf/card.md   # v1, about 2 h
#   bash run.sh --stage 3 --stop-stage 3 # only training (resumes where it was killed)
#   bash run.sh --gpus 0                 # training on a GPU
#   bash run.sh --stage 8 --ship true    # replace the shipped toolkit/pretrained/$name
#
# Stages (each rerunnable; the synthesis is cached per clip, training resumes):
#   0 synthesize the training corpus ($data/{train,dev,test}) and the outside test set
#     ($data/outside/test with its trial lists) and its 1.5 s noisy crops
#     ($data/outside_short/test, the same trials), validate them
#   1 speaker inventory, data lists; train_input=fbank: fbank features of train (with speed
#     copies) and dev; train_input=audio: the room and noise banks ($data/aug)
#   2 (unused: no global CMVN, the speaker models normalise each utterance)
#   3 training through torchrun into $exp
#   4 average the last $average_num checkpoints
#   5 export (ONNX, TorchScript, safetensors; parity-checked)
#   6 scoring: embeddings of the outside test sets and of the AS-Norm cohort, every list
#     scored with and without AS-Norm; the cohort beside the export (cohort.safetensors)
#   7 the peer on the same lists: Resemblyzer (tools/install_resemblyzer.sh installs it)
#   8 the model as the toolkit ships one (weights, config.json, model card) in
#     $exp/pretrained/$name; only --ship true replaces toolkit/pretrained/$name in the
#     checkout (--pretrained-root DIR: DIR/$name, never over a model already there)
set -euo pipefail
cd "$(dirname "$0")"
. ./path.sh

gpus=-1              # e.g. "0" or "0,1"; -1: CPU
num_procs=2          # CPU: gloo ranks of one thread each
num_nodes=1
node_rank=0
rdzv_endpoint=127.0.0.1:29400
stage=0
stop_stage=8

seed=777             # the self-contained recipe's seed: the same espeak-ng voices held out
engines=espeak,kokoro  # engines of the training corpus (blends need kokoro)
blends=800           # Kokoro blends, each a speaker (5 % dev, 5 % test)
kokoro_utts=4        # utterances per Kokoro training speaker (about 1 CPU-s each)
espeak_utts=12       # per espeak-ng training speaker (about 1 ms each)
speed_copies=0.9,1.1  # speed-perturbed copies of the training set, new speakers each
outside_engines=espeak,kokoro,festival,flite
outside_utts=20
# Extra synth_speaker_data options after the ones above (the last one given wins), e.g.
# "--num-train-speakers 20 --train-utts 4" for a small run; split into words on purpose.
corpus_opts=""
outside_opts=""
train_overrides=""   # extra training config overrides, e.g. "training.max_epoch=3"
nj=2

config=conf/ecapa_c192_short.yaml
data=data
exp=exp/ecapa_c192_short
# What training reads: audio (waveforms cropped, reverberated and noised on the fly with
# $data/aug's banks) or fbank (v1: precomputed features of train and its speed copies).
train_input=audio
num_rirs=300         # image-method rooms of $data/aug (train_input=audio)
num_noise=200        # noise clips of $data/aug, half of them babble of training talkers
short_seconds=1.5    # the outside test set's noisy crops ($data/outside_short/test)
short_snr_db=5,15
average_num=3
as_norm_top=100
cohort_utts_per_spk=4
name=ecapa-voicebank-v2
card=conf/card_v2.md # stage 8's model card template (v1: conf/card.md)
pretrained_root=""   # stage 8: where $name goes (empty: $exp/pretrained)
ship=false           # stage 8: true replaces the shipped toolkit/pretrained/$name
. utils/parse_options.sh

# Checked before any stage runs, not hours later at stage 8.
case $ship in true|false) ;; *) echo "$0: --ship $ship: expected true or false" >&2; exit 1 ;; esac
case $train_input in audio|fbank) ;;
  *) echo "$0: --train-input $train_input: expected audio or fbank" >&2; exit 1 ;; esac
if [ "$ship" = true ] && [ -n "$pretrained_root" ]; then
  echo "$0: --ship true writes the installed toolkit/pretrained: drop --pretrained-root" >&2
  exit 1
fi

if [ "$stage" -le 0 ] && [ "$stop_stage" -ge 0 ]; then
  echo "stage 0: TTS engines, the training corpus and the outside test set"
  # The engines named that espeak-ng (a dependency of the toolkit) is not.
  installs=()
  for e in ${engines//,/ } ${outside_engines//,/ }; do
    case " espeak ${installs[*]} " in *" $e "*) ;; *) installs+=("$e") ;; esac
  done
  [ ${#installs[@]} -eq 0 ] || bash "$TOOLKIT_ROOT/tools/install_voices.sh" "${installs[@]}"
  # Kokoro's own sizes only where it speaks (the generator refuses sizes of an engine
  # it was not given).
  kokoro_opts=()
  case ",$engines," in
    *,kokoro,*) kokoro_opts=(--engine-train-utts "kokoro=$kokoro_utts" --engine-words kokoro=3-6) ;;
  esac
  # $corpus_opts and $outside_opts are split into separate options on purpose.
  # shellcheck disable=SC2086
  python -m toolkit.bin.synth_speaker_data --out-dir "$data" --seed "$seed" --nj "$nj" \
    --num-train-speakers 300 --train-utts "$espeak_utts" \
    --num-dev-speakers 24 --dev-utts 4 --num-test-speakers 40 --test-utts 6 \
    --engines "$engines" --blends "$blends" "${kokoro_opts[@]}" $corpus_opts
  # shellcheck disable=SC2086
  python -m toolkit.bin.synth_speaker_data --out-dir "$data/outside" --test-only \
    --seed "$seed" --nj "$nj" --num-test-speakers 40 --test-utts "$outside_utts" \
    --engines "$outside_engines" $outside_opts
  # What a wake-word gate hears: about a second and a half of speech, in noise.
  python -m toolkit.bin.make_noisy_crops "$data/outside/test" "$data/outside_short/test" \
    --seconds "$short_seconds" --noise white,pink --snr-db "$short_snr_db" --seed "$seed"
  for x in train dev test outside/test outside_short/test; do
    utils/validate_data_dir.sh --no-audio "$data/$x"
  done
fi

if [ "$stage" -le 1 ] && [ "$stop_stage" -ge 1 ]; then
  echo "stage 1: speaker inventory, data lists, fbank of train and dev"
  python -m toolkit.bin.make_inventory "$data/dict/speakers.txt" --utt2spk "$data/train/utt2spk"
  python -m toolkit.bin.make_datalist "$data/train" "$data/train/data.list" \
    --inventory "$data/dict/speakers.txt" --label-mode speaker --nj "$nj"
  # The labels of the audio list: the inventory before the speed copies join it below.
  cp "$data/dict/speakers.txt" "$data/dict/speakers_audio.txt"
  for x in dev outside/test outside_short/test; do
    # Speakers outside training are labelled against their own list.
    python -m toolkit.bin.make_inventory "$data/$x/speakers.txt" --utt2spk "$data/$x/utt2spk"
    python -m toolkit.bin.make_datalist "$data/$x" "$data/$x/data.list" \
      --inventory "$data/$x/speakers.txt" --label-mode speaker --nj "$nj"
  done
  if [ "$train_input" = fbank ]; then
    # Speed-perturbed copies of every training utterance, each copy a new speaker: three
    # times the voices for the same synthesis (the inventory is rewritten with the copies).
    python -m toolkit.bin.compute_feats "$data/train/data.list" "$data/train/fbank" \
      --config "$config" --nj "$nj" --speed-copies "$speed_copies"
    python -m toolkit.bin.make_inventory "$data/dict/speakers.txt" \
      --data-list "$data/train/fbank/data.list" --relabel
    python -m toolkit.bin.compute_feats "$data/dev/data.list" "$data/dev/fbank" \
      --config "$config" --nj "$nj"
  else
    python -m toolkit.bin.synth_augment_data --out-dir "$data/aug" --num-rirs "$num_rirs" \
      --num-noise "$num_noise" --babble-list "$data/train/data.list" --seed "$seed"
  fi
fi

# Stage 2 is unused: no global CMVN, the speaker models normalise each utterance.

if [ "$stage" -le 3 ] && [ "$stop_stage" -ge 3 ]; then
  echo "stage 3: training in $exp"
  if [ "$train_input" = fbank ]; then
    inputs=(--train-data "$data/train/fbank/data.list" --dev-data "$data/dev/fbank/data.list"
            --inventory "$data/dict/speakers.txt")
  else
    inputs=(--train-data "$data/train/data.list" --dev-data "$data/dev/data.list"
            --inventory "$data/dict/speakers_audio.txt"
            "dataset.reverb.rir_list=$data/aug/rirs.list"
            "dataset.noise.noise_list=$data/aug/noise.list")
  fi
  # $train_overrides is split into separate key=value words on purpose.
  # shellcheck disable=SC2086
  utils/torchrun.sh "$gpus" "$num_procs" "$num_nodes" "$node_rank" "$rdzv_endpoint" \
    -m toolkit.bin.train --config "$config" --exp-dir "$exp" "${inputs[@]}" $train_overrides
fi

if [ "$stage" -le 4 ] && [ "$stop_stage" -ge 4 ]; then
  echo "stage 4: averaging the last $average_num checkpoints"
  python -m toolkit.bin.average_model --exp-dir "$exp" --output "$exp/avg_$average_num.pt" \
    --num "$average_num" --mode last
fi

if [ "$stage" -le 5 ] && [ "$stop_stage" -ge 5 ]; then
  echo "stage 5: export"
  python -m toolkit.bin.export_model --checkpoint "$exp/avg_$average_num.pt" --exp-dir "$exp" \
    --out-dir "$exp/export" --test-data "$data/outside/test/data.list"
fi

if [ "$stage" -le 6 ] && [ "$stop_stage" -ge 6 ]; then
  echo "stage 6: embeddings and scoring of every outside trial list"
  # The AS-Norm cohort: training speakers' means over their first utterances.
  awk -v n="$cohort_utts_per_spk" 'match($0, /"spk": "[^"]*"/) {
      s = substr($0, RSTART, RLENGTH); if (++count[s] <= n) print }' \
    "$data/train/data.list" > "$data/train/cohort.list"
  for part in outside:"$data/outside/test/data.list" \
              outside_short:"$data/outside_short/test/data.list"; do
    rm -rf "$exp/embeddings/${part%%:*}"
    python -m toolkit.bin.extract_embeddings --model "$exp/export/model.onnx" \
      --data-list "${part#*:}" --out-dir "$exp/embeddings/${part%%:*}" --nj "$nj"
  done
  # The cohort ships with the model (stage 8): AS-Norm wherever the encoder is used.
  rm -rf "$exp/embeddings/cohort"
  python -m toolkit.bin.extract_embeddings --model "$exp/export/model.onnx" \
    --data-list "$data/train/cohort.list" --out-dir "$exp/embeddings/cohort" --nj "$nj" \
    --cohort-out "$exp/export/cohort.safetensors"
  mkdir -p "$exp/score"
  : > "$exp/score/summary.txt"
  # Score names as tools/benchmarks/resemblyzer_compare.py gives them (stage 7).
  for set in outside outside_short; do
    dir=$data/$set/test
    for t in "$dir"/trials "$dir"/trials_*; do
      # trials_<engine> exist only with several outside engines: an unmatched glob stays
      # literal, so score only the lists that are there.
      [ -f "$t" ] || continue
      list=$(basename "$t")
      [ "$set" = outside ] || list=${set}_$list
      python -m toolkit.bin.score_speaker --trials "$t" \
        --embeddings "$exp/embeddings/$set/embeddings.scp" \
        --cohort "$exp/embeddings/cohort/speaker_embeddings.scp" --as-norm-top "$as_norm_top" \
        --out-dir "$exp/score/$list" --name "$name ${set}_$(basename "$t")" > /dev/null
      cat "$exp/score/$list/summary.txt" >> "$exp/score/summary.txt"
    done
  done
  cat "$exp/score/summary.txt"
fi

if [ "$stage" -le 7 ] && [ "$stop_stage" -ge 7 ]; then
  echo "stage 7: Resemblyzer (GE2E, real speech) on the same lists, scored the same way"
  bash "$TOOLKIT_ROOT/tools/install_resemblyzer.sh"
  python "$TOOLKIT_ROOT/tools/benchmarks/resemblyzer_compare.py" --data "$data" \
    --test-sets "outside/test outside_short/test" --cohort-dir "$data/train" \
    --cohort-utts-per-spk "$cohort_utts_per_spk" --as-norm-top "$as_norm_top" \
    --exp "$exp" --out-dir "$exp/resemblyzer" --nj "$nj"
fi

if [ "$stage" -le 8 ] && [ "$stop_stage" -ge 8 ]; then
  # The shipped model in the checkout is replaced only when asked (--ship true); by
  # default the package is this run's own output under $exp, replaced on a rerun; a
  # --pretrained-root that already holds $name is refused by the packager.
  if [ "$ship" = true ]; then
    package_opts=(--overwrite)
    where="the shipped toolkit/pretrained/$name (replacing it)"
  elif [ -z "$pretrained_root" ]; then
    package_opts=(--out-root "$exp/pretrained" --overwrite)
    where="$exp/pretrained/$name"
  else
    package_opts=(--out-root "$pretrained_root")
    where="$pretrained_root/$name"
  fi
  echo "stage 8: packaging $name into $where"
  python -m toolkit.bin.package_pretrained --export-dir "$exp/export" --name "$name" \
    "${package_opts[@]}" \
    --card "$card" --summary "$exp/score/summary.txt" \
    --set-file "comparison=$exp/resemblyzer/results.md" \
    --set "blends=$blends" --set "kokoro_utts=$kokoro_utts" --set "espeak_utts=$espeak_utts" \
    --set "num_rirs=$num_rirs" --set "short_seconds=$short_seconds" --set "short_snr_db=$short_snr_db" \
    --set "train_log=$(grep -h 'training finished' "$exp/log/train.rank0.log" | tail -1 | sed 's/.*training finished: //')"
fi
