"""The project's own pretrained models, shipped as package data: one directory per model,
``toolkit/pretrained/<name>/`` with

    model.safetensors   the weights
    config.json         the export metadata (task, architecture, features)
    README.md           the model card: data, recipe command and commit, licences, figures,
                        and the weights' sha256 on a line ``sha256 (model.safetensors): `HEX` ``

Each is written by a recipe's packaging stage (``toolkit.bin.package_pretrained``) and
checked against its card on load. Anywhere a model path is taken, ``pretrained:NAME`` names
one of these (``training.init_checkpoint=pretrained:NAME`` fine-tunes from it).
"""
import json
import os
import re
from typing import Dict, List

from toolkit.errors import DataError, MissingInputError
from toolkit.fileio import sha256_file

ROOT = os.path.dirname(os.path.abspath(__file__))
WEIGHTS = "model.safetensors"
CONFIG = "config.json"
CARD = "README.md"
PREFIX = "pretrained:"
_CARD_SHA = re.compile(r"sha256 \(model\.safetensors\)\W+([0-9a-f]{64})")
_NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]*$")


def available(root: str = ROOT) -> List[str]:
    """Names of the shipped models."""
    return sorted(d for d in os.listdir(root)
                  if os.path.isfile(os.path.join(root, d, WEIGHTS)))


def model_dir(name: str, root: str = ROOT) -> str:
    if not _NAME.match(name or "") or name not in available(root):
        raise MissingInputError(f"no pretrained model '{name}' in {root} (shipped: "
                                f"{', '.join(available(root)) or 'none'})")
    return os.path.join(root, name)


file_sha256 = sha256_file


def card_sha256(name: str, root: str = ROOT) -> str:
    """The weights' sha256 as the model card states it."""
    card = os.path.join(model_dir(name, root), CARD)
    with open(card, encoding="utf-8") as f:
        found = _CARD_SHA.findall(f.read())
    if len(found) != 1:
        raise DataError(f"{card}: expected one line 'sha256 (model.safetensors): `HEX`', "
                        f"found {len(found)}")
    return found[0]


def weights(name: str, verify: bool = True, root: str = ROOT) -> str:
    """Path of a shipped model's weights; with `verify`, checked against its card (a
    DataError names both digests when they differ: the files were changed or damaged)."""
    path = os.path.join(model_dir(name, root), WEIGHTS)
    if verify:
        stated, actual = card_sha256(name, root), file_sha256(path)
        if stated != actual:
            raise DataError(f"{path}: sha256 {actual} differs from its model card's {stated} "
                            f"({os.path.join(model_dir(name, root), CARD)}); reinstall the "
                            "package")
    return path


def metadata(name: str, root: str = ROOT) -> Dict:
    with open(os.path.join(model_dir(name, root), CONFIG), encoding="utf-8") as f:
        return json.load(f)


def resolve(path_or_name: str) -> str:
    """`pretrained:NAME` -> that model's verified weights; any other string unchanged."""
    if path_or_name.startswith(PREFIX):
        return weights(path_or_name[len(PREFIX):])
    return path_or_name
