"""Sharded data: tar files of N utterances, a second input form of the same pipeline.

A shard `<prefix>-000000.tar` holds each utterance's WAV and JSON entry (the format, its
writer and its stream reader: toolkit.data.shard_tar; opening paths and URLs:
toolkit.data.transport). `shards.list` names the tars (paths or URLs, one a line) and
`shards.index.json` beside it lists (key, duration, label) per shard, so batches are
planned without opening a tar.
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
import json
import logging
import os
import urllib.parse
from contextlib import closing
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np
from torch.utils.data import IterableDataset, get_worker_info

from toolkit.data.audio import BadEntry
from toolkit.data.datalist import BadCounter
from toolkit.data.loader import build_loader
from toolkit.data.plan import estimated_frames, plan_batches, usable_indices
from toolkit.data.shard_tar import (INDEX_FORMAT, INDEX_NAME, MISSING_FROM_SHARD,
                                    UNREADABLE_SHARD, ShardError, decode_wav, log_shard_error,
                                    read_members)
from toolkit.data.transport import (auth_token, beside, file_name, open_shard, read_bytes,
                                    read_text, url_scheme)

logger = logging.getLogger(__name__)


# --------------------------------------------------------------------------- index

def index_path_of(shard_list: str) -> str:
    """Where the index of a shard list lies: `shards.index.json` beside it."""
    return beside(shard_list, INDEX_NAME)


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
        index_path = index_path or beside(shard_list, INDEX_NAME)
        token = auth_token(token)
        text = read_text(shard_list, token)
        try:
            raw = json.loads(read_bytes(index_path, token))
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
            if not url_scheme(line) and not os.path.isabs(line):
                # Relative to the list's own location.
                line = urllib.parse.urljoin(shard_list, line) if url_scheme(shard_list) \
                    else beside(shard_list, line)
            name = file_name(line)
            rec = records.get(name)
            if rec is None:
                raise ValueError(f"{shard_list}:{lineno}: shard {name} is not in {index_path}")
            if not url_scheme(line) and not os.path.exists(line):
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
                    closing(read_members(f, source)) as entries:
                for key, wav, meta in entries:
                    m = want.pop(key, None)
                    if m is not None:
                        held[(shard, m)] = (wav, meta)
                    if not want:
                        break      # the rest of the tar is not ours to read
        except ShardError as err:
            log_shard_error(err)
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
