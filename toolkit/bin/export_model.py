"""Export a checkpoint to TorchScript (model.zip), ONNX (model.onnx) and safetensors
(model.safetensors + config.json), each checked against PyTorch on real test features
(whole utterance and streamed chunk by chunk); a mismatch above --tolerance fails."""
import argparse
import logging
import os
import sys

from toolkit.logging_utils import setup_logging

logger = logging.getLogger("export_model")


def get_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--checkpoint", required=True, help="training or averaged checkpoint (.pt)")
    p.add_argument("--exp-dir", required=True, help="experiment dir (config.yaml, inventory.txt)")
    p.add_argument("--out-dir", required=True)
    p.add_argument("--test-data", required=True, help="data list whose audio checks parity")
    p.add_argument("--num-check", type=int, default=20, help="utterances used for the check")
    p.add_argument("--tolerance", type=float, default=1e-4)
    p.add_argument("--threshold", type=float, default=None,
                   help="recommended detection threshold stored in the metadata")
    return p.parse_args(argv)


def parity_features(test, processor, count: int):
    """Features of `count` test utterances spread over the list; broken entries are
    skipped (and logged) like everywhere else."""
    from toolkit.data.audio import BadEntry
    from toolkit.data.datalist import BadCounter
    bad = BadCounter()
    features = []
    step = max(1, len(test) // max(1, count))
    for i in list(range(0, len(test), step)) + list(range(len(test))):
        if len(features) >= count:
            break
        entry = test.entry(i)
        try:
            features.append(processor(entry, 0))
        except BadEntry as err:
            bad.add(err.reason, entry["key"], err.detail)
    if not features:
        raise RuntimeError(f"no usable utterance in the test list for the parity check "
                           f"({bad.summary()})")
    return features


def main(argv=None):
    args = get_args(argv)
    setup_logging()
    import torch
    # Small streaming calls: extra threads only add contention.
    torch.set_num_threads(1)
    from toolkit.data.datalist import DataList
    from toolkit.data.dataset import UtteranceProcessor
    from toolkit.data.features import fbank_metadata
    from toolkit.export import (build_metadata, check_parity, export_onnx, export_safetensors,
                                export_torchscript, model_from_checkpoint)
    from toolkit.trainer.experiment import load_exp_config, read_exp_inventory

    cfg = load_exp_config(args.exp_dir)
    model = model_from_checkpoint(args.checkpoint)
    processor = UtteranceProcessor(cfg.dataset, seed=0, train=False)
    metadata = build_metadata(model, fbank_metadata(processor.opts),
                              read_exp_inventory(args.exp_dir), args.threshold)
    os.makedirs(args.out_dir, exist_ok=True)
    paths = {"torchscript": os.path.join(args.out_dir, "model.zip"),
             "onnx": os.path.join(args.out_dir, "model.onnx")}
    export_torchscript(model, paths["torchscript"], metadata)
    export_onnx(model, paths["onnx"], metadata)
    export_safetensors(model, os.path.join(args.out_dir, "model.safetensors"), metadata)

    test = DataList.load(args.test_data, require_label=False)
    processor = UtteranceProcessor(cfg.dataset, seed=0, train=False,
                                   from_features=test.has_features())
    features = parity_features(test, processor, args.num_check)
    worst = check_parity(model, paths, features, args.tolerance)
    logger.info("exported to %s: %s", args.out_dir,
                ", ".join(f"{k} max diff {v:.2e}" for k, v in worst.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
