"""Detect wake words in WAV files or a live raw-PCM stream.

  python -m toolkit.bin.kws --model exp/ds_tcn/export/model.onnx a.wav b.wav
  arecord -f S16_LE -r 16000 -c 1 -t raw | python -m toolkit.bin.kws --model model.onnx -

Prints one line per detection: source, keyword, start and end time (s), score. With `-`
it reads 16-bit little-endian mono PCM at the model's sample rate from stdin and reports
detections as they happen (chunks of --chunk-ms)."""
import argparse
import sys

import numpy as np

from toolkit.errors import cli


def get_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="model.onnx, model.zip (TorchScript) or .pt")
    p.add_argument("--threshold", type=float, default=None,
                   help="detection threshold (default: the one stored in the model)")
    p.add_argument("--chunk-ms", type=float, default=100.0, help="streaming chunk length")
    p.add_argument("--refractory-s", type=float, default=1.0,
                   help="no new detection this long after one")
    p.add_argument("--smooth-frames", type=int, default=1)
    p.add_argument("inputs", nargs="+", help="WAV files, or - for raw PCM on stdin")
    return p.parse_args(argv)


def _print(source, det, out):
    out.write(f"{source}\t{det.keyword_name}\t{det.start_s:.2f}\t{det.end_s:.2f}\t{det.score:.3f}\n")
    out.flush()


@cli
def main(argv=None):
    args = get_args(argv)
    from toolkit.data.augment import load_mono
    from toolkit.tasks.kws.detector import Detector, load_backend
    backend = load_backend(args.model)
    shift_ms = float(backend.metadata["feature"]["frame_shift_ms"])
    detector = Detector(backend, args.threshold, args.smooth_frames,
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


if __name__ == "__main__":
    sys.exit(main())
