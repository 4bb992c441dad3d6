"""Writes a shipped pretrained model (toolkit/pretrained/<name>/) from an export: the
weights and config.json copied, the model card rendered from the recipe's template.

The template is Markdown with ``{{key}}`` fields. Filled here: name, sha256, parameters,
size_kb, commit (the checkout's HEAD, marked when the tree has uncommitted changes), date
(UTC), summary (the given summary files' lines); the recipe adds its own (``key=value``).
A field the template names but nobody fills is an error naming its line, so a card never
ships with a hole in it."""
import datetime
import json
import math
import os
import re
import shutil
import subprocess
from typing import Dict, Sequence

from toolkit.errors import ConfigError, DataError, MissingInputError
from toolkit.pretrained import CARD, CONFIG, ROOT, WEIGHTS, _NAME, file_sha256

MAX_BYTES = 10 * 1024 * 1024        # the project's limit per shipped model
AUTO_FIELDS = ("name", "sha256", "parameters", "size_kb", "commit", "date", "summary", "task")
_STATISTICS = ("running_mean", "running_var", "num_batches_tracked")
_FIELD = re.compile(r"\{\{\s*([a-z0-9_]+)\s*\}\}")


def checkout_commit(root: str) -> str:
    """HEAD of the git checkout at `root`, "+ uncommitted changes" when the tracked files
    differ from it; "unknown" outside a checkout."""
    def git(*args):
        return subprocess.run(["git", "-C", root, *args], capture_output=True, text=True,
                              timeout=60)
    head = git("rev-parse", "HEAD")
    if head.returncode != 0:
        return "unknown (not a git checkout)"
    dirty = git("status", "--porcelain", "--untracked-files=no").stdout.strip()
    return head.stdout.strip() + (" + uncommitted changes" if dirty else "")


def parameter_count(weights: str) -> int:
    """Learned values in a safetensors file: every tensor but normalisation statistics."""
    from safetensors import safe_open
    with safe_open(weights, framework="np") as f:
        return sum(math.prod(f.get_slice(key).get_shape()) for key in f.keys()
                   if not key.endswith(_STATISTICS))


def render_card(template: str, values: Dict[str, str]) -> str:
    with open(template, encoding="utf-8") as f:
        lines = f.read().splitlines(keepends=True)
    out = []
    for number, line in enumerate(lines, 1):
        missing = [k for k in _FIELD.findall(line) if k not in values]
        if missing:
            raise ConfigError(f"{template}:{number}: no value for {{{{{missing[0]}}}}} "
                              f"(known: {', '.join(sorted(values))})")
        out.append(_FIELD.sub(lambda m: str(values[m.group(1)]), line))
    return "".join(out)


def package(export_dir: str, name: str, template: str, extra: Dict[str, str],
            summaries: Sequence[str] = (), root: str = ROOT,
            toolkit_root: str = os.path.dirname(os.path.dirname(ROOT)),
            max_bytes: int = MAX_BYTES) -> str:
    """Copies `export_dir`'s model.safetensors + config.json into root/name/ and renders
    the card; returns that directory. Refuses a model over `max_bytes`."""
    if not _NAME.match(name):
        raise ConfigError(f"pretrained model name '{name}': lower case letters, digits, "
                          "'.', '_' and '-' only")
    weights = os.path.join(export_dir, WEIGHTS)
    side = os.path.join(export_dir, CONFIG)
    for path in (weights, side, template, *summaries):
        if not os.path.exists(path):
            raise MissingInputError(f"{path} not found")
    size = os.path.getsize(weights) + os.path.getsize(side)
    if size > max_bytes:
        raise DataError(f"{weights}: {size / 2**20:.2f} MiB with its config, over the "
                        f"{max_bytes / 2**20:.2f} MiB a shipped model may take")
    with open(side, encoding="utf-8") as f:
        meta = json.load(f)
    if not isinstance(meta, dict) or "task" not in meta:
        raise DataError(f"{side}: no `task` in the export's metadata")
    summary = []
    for path in summaries:
        with open(path, encoding="utf-8") as f:
            summary += [line.rstrip("\n") for line in f if line.strip()]
    values = {"name": name, "sha256": file_sha256(weights),
              "parameters": f"{parameter_count(weights):,}",
              "size_kb": f"{os.path.getsize(weights) / 1024:,.0f}",
              "commit": checkout_commit(toolkit_root),
              "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"),
              "summary": "\n".join(summary), "task": meta["task"]}
    assert set(values) == set(AUTO_FIELDS)
    for key, value in extra.items():
        if key in values:
            raise ConfigError(f"card field '{key}' is filled by the packager; choose another")
        values[key] = value
    card = render_card(template, values)
    out = os.path.join(root, name)
    tmp = out + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    shutil.copyfile(weights, os.path.join(tmp, WEIGHTS))
    shutil.copyfile(side, os.path.join(tmp, CONFIG))
    with open(os.path.join(tmp, CARD), "w", encoding="utf-8") as f:
        f.write(card)
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)
    return out
