"""Encode audio to discrete codes, and decode codes back to audio, with an exported codec
(the export dir that toolkit.bin.export_model writes for a codec experiment).

  python -m toolkit.bin.codec encode --model exp/codec/export in.wav out.codes
  python -m toolkit.bin.codec decode --model exp/codec/export out.codes decoded.wav
  python -m toolkit.bin.codec encode --pretrained codec-voicebank-v2 in.wav out.codes
  python -m toolkit.bin.codec encode --model pretrained:codec-voicebank-v2 --n-q 4 in.wav low.codes

--pretrained NAME (or --model pretrained:NAME) uses a codec shipped with the toolkit
(toolkit/pretrained/NAME: weights and model card; its weights are checked against the
card's sha256 first) instead of an export dir.

The codes file is an .npz: codes int16 (n_q, frames), the sample rate, hop and length of
the decoded audio, and the fingerprint of the model's weights; decode refuses codes of
another model, and a file cut short or damaged, in one line. `encode --n-q K` keeps the
first K codebooks of the residual quantizer (K/n_codebooks of the bitrate); decode takes
codes of any 1..n_codebooks codebooks. NaN or infinite samples are refused; silence is
encoded. The decoded WAV (16-bit, the codec's output rate) has the encoded
file's duration. Causal models run chunk by chunk (--chunk-seconds), so memory stays
constant however long the file; non-causal models process whole files. Audio at another
rate than the encoder's (a codec may encode 16 kHz and decode 24 kHz: its export's
encoder_sample_rate and sample_rate) is resampled first (whole file); several channels are
averaged.
"""
import argparse
import logging
import sys

from toolkit.errors import cli
from toolkit.logging_utils import setup_logging

logger = logging.getLogger("codec")


def get_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    common = argparse.ArgumentParser(add_help=False)
    which = common.add_mutually_exclusive_group(required=True)
    which.add_argument("--model", help="codec export dir (encoder/decoder .onnx and .zip) "
                       "or pretrained:NAME")
    which.add_argument("--pretrained", metavar="NAME",
                       help="a codec shipped with the toolkit (toolkit/pretrained/NAME)")
    common.add_argument("--backend", choices=("onnx", "torch", "safetensors"), default="onnx",
                        help="with --model: onnx: onnxruntime on the .onnx graphs; torch: the "
                        "TorchScript .zip graphs; safetensors: PyTorch modules built from "
                        "model.safetensors (default: %(default)s; --pretrained always uses "
                        "safetensors)")
    common.add_argument("--chunk-seconds", type=float, default=1.0,
                        help="causal models: audio per processing step (rounded to whole "
                        "code frames; default: %(default)s)")
    common.add_argument("--threads", type=int, default=1, help="CPU threads (default: 1)")
    sub = p.add_subparsers(dest="command", required=True, metavar="{encode,decode}")
    enc = sub.add_parser("encode", parents=[common], help="audio file -> codes file",
                         description="Audio file -> codes file (.npz).")
    enc.add_argument("--n-q", type=int, default=None, metavar="K",
                     help="keep the first K codebooks: a lower bitrate (default: all)")
    enc.add_argument("input", help="audio file (WAV, FLAC, ...)")
    enc.add_argument("output", help="codes file to write")
    dec = sub.add_parser("decode", parents=[common], help="codes file -> 16-bit WAV",
                         description="Codes file -> 16-bit WAV at the codec's output rate.")
    dec.add_argument("input", help="codes file written by `encode`")
    dec.add_argument("output", help="WAV file to write")
    return p.parse_args(argv)


@cli
def main(argv=None):
    args = get_args(argv)
    setup_logging()
    from toolkit.pretrained import PREFIX
    from toolkit.tasks.codec.runtime import decode_file, encode_file, open_codec
    # open_codec resolves pretrained:NAME as every other model argument does.
    codec = open_codec(PREFIX + args.pretrained if args.pretrained else args.model,
                       args.backend, args.threads)
    if args.command == "encode":
        info = encode_file(codec, args.input, args.output, args.chunk_seconds, args.n_q)
        logger.info("%s: %.2f s -> %d frames x %d codebooks (%g kbit/s) -> %s", args.input,
                    info["seconds"], info["frames"], info["n_q"],
                    codec.bitrate_at(info["n_q"]) / 1000, args.output)
    else:
        info = decode_file(codec, args.input, args.output, args.chunk_seconds)
        logger.info("%s: %d frames x %d codebooks -> %.2f s -> %s", args.input,
                    info["frames"], info["n_q"], info["seconds"], args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
