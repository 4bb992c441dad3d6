"""Kaldi data directories -> data list entries.

Reads `wav.scp` (paths, `cmd |` pipes, `file.ark:offset`), optional `segments`, `text`,
`utt2spk`, `utt2dur` (computed in parallel when missing), and turns each utterance into a
data-list entry with a label from the class/keyword inventory.
"""
import logging
import multiprocessing as mp
import os
import re
from typing import Callable, Dict, List, Optional, Tuple

from toolkit.data.audio import BadEntry, read_audio
from toolkit.fileio import read_kv
from toolkit.registry import Registry

logger = logging.getLogger(__name__)
LABELERS: Registry = Registry("label mode")


def read_table(path: str, required: bool = True) -> Dict[str, str]:
    if not os.path.exists(path):
        if required:
            raise FileNotFoundError(f"{path} not found")
        return {}
    table: Dict[str, str] = {}
    for lineno, key, value in read_kv(path):
        if key in table:
            raise ValueError(f"{path}:{lineno}: duplicate key {key}")
        table[key] = value
    return table


def read_kw_times(path: str) -> Dict[str, Tuple[float, float]]:
    """`utt start end` lines (seconds, 0 <= start <= end): where the keyword of each
    listed positive is spoken. Malformed lines are errors naming file and line."""
    out: Dict[str, Tuple[float, float]] = {}
    for lineno, key, value in read_kv(path):
        parts = value.split()
        try:
            start, end = (float(x) for x in parts) if len(parts) == 2 else (None, None)
        except ValueError:
            start = end = None
        if start is None or not 0.0 <= start <= end:
            raise ValueError(f"{path}:{lineno}: expected '<utt> <start> <end>' with "
                             f"0 <= start <= end seconds, got {value!r}")
        if key in out:
            raise ValueError(f"{path}:{lineno}: duplicate key {key}")
        out[key] = (start, end)
    return out


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
        for lineno, key, rest in read_kv(segments_path):
            parts = rest.split()
            if len(parts) != 3:
                raise ValueError(f"{segments_path}:{lineno}: expected '<utt> <rec> <start> <end>'")
            rec, start, end = parts[0], float(parts[1]), float(parts[2])
            if rec not in wav_scp:
                raise ValueError(f"{segments_path}:{lineno}: recording {rec} not in wav.scp")
            utts[key] = (wav_scp[rec], start, end)
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
            from toolkit.fileio import atomic_write_text
            atomic_write_text(dur_path, "".join(f"{k} {durations[k]:.3f}\n"
                                                for k in sorted(durations)))
    for key, why in sorted(failed.items()):
        logger.warning("%s: skip %s: %s", data_dir, key, why)
    entries = []
    for key in sorted(utts):
        if key in failed:
            continue
        source, start, end = utts[key]
        entry = {"key": key, "wav": source, "duration": round(durations[key], 3)}
        if end >= 0:
            entry["start"], entry["end"] = start, end
        if key in text:
            entry["txt"] = text[key]
        if key in utt2spk:
            entry["spk"] = utt2spk[key]
        entries.append(entry)
    return entries


def _words(text: str) -> List[str]:
    return re.sub(r"[^\w' ]+", " ", text.lower()).split()


@LABELERS.register("keyword")
def keyword_labeler(inventory: List[str]) -> Callable[[str], Optional[int]]:
    """Index of the keyword whose word sequence occurs in the text (earliest occurrence
    wins), else -1 (filler). Case and punctuation are ignored."""
    phrases = [_words(k) for k in inventory]

    def label(text: str) -> Optional[int]:
        words = _words(text)
        best: Tuple[int, int] = (len(words) + 1, -1)
        for index, phrase in enumerate(phrases):
            n = len(phrase)
            for pos in range(len(words) - n + 1):
                if words[pos:pos + n] == phrase:
                    best = min(best, (pos, index))
                    break
        return best[1]
    return label


@LABELERS.register("class")
def class_labeler(inventory: List[str]) -> Callable[[str], Optional[int]]:
    """The text is the class name itself (command words); unknown names give None."""
    index = {name: i for i, name in enumerate(inventory)}
    return lambda text: index.get(text.strip())


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
        spk2utt: Dict[str, List[str]] = {}
        for utt in sorted(tables["utt2spk"]):
            spk2utt.setdefault(tables["utt2spk"][utt], []).append(utt)
        tables["spk2utt"] = {spk: " ".join(utts) for spk, utts in spk2utt.items()}
    for name, table in tables.items():
        with open(os.path.join(data_dir, name), "w", encoding="utf-8") as f:
            f.write("".join(f"{key} {table[key]}\n" for key in sorted(table)))
