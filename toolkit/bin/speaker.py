"""Are two recordings the same speaker? Cosine score of their embeddings with an exported
extractor (model.onnx / model.zip / model.safetensors), a checkpoint, or a pretrained
encoder shipped with the toolkit (toolkit/pretrained/).

  python -m toolkit.bin.speaker --model exp/resnet/export/model.onnx a.wav b.wav
  python -m toolkit.bin.speaker --pretrained ecapa-voicebank-v1 a.wav b.wav

Prints the score, and `same`/`different` against --threshold (default: the one scoring
stored in the model's metadata, if any)."""
import argparse
import sys

from toolkit.errors import cli


def get_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--model", help="model.onnx, model.zip, model.safetensors or .pt")
    which.add_argument("--pretrained", metavar="NAME", help="a shipped pretrained encoder")
    p.add_argument("--threshold", type=float, default=None)
    p.add_argument("wav_a")
    p.add_argument("wav_b")
    return p.parse_args(argv)


@cli
def main(argv=None):
    args = get_args(argv)
    from toolkit.tasks.speaker.embed import Embedder
    embedder = Embedder.from_path(args.model or "pretrained:" + args.pretrained)
    score = embedder.score(args.wav_a, args.wav_b)
    threshold = args.threshold if args.threshold is not None else embedder.metadata.get("threshold")
    verdict = "" if threshold is None else (" same" if score >= threshold else " different")
    print(f"{score:.4f}{verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
