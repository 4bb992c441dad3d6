"""Sharded data: tar files of N utterances, a second input form of the same pipeline.

A shard `<prefix>-000000.tar` holds, per utterance, `<key>.wav` (16-bit PCM WAV of the
utterance or its segment, original rate and channels) then `<key>.json` (the data-list
entry without `wav`; its start/end describe the source, the WAV is already cut).
`shards.list` names the tars (paths or URLs, one a line) and `shards.index.json` beside
it lists (key, duration, label) per shard, so batches are planned without opening a tar.
What only some tasks need (CTC `tokens`, keyword times `kw_end`) is read from each
utterance's JSON member when its batch is built, and checked there by the task.

Determinism contract, as in dataset.py:
- the plan depends only on (seed, epoch, index, config): the shard order is shuffled,
  then utterances are bucketed and batched inside windows of a few consecutive shards,
  so a reader streams only a couple of tars at a time;
- batch i goes to rank i % world (plan.rank_batches); inside a rank, loader worker w
  takes batches w, w+W, ...; DataLoader interleaves iterable workers round-robin, so
  batches come out in plan order whatever the worker count;
- augmentation randomness comes from (seed, epoch, key), so features equal those of the
  data-list pipeline on the same audio;
- resuming at batch k never decodes the skipped batches, and shards needed only by them
  are not opened.
"""
import io
import json
import logging
import multiprocessing as mp
import os
import posixpath
import re
import tarfile
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from collections import deque
from contextlib import closing
from typing import BinaryIO, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import soundfile as sf
from torch.utils.data import IterableDataset, get_worker_info

from toolkit.data.audio import BadEntry, check_and_mix, read_audio
from toolkit.data.datalist import BadCounter, DataList
from toolkit.data.loader import build_loader
from toolkit.data.plan import estimated_frames, plan_batches, usable_indices
from toolkit.fileio import atomic_write_text

logger = logging.getLogger(__name__)

INDEX_NAME = "shards.index.json"
LIST_NAME = "shards.list"
INDEX_FORMAT = "toolkit-shards"
INDEX_VERSION = 1
# Shard-level skip reasons (listed in datalist.BAD_REASONS too).
CORRUPT_SHARD = "corrupt_shard"          # not a tar at all
TRUNCATED_SHARD = "truncated_shard"      # a tar that stops (or turns to garbage) early
UNREADABLE_SHARD = "unreadable_shard"    # could not be opened or read (I/O, HTTP)
MISSING_FROM_SHARD = "missing_from_shard"  # in the index but not in the tar
HTTP_TIMEOUT_S = 60.0
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")


# --------------------------------------------------------------------------- opening

def _scheme(source: str) -> str:
    m = _SCHEME.match(source)
    return m.group(1).lower() if m else ""


def auth_token(configured: str = "") -> str:
    """The bearer token for http(s) shards: the config's, else TOOLKIT_DATA_TOKEN."""
    return configured or os.environ.get("TOOLKIT_DATA_TOKEN", "")


def _keeps_credentials(old_url: str, new_url: str) -> bool:
    """Whether a redirect from `old_url` to `new_url` may carry the bearer token: only to
    the same host, scheme and port (http -> https on the default ports too), as the
    `requests` package decides; a CDN or another host never sees it."""
    a, b = urllib.parse.urlsplit(old_url), urllib.parse.urlsplit(new_url)
    if (a.hostname or "").lower() != (b.hostname or "").lower():
        return False
    default = {"http": 80, "https": 443}
    port_a, port_b = a.port or default.get(a.scheme), b.port or default.get(b.scheme)
    if (a.scheme, port_a, b.scheme, port_b) == ("http", 80, "https", 443):
        return True
    return a.scheme == b.scheme and port_a == port_b


class _RedirectWithoutForeignToken(urllib.request.HTTPRedirectHandler):
    """urllib copies every header onto the redirected request, Authorization included."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        if new is not None and not _keeps_credentials(req.full_url, new.full_url):
            new.remove_header("Authorization")
        return new


_OPENER = urllib.request.build_opener(_RedirectWithoutForeignToken)


def open_shard(source: str, timeout: float = HTTP_TIMEOUT_S, token: str = "") -> BinaryIO:
    """Binary, sequentially readable file object for a local path, an http(s) URL
    (streamed, never read whole into memory) or any fsspec URL (s3://, gs://, file://).

    I/O failures raise OSError naming the source (the dataset counts them as skipped
    utterances); a scheme nothing can open raises ImportError/ValueError (a setup error)."""
    scheme = _scheme(source)
    if not scheme:
        return open(source, "rb")
    if scheme in ("http", "https"):
        request = urllib.request.Request(source)
        if token:
            request.add_header("Authorization", f"Bearer {token}")
        try:
            return _OPENER.open(request, timeout=timeout)
        except urllib.error.HTTPError as err:
            raise OSError(f"cannot open shard {source}: HTTP {err.code} {err.reason}") from None
        except (urllib.error.URLError, OSError) as err:
            reason = getattr(err, "reason", err)
            raise OSError(f"cannot open shard {source}: {reason}") from None
    try:
        import fsspec
    except ImportError:
        raise ImportError(f"cannot open shard {source}: '{scheme}://' URLs need fsspec and its "
                          f"backend for that scheme: pip install fsspec (plus e.g. s3fs, "
                          f"gcsfs, adlfs)") from None
    try:
        return fsspec.open(source, "rb").open()
    except ValueError as err:
        # fsspec raises ValueError("Protocol not known: ...") for schemes it has no class for.
        raise ValueError(f"cannot open shard {source}: fsspec has no backend for "
                         f"'{scheme}://' ({err}); install the package that provides it") from None
    except ImportError as err:
        raise ImportError(f"cannot open shard {source}: the fsspec backend for '{scheme}://' "
                          f"is not installed ({err})") from None
    except OSError as err:
        raise OSError(f"cannot open shard {source}: {err}") from None


def _read_all(source: str, token: str = "") -> bytes:
    with open_shard(source, token=token) as f:
        return f.read()


def read_text(source: str, token: str = "") -> str:
    """A shard list or data list, local or by URL, as text."""
    return _read_all(source, token or auth_token()).decode("utf-8")


def index_path_of(shard_list: str) -> str:
    """Where the index of a shard list lies: `shards.index.json` beside it."""
    return _beside(shard_list, INDEX_NAME)


def _beside(source: str, name: str) -> str:
    """`name` in the same directory as `source` (a path or a URL)."""
    if _scheme(source):
        parts = urllib.parse.urlsplit(source)
        path = posixpath.join(posixpath.dirname(parts.path), name)
        return urllib.parse.urlunsplit((parts.scheme, parts.netloc, path, "", ""))
    return os.path.join(os.path.dirname(os.path.abspath(source)), name)


def _shard_name(source: str) -> str:
    """File name of a shard, the key that ties a list line to its index record; a URL's
    query (signed URLs) is not part of it."""
    if _scheme(source):
        return posixpath.basename(urllib.parse.urlsplit(source).path)
    return os.path.basename(source)


# --------------------------------------------------------------------------- index

class ShardIndex:
    """Per shard: its source and its utterances (key, duration, label).

    Utterances of all shards sit in flat arrays in shard order (shard s owns
    [offsets[s], offsets[s+1])) and keys in one bytes blob, so forked loader workers
    share the pages, as with DataList."""

    def __init__(self, sources: Sequence[str], shard_offsets: np.ndarray, key_blob: bytes,
                 key_offsets: np.ndarray, durations: np.ndarray, labels: np.ndarray,
                 path: str = "", token: str = ""):
        self.token = token
        self.sources = list(sources)
        self.shard_offsets = shard_offsets
        self.key_blob = key_blob
        self.key_offsets = key_offsets
        self.durations = durations
        self.labels = labels
        self.path = path

    @property
    def num_shards(self) -> int:
        return len(self.sources)

    def __len__(self) -> int:
        return len(self.durations)

    def shard_range(self, shard: int) -> Tuple[int, int]:
        return int(self.shard_offsets[shard]), int(self.shard_offsets[shard + 1])

    def flat(self, shard: int, member: int) -> int:
        return int(self.shard_offsets[shard]) + int(member)

    def key(self, i: int) -> str:
        return self.key_blob[self.key_offsets[i]:self.key_offsets[i + 1]].decode("utf-8")

    def shard_keys(self, shard: int) -> List[str]:
        lo, hi = self.shard_range(shard)
        return [self.key(i) for i in range(lo, hi)]

    def total_hours(self) -> float:
        return float(self.durations.sum()) / 3600.0

    @classmethod
    def load(cls, shard_list: str, index_path: Optional[str] = None,
             token: str = "") -> "ShardIndex":
        """Reads a shard list (local or URL) and its index (`shards.index.json` beside
        the list unless `index_path` is given). List lines are matched to index records
        by file name, so a list may be a subset, reordered, or moved to other storage."""
        index_path = index_path or _beside(shard_list, INDEX_NAME)
        token = auth_token(token)
        text = _read_all(shard_list, token).decode("utf-8")
        try:
            raw = json.loads(_read_all(index_path, token))
        except ValueError as err:
            raise ValueError(f"{index_path}: not a shard index ({err})") from None
        if not isinstance(raw, dict) or raw.get("format") != INDEX_FORMAT:
            raise ValueError(f"{index_path}: not a shard index (format != {INDEX_FORMAT})")
        records: Dict[str, dict] = {}
        for rec in raw.get("shards", []):
            if rec["name"] in records:
                raise ValueError(f"{index_path}: shard {rec['name']} listed twice")
            records[rec["name"]] = rec
        sources, keys, durations, labels, counts = [], [], [], [], []
        for lineno, line in enumerate(text.splitlines(), 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            if not _scheme(line) and not os.path.isabs(line):
                # Relative to the list's own location.
                line = urllib.parse.urljoin(shard_list, line) if _scheme(shard_list) \
                    else _beside(shard_list, line)
            name = _shard_name(line)
            rec = records.get(name)
            if rec is None:
                raise ValueError(f"{shard_list}:{lineno}: shard {name} is not in {index_path}")
            if not _scheme(line) and not os.path.exists(line):
                raise FileNotFoundError(f"{shard_list}:{lineno}: shard {line} not found")
            if not len(rec["keys"]) == len(rec["durations"]) == len(rec["labels"]):
                raise ValueError(f"{index_path}: shard {name}: keys/durations/labels differ in length")
            sources.append(line)
            counts.append(len(rec["keys"]))
            keys.extend(rec["keys"])
            durations.extend(rec["durations"])
            labels.extend(rec["labels"])
        if not sources:
            raise ValueError(f"{shard_list}: no shards listed")
        encoded = [k.encode("utf-8") for k in keys]
        key_offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
        np.cumsum([len(k) for k in encoded], out=key_offsets[1:])
        shard_offsets = np.zeros(len(counts) + 1, dtype=np.int64)
        np.cumsum(counts, out=shard_offsets[1:])
        return cls(sources, shard_offsets, b"".join(encoded), key_offsets,
                   np.asarray(durations, dtype=np.float32), np.asarray(labels, dtype=np.int32),
                   shard_list, token)


# --------------------------------------------------------------------------- reading

class ShardError(Exception):
    """Damage to a whole shard stream (`reason` is one of the shard-level reasons)."""

    def __init__(self, reason: str, source: str, detail: str = ""):
        super().__init__(f"{source}: {reason}" + (f" ({detail})" if detail else ""))
        self.reason = reason
        self.source = source
        self.detail = detail


class _Tap:
    """Passes reads through, counting bytes and keeping the recent tail, so the end of
    an uncompressed tar can be checked: tarfile quietly stops at a missing or garbage
    header, which is how a tar cut on a member boundary looks."""
    KEEP = 1 << 16

    def __init__(self, raw):
        self.raw = raw
        self.total = 0
        self.chunks: deque = deque()
        self.kept = 0

    def read(self, n: int = -1) -> bytes:
        data = self.raw.read(n)
        if data:
            self.total += len(data)
            self.chunks.append(data)
            self.kept += len(data)
            while self.kept - len(self.chunks[0]) >= self.KEEP:
                self.kept -= len(self.chunks.popleft())
        return data

    def ends_properly(self, offset: int) -> bool:
        """True when the block at `offset` (where tarfile stopped) is an end-of-archive
        zero block."""
        tail = b"".join(self.chunks)
        start = offset - (self.total - len(tail))
        if start < 0:
            return True            # long gone from the tail; cannot tell, trust tarfile
        block = tail[start:start + tarfile.BLOCKSIZE]
        return len(block) == tarfile.BLOCKSIZE and not any(block)


def _read_members(fileobj: BinaryIO, source: str) -> Iterator[Tuple[str, bytes, Optional[dict]]]:
    """(key, wav bytes, meta) per complete wav+json pair; raises ShardError after the
    complete pairs when the stream is damaged."""
    tap = _Tap(fileobj)
    try:
        tar = tarfile.open(fileobj=tap, mode="r|*")
    except OSError as err:
        raise ShardError(UNREADABLE_SHARD, source, str(err)) from None
    except (tarfile.TarError, EOFError, ValueError) as err:
        raise ShardError(CORRUPT_SHARD, source, str(err)) from None
    count = 0
    with tar:
        key, parts = None, {}
        try:
            while True:
                member = tar.next()
                if member is None:
                    break
                tar.members = []   # stream mode would otherwise keep every TarInfo
                if not member.isfile():
                    continue
                stem, ext = posixpath.splitext(member.name)
                if ext not in (".wav", ".json"):
                    continue
                if stem != key:
                    key, parts = stem, {}
                parts[ext] = tar.extractfile(member).read()
                if len(parts) == 2:
                    try:
                        meta = json.loads(parts[".json"])
                    except ValueError:
                        meta = None
                    count += 1
                    yield key, parts[".wav"], meta
                    key, parts = None, {}
        except (tarfile.TarError, EOFError, ValueError) as err:
            raise ShardError(TRUNCATED_SHARD, source,
                             f"after {count} complete utterances: {err}") from None
        except OSError as err:
            raise ShardError(UNREADABLE_SHARD, source,
                             f"after {count} complete utterances: {err}") from None
        if getattr(tar.fileobj, "comptype", "tar") == "tar" and not tap.ends_properly(tar.offset):
            raise ShardError(TRUNCATED_SHARD, source, f"after {count} complete utterances: "
                             f"no end-of-archive block at byte {tar.offset}")


def _log_shard_error(err: ShardError) -> None:
    logger.warning("shard %s skipped from here on: %s%s", err.source, err.reason,
                   f" ({err.detail})" if err.detail else "")


def iterate_shard(fileobj: BinaryIO, source: str,
                  bad: Optional[BadCounter] = None) -> Iterator[Tuple[str, bytes, Optional[dict]]]:
    """(key, wav_bytes, meta) for each utterance of a tar stream, wav and json paired by
    key; meta is None when its JSON is unreadable. A corrupt shard yields nothing, a
    truncated one the complete utterances before the damage; either way one log line
    names the source and `bad` (if given) counts it once under the shard's name."""
    try:
        yield from _read_members(fileobj, source)
    except ShardError as err:
        _log_shard_error(err)
        if bad is not None:
            bad.add(err.reason, source, err.detail, log=False)


# --------------------------------------------------------------------------- processing

def decode_wav(data: bytes, name: str, channel: int = -1) -> Tuple[np.ndarray, int]:
    """WAV bytes -> (mono float32 wave, rate), with the checks of the list pipeline."""
    try:
        audio, rate = sf.read(io.BytesIO(data), dtype="float32", always_2d=True)
    except Exception as err:  # soundfile raises several types for corrupt data
        raise BadEntry("unreadable_audio", f"{name}: {err}") from None
    return check_and_mix(audio, name, channel), int(rate)


# --------------------------------------------------------------------------- batch plan

def plan_shard_batches(index: ShardIndex, dataset_cfg, seed: int, epoch: int, train: bool,
                       shards_per_window: int = 2, frames_of=None) -> List[np.ndarray]:
    """Global batch list of one epoch; each batch is an (n, 2) int64 array of
    (shard_id, member_index) rows. Shard order is shuffled with (seed, epoch); inside
    each window of `shards_per_window` consecutive shards, plan_batches does the
    shuffling, length bucketing (sort_window), batching and batch shuffling, so every
    batch draws on one window only."""
    rng = np.random.default_rng([seed & 0xFFFFFFFF, epoch, 0x5A4D])
    shuffle = train and dataset_cfg.shuffle
    order = rng.permutation(index.num_shards) if shuffle else np.arange(index.num_shards)
    per = max(1, int(shards_per_window))
    batches: List[np.ndarray] = []
    for w, start in enumerate(range(0, len(order), per)):
        ranges = [index.shard_range(int(s)) for s in order[start:start + per]]
        flat = np.concatenate([np.arange(lo, hi, dtype=np.int64) for lo, hi in ranges])
        if len(flat) == 0:
            continue
        shard_of = np.concatenate([np.full(hi - lo, s, dtype=np.int64)
                                   for s, (lo, hi) in zip(order[start:start + per], ranges)])
        member = flat - index.shard_offsets[shard_of]
        # Each window gets its own seed derived from (seed, epoch, window), so windows
        # are shuffled independently yet reproducibly.
        wseed = int(np.random.SeedSequence([seed & 0xFFFFFFFF, epoch, w, 0x5A4D])
                    .generate_state(1)[0])
        durations = index.durations[flat]
        frames = (frames_of or (lambda d: estimated_frames(d, dataset_cfg)))(durations)
        for local in plan_batches(frames, usable_indices(durations, dataset_cfg), dataset_cfg,
                                  wseed, epoch, train):
            batches.append(np.stack([shard_of[local], member[local]], axis=1).astype(np.int64))
    return batches


# --------------------------------------------------------------------------- dataset

def _rows(batch) -> np.ndarray:
    # rank_batches pads with empty 1-D arrays.
    return np.asarray(batch, dtype=np.int64).reshape(-1, 2)


class ShardBatchDataset(IterableDataset):
    """Yields this rank's batches [start:] from shards, in plan order.

    Worker w of W takes batches start+w, start+w+W, ...; it streams each shard its
    batches need once, when first needed, keeping only the wav bytes its own batches
    use until each batch is built (so memory stays within a window's share). Each
    utterance reaches the task's builder as its JSON entry plus the decoded audio."""

    def __init__(self, index: ShardIndex, batches: Sequence[np.ndarray], builder, epoch: int,
                 start: int = 0, channel: int = -1):
        self.index = index
        self.batches = batches
        self.builder = builder
        self.epoch = epoch
        self.start = start
        self.channel = channel

    def __len__(self) -> int:
        return max(0, len(self.batches) - self.start)

    def __iter__(self) -> Iterator:
        info = get_worker_info()
        wid, nw = (info.id, info.num_workers) if info is not None else (0, 1)
        positions = range(self.start + wid, len(self.batches), nw)
        # Members each shard must deliver to this worker; skipped batches add nothing,
        # so a shard holding only already-trained utterances is never opened.
        needed: Dict[int, set] = {}
        for p in positions:
            for s, m in _rows(self.batches[p]):
                needed.setdefault(int(s), set()).add(int(m))
        held: Dict[Tuple[int, int], bytes] = {}
        failed: Dict[Tuple[int, int], Tuple[str, str]] = {}
        for p in positions:
            rows = _rows(self.batches[p])
            for s in dict.fromkeys(int(s) for s in rows[:, 0]):
                if s in needed:
                    self._stream(s, needed.pop(s), held, failed)
            yield self._build(rows, held, failed)

    def _stream(self, shard: int, members: set, held: dict, failed: dict) -> None:
        lo, _ = self.index.shard_range(shard)
        want = {self.index.key(lo + m): m for m in members}
        source = self.index.sources[shard]
        reason, detail = MISSING_FROM_SHARD, source
        try:
            with open_shard(source, token=self.index.token) as f, \
                    closing(_read_members(f, source)) as entries:
                for key, wav, meta in entries:
                    m = want.pop(key, None)
                    if m is not None:
                        held[(shard, m)] = (wav, meta)
                    if not want:
                        break      # the rest of the tar is not ours to read
        except ShardError as err:
            _log_shard_error(err)
            reason, detail = err.reason, f"{source}: {err.detail}"
        except OSError as err:
            logger.warning("shard %s skipped: %s (%s)", source, UNREADABLE_SHARD, err)
            reason, detail = UNREADABLE_SHARD, str(err)
        else:
            if want:
                logger.warning("shard %s lacks %d indexed utterances (e.g. %s)", source,
                               len(want), next(iter(want)))
        for m in want.values():
            failed[(shard, m)] = (reason, detail)

    def _build(self, rows: np.ndarray, held: dict, failed: dict):
        examples, keys = [], []
        bad = BadCounter()
        seconds = 0.0
        for s, m in rows:
            s, m = int(s), int(m)
            i = self.index.flat(s, m)
            key = self.index.key(i)
            if (s, m) in failed:
                reason, detail = failed.pop((s, m))
                bad.add(reason, key, detail, log=False)   # the shard got one log line
                continue
            data, meta = held.pop((s, m))
            # The JSON's duration is the WAV's (shards hold the cut segment).
            entry = dict(meta) if isinstance(meta, dict) else {}
            entry.update(key=key, label=int(self.index.labels[i]))
            entry.setdefault("duration", float(self.index.durations[i]))
            try:
                audio = decode_wav(data, key, self.channel)
                example = self.builder(entry, self.epoch, audio)
            except BadEntry as err:
                bad.add(err.reason, key, err.detail)
                continue
            examples.append(example)
            keys.append(key)
            seconds += float(self.index.durations[i])
        return self.builder.collate(examples, keys, seconds, bad)


def make_shard_loader(dataset: ShardBatchDataset, num_workers: int, prefetch_factor: int,
                      seed: int):
    """Loader over the dataset's batches [start:] (the start lives in the dataset: an
    iterable dataset takes no sampler)."""
    return build_loader(dataset, num_workers, prefetch_factor, seed)


# --------------------------------------------------------------------------- writing

def encode_wav(audio: np.ndarray, rate: int) -> bytes:
    """(N, C) float in [-1, 1] -> 16-bit PCM WAV bytes. Rounds to int16 here so 16-bit
    sources survive bit-exactly and out-of-range samples clip instead of wrapping."""
    pcm = np.clip(np.round(audio.astype(np.float64) * 32768.0), -32768, 32767).astype(np.int16)
    buf = io.BytesIO()
    sf.write(buf, pcm, int(rate), subtype="PCM_16", format="WAV")
    return buf.getvalue()


def _add_member(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    # Fixed metadata: the same input gives the same bytes.
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mtime = 0
    info.mode = 0o644
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    tar.addfile(info, io.BytesIO(data))


def write_shard(path: str, entries: Sequence[dict]) -> Tuple[dict, BadCounter]:
    """Writes one tar (atomically) from data-list entries; returns its index record and
    the entries skipped for bad audio."""
    bad = BadCounter()
    record = {"name": os.path.basename(path), "keys": [], "durations": [], "labels": []}
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".tar", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            umask = os.umask(0)
            os.umask(umask)
            os.fchmod(f.fileno(), 0o666 & ~umask)   # mkstemp's 0600 would hide shards
            with tarfile.open(fileobj=f, mode="w", format=tarfile.PAX_FORMAT) as tar:
                for entry in entries:
                    key = entry["key"]
                    if not entry.get("wav"):
                        bad.add("missing_field", key, "no wav (feature entries cannot be sharded)")
                        continue
                    try:
                        audio, rate = read_audio(entry["wav"], float(entry.get("start", 0.0)),
                                                 float(entry.get("end", -1.0)))
                        check_and_mix(audio, entry["wav"])
                    except BadEntry as err:
                        bad.add(err.reason, key, err.detail)
                        continue
                    meta = {k: v for k, v in entry.items() if k != "wav"}
                    _add_member(tar, key + ".wav", encode_wav(audio, rate))
                    _add_member(tar, key + ".json", json.dumps(
                        meta, ensure_ascii=False, sort_keys=True).encode("utf-8"))
                    record["keys"].append(key)
                    record["durations"].append(entry["duration"])
                    label = entry.get("label")
                    record["labels"].append(label if isinstance(label, int)
                                            and not isinstance(label, bool) else -1)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return record, bad


def _write_shard_task(args):
    return write_shard(*args)


def make_shards(data_list: str, out_dir: str, utts_per_shard: int, nj: int = 1,
                prefix: str = "shards") -> Tuple[List[str], BadCounter]:
    """Data list -> OUT_DIR/<prefix>-NNNNNN.tar (consecutive list entries, list order),
    shards.list (absolute tar paths) and shards.index.json. Returns (tar paths, skipped
    entries: bad list lines, duplicate keys and bad audio)."""
    if utts_per_shard < 1:
        raise ValueError("utts_per_shard must be positive")
    datalist = DataList.load(data_list, require_label=False)
    bad = datalist.bad                    # bad list lines count as skipped entries too
    seen, entries = set(), []
    for i in range(len(datalist)):
        entry = datalist.entry(i)
        if entry["key"] in seen:
            bad.add("other", entry["key"], "duplicate key: only its first entry is kept")
            continue
        seen.add(entry["key"])
        entries.append(entry)
    os.makedirs(out_dir, exist_ok=True)
    out_dir = os.path.abspath(out_dir)
    tasks = [(os.path.join(out_dir, f"{prefix}-{n:06d}.tar"), entries[start:start + utts_per_shard])
             for n, start in enumerate(range(0, len(entries), utts_per_shard))]
    if nj > 1 and len(tasks) > 1:
        with mp.get_context("fork").Pool(min(nj, len(tasks))) as pool:
            results = pool.map(_write_shard_task, tasks, chunksize=1)
    else:
        results = [_write_shard_task(t) for t in tasks]
    records = []
    for record, shard_bad in results:
        records.append(record)
        bad.merge(shard_bad)
    index = {"format": INDEX_FORMAT, "version": INDEX_VERSION, "utts_per_shard": utts_per_shard}
    head = json.dumps(index, sort_keys=True)[:-1]
    body = ",\n".join(json.dumps(r, ensure_ascii=False, sort_keys=True) for r in records)
    # One shard per line: diffable, and still one JSON document.
    atomic_write_text(os.path.join(out_dir, INDEX_NAME), f'{head}, "shards": [\n{body}\n]}}\n')
    paths = [t[0] for t in tasks]
    atomic_write_text(os.path.join(out_dir, LIST_NAME), "".join(p + "\n" for p in paths))
    return paths, bad
