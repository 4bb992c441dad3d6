"""Small file helpers: atomic writes (temp file, fsync, rename) and line readers."""
import errno
import hashlib
import json
import os
import tempfile
from typing import Iterator, Tuple


def _fsync_dir(path: str) -> None:
    fd = os.open(os.path.dirname(os.path.abspath(path)) or ".", os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_bytes(path: str, data: bytes) -> None:
    """Writes `data` so that `path` holds either the old or the whole new content."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix="-" + os.path.basename(path), dir=directory)
    try:
        # mkstemp makes 0600 files; give the result the usual umask-based mode.
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        _fsync_dir(path)
    except OSError as err:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if err.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
            raise OSError(err.errno, f"no space left on device (or quota/file-size limit) while "
                          f"writing {path}; the previous file is intact") from err
        raise


def atomic_write_text(path: str, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def read_lines(path: str) -> Iterator[Tuple[int, str]]:
    """Yields (line number, text) decoding each line on its own, so one bad byte
    names its line instead of breaking the whole file."""
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as err:
                raise ValueError(f"{path}:{lineno}: not valid UTF-8 ({err.reason})") from None
            line = line.rstrip("\r\n")
            if line.strip():
                yield lineno, line


def sha256_file(path: str) -> str:
    """Hex sha256 of a file, read in 1 MiB blocks (checkpoints and archives can be large)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
