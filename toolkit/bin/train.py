"""Train a model of any registered task (toolkit.tasks: keyword spotting, speaker
embeddings, codecs); launch through torchrun (one process per GPU, or gloo ranks on CPU).

Rerunning the same command resumes from the newest valid checkpoint in --exp-dir.
Trailing `section.key=value` arguments override the YAML config (checked like the file).
A task may take input files beyond these options: the config's task declares them
(`inputs` in toolkit/task.py), and they are listed below, per task.

  torchrun --nproc-per-node=2 -m toolkit.bin.train --config conf/ds_tcn.yaml \\
      --exp-dir exp/ds_tcn --train-data data/train/data.list --dev-data data/dev/data.list \\
      --inventory data/dict/classes.txt training.max_epoch=5

  python -m toolkit.bin.train --print-config-reference   # every config key of every task
"""
import argparse
import sys

from toolkit.cli import task_input_options, task_inputs
from toolkit.errors import cli


def get_args(argv=None):
    import toolkit.tasks  # noqa: F401  (registers every task: their inputs are options)
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--print-config-reference", action="store_true",
                   help="print every config key (type, default, what it does) and exit")
    p.add_argument("--config", help="YAML config (task, dataset, optim, training and the "
                   "task's sections; may start from others with `defaults: [...]`)")
    p.add_argument("--exp-dir", help="experiment dir: config, checkpoints, logs")
    p.add_argument("--train-data", help="training data list (sets dataset.train_data)")
    p.add_argument("--dev-data", help="dev data list (sets dataset.dev_data)")
    p.add_argument("--inventory", help="class inventory (keywords, speakers), one name per "
                   "line, line order = class index; required by tasks with classes")
    p.add_argument("--num-gpus", type=int, default=None,
                   help="kept for recipes: GPUs per node (0/-1 = CPU); torchrun's "
                   "LOCAL_WORLD_SIZE is the truth and must agree")
    p.add_argument("--init-checkpoint", help="initialise weights only (sets training.init_checkpoint)")
    p.add_argument("overrides", nargs="*", help="section.key=value config overrides")
    task_input_options(p, argv)
    args = p.parse_args(argv)
    args.task_inputs = task_inputs(args)
    if not args.print_config_reference and not (args.config and args.exp_dir):
        p.error("--config and --exp-dir are required")
    return args


@cli
def main(argv=None):
    args = get_args(argv)
    if args.print_config_reference:
        from toolkit.config import config_reference
        from toolkit.config import TASKS
        sys.stdout.write(config_reference(TASKS.get(n) for n in TASKS.names()))
        return 0
    from toolkit.trainer.run import run_training
    return run_training(args)


if __name__ == "__main__":
    from toolkit.memory import reexec_with_allocator
    reexec_with_allocator()       # host memory: toolkit/memory.py
    sys.exit(main())
