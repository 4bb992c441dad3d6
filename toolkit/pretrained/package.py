"""Writes a shipped pretrained model (toolkit/pretrained/<name>/) from an export: the
weights and config.json copied, the model card rendered from the recipe's template.

The template is Markdown with ``{{key}}`` fields. Filled here: name, sha256 (the weights'),
config_sha256, parameters, size_kb, commit (the checkout's HEAD, marked when the tree has
uncommitted changes), date (UTC), summary (the given summary files' lines); the recipe adds
its own (``key=value``). A field the template names but nobody fills is an error naming its
line, so a card never ships with a hole in it; the digest lines a model needs to load are
added when the template lacks them, so a card never ships without them.

A model dir is replaced, never deleted first: the new one is staged under a hidden name,
the old one renamed aside, the new one renamed in, the old one removed. A packaging that
dies between the two renames leaves the old model aside, and the next packaging of that
name puts it back before anything else."""
import datetime
import json
import math
import os
import re
import shutil
import subprocess
from typing import Dict, Sequence

from toolkit.errors import ConfigError, DataError, MissingInputError
from toolkit.pretrained import (CARD, CONFIG, DIGESTED, OPTIONAL, ROOT, STAGING_SUFFIXES,
                                WEIGHTS, _NAME, _aside, card_lines, file_sha256)

MAX_BYTES = 10 * 1024 * 1024        # the project's limit per shipped model
AUTO_FIELDS = ("name", "sha256", "config_sha256", "parameters", "size_kb", "commit", "date",
               "summary", "task")
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


def with_digest_lines(card: str, digests: Dict[str, str], template: str) -> str:
    """`card` with one `sha256 (FILE): `HEX`` line per file of `digests` (the lines a model
    needs to load): a missing one is added after the weights' line (or at the end); a
    line stating another digest is an error naming the template."""
    found = card_lines(card)
    for filename, digest in digests.items():
        if any(d != digest for d in found[filename]) or len(found[filename]) > 1:
            raise ConfigError(f"{template}: states sha256 ({filename}) other than the file's "
                              f"{digest} (write `{{{{sha256}}}}` / `{{{{config_sha256}}}}`)")
    missing = "".join(f"sha256 ({f}): `{d}`\n" for f, d in digests.items() if not found[f])
    if not missing:
        return card
    anchor = re.search(r"^sha256 \(model\.safetensors\).*\n", card, re.M)
    if anchor:
        return card[:anchor.end()] + missing + card[anchor.end():]
    return card.rstrip("\n") + "\n\n" + missing


def _restore_aside(root: str, name: str) -> None:
    """A packaging that died after renaming the old model aside: put it back."""
    out, aside = os.path.join(root, name), _aside(root, name)
    if os.path.isdir(aside):
        if os.path.exists(out):
            shutil.rmtree(aside)            # the new one made it in: the old is garbage
        else:
            os.replace(aside, out)


def install_dir(staged: str, out: str, aside: str) -> None:
    """Replaces the directory `out` with `staged` so that `out` always holds a complete
    model: old renamed aside, new renamed in (the old put back if that fails), old removed."""
    had_old = os.path.exists(out)
    if had_old:
        os.replace(out, aside)
    try:
        os.replace(staged, out)
    except BaseException:
        if had_old:
            os.replace(aside, out)
        raise
    if had_old:
        shutil.rmtree(aside, ignore_errors=True)


def package(export_dir: str, name: str, template: str, extra: Dict[str, str],
            summaries: Sequence[str] = (), root: str = ROOT,
            toolkit_root: str = os.path.dirname(os.path.dirname(ROOT)),
            max_bytes: int = MAX_BYTES, overwrite: bool = False) -> str:
    """Copies `export_dir`'s model.safetensors + config.json (and the OPTIONAL files it
    holds, e.g. a speaker encoder's cohort.safetensors) into root/name/ and renders
    the card; returns that directory. Refuses a model over `max_bytes`, and a name already
    shipped unless `overwrite` (a recipe rerun must not replace a shipped model unasked)."""
    if not _NAME.match(name) or name.endswith(STAGING_SUFFIXES):
        raise ConfigError(f"pretrained model name '{name}': lower case letters, digits, "
                          f"'.', '_' and '-' only, not ending in {' or '.join(STAGING_SUFFIXES)}")
    out = os.path.join(root, name)
    if os.path.isdir(root):
        _restore_aside(root, name)
    if os.path.exists(out) and not overwrite:
        raise ConfigError(f"{out} exists: package under a new name, or pass --overwrite "
                          "(overwrite=True) to replace it")
    weights = os.path.join(export_dir, WEIGHTS)
    side = os.path.join(export_dir, CONFIG)
    for path in (weights, side, template, *summaries):
        if not os.path.exists(path):
            raise MissingInputError(f"{path} not found")
    size = sum(os.path.getsize(os.path.join(export_dir, f)) for f in DIGESTED + OPTIONAL
               if os.path.exists(os.path.join(export_dir, f)))
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
    os.makedirs(root, exist_ok=True)
    # A hidden name (it fails _NAME): never listed as a model, whatever it holds.
    staged = os.path.join(root, f".{name}.staging")
    shutil.rmtree(staged, ignore_errors=True)
    os.makedirs(staged)
    try:
        # Digests of the copies that ship, not of the export they came from.
        shutil.copyfile(weights, os.path.join(staged, WEIGHTS))
        shutil.copyfile(side, os.path.join(staged, CONFIG))
        shipped = list(DIGESTED)
        for extra_file in OPTIONAL:       # e.g. a speaker encoder's AS-Norm cohort
            if os.path.exists(os.path.join(export_dir, extra_file)):
                shutil.copyfile(os.path.join(export_dir, extra_file),
                                os.path.join(staged, extra_file))
                shipped.append(extra_file)
        digests = {f: file_sha256(os.path.join(staged, f)) for f in shipped}
        values = {"name": name, "sha256": digests[WEIGHTS], "config_sha256": digests[CONFIG],
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
        card = with_digest_lines(render_card(template, values), digests, template)
        with open(os.path.join(staged, CARD), "w", encoding="utf-8") as f:
            f.write(card)
        install_dir(staged, out, _aside(root, name))
    finally:
        shutil.rmtree(staged, ignore_errors=True)
    return out
