"""Frame posteriors of a data list through a deployable model (ONNX, TorchScript or a
checkpoint), written as a Kaldi ark (key -> frames x keywords) for scoring. The model
runs in streaming form with its cache, exactly as the detector runs it; --nj workers
share the list (toolkit.tasks.kws.posteriors)."""
import argparse
import logging
import sys

from toolkit.logging_utils import setup_logging
from toolkit.errors import cli

logger = logging.getLogger("compute_posteriors")


def get_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--model", required=True, help="model.onnx, model.zip or checkpoint .pt")
    p.add_argument("--data-list", required=True)
    p.add_argument("--output", required=True, help="posteriors ark to write")
    p.add_argument("--chunk-frames", type=int, default=0,
                   help="frames per model call (0: whole utterance; same result)")
    p.add_argument("--fuse-zero-shot", action="store_true",
                   help="a head on phone posteriors: write the geometric mean of its scores "
                        "and zero-shot search of its keywords (toolkit.tasks.kws.search)")
    p.add_argument("--fusion-components", action="store_true",
                   help="with --fuse-zero-shot: write what the fusion is made of, (T, 3K) "
                        "[head | search | verifier], for choose_fusion")
    p.add_argument("--nj", type=int, default=1,
                   help="worker processes, each on a slice of the list (the ark is the same "
                        "whatever nj)")
    args = p.parse_args(argv)
    if args.nj < 1:
        p.error(f"--nj must be at least 1, got {args.nj}")
    if args.fusion_components and not args.fuse_zero_shot:
        p.error("--fusion-components needs --fuse-zero-shot")
    return args


@cli
def main(argv=None):
    args = get_args(argv)
    setup_logging()
    from toolkit.tasks.kws.posteriors import write_posteriors

    written, bad = write_posteriors(args.model, args.data_list, args.output, args.chunk_frames,
                                    args.fuse_zero_shot, args.fusion_components, args.nj)
    logger.info("wrote %s: %d utterances, %d skipped%s", args.output, written, bad.total(),
                f" ({bad.summary()})" if bad.total() else "")
    return 0


if __name__ == "__main__":
    sys.exit(main())
