"""Objective quality of an exported codec on a test data list, next to signal-processing
baselines at stated bitrates: mel distance, multi-resolution STFT distance, SI-SDR, STOI
(pystoi, installed by tools/install.sh) and bitrate per system, as a Markdown table
(results.md) and JSON (results.json), plus log-mel spectrograms of one utterance (original,
decoded, each baseline) in spectrograms.png.

  python -m toolkit.bin.evaluate_codec --model exp/codec/export \\
      --test-data data/test/data.list --out-dir exp/codec/eval \\
      --baseline mulaw:8000:8 --baseline melgl:80:50:4

Baselines: mulaw:TARGET_RATE:BITS resamples to TARGET_RATE, mu-law quantises, resamples
back (TARGET_RATE x BITS bit/s; 8000:8 is G.711's 64 kbit/s); melgl:N_MELS:FRAME_RATE:BITS
sends a log-mel spectrogram quantised to BITS per value and decodes it by Griffin-Lim
(FRAME_RATE x N_MELS x BITS bit/s). Neither uses entropy coding.

--n-q K adds a row for the codec with its first K codebooks (K x frame rate x log2(codebook
size) bit/s): residual VQ's lower bitrates of the same codes, decoded through the export's
model.safetensors (the graphs take every codebook).
"""
import argparse
import logging
import sys

from toolkit.errors import cli
from toolkit.logging_utils import setup_logging

logger = logging.getLogger("evaluate_codec")


def _baseline(text: str):
    from toolkit.config import ConfigError
    from toolkit.tasks.codec.evaluate import parse_baseline
    try:
        return parse_baseline(text)
    except ConfigError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def get_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="codec export dir (toolkit.bin.export_model)")
    p.add_argument("--test-data", required=True, help="data list (JSON lines with `wav`)")
    p.add_argument("--out-dir", required=True, help="where results.md/.json/.png go")
    p.add_argument("--backend", choices=("onnx", "torch"), default="onnx",
                   help="graphs to run: onnx (onnxruntime) or torch (TorchScript)")
    p.add_argument("--baseline", action="append", default=[], type=_baseline,
                   metavar="SPEC", help="mulaw:TARGET_RATE:BITS or melgl:N_MELS:FRAME_RATE:BITS "
                   "(repeatable)")
    p.add_argument("--n-q", action="append", default=[], type=int, metavar="K",
                   help="also evaluate the codec with its first K codebooks only (a lower "
                   "bitrate of the same model, trained by quantizer dropout; repeatable)")
    p.add_argument("--max-utts", type=int, default=0,
                   help="evaluate at most this many utterances (0: all)")
    p.add_argument("--plot-key", default="", help="utterance for the spectrogram figure "
                   "(default: the first evaluated)")
    p.add_argument("--threads", type=int, default=1, help="CPU threads (default: 1)")
    return p.parse_args(argv)


@cli
def main(argv=None):
    args = get_args(argv)
    setup_logging()
    from toolkit.tasks.codec.evaluate import evaluate_list, markdown_table, write_report
    from toolkit.tasks.codec.runtime import ExportedCodec
    codec = ExportedCodec(args.model, args.backend, args.threads)
    result = evaluate_list(codec, args.test_data, args.baseline, args.max_utts, args.plot_key,
                           args.n_q)
    paths = write_report(result, args.out_dir)
    sys.stdout.write(markdown_table(result))
    logger.info("wrote %s", ", ".join(paths.values()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
