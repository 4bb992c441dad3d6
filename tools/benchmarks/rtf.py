"""Real-time factor of the streaming detector on ONE CPU core, features included.

For every causal model type (default configs, 40 mel bins, 1 keyword, random weights)
and every deployment format, a synthetic waveform (noise + tone bursts) is fed in
100 ms chunks through toolkit.detector.Detector (fbank + model + decision rule), as a
microphone loop would. RTF = processing time / audio time; the feature-only RTF
(StreamingFbank alone) shows how much of it the front end takes.

  python tools/benchmarks/rtf.py                         # all models x all formats, 60 s
  python tools/benchmarks/rtf.py --models ds_tcn --formats onnx --seconds 20
  python tools/benchmarks/rtf.py --models ds_tcn --model-option hidden_dim=128
"""
import argparse
import os
import sys
import tempfile
import time

# One core: set before numpy/torch/onnxruntime start their thread pools.
for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

from toolkit.data.features import fbank_metadata, fbank_options  # noqa: E402
from toolkit.tasks.kws.detector import Detector, ModuleBackend, StreamingFbank, load_backend  # noqa: E402
from toolkit.tasks.kws.export import (StreamingScorer, build_metadata, export_onnx,  # noqa: E402
                            export_torchscript)
from toolkit.tasks.kws.models import MODELS, build_model, count_parameters  # noqa: E402

MODEL_TYPES = ["ds_tcn", "tcn", "mdtc", "gru"]
FORMATS = ["pytorch", "torchscript", "onnx"]
RATE = 16000
INPUT_DIM = 40
CHUNK_S = 0.1
THRESHOLD = 0.5


def synthetic_wave(seconds: float, seed: int = 0) -> np.ndarray:
    """Noise plus on/off tone bursts of drifting pitch, float32 in [-1, 1]."""
    rng = np.random.default_rng(seed)
    n = int(seconds * RATE)
    t = np.arange(n) / RATE
    gate = (np.sin(2 * np.pi * 0.7 * t) > 0.3).astype(np.float64)
    pitch = 300 + 200 * np.sin(2 * np.pi * 0.05 * t)
    tone = 0.3 * gate * np.sin(2 * np.pi * np.cumsum(pitch) / RATE)
    return np.clip(tone + 0.03 * rng.standard_normal(n), -1, 1).astype(np.float32)


def build(model_type: str, options=()) -> torch.nn.Module:
    import yaml
    extra = {k: yaml.safe_load(v) for k, v in (o.split("=", 1) for o in options)}
    config = MODELS.get(model_type).Config(type=model_type, input_dim=INPUT_DIM, num_outputs=1,
                                           **extra)
    torch.manual_seed(0)
    return build_model(config).eval()


def make_backend(fmt: str, model: torch.nn.Module, metadata: dict, tmp: str):
    if fmt == "pytorch":
        return ModuleBackend(StreamingScorer(model), metadata)
    name = model.config.type
    if fmt == "torchscript":
        path = os.path.join(tmp, f"{name}.zip")
        export_torchscript(model, path, metadata)
    else:
        path = os.path.join(tmp, f"{name}.onnx")
        export_onnx(model, path, metadata)
    return load_backend(path, threads=1)


def chunks_of(wave: np.ndarray):
    step = int(CHUNK_S * RATE)
    return [wave[i:i + step] for i in range(0, len(wave), step)]


def time_best(run, repeats: int) -> float:
    # The minimum over repeats is the least disturbed by other processes on the core.
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
    return best


def detector_rtf(detector: Detector, chunks, seconds: float, repeats: int) -> float:
    def run():
        detector.reset()
        for c in chunks:
            detector.accept_waveform(c)
    # Warm-up: first calls allocate, and TorchScript's profiling executor optimises the
    # graph only after a couple of runs.
    detector.reset()
    for c in chunks[:20]:
        detector.accept_waveform(c)
    return time_best(run, repeats) / seconds


def feature_rtf(feature: dict, chunks, seconds: float, repeats: int) -> float:
    fbank = StreamingFbank(feature)

    def run():
        fbank.reset()
        for c in chunks:
            fbank.accept(c)
    return time_best(run, repeats) / seconds


def get_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=MODEL_TYPES, choices=MODEL_TYPES)
    p.add_argument("--formats", nargs="+", default=FORMATS, choices=FORMATS)
    p.add_argument("--seconds", type=float, default=60.0, help="audio length streamed")
    p.add_argument("--model-option", action="append", default=[], metavar="KEY=VALUE",
                   help="model config field, e.g. hidden_dim=128 (repeatable)")
    p.add_argument("--repeats", type=int, default=3, help="timed passes; the fastest counts")
    return p.parse_args(argv)


def main(argv=None):
    args = get_args(argv)
    torch.set_num_threads(1)
    torch.set_num_interop_threads(1)
    feature = fbank_metadata(fbank_options(INPUT_DIM, sample_rate=RATE))
    wave = synthetic_wave(args.seconds)
    seconds = len(wave) / RATE
    chunks = chunks_of(wave)
    feat_rtf = feature_rtf(feature, chunks, seconds, args.repeats)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for model_type in args.models:
            model = build(model_type, args.model_option)
            metadata = build_metadata(model, feature, ["keyword"], THRESHOLD)
            for fmt in args.formats:
                detector = Detector(make_backend(fmt, model, metadata, tmp))
                rtf = detector_rtf(detector, chunks, seconds, args.repeats)
                rows.append((model_type, count_parameters(model), fmt, rtf))
                print(f"{model_type} {fmt}: RTF {rtf:.4f}", file=sys.stderr, flush=True)
    print(f"\n{seconds:.0f} s of 16 kHz audio in {CHUNK_S * 1000:.0f} ms chunks, 1 thread, "
          f"best of {args.repeats}\n")
    print("| model | params | format | RTF | feature-only RTF |")
    print("|---|---:|---|---:|---:|")
    for model_type, params, fmt, rtf in rows:
        print(f"| {model_type} | {params:,} | {fmt} | {rtf:.4f} | {feat_rtf:.4f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
