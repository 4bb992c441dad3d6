"""Export a trained checkpoint to deployable files, each checked against PyTorch on real
test utterances (a mismatch above --tolerance fails). What is written depends on the
experiment's task: keyword models as a streaming graph (model.zip TorchScript,
model.onnx, model.safetensors + config.json), speaker models as an embedding extractor,
codecs as encoder and decoder graphs."""
import argparse
import logging
import sys

from toolkit.errors import cli
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
                   help="keyword models: recommended detection threshold stored in the metadata")
    return p.parse_args(argv)


@cli
def main(argv=None):
    args = get_args(argv)
    setup_logging()
    import torch
    # Small streaming calls: extra threads only add contention.
    torch.set_num_threads(1)
    import toolkit.tasks  # noqa: F401  (registers every task)
    from toolkit.task import TASKS
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
