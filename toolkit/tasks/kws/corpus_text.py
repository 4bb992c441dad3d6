"""The texts of the synthetic wake-word corpus (toolkit.tasks.kws.corpus): keyword
phrases, the carrier phrases positives are said in, random negatives, confusables (the
keyword's real-word neighbours by category, toolkit.tasks.kws.neighbours) and accent
variants of the keyword (test sets only: they should fire). `TextFilter` keeps every negative free of a keyword, by words and by
sound (espeak-ng phonemes). Every draw comes from the caller's numpy generator, so that
a corpus plan stays a pure function of its seed."""
import functools
import re
from typing import Dict, List, Sequence, Tuple

import numpy as np

from toolkit.tasks.kws.neighbours import KeywordNeighbours
from toolkit.voicebank import SynthError

RANDOM_WORDS = (2, 8)        # words of a random negative
POS_ALONE = 0.4              # positives with no carrier phrase

CARRIERS = (
    "{kw} turn on the lights", "okay {kw}", "hmm {kw} what time is it",
    "{kw} play some music", "{kw} what is the weather like today", "um {kw}",
    "{kw} set a timer for ten minutes", "{kw} stop", "hello {kw}",
    "{kw} call my mother", "well {kw} are you there", "{kw} turn it off",
    "so {kw} how are you", "{kw} open the door", "please {kw} start the music",
    "{kw} how far is the station", "oh {kw} can you hear me", "{kw} volume up",
    "right {kw} read my messages", "{kw} good morning",
)

VOCAB = tuple("""
a about above across act add after again against age ago air all almost alone along
already also always am among an and animal another answer any anything appear apple
are area arm around art as ask at away baby back bad bag ball bank bar base be bear
beat beautiful became because become bed been before began begin behind being believe
below best better between big bird bit black blue board boat body book both bottom box
boy bread break bring brother brown build built burn bus busy but buy by cake call
came can car card care carry case cat catch cause center certain chair change check
child children city class clean clear close cloud coffee cold color come common
complete could country course cover cross cup cut dark day dead deal dear deep did
different dinner do doctor does dog done door down draw dream dress drink drive dry
during each early earth east easy eat egg eight either else end enough even evening
ever every example eye face fact fall family far farm fast father feel feet few field
fill final find fine fire first fish five floor flower fly follow food foot for force
form four free friend from front full game garden gave get girl give glass go gold
gone good got great green ground group grow had hair half hand happen happy hard has
have he head hear heard heart heat heavy held help her here high hill him his hold
home hope horse hot hour house how however hundred idea if important in inside into
is island it its job just keep kept kind king knew know land large last late later
laugh learn least leave left leg less let letter life light like line list listen
little live long look lost lot loud love low made make man many map mark market may
me mean measure meet men might mile milk mind minute miss money month moon more
morning most mother mountain move much music must my name near need never new next
nice night nine no north not note nothing now number of off often oil old on once one
only open or order other our out over own page paper park part party pass past pay
people person pick picture piece place plan plant play point poor possible power
pretty problem pull push put question quick quiet rain ran reach read ready real red
remember rest rich ride right river road rock room round rule run said same sat saw
say school sea second see seem seen sell send sentence seven several shall she ship
shop short should show side simple since sing sister sit six size sleep slow small
snow so some something song soon sound south speak special spring stand star start
state stay step still stone stood story street strong study such summer sun sure
table take talk tall tea teacher tell ten than thank that the their them then there
these they thing think third this those though thought three through time to today
together told too took top touch tower town train travel tree true try turn twelve
two under until up upon us use very visit voice wait walk wall want warm was watch
water way we wear weather week well went were west what wheel when where which while
white who whole why wide wife will wind window winter with without woman wonder wood
word work world would write wrong yard year yellow yes yet you young your
""".split())

_WORD_RE = re.compile(r"^[a-z0-9']+$")


# --------------------------------------------------------------------------------------
# Keywords and their confusables
# --------------------------------------------------------------------------------------

def normalize_keyword(keyword: str) -> str:
    """Lowercase, single-spaced keyword; raises SynthError when empty or unspeakable."""
    words = str(keyword).lower().replace("-", " ").split()
    if not words:
        raise SynthError(f"empty keyword {keyword!r}: give a phrase such as --keyword 'hey snips'")
    bad = [w for w in words if not _WORD_RE.match(w)]
    if bad:
        raise SynthError(f"keyword {keyword!r}: words may only hold letters, digits and "
                         f"apostrophes, got {bad}")
    return " ".join(words)


def contains_phrase(words: Sequence[str], phrase: Sequence[str]) -> bool:
    """True when `phrase` occurs in `words` as a contiguous word sequence."""
    return count_phrase(words, phrase) > 0


def count_phrase(words: Sequence[str], phrase: Sequence[str]) -> int:
    n = len(phrase)
    if n == 0:
        return 0
    return sum(1 for i in range(len(words) - n + 1) if tuple(words[i:i + n]) == tuple(phrase))


def common_words() -> frozenset:
    """Everyday words (the vocabulary and the carrier phrases): preferred neighbours."""
    words = set(VOCAB)
    for c in CARRIERS:
        words.update(w for w in c.split() if w != "{kw}")
    return frozenset(words)


def confusable_categories(keyword: str) -> Dict[str, List[str]]:
    """The keyword's neighbours by category (toolkit.tasks.kws.neighbours.CATEGORIES),
    unfiltered; `context` (keyword pieces among random words) is drawn at sampling time.
    The caller's own copy: planning asks twice per keyword (lexicon_words, the draw)."""
    return {cat: list(words) for cat, words in _categories(keyword).items()}


@functools.lru_cache(maxsize=8)
def _categories(keyword: str) -> Dict[str, Tuple[str, ...]]:
    return {cat: tuple(words)
            for cat, words in KeywordNeighbours(keyword, common=common_words()).categories().items()}


def accent_variants(keyword: str) -> List[str]:
    """Spellings of the keyword one vowel away that are no word: the keyword in another
    accent, never a negative."""
    return KeywordNeighbours(keyword).accent_variants()


# --------------------------------------------------------------------------------------
# Keeping keywords out of the negatives
# --------------------------------------------------------------------------------------

class TextFilter:
    """Rejects texts that contain a keyword, by words or by sound (espeak phonemes of
    each word under every accent, stress marks and word gaps removed)."""

    def __init__(self, keywords: Sequence[str], phonemes: Dict[str, Dict[str, str]]):
        self.keywords = [k.split() for k in keywords]
        self.phonemes = phonemes          # accent -> word -> phoneme string

    def _sound(self, words: Sequence[str], accent: str) -> str:
        table = self.phonemes[accent]
        return "".join(table.get(w, "?" + w + "?") for w in words)

    def is_negative(self, text: str) -> bool:
        words = text.split()
        if any(contains_phrase(words, k) for k in self.keywords):
            return False
        for accent in self.phonemes:
            sound = self._sound(words, accent)
            if any(self._sound(k, accent) in sound for k in self.keywords):
                return False
        return True

    def keyword_in(self, text: str) -> str:
        """Why `text` is no negative: `words` (a keyword's words in a row, any case),
        `spelling` (a keyword's letters spelled by whole words across their boundaries:
        "a lexa" for "alexa"), `sound` (its phonemes in the text's, as is_negative); ""
        when it is one."""
        words = text.lower().split()
        if any(contains_phrase(words, k) for k in self.keywords):
            return "words"
        if any(spelled_across(words, "".join(k)) for k in self.keywords):
            return "spelling"
        return "" if self.is_negative(" ".join(words)) else "sound"


def spelled_across(words: Sequence[str], letters: str) -> bool:
    """True when consecutive whole `words` spell `letters` exactly."""
    for i in range(len(words)):
        spelled = ""
        for w in words[i:]:
            spelled += w
            if len(spelled) >= len(letters):
                break
        if spelled == letters:
            return True
    return False


def clean_phonemes(s: str) -> str:
    """espeak-ng phonemes without stress marks and word gaps (TextFilter compares these)."""
    return re.sub(r"[\s',_]", "", s)


def lexicon_words(keywords: Sequence[str]) -> List[str]:
    """Every word a planned text can contain: vocabulary, carriers, keywords, confusables."""
    words = set(VOCAB)
    for c in CARRIERS:
        words.update(w for w in c.split() if w != "{kw}")
    for k in keywords:
        for cat in confusable_categories(k).values():
            for phrase in cat:
                words.update(phrase.split())
        words.update(k.split())
    return sorted(words)


# --------------------------------------------------------------------------------------
# Drawing the texts of a plan
# --------------------------------------------------------------------------------------

def random_vocab_words(rng: np.random.Generator, lo: int, hi: int) -> List[str]:
    """`lo` to `hi` words of VOCAB, drawn with replacement."""
    return [VOCAB[int(i)] for i in rng.integers(len(VOCAB), size=int(rng.integers(lo, hi + 1)))]


def positive_text(rng, kw: str, keywords: Sequence[str]) -> str:
    """Keyword alone or in a carrier phrase that adds no other keyword."""
    for _ in range(50):
        if rng.random() < POS_ALONE:
            return kw
        text = CARRIERS[int(rng.integers(len(CARRIERS)))].format(kw=kw)
        words, kww = text.split(), kw.split()
        if all(count_phrase(words, o.split()) == count_phrase(kww, o.split()) for o in keywords):
            return text
    return kw


def negative_text(rng, filt: TextFilter, lo: int = RANDOM_WORDS[0],
                   hi: int = RANDOM_WORDS[1]) -> str:
    """Random vocabulary words that neither contain nor sound like a keyword."""
    for _ in range(200):
        text = " ".join(random_vocab_words(rng, lo, hi))
        if filt.is_negative(text):
            return text
    raise SynthError("could not draw a random negative free of the keywords")


# The order categories are walked in: the keyword's parts first, so that the first
# confusables of a small corpus cover each word alone.
WALK = ("alone", "reorder", "real_word", "inside_word", "cross_boundary", "context")
HARD = ("real_word", "cross_boundary")   # near-homophones of the whole keyword


def confusable_text(i: int, rng, keywords: Sequence[str], cats: Dict[str, Dict[str, List[str]]],
                     filt: TextFilter) -> Tuple[str, str]:
    """The i-th confusable and its category: keywords and categories taken in turn, the
    item random within its category. `context` is a proper part of the keyword (a real-word
    neighbour for a one-word keyword) among random words, and is counted as its category."""
    kw = keywords[i % len(keywords)]
    j = i // len(keywords)
    kcats = cats[kw]
    names = [c for c in WALK if c == "context" or kcats.get(c)]
    name = names[j % len(names)]
    words = kw.split()
    for attempt in range(100):
        category = name
        if name == "alone":       # deterministic walk: covers each word early
            items = kcats["alone"]
            text = items[(j // len(names) + attempt) % len(items)]
        elif name == "context":
            if len(words) > 1:
                a = int(rng.integers(len(words)))
                b = int(rng.integers(a + 1, len(words) + 1))
                piece = words[a:b - 1] if b - a == len(words) else words[a:b]   # proper part
                category = "alone"
            else:
                near = kcats.get("real_word", [])
                piece = [near[int(rng.integers(len(near)))]] if near else []
                category = "real_word"
            text = " ".join(random_vocab_words(rng, 0, 2) + piece + random_vocab_words(rng, 1, 3))
        else:
            items = kcats[name]
            text = items[int(rng.integers(len(items)))]
        if filt.is_negative(text):
            return text, category
    return negative_text(rng, filt), "context"


def hard_confusable_text(i: int, rng, keywords: Sequence[str],
                          cats: Dict[str, Dict[str, List[str]]], filt: TextFilter
                          ) -> Tuple[str, str]:
    """The i-th hard confusable and its category: a real-word or cross-boundary
    near-homophone of the whole keyword, keywords taken in turn."""
    kw = keywords[i % len(keywords)]
    items = [(t, c) for c in HARD for t in cats[kw].get(c, [])]
    for _ in range(100):
        if not items:
            break
        text, category = items[int(rng.integers(len(items)))]
        if filt.is_negative(text):
            return text, category
    return confusable_text(i, rng, keywords, cats, filt)


def accent_text(rng, variant: str) -> str:
    """An accent variant alone or in a carrier phrase, as positives are said."""
    if rng.random() < POS_ALONE:
        return variant
    return CARRIERS[int(rng.integers(len(CARRIERS)))].format(kw=variant)
