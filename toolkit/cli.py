"""Argument helpers shared by the binaries."""
import argparse
from typing import Dict, List, Optional, Sequence, Tuple


def low_high(kind):
    """An argparse type for `LOW,HIGH` of `kind` (int, float): a clear error otherwise."""
    def parse(text: str):
        try:
            low, high = (kind(x) for x in text.split(","))
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected LOW,HIGH, got {text!r}") from None
        return low, high
    return parse


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
    from toolkit.config import TASKS, ConfigError, apply_overrides, load_yaml, task_class
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
        shared = [f"--{spec.name}" for spec in task.inputs if spec.name in seen]
        note = None
        if not task.inputs:
            note = "none beyond the options above"
        elif len(shared) == len(task.inputs):   # every flag already listed by another task
            note = f"{', '.join(shared)}, as above"
        group = parser.add_argument_group(f"inputs of task {task.name}", note)
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


def parse_with_options_file(parser: argparse.ArgumentParser,
                            argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    """Parses `argv` with `--config FILE` added: a YAML mapping of the parser's own options
    (keys are the long option names, `num-train-pos` or `num_train_pos`) that sets their
    values; an option given on the command line wins over the file. A corpus generator's
    many settings live in a recipe's conf/ file this way, and run.sh passes only what a
    user turns. An unknown key, or a value the option rejects, is an error naming the file
    and the key."""
    from toolkit.config import ConfigError, load_yaml
    parser.add_argument("--config", metavar="YAML",
                        help="a YAML file of this binary's options (long names as keys); "
                             "options on the command line override it")
    probe = argparse.ArgumentParser(add_help=False)
    probe.add_argument("--config")
    known, _ = probe.parse_known_args(argv)
    if known.config:
        try:
            raw = load_yaml(known.config)
        except ConfigError as err:
            parser.error(str(err))
        if not isinstance(raw, dict):
            parser.error(f"{known.config}: expected a mapping of option names to values")
        by_name = {}
        for action in parser._actions:
            for flag in action.option_strings:
                if flag.startswith("--"):
                    by_name[flag[2:].replace("-", "_")] = action
        values, seen = [], {}
        for key, value in raw.items():
            action = by_name.get(str(key).replace("-", "_"))
            if action is not None and action.dest in seen:
                parser.error(f"{known.config}: '{key}' and '{seen[action.dest]}' name the same "
                             "option")
            if action is not None:
                seen[action.dest] = key
            if action is None or action.dest in ("help", "config"):
                parser.error(f"{known.config}: unknown option '{key}' (this binary's options: "
                             f"{', '.join(sorted(k for k in by_name if k not in ('help', 'config')))})")
            flag = next(f for f in action.option_strings if f.startswith("--"))
            if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
                if not isinstance(value, bool):
                    parser.error(f"{known.config}: option '{key}' takes true or false, got {value!r}")
                if value == isinstance(action, argparse._StoreTrueAction):
                    values.append(flag)
                continue
            items = value if isinstance(value, list) and isinstance(
                action, argparse._AppendAction) else [value]
            for item in items:
                values += [flag, "" if item is None else str(item)]
        file_args = _parse_or_name(parser, values, known.config)
        for dest, value in _given(parser, argv).items():
            setattr(file_args, dest, value)      # the command line wins
        file_args.config = known.config
        if missing := [a for a in parser._actions if a.required
                       and getattr(file_args, a.dest) is None]:
            parser.error(f"the following arguments are required: "
                         f"{', '.join('/'.join(a.option_strings) for a in missing)}")
        return file_args
    return parser.parse_args(argv)


def _parse_or_name(parser: argparse.ArgumentParser, values: List[str],
                   path: str) -> argparse.Namespace:
    # Required options may come from the command line only: parse the file's options with
    # the requirement lifted, then restore it.
    required = [a for a in parser._actions if a.required]
    for action in required:
        action.required = False
    error = parser.error
    parser.error = lambda message: error(f"{path}: {message}")
    try:
        return parser.parse_args(values)
    finally:
        parser.error = error
        for action in required:
            action.required = True


_UNSET = object()


def _given(parser: argparse.ArgumentParser, argv) -> dict:
    """The options `argv` itself sets (dest -> value), told apart from defaults."""
    saved = [(a, a.default, a.required) for a in parser._actions]
    for action in parser._actions:
        if action.dest != "help":      # an append action's list starts from None
            action.required = False
            action.default = None if isinstance(action, argparse._AppendAction) else _UNSET
    try:
        args = parser.parse_args(argv)
    finally:
        for action, default, required in saved:
            action.default, action.required = default, required
    appended = {a.dest for a in parser._actions if isinstance(a, argparse._AppendAction)}
    return {k: v for k, v in vars(args).items()
            if v is not _UNSET and not (k in appended and v is None)}
