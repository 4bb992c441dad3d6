"""The project's own pretrained models, shipped as package data: one directory per model,
``toolkit/pretrained/<name>/`` with

    model.safetensors   the weights
    config.json         the export metadata (task, architecture, features)
    README.md           the model card: data, recipe command and commit, licences, figures,
                        and the sha256 of both files on lines
                        ``sha256 (model.safetensors): `HEX` `` and ``sha256 (config.json): `HEX` ``

Each is written by a recipe's packaging stage (``toolkit.bin.package_pretrained``) and
checked against its card on load: the weights and the config alike, since the config
decides how the weights are read (unit order, feature options, threshold). Anywhere a model
path is taken, ``pretrained:NAME`` names one of these
(``training.init_checkpoint=pretrained:NAME`` fine-tunes from it). Code and weights are
Apache-2.0 (LICENSE at the repository root).
"""
import json
import os
import re
from typing import Dict, List, Optional, Tuple

from toolkit.errors import DataError, MissingInputError
from toolkit.fileio import sha256_file

ROOT = os.path.dirname(os.path.abspath(__file__))
WEIGHTS = "model.safetensors"
CONFIG = "config.json"
CARD = "README.md"
PREFIX = "pretrained:"
DIGESTED = (WEIGHTS, CONFIG)          # the files a card states the sha256 of
# Files some models ship beside the weights, digested on the card when they do: a speaker
# encoder's AS-Norm cohort (training speakers' mean embeddings, tensor `embeddings`).
COHORT = "cohort.safetensors"
OPTIONAL = (COHORT,)
_CARD_SHA = re.compile(
    r"sha256 \((model\.safetensors|config\.json|cohort\.safetensors)\)\W+([0-9a-f]{64})")
_NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]*$")
# Left by an interrupted packaging (the packager of d486171 staged into NAME.tmp): never a
# model, even when it holds one's files.
STAGING_SUFFIXES = (".tmp", ".old")
# What a model of each task is, for the one line that refuses one of another task.
TASK_WORDS = {"speaker": "a speaker encoder", "phone_ctc": "a phone front end",
              "codec": "a speech codec", "kws": "a keyword model"}


def _aside(root: str, name: str) -> str:
    """Where the packager keeps a model it replaces, between its two renames
    (toolkit.pretrained.package.install_dir)."""
    return os.path.join(root, f".{name}.old")


def _folder(root: str, name: str) -> str:
    """`root/name`, or the old model set aside by a packaging that died between its two
    renames: a name never goes missing."""
    path = os.path.join(root, name)
    if not os.path.isdir(path) and os.path.isfile(os.path.join(_aside(root, name), WEIGHTS)):
        return _aside(root, name)
    return path


def available(root: str = ROOT) -> List[str]:
    """Names of the shipped models (staging dirs of a packaging never count)."""
    names = {d[1:-len(".old")] if d.startswith(".") and d.endswith(".old") else d
             for d in os.listdir(root)}
    return sorted(d for d in names
                  if _NAME.match(d) and not d.endswith(STAGING_SUFFIXES)
                  and os.path.isfile(os.path.join(_folder(root, d), WEIGHTS)))


def model_dir(name: str, root: str = ROOT) -> str:
    if not _NAME.match(name or "") or name not in available(root):
        raise MissingInputError(f"no pretrained model '{name}' in {root} (shipped: "
                                f"{', '.join(available(root)) or 'none'})")
    return _folder(root, name)


file_sha256 = sha256_file


def card_lines(text: str) -> Dict[str, List[str]]:
    """file -> the digests a card's text states for it."""
    found: Dict[str, List[str]] = {f: [] for f in DIGESTED + OPTIONAL}
    for filename, digest in _CARD_SHA.findall(text):
        found[filename].append(digest)
    return found


def card_digests(name: str, root: str = ROOT) -> Dict[str, str]:
    """The sha256 of model.safetensors and config.json as the model card states them."""
    card = os.path.join(model_dir(name, root), CARD)
    with open(card, encoding="utf-8") as f:
        found = card_lines(f.read())
    for filename, digests in found.items():
        if filename in OPTIONAL and len(digests) <= 1:
            continue
        if len(digests) != 1:
            raise DataError(f"{card}: expected one line 'sha256 ({filename}): `HEX`', found "
                            f"{len(digests)} (repackage the model with toolkit.bin."
                            "package_pretrained)")
    return {filename: digests[0] for filename, digests in found.items() if digests}


def card_sha256(name: str, root: str = ROOT) -> str:
    """The weights' sha256 as the model card states it."""
    return card_digests(name, root)[WEIGHTS]


def verify_files(name: str, root: str = ROOT, files: Tuple[str, ...] = DIGESTED) -> None:
    """Checks `files` of a shipped model against its card: a DataError names the file and
    both digests when they differ (the files were changed or damaged)."""
    folder = model_dir(name, root)
    stated = card_digests(name, root)
    for filename in files:
        path = os.path.join(folder, filename)
        if filename not in stated:
            raise DataError(f"{os.path.join(folder, CARD)} states no sha256 ({filename}): the "
                            f"model ships no {filename} (repackage it to add one)")
        actual = file_sha256(path)
        if stated[filename] != actual:
            raise DataError(f"{path}: sha256 {actual} differs from its model card's "
                            f"{stated[filename]} ({os.path.join(folder, CARD)}); reinstall the "
                            "package")


def companion(weights_path: str, filename: str) -> Optional[str]:
    """`filename` beside a model's weights (e.g. COHORT), or None when there is none. Beside
    a shipped model's weights it counts only when the card states its sha256, and is
    checked against it (a DataError when it differs or has gone)."""
    folder = os.path.dirname(os.path.abspath(weights_path))
    path = os.path.join(folder, filename)
    if os.path.dirname(folder) == ROOT:
        name = os.path.basename(folder)
        if filename not in card_digests(name, ROOT):
            return None
        verify_files(name, ROOT, (filename,))
        return path
    return path if os.path.exists(path) else None


def weights(name: str, verify: bool = True, root: str = ROOT) -> str:
    """Path of a shipped model's weights; with `verify`, the weights and the config.json
    beside them are checked against the card first (see `verify_files`)."""
    path = os.path.join(model_dir(name, root), WEIGHTS)
    if verify:
        verify_files(name, root)
    return path


def metadata(name: str, root: str = ROOT, verify: bool = True) -> Dict:
    """A shipped model's config.json, checked against its card first."""
    path = os.path.join(model_dir(name, root), CONFIG)
    if verify:
        verify_files(name, root, (CONFIG,))
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def check_task(name: str, task: str, root: str = ROOT) -> None:
    """A DataError naming the model and its task when `name` is not a `task` model (a
    phone front end given where a speaker encoder goes)."""
    found = metadata(name, root).get("task", "")
    if found != task:
        fitting = [n for n in available(root) if metadata(n, root, False).get("task") == task]
        raise DataError(f"pretrained model '{name}' is {TASK_WORDS.get(found, 'a model')} "
                        f"(task {found or 'unknown'}), not {TASK_WORDS.get(task, 'a model')} "
                        f"(task {task}); shipped {task} models: {', '.join(fitting) or 'none'}")


def resolve(path_or_name: str, task: str = "") -> str:
    """`pretrained:NAME` -> that model's verified weights (with `task`: refused unless it is
    a model of that task); any other string unchanged."""
    if path_or_name.startswith(PREFIX):
        name = path_or_name[len(PREFIX):]
        if task:
            check_task(name, task)
        return weights(name)
    return path_or_name
