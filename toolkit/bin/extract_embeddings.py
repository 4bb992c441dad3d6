"""Speaker embeddings of every utterance of a data list, with an exported extractor
(model.onnx / model.zip / model.safetensors), a checkpoint (.pt) or a pretrained encoder
shipped with the toolkit (--pretrained NAME, toolkit/pretrained/): whole utterances,
long ones in chunks whose embeddings are averaged. Writes OUT_DIR/embeddings.{scp,N.ark}
(Kaldi float vectors, kaldiio) and the per-speaker means speaker_embeddings.{ark,scp}.
The list is split into --nj parts extracted in parallel; a rerun skips the parts finished
with the same model, data list and --nj (each part records their sha256), redoing others.

  python -m toolkit.bin.extract_embeddings --model exp/resnet/export/model.onnx \\
      --data-list data/test/data.list --out-dir exp/resnet/embeddings/test --nj 2
  python -m toolkit.bin.extract_embeddings --pretrained ecapa-voicebank-v1 \\
      --data-list data/test/data.list --out-dir exp/pretrained/embeddings/test

With --cohort-out FILE the per-speaker means are also written as an AS-Norm cohort in
safetensors (tensor `embeddings`, speakers x dim; `speakers` in its metadata): put it as
cohort.safetensors beside an export and the packager ships it with the model.
"""
import argparse
import logging
import sys

from toolkit.errors import cli
from toolkit.logging_utils import setup_logging

logger = logging.getLogger("extract_embeddings")


def get_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--model", help="model.onnx, model.zip, model.safetensors or .pt")
    which.add_argument("--pretrained", metavar="NAME",
                       help="a shipped pretrained encoder (toolkit/pretrained/NAME)")
    p.add_argument("--data-list", required=True, help="data list (wav or feat entries)")
    p.add_argument("--out-dir", required=True)
    p.add_argument("--nj", type=int, default=1, help="parallel parts (default %(default)s)")
    p.add_argument("--threads", type=int, default=1, help="threads per part")
    p.add_argument("--cohort-out", default="", metavar="FILE",
                   help="also write the per-speaker means as a safetensors cohort")
    return p.parse_args(argv)


@cli
def main(argv=None):
    args = get_args(argv)
    setup_logging()
    from toolkit.tasks.speaker.embed import extract_embeddings
    model = args.model or "pretrained:" + args.pretrained
    counts = extract_embeddings(model, args.data_list, args.out_dir, max(1, args.nj),
                                args.threads)
    logger.info("wrote %s/embeddings.scp (%d utterances) and speaker_embeddings.scp "
                "(%d speakers)", args.out_dir, counts["utterances"], counts["speakers"])
    if args.cohort_out:
        from toolkit.tasks.speaker.embed import write_cohort
        count = write_cohort(f"{args.out_dir}/speaker_embeddings.scp", args.cohort_out)
        logger.info("wrote the cohort %s (%d speakers)", args.cohort_out, count)
    return 0


if __name__ == "__main__":
    sys.exit(main())
