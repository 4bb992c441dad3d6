"""What make_datalist needs from keyword spotting, without torch: the `keyword` label
mode (which keyword a transcript speaks), the `kw_times` file (where it is spoken), the
utterance kind and neighbour category of a wake-word corpus (utt2kind, utt2cat: what
scoring measures apart) and CTC unit targets of the transcript."""
import os
import re
from typing import Callable, Dict, List, Optional, Tuple

from toolkit.data.kaldi import LABELERS, read_table, scan_table
from toolkit.errors import DataError

KW_TIMES = "kw_times"
# Data list field <- Kaldi table of a wake-word corpus (toolkit.tasks.kws.corpus).
KIND_TABLES = {"kind": "utt2kind", "cat": "utt2cat"}


def read_kw_times(path: str) -> Dict[str, Tuple[float, float]]:
    """`utt start end` lines (seconds, 0 <= start <= end): where the keyword of each
    listed positive is spoken. Malformed lines are errors naming file and line."""
    out: Dict[str, Tuple[float, float]] = {}
    read_table(path)           # duplicate keys and bad bytes, named by line
    for line in scan_table(path).lines:
        key, value = line.key, line.value
        parts = value.split()
        try:
            start, end = (float(x) for x in parts) if len(parts) == 2 else (None, None)
        except ValueError:
            start = end = None
        if start is None or not 0.0 <= start <= end:
            raise DataError(f"{path}:{line.lineno}: expected '<utt> <start> <end>' with "
                            f"0 <= start <= end seconds, got {value!r}")
        out[key] = (start, end)
    return out


def _words(text: str) -> List[str]:
    return re.sub(r"[^\w' ]+", " ", text.lower()).split()


@LABELERS.register("keyword")
def keyword_labeler(inventory: List[str]) -> Callable[[dict], Optional[int]]:
    """Index of the keyword whose word sequence occurs in the text (earliest occurrence
    wins), else -1 (filler). Case and punctuation are ignored."""
    phrases = [_words(k) for k in inventory]

    def label(entry: dict) -> Optional[int]:
        words = _words(entry.get("txt", ""))
        best: Tuple[int, int] = (len(words) + 1, -1)
        for index, phrase in enumerate(phrases):
            n = len(phrase)
            for pos in range(len(words) - n + 1):
                if words[pos:pos + n] == phrase:
                    best = min(best, (pos, index))
                    break
        return best[1]
    return label


def kw_times_annotator(data_dir: str) -> Callable[[dict], None]:
    """Adds `kw_start`/`kw_end` from the data dir's kw_times file, and `kind`/`cat` from
    its utt2kind/utt2cat, for the files it has."""
    times_path = os.path.join(data_dir, KW_TIMES)
    kw_times = read_kw_times(times_path) if os.path.exists(times_path) else {}
    tables = {field: read_table(os.path.join(data_dir, name))
              for field, name in KIND_TABLES.items()
              if os.path.exists(os.path.join(data_dir, name))}

    def annotate(entry: dict) -> None:
        if entry["key"] in kw_times:
            entry["kw_start"], entry["kw_end"] = kw_times[entry["key"]]
        for field, table in tables.items():
            if entry["key"] in table:
                entry[field] = table[entry["key"]]
    return annotate


def tokens_annotator(tokenizer) -> Callable[[dict], Optional[str]]:
    """Adds the CTC `tokens` of the transcript (empty for silence or noise: all blank);
    returns the out-of-lexicon words of an entry that gets none."""
    def annotate(entry: dict) -> Optional[str]:
        ids, oov = tokenizer.encode(entry.get("txt", ""))
        if ids is None:
            return " ".join(oov)
        entry["tokens"] = ids
        return None
    return annotate
