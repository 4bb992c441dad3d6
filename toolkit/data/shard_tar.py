"""The tar shard format: per utterance `<key>.wav` (16-bit PCM WAV of the utterance or its
segment, original rate and channels) then `<key>.json` (the data-list entry without
`wav`; its start/end describe the source, the WAV is already cut). `make_shards` writes
the tars of a data list, `shards.list` naming them and `shards.index.json` beside it,
(key, duration, label) per shard; `read_members` streams a tar back, pairing wav and json
by key and telling a corrupt or truncated tar (ShardError) from a complete one.

Bytes come and go through toolkit.data.transport; the dataset over shards is
toolkit.data.shards."""
import io
import json
import logging
import multiprocessing as mp
import os
import posixpath
import tarfile
import tempfile
from collections import deque
from typing import BinaryIO, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import soundfile as sf

from toolkit.data.audio import BadEntry, check_and_mix, read_audio
from toolkit.data.datalist import BadCounter, DataList
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


def read_members(fileobj: BinaryIO, source: str) -> Iterator[Tuple[str, bytes, Optional[dict]]]:
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


def log_shard_error(err: ShardError) -> None:
    """The one log line a damaged shard gets."""
    logger.warning("shard %s skipped from here on: %s%s", err.source, err.reason,
                   f" ({err.detail})" if err.detail else "")


def iterate_shard(fileobj: BinaryIO, source: str,
                  bad: Optional[BadCounter] = None) -> Iterator[Tuple[str, bytes, Optional[dict]]]:
    """(key, wav_bytes, meta) for each utterance of a tar stream, wav and json paired by
    key; meta is None when its JSON is unreadable. A corrupt shard yields nothing, a
    truncated one the complete utterances before the damage; either way one log line
    names the source and `bad` (if given) counts it once under the shard's name."""
    try:
        yield from read_members(fileobj, source)
    except ShardError as err:
        log_shard_error(err)
        if bad is not None:
            bad.add(err.reason, source, err.detail, log=False)


def decode_wav(data: bytes, name: str, channel: int = -1) -> Tuple[np.ndarray, int]:
    """WAV bytes -> (mono float32 wave, rate), with the checks of the list pipeline."""
    try:
        audio, rate = sf.read(io.BytesIO(data), dtype="float32", always_2d=True)
    except Exception as err:  # soundfile raises several types for corrupt data
        raise BadEntry("unreadable_audio", f"{name}: {err}") from None
    return check_and_mix(audio, name, channel), int(rate)


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
