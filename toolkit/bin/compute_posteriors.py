"""Frame posteriors of a data list through a deployable model (ONNX, TorchScript or a
checkpoint), written as a Kaldi ark (key -> frames x keywords) for scoring. The model
runs in streaming form with its cache, exactly as the detector runs it."""
import argparse
import logging
import os
import sys

import numpy as np

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
    args = p.parse_args(argv)
    if args.fusion_components and not args.fuse_zero_shot:
        p.error("--fusion-components needs --fuse-zero-shot")
    return args


@cli
def main(argv=None):
    args = get_args(argv)
    setup_logging()
    import kaldiio
    from toolkit.config import dataset_config_from_metadata
    from toolkit.data.audio import BadEntry
    from toolkit.data.datalist import BadCounter, DataList
    from toolkit.data.pipeline import evaluation_pipeline
    from toolkit.tasks.kws.detector import load_backend

    backend = load_backend(args.model, fuse_zero_shot=args.fuse_zero_shot)
    feature = backend.metadata["feature"]
    cfg = dataset_config_from_metadata(feature)    # the model's feature type and options
    datalist = DataList.load(args.data_list, require_label=False)
    processor = evaluation_pipeline(cfg)
    bad = BadCounter()
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    with kaldiio.WriteHelper(f"ark:{args.output}") as writer:
        for i in range(len(datalist)):
            entry = datalist.entry(i)
            try:
                feats = processor.features(entry, 0)
            except BadEntry as err:
                bad.add(err.reason, entry["key"], err.detail)
                continue
            backend.reset()
            chunk = args.chunk_frames or len(feats)
            probs = []
            for s in range(0, len(feats), chunk):
                fused = backend.step(feats[s:s + chunk])
                probs.append(backend.components if args.fusion_components else fused)
            writer(entry["key"], np.concatenate(probs).astype(np.float32))
    logger.info("wrote %s: %d utterances, %d skipped%s", args.output, len(datalist) - bad.total(),
                bad.total(), f" ({bad.summary()})" if bad.total() else "")
    return 0


if __name__ == "__main__":
    sys.exit(main())
