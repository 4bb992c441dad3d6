"""Command-word scoring: classify every utterance of a data list with a deployable model
(ONNX, TorchScript or a checkpoint .pt) and write accuracy.txt, confusion.txt,
confusion.json, confusion.png and predictions.txt to --out-dir.

The model sees each whole utterance once; features follow the model's own metadata
(sample rate, fbank options), as compute_posteriors does. The predicted class is the
argmax of the class probabilities (frame posteriors of a streaming model are averaged
over frames first). Prints one line: `accuracy 95.31% (1234/1295) over 12 classes`.
"""
import argparse
import logging
import os
import sys

import numpy as np

from toolkit.logging_utils import setup_logging
from toolkit.errors import cli

logger = logging.getLogger("score_commands")


def get_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="model.onnx, model.zip or checkpoint .pt")
    p.add_argument("--data-list", required=True, help="JSON-lines list with class labels")
    p.add_argument("--inventory", required=True,
                   help="class names, one per line; line order is the class index")
    p.add_argument("--out-dir", required=True)
    p.add_argument("--threads", type=int, default=1, help="intra-op threads of the backend")
    return p.parse_args(argv)


def dataset_config_for(feature: dict):
    """DatasetConfig whose fbank matches the exported model's feature metadata."""
    from toolkit.config import DatasetConfig
    cfg = DatasetConfig(sample_rate=int(feature["sample_rate"]))
    cfg.feature.num_mel_bins = int(feature["num_mel_bins"])
    cfg.feature.frame_length_ms = float(feature["frame_length_ms"])
    cfg.feature.frame_shift_ms = float(feature["frame_shift_ms"])
    cfg.feature.dither = float(feature.get("dither", 0.0))
    return cfg


@cli
def main(argv=None):
    args = get_args(argv)
    setup_logging()
    from toolkit.tasks.kws.classification import Skipped, confusion_matrix, summary_line, \
        utterance_probs, write_outputs
    from toolkit.data.audio import BadEntry
    from toolkit.data.datalist import DataList
    from toolkit.data.inventory import read_inventory
    from toolkit.data.pipeline import evaluation_pipeline
    from toolkit.tasks.kws.detector import load_backend

    names = read_inventory(args.inventory)
    backend = load_backend(args.model, threads=args.threads)
    meta = backend.metadata
    model_classes = list(meta.get("keywords") or [])
    if model_classes and len(model_classes) != len(names):
        raise SystemExit(f"error: {args.inventory} has {len(names)} classes but the model was "
                         f"exported with {len(model_classes)} ({', '.join(model_classes)})")
    if model_classes and model_classes != names:
        logger.warning("inventory names differ from the model's class list %s; the inventory's "
                       "line order is taken as the class index", model_classes)
    if int(meta.get("cache_size", 0)) != 0:
        logger.info("streaming model: frame posteriors are averaged over each utterance")

    # Labels are checked here rather than by DataList.load, so that every unscorable
    # utterance is named in this report instead of only in a load warning.
    datalist = DataList.load(args.data_list, require_label=False)
    processor = evaluation_pipeline(dataset_config_for(meta["feature"]))
    skipped = Skipped()
    for reason, n in datalist.bad.counts.items():
        skipped.counts[f"bad list line: {reason}"] += n
        skipped.examples[f"bad list line: {reason}"] = list(datalist.bad.examples.get(reason, []))
    labels, preds, predictions = [], [], []
    for i in range(len(datalist)):
        entry = datalist.entry(i)
        key, label = entry["key"], int(datalist.labels[i])
        if label == -1:
            skipped.add("label -1 or missing (no class)", key)
            continue
        if not 0 <= label < len(names):
            skipped.add(f"label outside the inventory (0..{len(names) - 1})", key)
            continue
        try:
            feats = processor.features(entry, 0)
        except BadEntry as err:
            skipped.add(f"unusable audio: {err.reason}", key)
            continue
        probs = utterance_probs(backend, feats)
        if len(probs) != len(names):
            raise SystemExit(f"error: the model has {len(probs)} outputs but {args.inventory} "
                             f"lists {len(names)} classes")
        pred = int(np.argmax(probs))
        labels.append(label)
        preds.append(pred)
        predictions.append((key, label, pred, float(probs[pred])))
    if skipped.total():
        logger.warning("%d utterances skipped: %s", skipped.total(), "; ".join(skipped.lines()))
    if not labels:
        raise SystemExit(f"error: no utterance of {args.data_list} has a label in the inventory")
    os.makedirs(args.out_dir, exist_ok=True)
    matrix = confusion_matrix(labels, preds, len(names))
    report = write_outputs(args.out_dir, matrix, names, skipped, predictions, model=args.model)
    logger.info("wrote accuracy.txt, confusion.{txt,json,png}, predictions.txt to %s",
                args.out_dir)
    print(summary_line(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
