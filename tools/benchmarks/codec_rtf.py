"""Real-time factor of a codec on ONE CPU core: streaming encode + decode, as a call would
run it (20 ms blocks in, codes out, codes in, audio out), and whole-file encode + decode.

RTF = processing seconds / audio seconds. The audio is a data list's utterances (real
speech), or a synthetic vowel when none is given. Threads are pinned to one before numpy,
torch and onnxruntime start their pools.

  python tools/benchmarks/codec_rtf.py --model pretrained:codec-voicebank-v2
  python tools/benchmarks/codec_rtf.py --model exp/codec_v2/export --backend torch \
      --data egs/tts_codec/s0/data/reserved/test/data.list --block-ms 100
"""
import argparse
import json
import os
import time

for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402

from toolkit.tasks.codec.runtime import BACKENDS, open_codec  # noqa: E402


def get_args():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True,
                        help="codec export dir, or pretrained:NAME")
    parser.add_argument("--backend", default="onnx", choices=BACKENDS)
    parser.add_argument("--data", default="", help="data list of utterances (default: a "
                        "synthetic 10 s vowel)")
    parser.add_argument("--max-utts", type=int, default=10)
    parser.add_argument("--block-ms", type=float, default=20.0,
                        help="streaming block: audio in and codes in (default 20 ms = 1 frame)")
    parser.add_argument("--repeats", type=int, default=3, help="best of N passes")
    return parser.parse_args()


def load_waves(path: str, max_utts: int, rate: int):
    if not path:
        t = np.arange(10 * rate) / rate
        vowel = sum(np.sin(2 * np.pi * k * 140.0 * t) / k for k in range(1, 20))
        return [(0.1 * vowel * (0.6 + 0.4 * np.sin(2 * np.pi * 3.0 * t))).astype(np.float32)]
    import soundfile as sf
    waves = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            wave, sr = sf.read(json.loads(line)["wav"], dtype="float32")
            if sr != rate:
                from toolkit.data.audio import resample
                wave = resample(wave, sr, rate)
            waves.append(wave)
            if len(waves) == max_utts:
                break
    return waves


def best_time(run, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return min(times)


def main():
    args = get_args()
    codec = open_codec(args.model, args.backend, threads=1)
    waves = load_waves(args.data, args.max_utts, codec.sample_rate)
    seconds = sum(len(w) for w in waves) / codec.sample_rate
    block = max(1, int(round(args.block_ms / 1000 * codec.encoder_sample_rate)))
    frames = max(1, int(round(args.block_ms / 1000 * codec.encoder_sample_rate / codec.encoder_hop)))

    def whole():
        for w in waves:
            codec.decode(codec.encode(w), len(w))

    def streaming():
        for w in waves:
            codes = np.concatenate(list(codec.encode_chunks(
                w[i:i + block] for i in range(0, len(w), block))), axis=1)
            for _ in codec.decode_chunks(codes[:, i:i + frames]
                                         for i in range(0, codes.shape[1], frames)):
                pass

    whole()                                   # warm-up: graph loading, first-call costs
    print(f"{args.model} ({args.backend}, one thread), {len(waves)} utterances, "
          f"{seconds:.1f} s of audio")
    print(f"whole files: RTF {best_time(whole, args.repeats) / seconds:.4f}")
    if codec.causal:
        print(f"streaming, {args.block_ms:g} ms blocks: RTF "
              f"{best_time(streaming, args.repeats) / seconds:.4f}")


if __name__ == "__main__":
    main()
