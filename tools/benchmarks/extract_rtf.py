"""Real-time factor of speaker-embedding extraction on ONE CPU core: WAV -> fbank ->
embedding, as toolkit.tasks.speaker.embed.Embedder does it, for ResNet34 and ECAPA-TDNN
C=512 and C=1024 (80 bins; random weights unless --checkpoint), through PyTorch and
through the exported ONNX graph. RTF = processing seconds / audio seconds, median over
--repeats passes of the WAVs, by the wall clock and by the process's CPU time (what a
machine shared with other jobs still measures fairly); the fbank share is shown apart.

  python tools/benchmarks/extract_rtf.py --wav-list data/test/data.list --max-wavs 20
  python tools/benchmarks/extract_rtf.py --wavs a.wav b.wav --models resnet34
"""
import argparse
import json
import os
import statistics
import sys
import tempfile
import time

# One core: set before numpy/torch/onnxruntime start their thread pools.
for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import torch  # noqa: E402

MODELS = {
    "resnet34": {"type": "resnet", "embed_dim": 256, "num_blocks": [3, 4, 6, 3],
                 "base_channels": 32},
    "ecapa_c512": {"type": "ecapa_tdnn", "embed_dim": 192, "channels": 512},
    "ecapa_c1024": {"type": "ecapa_tdnn", "embed_dim": 192, "channels": 1024},
}


def get_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--wavs", nargs="*", default=[], help="WAV files")
    p.add_argument("--wav-list", help="data list whose `wav` entries are used")
    p.add_argument("--max-wavs", type=int, default=20)
    p.add_argument("--models", default=",".join(MODELS), help="comma list of " + ",".join(MODELS))
    p.add_argument("--checkpoint", help="a trained checkpoint (.pt) instead of the random models")
    p.add_argument("--bins", type=int, default=80)
    p.add_argument("--repeats", type=int, default=3)
    return p.parse_args(argv)


def load_waves(args, rate=16000):
    from toolkit.data.augment import load_mono
    paths = list(args.wavs)
    if args.wav_list:
        with open(args.wav_list, encoding="utf-8") as f:
            paths += [json.loads(line)["wav"] for line in f if line.strip()]
    paths = paths[:args.max_wavs]
    if not paths:
        raise SystemExit("give --wavs or --wav-list")
    return [load_mono(p, rate) for p in paths]


def systems(args, tmp):
    """(name, model, fbank metadata) of each model to measure."""
    from toolkit.data.features import fbank_metadata, fbank_options
    from toolkit.tasks.speaker.embed import model_from_checkpoint
    from toolkit.tasks.speaker.models import SPEAKER_MODELS, build_speaker_model
    if args.checkpoint:
        model, cfg = model_from_checkpoint(args.checkpoint)
        f = cfg["dataset"]["feature"]
        yield os.path.basename(args.checkpoint), model, fbank_metadata(fbank_options(
            f["num_mel_bins"], f["frame_length_ms"], f["frame_shift_ms"], 0.0,
            cfg["dataset"]["sample_rate"]))
        return
    for name in args.models.split(","):
        torch.manual_seed(0)
        cfg = dict(MODELS[name], input_dim=args.bins)
        model = build_speaker_model(SPEAKER_MODELS.get(cfg["type"]).Config(**cfg)).eval()
        yield name, model, fbank_metadata(fbank_options(args.bins, 25.0, 10.0, 0.0, 16000))


def timed(fn, repeats):
    """(wall, CPU) seconds of fn, medians over `repeats` calls."""
    walls, cpus = [], []
    for _ in range(repeats):
        wall, cpu = time.perf_counter(), time.process_time()
        fn()
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    return statistics.median(walls), statistics.median(cpus)


def main(argv=None) -> int:
    args = get_args(argv)
    torch.set_num_threads(1)
    from toolkit import export as writers
    from toolkit.export import onnx_runner, torch_runner
    from toolkit.tasks.speaker.embed import Embedder, build_metadata
    waves = load_waves(args)
    audio_s = sum(len(w) for w in waves) / 16000
    print(f"{len(waves)} WAVs, {audio_s:.1f} s of audio; one thread; median of {args.repeats}")
    with tempfile.TemporaryDirectory() as tmp:
        for name, model, fbank in systems(args, tmp):
            meta = build_metadata(model, fbank)
            path = os.path.join(tmp, f"{name}.onnx")
            writers.export_onnx(model, (torch.randn(1, 120, model.config.input_dim),), path,
                                ["feats"], ["embedding"],
                                {"feats": {0: "batch", 1: "frames"}, "embedding": {0: "batch"}},
                                meta)
            runners = {"pytorch": Embedder(torch_runner(model), meta),
                       "onnx": Embedder(onnx_runner(path, 1), meta)}
            feats = [runners["onnx"].features(w) for w in waves]
            fbank = timed(lambda: [runners["onnx"].features(w) for w in waves], args.repeats)
            params = sum(p.numel() for p in model.parameters()) / 1e6
            for backend, embedder in runners.items():
                embedder.embed_features(feats[0])            # warm-up
                net = timed(lambda: [embedder.embed_features(f) for f in feats], args.repeats)
                wall, cpu = fbank[0] + net[0], fbank[1] + net[1]
                print(f"{name:>12} ({params:5.2f} M) {backend:>7}: RTF {wall / audio_s:.4f} wall, "
                      f"{cpu / audio_s:.4f} CPU (fbank {fbank[1] / audio_s:.4f}, network "
                      f"{net[1] / audio_s:.4f} CPU); {audio_s / cpu:.0f}x real time per core")
    return 0


if __name__ == "__main__":
    sys.exit(main())
