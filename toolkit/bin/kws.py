"""Detect wake words in WAV files or a live raw-PCM stream, with a trained model or with no
training at all (zero-shot: the keywords' espeak-ng phones searched in the posteriors of
the pretrained phone front end), or with both: a head on phone posteriors fused with that
search (--fuse-zero-shot; threshold `fused_threshold`, stored by the recipe's stage 6).

  python -m toolkit.bin.kws --model exp/ds_tcn/export/model.onnx a.wav b.wav
  arecord -f S16_LE -r 16000 -c 1 -t raw | python -m toolkit.bin.kws --model model.onnx -
  python -m toolkit.bin.kws --keywords "hey jarvis,alexa" a.wav          # zero-shot
  python -m toolkit.bin.kws --keywords "hey jarvis" --calibrate neg/data.list --fa-per-hour 1
  python -m toolkit.bin.kws --model exp/phone_ds_tcn/export/model.onnx --fuse-zero-shot a.wav
  python -m toolkit.bin.kws --keywords "hey jarvis" --enroll me/ --out me.enrol  # your voice
  python -m toolkit.bin.kws --keywords "hey jarvis" --enrolled me.enrol a.wav    # only it wakes

Prints one line per detection: source, keyword, start and end time (s), score. With `-`
it reads 16-bit little-endian mono PCM at the model's sample rate from stdin and reports
detections as they happen (chunks of --chunk-ms). With --calibrate it runs over a data
list of speech without the keywords instead and prints, per keyword, the lowest threshold
that keeps to --fa-per-hour false alarms, counted as detection fires them (every firing
under --refractory-s and --smooth-frames, over the list's hours).

Personal wake word: --enroll embeds the keyword in clips of your voice (3 or more) with a
speaker encoder and writes them and a speaker threshold, calibrated from the clips (and the
encoder's cohort), to --out; --enrolled then keeps only detections in that voice, with the
speaker score as a 6th column.

A file that cannot be scanned (missing, empty, unreadable, NaN samples) is named on stderr
and skipped, the others are scanned, and the exit status is 1; silence is scanned as audio."""
import argparse
import sys

import numpy as np

from toolkit.errors import cli
from toolkit.tasks.kws.enrol import SpeakerGate
from toolkit.tasks.kws.enrol_cli import (add_enrolment_arguments, check_enrolment_arguments,
                                         enrol_to_file)


def get_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", help="model.onnx, model.zip (TorchScript), .safetensors or .pt")
    src.add_argument("--keywords", help="zero-shot: comma-separated keywords (English words "
                     "espeak-ng pronounces), searched in the phone front end's posteriors")
    p.add_argument("--frontend", default="", help="zero-shot: the phone front end, "
                   "pretrained:NAME or a phone_ctc export (default pretrained:phone-voicebank-v2)")
    p.add_argument("--fuse-zero-shot", action="store_true",
                   help="with --model on phone posteriors: score each frame by the geometric "
                        "mean of the model and zero-shot search of its keywords")
    p.add_argument("--threshold", type=float, default=None,
                   help="detection threshold (default: the one stored in the model; zero-shot: "
                        "toolkit.tasks.kws.search.ZERO_SHOT_THRESHOLD)")
    p.add_argument("--calibrate", metavar="DATA_LIST", default="",
                   help="print the thresholds for --fa-per-hour on this list of negative speech "
                        "(JSON lines with wav and duration) instead of detecting")
    p.add_argument("--fa-per-hour", type=float, default=1.0)
    p.add_argument("--chunk-ms", type=float, default=100.0, help="streaming chunk length")
    p.add_argument("--refractory-s", type=float, default=1.0,
                   help="no new detection this long after one")
    p.add_argument("--smooth-frames", type=int, default=1)
    add_enrolment_arguments(p)
    p.add_argument("inputs", nargs="*", help="WAV files, or - for raw PCM on stdin")
    args = p.parse_args(argv)
    check_enrolment_arguments(p, args)
    if not args.inputs and not args.calibrate and not args.enroll:
        p.error("give WAV files (or -) to detect in, --calibrate DATA_LIST, or --enroll CLIPS")
    if args.fuse_zero_shot and not args.model:
        p.error("--fuse-zero-shot fuses a --model with zero-shot search of its keywords")
    if args.keywords is not None:
        args.keywords = [k.strip() for k in args.keywords.split(",") if k.strip()]
        if not args.keywords:
            p.error("--keywords names no keyword (give comma-separated words, e.g. "
                    "\"hey jarvis,alexa\")")
    if args.fa_per_hour <= 0:
        p.error(f"--fa-per-hour must be > 0, got {args.fa_per_hour:g}")
    if args.smooth_frames < 1:
        p.error(f"--smooth-frames must be >= 1, got {args.smooth_frames}")
    return args


def _print(source, det, out):
    speaker = "" if det.speaker_score is None else f"\t{det.speaker_score:.3f}"
    out.write(f"{source}\t{det.keyword_name}\t{det.start_s:.2f}\t{det.end_s:.2f}"
              f"\t{det.score:.3f}{speaker}\n")
    out.flush()


def _refractory_frames(backend, refractory_s: float) -> int:
    return int(round(refractory_s * 1000 / float(backend.metadata["feature"]["frame_shift_ms"])))


@cli
def main(argv=None):
    args = get_args(argv)
    from toolkit.data.audio import BadEntry
    from toolkit.data.augment import load_mono
    from toolkit.tasks.kws.detector import Detector, load_backend
    from toolkit.tasks.kws.search import ZERO_SHOT_THRESHOLD, ZeroShotBackend
    if args.model:
        backend = load_backend(args.model, fuse_zero_shot=args.fuse_zero_shot)
    else:
        backend = ZeroShotBackend(args.keywords, args.frontend)
    if args.calibrate:
        return calibrate(backend, args.calibrate, args.fa_per_hour, args.smooth_frames,
                         _refractory_frames(backend, args.refractory_s))
    threshold = args.threshold
    if threshold is None and not args.model:
        threshold = ZERO_SHOT_THRESHOLD
    gate = SpeakerGate(args.enrolled, encoder=args.speaker_model) if args.enrolled else None
    detector = Detector(backend, threshold, args.smooth_frames,
                        _refractory_frames(backend, args.refractory_s), enrolled=gate)
    if args.enroll is not None:
        print(enrol_to_file(detector, args.enroll, args.out, args.speaker_model, args.context_s))
        return 0
    found, skipped = 0, 0
    for source in args.inputs:
        detector.reset()
        chunk = max(1, int(detector.sample_rate * args.chunk_ms / 1000))
        if source == "-":
            detections = _stream_stdin(detector, chunk)
        else:
            try:
                wave = load_mono(source, detector.sample_rate, allow_silence=True)
            except BadEntry as err:
                sys.stderr.write(f"skipped {source}: {err}\n")
                skipped += 1
                continue
            detections = (det for start in range(0, len(wave), chunk)
                          for det in detector.accept_waveform(wave[start:start + chunk]))
        for det in detections:
            _print(source, det, sys.stdout)
            found += 1
        for det in detector.flush():
            _print(source, det, sys.stdout)
            found += 1
    sys.stderr.write(f"{found} detection(s)"
                     + (f"; {detector.rejected} not in the enrolled voice" if gate else "")
                     + (f"; {skipped} of {len(args.inputs)} input(s) skipped"
                        if skipped else "") + "\n")
    return 1 if skipped else 0


def _stream_stdin(detector, chunk: int):
    """Detections as raw 16-bit PCM arrives on stdin."""
    stream = sys.stdin.buffer
    pending = b""
    while True:
        data = stream.read(chunk * 2)
        if not data:
            break
        data = pending + data
        usable = len(data) - len(data) % 2
        pending = data[usable:]
        yield from detector.accept_waveform(np.frombuffer(data[:usable], dtype="<i2"))


def calibrate(backend, data_list: str, fa_per_hour: float, smooth_frames: int,
              refractory_frames: int) -> int:
    from toolkit.data.audio import BadEntry
    from toolkit.data.augment import load_mono
    from toolkit.data.datalist import DataList
    from toolkit.data.features import streaming_extractor
    from toolkit.errors import DataError
    from toolkit.tasks.kws.search import calibrate_threshold
    frontend = streaming_extractor(backend.metadata["feature"])
    rate = int(backend.metadata["feature"]["sample_rate"])
    scores, seconds, skipped = [], 0.0, 0
    entries = DataList.load(data_list, require_label=False)
    for entry in (entries.entry(i) for i in range(len(entries))):
        try:
            wave = load_mono(entry["wav"], rate, allow_silence=True)
        except BadEntry as err:
            sys.stderr.write(f"{data_list}: skipped {entry.get('key', entry['wav'])}: {err}\n")
            skipped += 1
            continue
        backend.reset()
        frontend.reset()
        scores.append(backend.step(frontend.accept(wave)))
        seconds += len(wave) / rate
    if not scores or seconds <= 0:
        raise DataError(f"{data_list}: no negative audio to calibrate on ({len(entries)} entries"
                        + (f", {skipped} skipped" if skipped else "") + ")")
    hours = seconds / 3600.0
    for k, name in enumerate(backend.metadata["keywords"]):
        threshold = calibrate_threshold(scores, hours, fa_per_hour, k, smooth_frames,
                                        refractory_frames)
        # Printed rounded up, so the value a user copies keeps to the budget too.
        shown = np.ceil(threshold * 1e4) / 1e4
        note = "" if shown <= 1.0 else " (above every score: the audio holds the keyword?)"
        print(f"{name}\tthreshold {shown:.4f} for {fa_per_hour:g} FA/h over {len(scores)} "
              f"utterances ({hours:.2f} h){note}")
    if skipped:
        sys.stderr.write(f"{skipped} of {len(entries)} entries skipped\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
