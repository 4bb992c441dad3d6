"""Hugging Face datasets as a training or dev input (`dataset.hf.train` / `dataset.hf.dev`):
each entry names a dataset (hub name or local directory), a split and its audio column;
the entries are mixed into one input whose batches are planned like a data list's.

- `datasets` only opens the tables (memory-mapped Arrow, shared by forked loader
  workers): hub datasets, local parquet/Arrow directories, `save_to_disk` output, and
  folders of audio files (`audiofolder`, read as paths). The audio column is read
  undecoded (`Audio(decode=False)`: bytes or a path) and decoded here with soundfile, so
  no torchcodec/FFmpeg is involved. The loader resamples to `dataset.sample_rate` as for
  every other input.
- A `save_to_disk` DatasetDict has named splits. A saved `Dataset` is one table: saved
  with the name of the split it came from, it answers to that name only; unsplit, it is
  read whole under the default split name (`train`) and any other name is an error, so
  a dev entry can never silently be the training table.
- Exact resume needs every duration before the first batch: they come from a duration
  column when the entry names one, otherwise from each row's audio header, read once and
  cached beside the `datasets` cache (keyed by the table's fingerprint). A damaged cached
  index is logged and rebuilt; a new one is written whole or not at all.
- Rows whose audio is missing or unreadable when indexed are counted and left out, as a
  data list's bad lines are; rows that fail later are counted per batch. Keys are
  `<dataset>:<split>/<id or row>`, unique across the mixed entries and stable, so every
  utterance keeps its own random stream; <dataset> is the last component of the path,
  or more of it where datasets of one name from different places are mixed.
- A per-entry `token` (else the HF_TOKEN environment variable) reaches only the hub
  client; it is a secret-named key, redacted from every file the toolkit writes.
"""
import hashlib
import io
import json
import logging
import os
import re
import struct
import time
from collections import Counter
from typing import Callable, List, Tuple, Union

import numpy as np
import soundfile as sf
from torch.utils.data import Dataset

from toolkit.config import ConfigError
from toolkit.data.audio import BadEntry, check_and_mix
from toolkit.data.datalist import MAX_ABSURD_DURATION, BadCounter
from toolkit.data.loader import make_loader
from toolkit.data.plan import plan_epoch, report_duration_filter, usable_indices
from toolkit.data.sources import SOURCES, DataSource, builder_channel
from toolkit.errors import MissingInputError
from toolkit.fileio import atomic_write_bytes

logger = logging.getLogger(__name__)
INDEX_VERSION = 1
INDEX_BATCH = 256             # rows read per Arrow slice while indexing
UNSPLIT_NAME = "train"        # split name an unsplit saved Dataset is read whole under


def _import_datasets():
    try:
        import datasets
    except ImportError:
        raise ConfigError("dataset.hf needs the `datasets` package (tools/install.sh installs "
                          "it with the toolkit's extras)") from None
    return datasets


def _is_saved_dataset(path: str) -> bool:
    """A directory written by `save_to_disk` (one split, or a DatasetDict of splits)."""
    return os.path.isdir(path) and (
        os.path.exists(os.path.join(path, "state.json"))
        or os.path.exists(os.path.join(path, "dataset_dict.json")))


def open_table(entry, where: str):
    """The split of one entry as a `datasets.Dataset`, audio left undecoded."""
    datasets = _import_datasets()
    token = entry.token or None          # None: huggingface_hub reads HF_TOKEN itself
    local = os.path.expanduser(entry.path)
    try:
        if _is_saved_dataset(local):
            ds = datasets.load_from_disk(local)
            if isinstance(ds, datasets.DatasetDict):
                if entry.split not in ds:
                    raise ConfigError(f"{where}.split: {entry.path} has splits "
                                      f"{', '.join(ds)}, not {entry.split!r}")
                ds = ds[entry.split]
            else:
                _check_single_split(ds, entry, where)
        else:
            # A hub name is `org/name`; a local directory is named from / . or ~.
            if entry.path.startswith(("/", ".", "~")) and not os.path.exists(local):
                raise MissingInputError(f"{where}.path: {entry.path} not found")
            ds = datasets.load_dataset(local, entry.name or None, split=entry.split,
                                       revision=entry.revision or None, token=token)
    except (ConfigError, MissingInputError):
        raise
    except (FileNotFoundError, ValueError, KeyError) as err:
        raise ConfigError(f"{where}: cannot open {entry.path} split {entry.split!r}: "
                          f"{_one_line(err)}") from None
    except Exception as err:     # hub and builder errors have many types
        if not _needs_torchcodec(err):
            raise ConfigError(f"{where}: cannot open {entry.path} split {entry.split!r}: "
                              f"{type(err).__name__}: {_one_line(err)}") from None
        ds = _open_audio_folder(entry, local, where, token, datasets)
    columns = list(ds.column_names)
    for key in ("audio_column", "id_column", "duration_column", "label_column"):
        column = getattr(entry, key)
        if column and column not in columns:
            raise ConfigError(f"{where}.{key}: {entry.path} split {entry.split!r} has no column "
                              f"{column!r} (columns: {', '.join(columns)})")
    feature = ds.features[entry.audio_column]
    if isinstance(feature, datasets.Audio):
        ds = ds.cast_column(entry.audio_column, datasets.Audio(decode=False))
    elif not (_is_audio_struct(feature) or feature == datasets.Value("string")):
        raise ConfigError(f"{where}.audio_column: column {entry.audio_column!r} of {entry.path} "
                          f"is {feature}, not audio (an Audio feature, a bytes/path struct or a "
                          "path string)")
    return ds


def _check_single_split(ds, entry, where: str) -> None:
    """A saved `Dataset` (not a DatasetDict) is one table. Saved with the name of the split
    it was cut from, it answers to that name; unsplit, to the default `train` (read
    whole). Any other name is refused: reading the whole table would make dev train."""
    recorded = str(ds.split) if ds.split is not None else None
    if recorded is not None and entry.split != recorded:
        raise ConfigError(f"{where}.split: {entry.path} holds the one split {recorded!r}, "
                          f"not {entry.split!r}: set split: {recorded}")
    if recorded is None and entry.split != UNSPLIT_NAME:
        raise ConfigError(f"{where}.split: {entry.path} is one unsplit dataset (save_to_disk "
                          f"of a Dataset), it has no split {entry.split!r}: omit split (or "
                          f"set split: {UNSPLIT_NAME}) to read it whole, or save a "
                          "DatasetDict of named splits")


def _needs_torchcodec(err: BaseException) -> bool:
    while err is not None:
        if "torchcodec" in str(err):
            return True
        err = err.__cause__ or err.__context__
    return False


def _open_audio_folder(entry, local: str, where: str, token, datasets):
    """A folder of loose audio files (`audiofolder`): `datasets` would encode each file
    through torchcodec, so the audio column is declared a plain path string instead, and
    the files are read here. Its metadata columns are left out (their types are unknown
    before the folder is built)."""
    try:
        return datasets.load_dataset(
            local, entry.name or None, split=entry.split, revision=entry.revision or None,
            token=token, features=datasets.Features({entry.audio_column: datasets.Value("string")}),
            drop_labels=True, drop_metadata=True)
    except Exception as err:
        raise ConfigError(f"{where}: cannot open {entry.path} split {entry.split!r} as a folder "
                          f"of audio files without torchcodec: {type(err).__name__}: "
                          f"{_one_line(err)}; convert it to parquet or save_to_disk form") from None


def _is_audio_struct(feature) -> bool:
    return isinstance(feature, dict) and {"bytes", "path"} <= set(feature)


def _one_line(err: BaseException) -> str:
    # soundfile names an in-memory file by its object repr: noise in a log line.
    text = re.sub(r"<_io\.BytesIO object at 0x[0-9a-f]+>", "audio bytes", str(err))
    return " ".join(text.split())[:300]


def describe(entry) -> str:
    return f"hf:{entry.path}" + (f"[{entry.name}]" if entry.name else "") + f":{entry.split}"


def data_identity(entry) -> str:
    """Where an entry's table comes from: a local directory's absolute path, else the hub
    name; with the configuration and split, what makes two entries the same data."""
    local = os.path.expanduser(entry.path)
    if entry.path.startswith(("/", ".", "~")) or os.path.exists(local):
        return os.path.abspath(local)
    return entry.path.rstrip("/")


def key_prefixes(entries) -> List[str]:
    """`<dataset>[<name>]:<split>/` per entry, <dataset> the last component of its path;
    entries of different data that would share a prefix (`/a/speech`, `/b/speech`) take
    as many more trailing components as keep them apart (`a/speech`, `b/speech`). The
    same data listed twice keeps one prefix (its keys then repeat, which is refused)."""
    parts = [data_identity(e).rstrip("/").split("/") for e in entries]
    data = [(data_identity(e), e.name, e.split) for e in entries]
    depth = [1] * len(entries)

    def prefix(i: int) -> str:
        e = entries[i]
        base = ("/".join(parts[i][-depth[i]:]) if depth[i] > 1 else
                e.path.rstrip("/").rsplit("/", 1)[-1] or e.path)
        return re.sub(r"\s+", "_", base + (f"[{e.name}]" if e.name else "") + f":{e.split}/")

    while True:
        sharing: dict = {}
        for i in range(len(entries)):
            sharing.setdefault(prefix(i), []).append(i)
        longer = [i for group in sharing.values() if len({data[i] for i in group}) > 1
                  for i in group if depth[i] < len(parts[i])]
        if not longer:
            return [prefix(i) for i in range(len(entries))]
        for i in longer:
            depth[i] += 1


def _repeated_keys(split: str, entries, keys: List[str], which: np.ndarray) -> str:
    """The one-line error for repeated utterance keys, naming what to change: the entry
    listed twice, or the id column whose values do not name utterances."""
    counts = Counter(keys)
    dupes = sorted(k for k, n in counts.items() if n > 1)
    first: dict = {}
    cause = ""
    for key, t in zip(keys, which.tolist()):
        if counts[key] < 2:
            continue
        if key not in first:
            first[key] = t
            continue
        where = f"dataset.hf.{split}[{first[key]}]"
        if first[key] == t:
            cause = (f"{where}.id_column {entries[t].id_column!r} repeats values; name a "
                     "column of unique utterance ids, or set id_column: '' to key rows by "
                     "their number")
        else:
            cause = (f"{where} and [{t}] read the same split of "
                     f"{data_identity(entries[t])}; list it once")
        break
    return (f"dataset.hf.{split}: utterance keys repeat (e.g. {', '.join(dupes[:3])}): "
            f"{cause}")


# --------------------------------------------------------------------------- audio bytes

def wav_shortfall(data: bytes) -> int:
    """Bytes missing from a RIFF/WAVE blob whose header promises more data than it holds
    (soundfile returns the shorter audio without a word)."""
    if len(data) < 12 or data[:4] != b"RIFF" or data[8:12] != b"WAVE":
        return 0
    pos = 12
    while pos + 8 <= len(data):
        cid, size = data[pos:pos + 4], struct.unpack("<I", data[pos + 4:pos + 8])[0]
        if cid == b"data":
            return 0 if size in (0, 0xFFFFFFFF) else max(0, pos + 8 + size - len(data))
        pos += 8 + size + (size & 1)
    return 0


def _audio_source(value, key: str):
    """(bytes or None, local path or None) of an undecoded audio cell."""
    if value is None:
        raise BadEntry("missing_field", f"{key}: no audio")
    data, path = (value.get("bytes"), value.get("path")) if isinstance(value, dict) else \
        ((value, None) if isinstance(value, (bytes, bytearray)) else (None, value))
    if data:
        return bytes(data), path
    if path and os.path.isfile(path):
        return None, path
    raise BadEntry("missing_file" if path else "missing_field", f"{key}: {path or 'no audio'}")


def audio_header(value, key: str) -> Tuple[float, int]:
    """(duration in seconds, sample rate) from the header alone."""
    data, path = _audio_source(value, key)
    try:
        info = sf.info(io.BytesIO(data) if data is not None else path)
    except Exception as err:
        raise BadEntry("unreadable_audio", f"{key}: {_one_line(err)}") from None
    if data is not None and wav_shortfall(data) > 0:
        raise BadEntry("truncated_audio", f"{key}: header promises more data than the row holds")
    if info.frames <= 0 or info.samplerate <= 0:
        raise BadEntry("empty_audio", key)
    return info.frames / info.samplerate, int(info.samplerate)


def decode_audio(value, key: str, channel: int) -> Tuple[np.ndarray, int]:
    """Mono float32 waveform and its rate, with the checks of the data-list pipeline."""
    data, path = _audio_source(value, key)
    if data is not None and wav_shortfall(data) > 0:
        raise BadEntry("truncated_audio", f"{key}: header promises more data than the row holds")
    try:
        audio, rate = sf.read(io.BytesIO(data) if data is not None else path, dtype="float32",
                              always_2d=True)
    except Exception as err:
        raise BadEntry("unreadable_audio", f"{key}: {_one_line(err)}") from None
    return check_and_mix(audio, key, channel), int(rate)


# --------------------------------------------------------------------------- index

def _index_path(ds, entry) -> str:
    datasets = _import_datasets()
    digest = hashlib.sha256(json.dumps(
        [INDEX_VERSION, ds._fingerprint, len(ds), entry.audio_column, entry.id_column,
         entry.duration_column, entry.label_column]).encode()).hexdigest()[:24]
    return os.path.join(str(datasets.config.HF_DATASETS_CACHE), "toolkit_index", digest + ".npz")


def _column(ds, name: str) -> list:
    return ds.select_columns([name]).with_format("arrow").data.column(name).to_pylist()


def build_index(ds, entry, where: str) -> dict:
    """Per row: duration (seconds), label, id, and the reason it is unusable ('' if not)."""
    n = len(ds)
    ids = [str(x) for x in _column(ds, entry.id_column)] if entry.id_column else \
        [f"{i:08d}" for i in range(n)]
    labels = np.full(n, -1, dtype=np.int64)
    if entry.label_column:
        for i, v in enumerate(_column(ds, entry.label_column)):
            if isinstance(v, (int, np.integer)) and not isinstance(v, bool):
                labels[i] = int(v)
            else:
                labels[i] = np.iinfo(np.int64).min        # checked against the task's needs
    durations = np.zeros(n, dtype=np.float64)
    problems = [""] * n
    if entry.duration_column:
        for i, v in enumerate(_column(ds, entry.duration_column)):
            ok = isinstance(v, (int, float)) and not isinstance(v, bool) and np.isfinite(v)
            durations[i] = float(v) if ok else 0.0
            if not ok or not 0 < v <= MAX_ABSURD_DURATION:
                problems[i] = f"absurd_duration\t{entry.duration_column}={v!r}"
        return {"ids": ids, "labels": labels, "durations": durations, "problems": problems}
    started, last_report = time.time(), time.time()
    audio = ds.select_columns([entry.audio_column]).with_format("arrow")
    for lo in range(0, n, INDEX_BATCH):
        cells = audio[lo:lo + INDEX_BATCH].column(entry.audio_column).to_pylist()
        for i, value in enumerate(cells, lo):
            try:
                seconds, _ = audio_header(value, ids[i])
            except BadEntry as err:
                problems[i] = f"{err.reason}\t{err.detail}"
                continue
            durations[i] = seconds
            if seconds > MAX_ABSURD_DURATION:
                problems[i] = f"absurd_duration\t{seconds:.0f} s"
        if time.time() - last_report > 30:
            logger.info("%s: read %d of %d audio headers", where, lo + INDEX_BATCH, n)
            last_report = time.time()
    logger.info("%s: %d audio headers read in %.1f s", where, n, time.time() - started)
    return {"ids": ids, "labels": labels, "durations": durations, "problems": problems}


def _read_index(path: str, rows: int) -> dict:
    with np.load(path, allow_pickle=False) as z:
        index = {"ids": [str(x) for x in z["ids"]], "labels": z["labels"],
                 "durations": z["durations"], "problems": [str(x) for x in z["problems"]]}
    if any(len(v) != rows for v in index.values()):
        raise ValueError(f"{len(index['ids'])} rows indexed, the table has {rows}")
    return index


def load_index(ds, entry, where: str) -> dict:
    """The cached index of `ds`, or a new one (read from the table and cached). A cached
    index that cannot be read whole, whatever the damage, is logged and rebuilt."""
    path = _index_path(ds, entry)
    if os.path.exists(path):
        try:
            return _read_index(path, len(ds))
        except Exception as err:      # zip, zlib, npy and OS errors: any damage is a rebuild
            logger.warning("%s: cached duration index %s is damaged (%s: %s); rebuilding it",
                           where, path, type(err).__name__, _one_line(err))
    index = build_index(ds, entry, where)
    buf = io.BytesIO()
    np.savez(buf, ids=np.asarray(index["ids"], dtype=str), labels=index["labels"],
             durations=index["durations"], problems=np.asarray(index["problems"], dtype=str))
    try:
        # Temporary file, fsync, rename: a killed run leaves the old index or the whole new one.
        atomic_write_bytes(path, buf.getvalue())
        logger.info("%s: durations cached in %s", where, path)
    except OSError as err:
        logger.warning("%s: duration index not cached (%s); it is read again next time",
                       where, err)
    return index


# --------------------------------------------------------------------------- the source

class HFBatchDataset(Dataset):
    """Item i = the i-th batch of this rank's plan: rows decoded, built and collated."""

    def __init__(self, source: "HFSource", batches, builder, epoch: int, channel: int):
        self.source = source
        self.batches = batches
        self.builder = builder
        self.epoch = epoch
        self.channel = channel

    def __len__(self) -> int:
        return len(self.batches)

    def __getitem__(self, i: int):
        src = self.source
        examples, keys = [], []
        bad = BadCounter()
        seconds = 0.0
        for idx in self.batches[i]:
            idx = int(idx)
            key = src.key(idx)
            entry = {"key": key, "duration": float(src.durations[idx]),
                     "label": int(src.labels[idx])}
            try:
                audio = decode_audio(src.audio_cell(idx), key, self.channel)
                example = self.builder(entry, self.epoch, audio)
            except BadEntry as err:
                bad.add(err.reason, key, err.detail)
                continue
            examples.append(example)
            keys.append(key)
            seconds += float(src.durations[idx])
        return self.builder.collate(examples, keys, seconds, bad)


@SOURCES.register("hf")
class HFSource(DataSource):
    """The entries of `dataset.hf.<split>`, mixed: their usable rows, one utterance each."""

    def __init__(self, split: str, requirements, dataset_cfg, frames_of: Callable):
        entries = getattr(dataset_cfg.hf, split)
        self.path = " + ".join(describe(e) for e in entries)
        self.bad = BadCounter()
        self.tables = []
        self.audio_columns: List[str] = []
        self.audio_files: List[str] = []
        which, rows, durations, labels, keys = [], [], [], [], []
        prefixes = key_prefixes(entries)
        for t, entry in enumerate(entries):
            where = f"dataset.hf.{split}[{t}]"
            if entry.label_column == "" and requirements.require_label:
                raise ConfigError(f"{where}.label_column: this task needs a label per "
                                  "utterance; name the dataset's integer class column")
            ds = open_table(entry, where)
            index = load_index(ds, entry, f"{where} ({describe(entry)})")
            prefix = prefixes[t]
            good = self._usable_rows(index, prefix, requirements, where)
            self.tables.append(ds.select_columns([entry.audio_column]))
            self.audio_columns.append(entry.audio_column)
            if getattr(ds.features[entry.audio_column], "dtype", None) == "string":
                # Audio as file paths: the files themselves are what training reads.
                column = _column(ds, entry.audio_column)
                self.audio_files.extend(str(column[r]) for r in good)
            which.append(np.full(len(good), t, dtype=np.int32))
            rows.append(good)
            durations.append(index["durations"][good])
            labels.append(index["labels"][good])
            keys.extend(prefix + index["ids"][r] for r in good)
            logger.info("%s: %s, %d of %d rows usable (%.2f h)", where, describe(entry),
                        len(good), len(ds), float(np.sum(durations[-1])) / 3600)
        if len(set(keys)) != len(keys):
            raise ConfigError(_repeated_keys(split, entries, keys, np.concatenate(which)))
        self.which = np.concatenate(which) if which else np.zeros(0, np.int32)
        self.rows = np.concatenate(rows) if rows else np.zeros(0, np.int64)
        self.durations = np.concatenate(durations).astype(np.float32) if durations else \
            np.zeros(0, np.float32)
        self.labels = (np.concatenate(labels) if labels else np.zeros(0)).astype(np.int32)
        # Keys as one blob (forked workers share its pages; no per-string refcounts).
        encoded = [k.encode("utf-8") for k in keys]
        self.key_offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
        np.cumsum([len(k) for k in encoded], out=self.key_offsets[1:])
        self.key_blob = b"".join(encoded)
        self.keep = usable_indices(self.durations, dataset_cfg)
        self.outside_duration = report_duration_filter(self.durations, self.key, dataset_cfg,
                                                       self.path)
        self.frames = frames_of(self.durations)

    def _usable_rows(self, index: dict, prefix: str, requirements, where: str) -> np.ndarray:
        low = -1 if requirements.allow_negative_label else 0
        good = []
        bad = BadCounter()
        for r, problem in enumerate(index["problems"]):
            key = prefix + index["ids"][r]
            label = int(index["labels"][r])
            if problem:
                reason, _, detail = problem.partition("\t")
                bad.add(reason, key, detail)
            elif requirements.require_label and label == np.iinfo(np.int64).min:
                bad.add("missing_label", key, "label column value is not an integer")
            elif requirements.require_label and (
                    label < low or (requirements.num_classes is not None
                                    and label >= requirements.num_classes)):
                bad.add("label_not_in_inventory", key, f"label {label}")
            else:
                good.append(r)
        if bad.total():
            logger.warning("%s: %d of %d rows left out: %s", where, bad.total(),
                           len(index["problems"]), bad.summary())
        self.bad.merge(bad)
        return np.asarray(good, dtype=np.int64)

    def key(self, i: int) -> str:
        return self.key_blob[self.key_offsets[i]:self.key_offsets[i + 1]].decode("utf-8")

    def audio_cell(self, i: int):
        t = int(self.which[i])
        return self.tables[t][int(self.rows[i])][self.audio_columns[t]]

    def __len__(self) -> int:
        return len(self.durations)

    def total_hours(self) -> float:
        return float(self.durations.sum()) / 3600.0

    def plan(self, dataset_cfg, seed, epoch, train):
        return plan_epoch(self.frames, self.keep, dataset_cfg, seed, epoch, train, self.labels)

    def loader(self, batches, builder, epoch, start, num_workers, prefetch_factor, seed):
        return make_loader(HFBatchDataset(self, batches, builder, epoch, builder_channel(builder)),
                           start, num_workers, prefetch_factor, seed)

    def referenced_files(self) -> List[Union[str, Tuple[str, str]]]:
        """The Arrow files behind the tables, and audio files named by path. Arrow files in
        `datasets`' cache come as (name under the cache, path): that name carries the
        builder's hash of the data, its configuration and revision, while where the cache
        lives (HF_HOME) is no part of the data."""
        cache = os.path.realpath(str(_import_datasets().config.HF_DATASETS_CACHE))
        files: dict = {}
        for ds in self.tables:
            for f in ds.cache_files:
                path = f["filename"]
                real = os.path.realpath(path)
                files[path] = (path if os.path.commonpath([cache, real]) != cache else
                               ("$HF_DATASETS_CACHE/" + os.path.relpath(real, cache), path))
        files.update((f, f) for f in self.audio_files)
        return list(files.values())
