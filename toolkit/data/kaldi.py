"""Kaldi data directories: the one reader and writer of `key value` tables, and the
conversion of a data dir into data-list entries.

Reads `wav.scp` (paths, `cmd |` pipes, `file.ark:offset`), optional `segments`, `text`,
`utt2spk`, `utt2dur` (computed in parallel when missing), and turns each utterance into a
data-list entry with a label from the class inventory (LABELERS: how a label is found).
Relative paths in `wav.scp` and feats.scp are Kaldi's: relative to the working directory;
entries get them absolute (a data list resolves relative paths against its own directory).
"""
import logging
import multiprocessing as mp
import os
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Tuple

from toolkit.data.audio import BadEntry, read_audio
from toolkit.data.datalist import resolve_source
from toolkit.errors import DataError, MissingInputError
from toolkit.fileio import atomic_write_text
from toolkit.registry import Registry

logger = logging.getLogger(__name__)
LABELERS: Registry = Registry("label mode")
FIX_HINT = "utils/fix_data_dir.sh {dir} repairs sorting, duplicates and coverage"


@dataclass
class Line:
    lineno: int
    key: str
    value: str


@dataclass
class Table:
    name: str
    path: str
    lines: List[Line] = field(default_factory=list)
    blank: List[int] = field(default_factory=list)
    undecodable: List[int] = field(default_factory=list)

    def first(self) -> Dict[str, Line]:
        """Each key's first line (what `fix_data_dir` keeps)."""
        out: Dict[str, Line] = {}
        for line in self.lines:
            out.setdefault(line.key, line)
        return out


def c_order(key: str) -> bytes:
    """Sort key matching `LC_ALL=C sort`, which Kaldi tools assume: raw byte order."""
    return key.encode("utf-8")


def scan_table(path: str) -> Table:
    """Every line of a table, recording blank and non-UTF-8 lines instead of failing on
    them, so that a validator can report them together with everything else."""
    table = Table(os.path.basename(path), path)
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                table.undecodable.append(lineno)
                continue
            parts = text.strip().split(maxsplit=1)
            if not parts:
                table.blank.append(lineno)
                continue
            table.lines.append(Line(lineno, parts[0], parts[1] if len(parts) > 1 else ""))
    return table


def read_table(path: str, required: bool = True) -> Dict[str, str]:
    """key -> value. A duplicate key or a non-UTF-8 line is a DataError naming the line
    and pointing at fix_data_dir; blank lines are ignored."""
    if not os.path.exists(path):
        if required:
            raise MissingInputError(f"{path} not found")
        return {}
    scanned = scan_table(path)
    hint = FIX_HINT.format(dir=os.path.dirname(path) or ".")
    if scanned.undecodable:
        raise DataError(f"{path}:{scanned.undecodable[0]}: not valid UTF-8; {hint}")
    table: Dict[str, str] = {}
    for line in scanned.lines:
        if line.key in table:
            raise DataError(f"{path}:{line.lineno}: duplicate key {line.key}; {hint}")
        table[line.key] = line.value
    return table


def write_table(path: str, rows: Dict[str, str]) -> None:
    """`key value` lines sorted in C order, written atomically."""
    atomic_write_text(path, "".join(f"{k} {rows[k]}\n" for k in sorted(rows, key=c_order)))


def _duration_of(args: Tuple[str, str, float, float]) -> Tuple[str, Optional[float], str]:
    key, source, start, end = args
    if end >= 0:
        return key, end - start, ""
    try:
        if not source.endswith("|") and os.path.exists(source):
            import soundfile as sf
            info = sf.info(source)
            return key, info.frames / info.samplerate, ""
        audio, rate = read_audio(source)
        return key, len(audio) / rate, ""
    except BadEntry as err:
        return key, None, err.reason
    except Exception as err:
        return key, None, f"unreadable_audio ({err})"


def compute_durations(items: List[Tuple[str, str, float, float]], nj: int) -> Dict[str, Tuple[Optional[float], str]]:
    if nj > 1 and len(items) > 64:
        with mp.get_context("fork").Pool(nj) as pool:
            results = pool.map(_duration_of, items, chunksize=64)
    else:
        results = [_duration_of(x) for x in items]
    return {k: (d, why) for k, d, why in results}


def load_data_dir(data_dir: str, nj: int = 2, write_utt2dur: bool = True) -> List[dict]:
    """Entries (key, wav, txt, duration[, start, end, spk]) in sorted key order."""
    wav_scp = read_table(os.path.join(data_dir, "wav.scp"))
    segments_path = os.path.join(data_dir, "segments")
    utts: Dict[str, Tuple[str, float, float]] = {}
    if os.path.exists(segments_path):
        for line in scan_table(segments_path).lines:
            parts = line.value.split()
            where = f"{segments_path}:{line.lineno}"
            try:
                rec, start, end = parts[0], float(parts[1]), float(parts[2])
                if len(parts) != 3:
                    raise ValueError
            except (ValueError, IndexError):
                raise DataError(f"{where}: expected '<utt> <rec> <start> <end>'") from None
            if rec not in wav_scp:
                raise DataError(f"{where}: recording {rec} not in wav.scp")
            if line.key in utts:
                raise DataError(f"{where}: duplicate key {line.key}; "
                                + FIX_HINT.format(dir=data_dir))
            utts[line.key] = (wav_scp[rec], start, end)
    else:
        utts = {k: (v, 0.0, -1.0) for k, v in wav_scp.items()}
    text = read_table(os.path.join(data_dir, "text"), required=False)
    utt2spk = read_table(os.path.join(data_dir, "utt2spk"), required=False)
    dur_path = os.path.join(data_dir, "utt2dur")
    durations = {k: float(v) for k, v in read_table(dur_path, required=False).items()}
    missing = [(k, *utts[k]) for k in utts if k not in durations]
    failed: Dict[str, str] = {}
    if missing:
        logger.info("%s: computing %d durations with %d jobs", data_dir, len(missing), nj)
        for key, (dur, why) in compute_durations(missing, nj).items():
            if dur is None:
                failed[key] = why
            else:
                durations[key] = dur
        if write_utt2dur:
            write_table(dur_path, {k: f"{v:.3f}" for k, v in durations.items()})
    for key, why in sorted(failed.items()):
        logger.warning("%s: skip %s: %s", data_dir, key, why)
    entries = []
    for key in sorted(utts):
        if key in failed:
            continue
        source, start, end = utts[key]
        entry = {"key": key, "wav": resolve_source(source, os.getcwd()),
                 "duration": round(durations[key], 3)}
        if end >= 0:
            entry["start"], entry["end"] = start, end
        if key in text:
            entry["txt"] = text[key]
        if key in utt2spk:
            entry["spk"] = utt2spk[key]
        entries.append(entry)
    return entries


@LABELERS.register("class")
def class_labeler(inventory: List[str]) -> Callable[[dict], Optional[int]]:
    """The text is the class name itself (command words); unknown names give None."""
    index = {name: i for i, name in enumerate(inventory)}
    return lambda entry: index.get(entry.get("txt", "").strip())


@LABELERS.register("speaker")
def speaker_labeler(inventory: List[str]) -> Callable[[dict], Optional[int]]:
    """The utterance's speaker (utt2spk) indexes the inventory; unknown speakers give None."""
    index = {name: i for i, name in enumerate(inventory)}
    return lambda entry: index.get(entry.get("spk", ""))


@LABELERS.register("none")
def no_labeler(inventory: Optional[List[str]]) -> Callable[[dict], Optional[int]]:
    """No class at all: every utterance is kept with label -1 (phone recognition, whose
    targets are the transcript's units, `tokens`)."""
    return lambda entry: -1


def labelled_entries(data_dir: str, labeler: Callable[[dict], Optional[int]], nj: int = 2,
                     feats: Optional[Dict[str, str]] = None,
                     before: Optional[Callable[[dict], None]] = None,
                     after: Optional[Callable[[dict], Optional[str]]] = None,
                     ) -> Tuple[List[dict], Dict[str, List[str]]]:
    """A data dir's entries with their labels (and `feat` from `feats`, a feats.scp table,
    when given). `before` adds task fields ahead of `feat` and `label`; `after` adds them
    behind and returns why it could not (the entry is kept, the reason reported), or None.
    Returns the entries and, by reason (no_features, no_label, note), the keys concerned."""
    entries: List[dict] = []
    problems: Dict[str, List[str]] = {}
    for entry in load_data_dir(data_dir, nj=nj):
        key = entry["key"]
        if before is not None:
            before(entry)
        if feats is not None:
            if key not in feats:
                problems.setdefault("no_features", []).append(key)
                continue
            entry["feat"] = resolve_source(feats[key], os.getcwd())
        label = labeler(entry)
        if label is None:
            problems.setdefault("no_label", []).append(key)
            continue
        entry["label"] = label
        note = after(entry) if after is not None else None
        if note:
            problems.setdefault("note", []).append(f"{key} ({note})")
        entries.append(entry)
    return entries, problems


def write_data_dir(data_dir: str, tables: Dict[str, Dict[str, str]],
                   stale: Tuple[str, ...] = ("segments", "utt2dur", "data.list")) -> None:
    """Writes Kaldi tables (file name -> {key: value}) sorted in C order, derives spk2utt
    from utt2spk, and removes files of an earlier run (`stale`) that this one does not
    write, so a rerun never mixes old and new utterances."""
    os.makedirs(data_dir, exist_ok=True)
    for name in stale:
        path = os.path.join(data_dir, name)
        if name not in tables and os.path.exists(path):
            os.remove(path)
    tables = dict(tables)
    if "utt2spk" in tables:
        tables["spk2utt"] = spk2utt_of(tables["utt2spk"])
    for name, table in tables.items():
        write_table(os.path.join(data_dir, name), table)


def spk2utt_of(utt2spk: Dict[str, str]) -> Dict[str, str]:
    """spk2utt rows from utt2spk: each speaker's utterances in C order."""
    out: Dict[str, List[str]] = {}
    for utt in sorted(utt2spk, key=c_order):
        out.setdefault(utt2spk[utt], []).append(utt)
    return {spk: " ".join(utts) for spk, utts in out.items()}
