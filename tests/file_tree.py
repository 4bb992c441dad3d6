"""Every file under a directory as bytes or digests, for tests that compare two outputs
byte for byte wherever they were written."""
import hashlib
import os
from typing import Callable, Dict, Iterable, Optional


def file_tree(root, relative_in: Optional[Iterable[str]] = None,
              skip: Callable[[str], bool] = lambda rel: False) -> Dict[str, bytes]:
    """{path relative to `root`: bytes} of every file under `root`. The root's absolute
    path is replaced by b"<root>" in every file, or only in the files named in
    `relative_in` (e.g. wav.scp), so that two directories compare by content;
    `skip(relative path)` leaves a file out."""
    root = os.path.abspath(str(root))
    names_to_relativize = None if relative_in is None else set(relative_in)
    out = {}
    for folder, _, names in os.walk(root):
        for name in names:
            path = os.path.join(folder, name)
            rel = os.path.relpath(path, root)
            if skip(rel):
                continue
            with open(path, "rb") as f:
                data = f.read()
            if names_to_relativize is None or name in names_to_relativize:
                data = data.replace(root.encode(), b"<root>")
            out[rel] = data
    return out


def file_digests(root, **options) -> Dict[str, str]:
    """file_tree's files as sha256 hex digests."""
    return {rel: hashlib.sha256(data).hexdigest()
            for rel, data in file_tree(root, **options).items()}
