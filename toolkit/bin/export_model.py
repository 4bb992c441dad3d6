"""Export a trained checkpoint to deployable files, each checked against PyTorch on real
test utterances (a mismatch above --tolerance fails). What is written depends on the
experiment's task: keyword models as a streaming graph (model.zip TorchScript,
model.onnx, model.safetensors + config.json), speaker models as an embedding extractor,
codecs as encoder and decoder graphs.

A pretrained model shipped with the toolkit (toolkit/pretrained/NAME) is exported the same
way from its weights (speaker encoders, codecs and phone front ends alike): --pretrained
NAME --out-dir DIR [--test-data LIST]; without a test list the parity check runs on seeded
random features (a phone front end: the fbank of seeded noise).

  python -m toolkit.bin.export_model --checkpoint exp/ecapa/avg_3.pt --exp-dir exp/ecapa \\
      --out-dir exp/ecapa/export --test-data data/test/data.list
  python -m toolkit.bin.export_model --pretrained ecapa-voicebank-v1 --out-dir exp/pretrained
"""
import argparse
import logging
import sys

from toolkit.errors import ConfigError, cli
from toolkit.logging_utils import setup_logging

logger = logging.getLogger("export_model")


def get_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--checkpoint", help="training or averaged checkpoint (.pt)")
    which.add_argument("--pretrained", metavar="NAME",
                       help="a shipped pretrained model (toolkit/pretrained/NAME)")
    p.add_argument("--exp-dir", help="experiment dir (config.yaml, inventory.txt); "
                   "needed with --checkpoint")
    p.add_argument("--out-dir", required=True)
    p.add_argument("--test-data", help="data list whose audio checks parity (needed with "
                   "--checkpoint; with --pretrained random features serve without it)")
    p.add_argument("--num-check", type=int, default=20, help="utterances used for the check")
    p.add_argument("--tolerance", type=float, default=1e-4)
    p.add_argument("--threshold", type=float, default=None,
                   help="keyword models: recommended detection threshold stored in the metadata")
    return p.parse_args(argv)


@cli
def main(argv=None):
    args = get_args(argv)
    if args.checkpoint and not (args.exp_dir and args.test_data):
        raise ConfigError("--checkpoint needs --exp-dir and --test-data")
    setup_logging()
    import torch
    # Small streaming calls: extra threads only add contention.
    torch.set_num_threads(1)
    import toolkit.tasks  # noqa: F401  (registers every task)
    from toolkit.config import TASKS
    if args.pretrained:
        from toolkit import pretrained
        weights = pretrained.weights(args.pretrained)
        task_name = pretrained.metadata(args.pretrained).get("task", "")
        if task_name not in TASKS:
            raise ConfigError(f"{weights}: config.json names task '{task_name}', not one of "
                              f"{', '.join(TASKS.names())}")
        from toolkit.task import Task
        if TASKS.get(task_name).export_weights.__func__ is Task.export_weights.__func__:
            raise ConfigError(f"pretrained model '{args.pretrained}' (task {task_name}): this "
                              "task exports from a checkpoint only (--checkpoint)")
        worst = TASKS.get(task_name).export_weights(weights, args.out_dir, args.test_data,
                                                    args.num_check, args.tolerance)
        logger.info("exported %s to %s: %s", args.pretrained, args.out_dir,
                    ", ".join(f"{k} max diff {v:.2e}" for k, v in worst.items()))
        return 0
    from toolkit.trainer.experiment import load_exp_config, read_exp_inventory
    cfg = load_exp_config(args.exp_dir)
    task_cls = TASKS.get(cfg.task.type)
    inventory = read_exp_inventory(args.exp_dir) if task_cls.needs_inventory else None
    task = task_cls(cfg, inventory)
    worst = task.export(args.checkpoint, args.out_dir, args.test_data,
                        num_check=args.num_check, tolerance=args.tolerance,
                        threshold=args.threshold)
    logger.info("exported to %s: %s", args.out_dir,
                ", ".join(f"{k} max diff {v:.2e}" for k, v in worst.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
