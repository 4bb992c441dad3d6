"""Detect wake words in WAV files or a live raw-PCM stream, with a trained model or with no
training at all (zero-shot: the keywords' espeak-ng phones searched in the posteriors of
the pretrained phone front end), or with both: a head on phone posteriors fused with that
search (--fuse-zero-shot; threshold `fused_threshold`, stored by the recipe's stage 6).

  python -m toolkit.bin.kws --model exp/ds_tcn/export/model.onnx a.wav b.wav
  arecord -f S16_LE -r 16000 -c 1 -t raw | python -m toolkit.bin.kws --model model.onnx -
  python -m toolkit.bin.kws --keywords "hey jarvis,alexa" a.wav          # zero-shot
  python -m toolkit.bin.kws --keywords "hey jarvis" --calibrate neg/data.list --fa-per-hour 1
  python -m toolkit.bin.kws --model exp/phone_ds_tcn/export/model.onnx --fuse-zero-shot a.wav

Prints one line per detection: source, keyword, start and end time (s), score. With `-`
it reads 16-bit little-endian mono PCM at the model's sample rate from stdin and reports
detections as they happen (chunks of --chunk-ms). With --calibrate it runs over a data
list of speech without the keywords instead and prints, per keyword, the lowest threshold
that keeps to --fa-per-hour false alarms (one per utterance at most)."""
import argparse
import sys

import numpy as np

from toolkit.errors import cli


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
    p.add_argument("inputs", nargs="*", help="WAV files, or - for raw PCM on stdin")
    args = p.parse_args(argv)
    if not args.inputs and not args.calibrate:
        p.error("give WAV files (or -) to detect in, or --calibrate DATA_LIST")
    if args.fuse_zero_shot and not args.model:
        p.error("--fuse-zero-shot fuses a --model with zero-shot search of its keywords")
    return args


def _print(source, det, out):
    out.write(f"{source}\t{det.keyword_name}\t{det.start_s:.2f}\t{det.end_s:.2f}\t{det.score:.3f}\n")
    out.flush()


@cli
def main(argv=None):
    args = get_args(argv)
    from toolkit.data.augment import load_mono
    from toolkit.tasks.kws.detector import Detector, load_backend
    from toolkit.tasks.kws.search import ZERO_SHOT_THRESHOLD, ZeroShotBackend
    if args.model:
        backend = load_backend(args.model, fuse_zero_shot=args.fuse_zero_shot)
    else:
        backend = ZeroShotBackend([k.strip() for k in args.keywords.split(",") if k.strip()],
                                  args.frontend)
    if args.calibrate:
        return calibrate(backend, args.calibrate, args.fa_per_hour)
    threshold = args.threshold
    if threshold is None and not args.model:
        threshold = ZERO_SHOT_THRESHOLD
    shift_ms = float(backend.metadata["feature"]["frame_shift_ms"])
    detector = Detector(backend, threshold, args.smooth_frames,
                        int(round(args.refractory_s * 1000 / shift_ms)))
    found = 0
    for source in args.inputs:
        detector.reset()
        chunk = max(1, int(detector.sample_rate * args.chunk_ms / 1000))
        if source == "-":
            stream = sys.stdin.buffer
            pending = b""
            while True:
                data = stream.read(chunk * 2)
                if not data:
                    break
                data = pending + data
                usable = len(data) - len(data) % 2
                pending = data[usable:]
                for det in detector.accept_waveform(np.frombuffer(data[:usable], dtype="<i2")):
                    _print("-", det, sys.stdout)
                    found += 1
        else:
            wave = load_mono(source, detector.sample_rate)
            for start in range(0, len(wave), chunk):
                for det in detector.accept_waveform(wave[start:start + chunk]):
                    _print(source, det, sys.stdout)
                    found += 1
    sys.stderr.write(f"{found} detection(s)\n")
    return 0


def calibrate(backend, data_list: str, fa_per_hour: float) -> int:
    from toolkit.data.augment import load_mono
    from toolkit.data.datalist import DataList
    from toolkit.data.features import streaming_extractor
    from toolkit.tasks.kws.search import calibrate_threshold
    frontend = streaming_extractor(backend.metadata["feature"])
    rate = int(backend.metadata["feature"]["sample_rate"])
    scores, seconds = [], 0.0
    entries = DataList.load(data_list, require_label=False)
    for entry in (entries.entry(i) for i in range(len(entries))):
        wave = load_mono(entry["wav"], rate)
        backend.reset()
        frontend.reset()
        scores.append(backend.step(frontend.accept(wave)))
        seconds += len(wave) / rate
    for k, name in enumerate(backend.metadata["keywords"]):
        threshold = calibrate_threshold(scores, seconds / 3600.0, fa_per_hour, k)
        print(f"{name}\tthreshold {threshold:.4f} for {fa_per_hour:g} FA/h over "
              f"{len(scores)} utterances ({seconds / 3600.0:.2f} h)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
