"""CTC targets. A lexicon maps each word to units (phones or characters); `units.txt`
lists the units, one per line, with the CTC blank `<blank>` first (index 0).

    lexicon.txt   hey h eI            units.txt   <blank>
                  snips s n I p s                 @
                                                  I
                                                  ...
"""
import logging
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

from toolkit.registry import Registry

logger = logging.getLogger(__name__)

BLANK = "<blank>"

Lexicon = Dict[str, List[str]]


def is_nonspeech(word: str) -> bool:
    """Kaldi-style markers such as <noise>, <sil>, <unk>: no units (CTC blank)."""
    return len(word) > 2 and word[0] == "<" and word[-1] == ">"


def read_lexicon(path: str) -> Lexicon:
    """`word unit unit ...` per line; the first pronunciation of a word wins."""
    from toolkit.fileio import read_lines
    lexicon: Lexicon = {}
    for lineno, line in read_lines(path):
        fields = line.split()
        if len(fields) < 2:
            raise ValueError(f"{path}:{lineno}: expected 'word unit [unit ...]', got {line!r}")
        if BLANK in fields[1:]:
            raise ValueError(f"{path}:{lineno}: {BLANK} is reserved for the CTC blank")
        lexicon.setdefault(fields[0], fields[1:])
    if not lexicon:
        raise ValueError(f"{path}: empty lexicon")
    return lexicon


def write_lexicon(path: str, lexicon: Lexicon) -> None:
    from toolkit.fileio import atomic_write_text
    atomic_write_text(path, "".join(f"{w} {' '.join(u)}\n" for w, u in sorted(lexicon.items())))


def units_of(lexicon: Lexicon) -> List[str]:
    """The unit inventory of a lexicon: blank first, then the units in code-point order."""
    return [BLANK] + sorted({u for units in lexicon.values() for u in units})


def read_units(path: str) -> List[str]:
    from toolkit.data.inventory import read_inventory
    units = read_inventory(path)
    if units[0] != BLANK:
        raise ValueError(f"{path}: the first unit must be {BLANK} (the CTC blank), "
                         f"got {units[0]!r}")
    if len(units) < 2:
        raise ValueError(f"{path}: no units besides {BLANK}")
    return units


class Tokenizer:
    """Transcript -> unit ids through the lexicon."""

    def __init__(self, lexicon: Lexicon, units: Sequence[str]):
        self.index = {u: i for i, u in enumerate(units)}
        missing = sorted({u for us in lexicon.values() for u in us} - set(self.index))
        if missing:
            raise ValueError(f"lexicon units missing from the unit list: {missing[:10]}")
        self.lexicon = lexicon

    def encode(self, text: str) -> Tuple[Optional[List[int]], List[str]]:
        """(ids, []) or (None, out-of-lexicon words)."""
        words = [w for w in text.split() if not is_nonspeech(w)]
        oov = [w for w in words if w not in self.lexicon]
        if oov:
            return None, oov
        return [self.index[u] for w in words for u in self.lexicon[w]], []


# How words become units. Each builder takes the word list and returns a lexicon.
LEXICON_BUILDERS: Registry = Registry("lexicon unit")


@LEXICON_BUILDERS.register("char")
def char_lexicon(words: Iterable[str], voice: str = "") -> Lexicon:
    """Spelling: each character is a unit (any script, no pronunciation tool needed)."""
    return {w: list(w) for w in words}


# espeak's ASCII phoneme names carry stress and syllable marks (the phone is the same) and
# ";" for palatalisation.
_PHONE_MARKS = str.maketrans("", "", "',%=;")


def base_phone(phone: str) -> str:
    """espeak-ng's contextual variants ("t#", "t2", "@2", "aI3": a flap, a weak vowel) as
    their phone: which variant is spoken depends on context a CTC target cannot see, so
    keeping them apart only splits one sound over several units. Single-character phones
    that are digits ("0", "3") are phones themselves."""
    trimmed = phone.rstrip("0123456789#") if len(phone) > 1 else phone
    return trimmed or phone


@LEXICON_BUILDERS.register("phone")
def espeak_lexicon(words: Iterable[str], voice: str = "en-us") -> Lexicon:
    """Pronunciations from espeak-ng (the TTS the synthetic recipe speaks with)."""
    from toolkit.voicebank.espeak import Espeak
    engine = Espeak()
    lexicon: Lexicon = {}
    for w in words:
        raw = engine.phonemes(w, voice, separator="_")
        phones = [base_phone(p.translate(_PHONE_MARKS)) for p in raw.replace(" ", "_").split("_")]
        phones = [p for p in phones if p]
        if not phones:
            logger.warning("espeak-ng gave no phonemes for %r; left out of the lexicon", w)
            continue
        lexicon[w] = phones
    return lexicon


def transcript_words(text_files: Sequence[str]) -> List[str]:
    """Every word of Kaldi `text` files (key first on each line), sorted."""
    from toolkit.data.kaldi import read_table
    words = set()
    for path in text_files:
        for text in read_table(path).values():
            words.update(w for w in text.split() if not is_nonspeech(w))
    return sorted(words)
