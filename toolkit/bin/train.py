"""Train a model; launch through torchrun (one process per GPU, or gloo ranks on CPU).

Rerunning the same command resumes from the newest valid checkpoint in --exp-dir.
Trailing `section.key=value` arguments override the YAML config (checked like the file).

  torchrun --nproc-per-node=2 -m toolkit.bin.train --config conf/ds_tcn.yaml \\
      --exp-dir exp/ds_tcn --train-data data/train/data.list --dev-data data/dev/data.list \\
      --inventory data/dict/keywords.txt --cmvn data/train/global_cmvn.json training.max_epoch=5
"""
import argparse
import sys

from toolkit.trainer.run import run_training


def get_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", required=True, help="YAML config (dataset/model/loss/optim/training)")
    p.add_argument("--exp-dir", required=True, help="experiment dir: config, checkpoints, logs")
    p.add_argument("--train-data", help="training data list (sets dataset.train_data)")
    p.add_argument("--dev-data", help="dev data list (sets dataset.dev_data)")
    p.add_argument("--inventory", required=True,
                   help="class/keyword inventory file, one name per line (order = index)")
    p.add_argument("--units", help="CTC unit list (<blank> first; toolkit.bin.make_lexicon): sets "
                   "model.ctc_outputs when the loss has a ctc component, ignored otherwise")
    p.add_argument("--cmvn", help="global CMVN (JSON or Kaldi stats); sets model.cmvn_file")
    p.add_argument("--num-gpus", type=int, default=None,
                   help="GPUs per node the recipe expects (0/-1 = CPU); must match torchrun")
    p.add_argument("--init-checkpoint", help="initialise weights only (sets training.init_checkpoint)")
    p.add_argument("overrides", nargs="*", help="section.key=value config overrides")
    return p.parse_args(argv)


def main(argv=None):
    args = get_args(argv)
    return run_training(args)


if __name__ == "__main__":
    sys.exit(main())
