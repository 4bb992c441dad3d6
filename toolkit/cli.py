"""Argument helpers shared by the binaries."""
import argparse
from typing import Dict, List, Optional, Sequence, Tuple


def path_pairs(parser: argparse.ArgumentParser, paths: Sequence[str],
               names: str) -> List[Tuple[str, str]]:
    """INPUT OUTPUT INPUT OUTPUT ... as (input, output) pairs: one binary start serves a
    recipe's every set. An odd count is a usage error naming the expected `names`."""
    if len(paths) % 2:
        parser.error(f"expected {names} pairs, got an odd number of paths ({len(paths)})")
    return list(zip(paths[::2], paths[1::2]))


def task_input_options(parser: argparse.ArgumentParser, argv: Optional[Sequence[str]]) -> None:
    """Adds the inputs tasks declare (toolkit.task.Task.inputs) to a training parser, one
    group per task: those of the task the --config names (and task.type=... overrides),
    or of every registered task for --help or when that task cannot be read (the config's
    own error is then reported by the resolution, not as an unknown option). Their values
    land in `args.task_inputs` (name -> path, given ones only)."""
    from toolkit.config import ConfigError, apply_overrides, load_yaml
    from toolkit.task import TASKS, task_class
    probe = argparse.ArgumentParser(add_help=False)
    probe.add_argument("--config")
    probe.add_argument("-h", "--help", action="store_true")
    probe.add_argument("--print-config-reference", action="store_true")
    known, rest = probe.parse_known_args(argv)
    tasks = None
    if known.config and not (known.help or known.print_config_reference):
        try:
            raw = apply_overrides(load_yaml(known.config),
                                  [a for a in rest if a.startswith("task.type=")])
            tasks = [task_class(raw)]
        except (ConfigError, KeyError):
            tasks = None
    if tasks is None:
        tasks = [TASKS.get(name) for name in TASKS.names()]
    seen: Dict[str, str] = {}          # flag name -> argparse dest
    for task in tasks:
        group = parser.add_argument_group(
            f"inputs of task {task.name}",
            None if task.inputs else "none beyond the options above")
        for spec in task.inputs:
            if spec.name in seen:       # another task declared the flag first
                continue
            seen[spec.name] = group.add_argument(
                f"--{spec.name}", metavar="PATH", default=None,
                help=f"{spec.help} (sets {spec.fills})").dest
    parser.set_defaults(task_input_dests=seen)


def task_inputs(args: argparse.Namespace) -> Dict[str, str]:
    """The declared inputs given on the command line (name -> path)."""
    dests = getattr(args, "task_input_dests", {})
    return {name: getattr(args, dest) for name, dest in dests.items()
            if getattr(args, dest) is not None}
