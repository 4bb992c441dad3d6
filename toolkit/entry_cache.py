"""Directories computed once and kept across runs and recipes: an entry is found again by
its key (a JSON object of everything that decides its content) and built when it is
missing or damaged.

Layout: ``<root>/<digest>/`` (digest: sha256 of the canonical key text) holds the files
its builder wrote, ``key.json`` (the key) and ``manifest.json`` (size and sha256 of every
other file); ``<root>/.locks/<digest>.lock`` is its lock.

- Written once, published whole: a builder writes into a private temporary directory
  (``.<digest>.tmp-*``), which is renamed into place after its manifest is written; a
  reader never sees a half-written entry.
- Locked: every use of an entry holds an exclusive ``fcntl`` lock on its lock file, so
  that of two runs asking for one key at once, one builds and the other waits and then
  reuses it. The kernel drops a killed run's lock; the temporary directory it leaves is
  removed by the next run that takes the lock.
- Verified on use: the stored key, the files and their sizes and sha256 against the
  manifest. A damaged entry (a file missing, cut short or changed, an unreadable
  manifest) is logged with the file named, removed and built again.
- Files are made read-only, as a reminder that users hard-link them (`link_or_copy`).
- Nothing outside `root` is ever removed. Nothing is evicted: delete the directory to
  reclaim the space.
"""
import contextlib
import errno
import fcntl
import hashlib
import json
import logging
import os
import shutil
import stat
import tempfile
import time
from typing import Callable, Dict, Iterator, Mapping, NamedTuple, Optional

from toolkit.fileio import atomic_write_text, sha256_file

logger = logging.getLogger(__name__)

KEY_NAME = "key.json"
MANIFEST_NAME = "manifest.json"
LOCKS = ".locks"
TMP_MARK = ".tmp-"
# A builder: fills the directory it is given (empty, private to it).
Builder = Callable[[str], None]


class Entry(NamedTuple):
    path: str          # the entry's directory
    digest: str        # its name: sha256 of the key
    content: str       # sha256 of its manifest: the same for the same bytes
    built: bool        # built by this call (else found and verified)


def key_text(key: Mapping) -> str:
    """The canonical text of a key (sorted, compact, exact floats)."""
    return json.dumps(key, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


def key_digest(key: Mapping) -> str:
    return hashlib.sha256(key_text(key).encode("utf-8")).hexdigest()


def _files(folder: str) -> Dict[str, str]:
    """Relative path -> path of every file under `folder` but the key and the manifest."""
    out = {}
    for base, dirs, names in os.walk(folder):
        dirs.sort()
        for name in sorted(names):
            path = os.path.join(base, name)
            rel = os.path.relpath(path, folder)
            if rel not in (KEY_NAME, MANIFEST_NAME):
                out[rel] = path
    return out


def _remove_tree(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    elif os.path.lexists(path):
        os.unlink(path)


class EntryCache:
    """The entries under `root` (see the module docstring); `what` names them in logs."""

    def __init__(self, root: str, what: str = "cache entry"):
        self.root = os.path.abspath(root)
        self.what = what

    def path(self, key: Mapping) -> str:
        return os.path.join(self.root, key_digest(key))

    @contextlib.contextmanager
    def _lock(self, digest: str) -> Iterator[None]:
        folder = os.path.join(self.root, LOCKS)
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, digest + ".lock"), "a+b") as f:
            try:
                fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as err:
                if err.errno not in (errno.EAGAIN, errno.EACCES):
                    raise
                logger.info("%s %s is in use by another run: waiting for it", self.what,
                            os.path.join(self.root, digest))
                t0 = time.time()
                fcntl.flock(f.fileno(), fcntl.LOCK_EX)
                logger.info("waited %.1f s for %s %s", time.time() - t0, self.what, digest[:12])
            try:
                yield
            finally:
                fcntl.flock(f.fileno(), fcntl.LOCK_UN)

    def problem(self, path: str, key: Mapping) -> Optional[str]:
        """What is wrong with the entry at `path` for `key` (naming the file), or None
        when it is whole. The caller holds its lock."""
        try:
            with open(os.path.join(path, KEY_NAME), encoding="utf-8") as f:
                if json.load(f) != json.loads(key_text(key)):
                    return f"{os.path.join(path, KEY_NAME)}: another key"
            with open(os.path.join(path, MANIFEST_NAME), encoding="utf-8") as f:
                manifest = json.load(f)["files"]
            if not isinstance(manifest, dict):
                raise ValueError("`files` is not an object")
        except (OSError, ValueError, KeyError, TypeError) as err:
            return f"{path}: unreadable key or manifest ({type(err).__name__}: {err})"
        present = _files(path)
        for rel, (size, digest) in sorted(manifest.items()):
            file = os.path.join(path, rel)
            if rel not in present:
                return f"{file}: missing"
            if os.path.getsize(file) != size:
                return f"{file}: {os.path.getsize(file)} bytes, the manifest says {size}"
            if sha256_file(file) != digest:
                return f"{file}: sha256 differs from the manifest's"
        extra = sorted(set(present) - set(manifest))
        if extra:
            return f"{os.path.join(path, extra[0])}: a file the manifest does not list"
        return None

    @contextlib.contextmanager
    def open(self, key: Mapping, build: Optional[Builder]) -> Iterator[Optional[Entry]]:
        """The verified entry of `key`, built first by `build` when it is missing or
        damaged (None then without a builder), its lock held for the body of the `with`."""
        digest = key_digest(key)
        path = os.path.join(self.root, digest)
        os.makedirs(self.root, exist_ok=True)
        with self._lock(digest):
            for name in os.listdir(self.root):      # left by killed builders of this key
                if name.startswith(f".{digest}{TMP_MARK}"):
                    _remove_tree(os.path.join(self.root, name))
            built = False
            if os.path.lexists(path):
                t0 = time.time()
                problem = self.problem(path, key)
                if problem is None:
                    logger.info("%s %s: verified in %.1f s", self.what, path, time.time() - t0)
                else:
                    logger.warning("%s %s is damaged (%s): %s", self.what, path, problem,
                                   "building it again" if build else "not used")
                    self.discard(path)
            if not os.path.lexists(path):
                if build is None:
                    yield None
                    return
                self._build(key, path, build)
                built = True
            with open(os.path.join(path, MANIFEST_NAME), "rb") as f:
                content = hashlib.sha256(f.read()).hexdigest()
            yield Entry(path, digest, content, built)

    def _build(self, key: Mapping, path: str, build: Builder) -> None:
        t0 = time.time()
        tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(path)}{TMP_MARK}", dir=self.root)
        try:
            logger.info("%s %s: building", self.what, path)
            build(tmp)
            files = {}
            for rel, file in _files(tmp).items():
                files[rel] = [os.path.getsize(file), sha256_file(file)]
                os.chmod(file, stat.S_IMODE(os.stat(file).st_mode) & ~0o222)
            atomic_write_text(os.path.join(tmp, KEY_NAME), json.dumps(key, indent=1,
                                                                      sort_keys=True))
            atomic_write_text(os.path.join(tmp, MANIFEST_NAME),
                              json.dumps({"files": files}, indent=0, sort_keys=True))
            os.replace(tmp, path)
        except BaseException:
            _remove_tree(tmp)
            raise
        logger.info("%s %s: built in %.1f s (%d files)", self.what, path, time.time() - t0,
                    len(files))

    def discard(self, path: str) -> None:
        """Removes the entry at `path` (inside root): first renamed aside, so that a
        removal cut short never leaves a half entry under its name."""
        if os.path.dirname(os.path.abspath(path)) != self.root:
            raise ValueError(f"{path} is not an entry of {self.root}")
        aside = tempfile.mkdtemp(prefix=f".{os.path.basename(path)}{TMP_MARK}", dir=self.root)
        os.replace(path, os.path.join(aside, "old"))
        _remove_tree(aside)


def link_or_copy(src: str, dst: str) -> None:
    """`dst` becomes `src`'s file: a hard link (no copy, no space) where the file system
    allows one, else a copy; an existing `dst` is replaced atomically."""
    tmp = os.path.join(os.path.dirname(dst) or ".", f".{os.path.basename(dst)}.link-{os.getpid()}")
    if os.path.lexists(tmp):
        os.unlink(tmp)
    try:
        os.link(src, tmp)
    except OSError:
        shutil.copyfile(src, tmp)
    os.replace(tmp, dst)
