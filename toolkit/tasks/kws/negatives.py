"""The general negatives of a synthetic wake-word corpus (toolkit.tasks.kws.corpus): its
random-word and noise-only utterances (utt2kind `neg`, `noise`). They are planned from
streams no keyword enters, so every keyword's corpus of the same settings holds the same
ones, and are

- filtered per keyword: a negative whose text holds a keyword (its words in a row, its
  letters spelled across word boundaries, its sound: TextFilter.keyword_in), or whose
  babble noise is spoken from a sentence that does, is dropped from that keyword's corpus,
  logged and counted (per split, with the reasons);
- made once with the negatives cache on (synth_kws_data --neg-cache): rendered into an
  entry under cache_root()/audio (<toolkit cache>/kws_negatives, or $TOOLKIT_NEG_CACHE) (toolkit.entry_cache: keyed, locked,
  verified on use, published whole, rebuilt when damaged) and hard-linked (or copied)
  into each corpus, byte for byte what rendering them into the corpus writes. Each split's
  data dir then records where they came from (RECORD_NAME), from which compute_feats
  --neg-cache takes their features computed once per front end
  (toolkit.tasks.kws.neg_feats).

An entry's key: everything of the corpus stamp that is not the keyword's (format, seed,
sample rate, SNR range, engines with their versions, voices and shares, blends,
test-only), the count of each general kind per split, and the sha256 of their plan
(texts, voices, prosody, noise, babble, group seeds). An entry holds wavs/<split>/<utt>.wav
for every general negative planned, and utt2len (samples of each).
"""
import contextlib
import json
import logging
import os
from collections import Counter
from dataclasses import asdict
from typing import Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

from toolkit.data import kaldi
from toolkit.entry_cache import Entry, EntryCache, link_or_copy
from toolkit.fileio import atomic_write_text
from toolkit.tasks.kws.corpus_text import TextFilter
from toolkit.voicebank import SynthError, toolkit_cache_dir
from toolkit.voicebank.corpus_dir import FINISHED, WAVS_NAME, Group

logger = logging.getLogger(__name__)

GENERAL_KINDS = ("neg", "noise")
CACHE_NAME = "kws_negatives"      # under the toolkit cache ($TOOLKIT_CACHE, ~/.cache/toolkit)
CACHE_ENV = "TOOLKIT_NEG_CACHE"   # or here
CACHE_FORMAT = 1                  # bump when an entry's layout changes: old entries then miss
RECORD_NAME = "neg_cache.json"    # in each split's data dir of a corpus that used the cache
LENGTHS_NAME = "utt2len"
# Stamp settings that only shape the keyword's own utterances (the general negatives'
# counts enter the key by themselves).
KEYWORD_SETTINGS = ("keywords", "sizes", "train_conf_share", "train_hard_share", FINISHED)
EXAMPLES = 5                      # dropped negatives named in the log, per split

# (groups, directory) -> the renderer's results [(utt, samples, span)]: the groups' WAVs
# written to <directory>/wavs/<split>/.
Render = Callable[[Sequence[Group], str], List[Tuple[str, int, object]]]


def cache_root() -> str:
    """$TOOLKIT_NEG_CACHE, else <toolkit cache>/kws_negatives ($TOOLKIT_CACHE, else
    ~/.cache/toolkit)."""
    value = os.environ.get(CACHE_ENV, "").strip()
    return os.path.abspath(os.path.expanduser(value)) if value else \
        os.path.join(toolkit_cache_dir(), CACHE_NAME)


def is_general(group: Group) -> bool:
    return bool(group.specs) and all(s.kind in GENERAL_KINDS for s in group.specs)


# --------------------------------------------------------------------------------------
# The keyword filter
# --------------------------------------------------------------------------------------

def drop_for_keywords(groups: Sequence[Group], filt: TextFilter) -> Dict[str, str]:
    """utt -> why it holds a keyword, for the general negatives of `groups`: its text
    (`words`, `spelling`, `sound`), or `babble <why>` for an utterance in babble noise
    whose group's babble pool speaks a sentence that holds one."""
    dropped = {}
    for group in filter(is_general, groups):
        babble = next((why for why in (filt.keyword_in(b.text) for b in group.babble) if why), "")
        for spec in group.specs:
            why = filt.keyword_in(spec.text) if spec.kind == "neg" else ""
            if not why and babble and spec.noise == "babble":
                why = f"babble {babble}"
            if why:
                dropped[spec.utt] = why
    return dropped


def log_dropped(dropped: Mapping[str, str], groups: Sequence[Group],
                keywords: Sequence[str]) -> Dict[str, int]:
    """Logs, per split, how many general negatives were dropped for `keywords` and why
    (naming the first few); returns split -> count."""
    counts = {}
    for split in dict.fromkeys(g.split for g in groups if is_general(g)):
        specs = [s for g in groups if g.split == split and is_general(g) for s in g.specs]
        gone = [s for s in specs if s.utt in dropped]
        counts[split] = len(gone)
        if not gone:
            logger.info("%s: none of the %d general negatives holds %s", split, len(specs),
                        " or ".join(repr(k) for k in keywords))
            continue
        why = Counter(dropped[s.utt].split()[0] if not dropped[s.utt].startswith("babble")
                      else "babble" for s in gone)
        logger.warning("%s: %d of %d general negatives dropped: they hold %s (%s); e.g. %s",
                       split, len(gone), len(specs), " or ".join(repr(k) for k in keywords),
                       ", ".join(f"{n} by {w}" for w, n in sorted(why.items())),
                       "; ".join(f"{s.utt} {s.text!r} ({dropped[s.utt]})"
                                 for s in gone[:EXAMPLES]))
    return counts


# --------------------------------------------------------------------------------------
# The cache
# --------------------------------------------------------------------------------------

def plan_digest(groups: Sequence[Group]) -> str:
    """sha256 of everything planned of `groups` (what decides their samples)."""
    import hashlib
    text = json.dumps([[g.split, g.index, list(g.seed), [asdict(s) for s in g.specs],
                        [asdict(b) for b in g.babble]] for g in groups],
                      sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def entry_key(stamp: Mapping, groups: Sequence[Group]) -> dict:
    """The key of the general negatives of `groups` in a corpus of `stamp`."""
    general = [g for g in groups if is_general(g)]
    counts: Dict[str, Dict[str, int]] = {}
    for g in general:
        for s in g.specs:
            counts.setdefault(g.split, {k: 0 for k in GENERAL_KINDS})[s.kind] += 1
    settings = {k: v for k, v in stamp.items() if k not in KEYWORD_SETTINGS}
    return {"what": "general negatives of a synthetic wake-word corpus",
            "cache_format": CACHE_FORMAT, "settings": settings, "counts": counts,
            "plan_sha256": plan_digest(general)}


@contextlib.contextmanager
def cached_negatives(stamp: Mapping, groups: Sequence[Group], render: Render,
                     root: Optional[str] = None) -> Iterator[Tuple[Entry, Dict[str, int]]]:
    """(the entry of the general negatives of `groups`, utt -> samples), rendered first
    by `render` when the entry is missing or damaged; its lock held for the body."""
    general = [g for g in groups if is_general(g)]
    planned = {s.utt for g in general for s in g.specs}
    cache = EntryCache(os.path.join(root or cache_root(), "audio"), "negatives cache entry")

    def build(folder: str) -> None:
        results = render(general, folder)
        kaldi.write_table(os.path.join(folder, LENGTHS_NAME),
                          {utt: str(n) for utt, n, _ in results})

    with cache.open(entry_key(stamp, groups), build) as entry:
        lengths_path = os.path.join(entry.path, LENGTHS_NAME)
        lengths = {k: int(v) for k, v in kaldi.read_table(lengths_path).items()}
        if set(lengths) != planned:
            raise SynthError(f"{lengths_path}: holds other utterances than the plan of its key "
                             f"({len(set(lengths) ^ planned)} differ): remove {entry.path}")
        yield entry, lengths


def wav_path(root: str, split: str, utt: str) -> str:
    return os.path.join(root, WAVS_NAME, split, utt + ".wav")


def link_negatives(entry: Entry, groups: Sequence[Group], dropped: Mapping[str, str],
                   wav_dir: Callable[[str], str]) -> int:
    """Hard-links (else copies) every general negative of `groups` not `dropped` from the
    entry into wav_dir(split); returns how many."""
    n = 0
    for group in filter(is_general, groups):
        for spec in group.specs:
            if spec.utt not in dropped:
                link_or_copy(wav_path(entry.path, group.split, spec.utt),
                             os.path.join(wav_dir(group.split), spec.utt + ".wav"))
                n += 1
    return n


def write_records(out_dir: str, entry: Entry, groups: Sequence[Group],
                  dropped: Mapping[str, str]) -> None:
    """RECORD_NAME in each split's data dir: the entry and the utterances taken from it."""
    for split in dict.fromkeys(g.split for g in groups if is_general(g)):
        utts = [s.utt for g in groups if g.split == split and is_general(g) for s in g.specs]
        record = {"cache_format": CACHE_FORMAT, "entry": entry.path, "digest": entry.digest,
                  "content": entry.content, "split": split,
                  "utts": sorted(u for u in utts if u not in dropped),
                  "dropped": {u: dropped[u] for u in sorted(utts) if u in dropped}}
        atomic_write_text(os.path.join(out_dir, split, RECORD_NAME),
                          json.dumps(record, indent=0, sort_keys=True))


def read_record(data_dir: str) -> Optional[dict]:
    """The record in `data_dir`, None when it has none; SynthError naming it when it
    cannot be read."""
    path = os.path.join(data_dir, RECORD_NAME)
    if not os.path.exists(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            record = json.load(f)
        for name, kind in (("entry", str), ("digest", str), ("content", str), ("split", str),
                           ("utts", list)):
            if not isinstance(record.get(name), kind):
                raise ValueError(f"`{name}` missing or not a {kind.__name__}")
    except (OSError, ValueError) as err:
        raise SynthError(f"{path}: unreadable negatives cache record ({err}); rerun stage 0 "
                         f"(synth_kws_data) for this corpus") from None
    return record
