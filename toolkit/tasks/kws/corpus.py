"""Synthetic wake-word corpus: TTS speech mixed with noise.

Produces Kaldi data dirs ``{train,dev,test}`` (wav.scp, text, utt2dur, utt2spk, spk2utt,
utt2kind, kw_times), the WAVs under ``wavs/<split>/``, ``dict/keywords.txt`` (line i =
class i) and ``dict/tts_engines``.

Engines: the TTS engines that speak are an explicit choice (``engines``, the binary's
``--engines``; names of toolkit.tts.engines.ENGINES), espeak-ng alone by default. An
engine that is not asked for is never looked at, so what happens to be installed does not
change the corpus; one that is asked for but missing is an error before any work. The
engines besides espeak-ng speak OTHER_ENGINES_SHARE of the utterances, shared alike.
espeak-ng is needed whatever speaks: its phonemes keep keyword sound-alikes out of the
negatives. ``dict/tts_engines`` holds one ``<engine> <share>`` line per engine (its planned
share of the utterances; a split without voices of an engine gets none of it), and the
stamp records the engines, shares and voices.

Keyword timings (kw_times, positives only) come from the engine's word onsets (espeak-ng;
flite, from its phone segments, when they add up: toolkit.tts.flite). From an engine that
times no words (festival, or flite when they do not add up), a positive that is the
keyword alone spans its whole speech and one in a carrier phrase gets no kw_times line.

Determinism: libespeak-ng keeps internal waveform state from one utterance to the next
and nothing resets it, so the corpus is planned in the parent (all text/voice/parameter
choices) and rendered in fixed groups, each in a freshly forked child that loads
espeak-ng itself (toolkit.tts.pool).  Group composition never depends on ``nj``, so output
files are byte-identical for any ``nj``.  The parent process never loads espeak-ng.
espeak-ng also seeds its own noise generator (breath/echo voices) from the clock, so every
utterance reseeds it (espeak_ng_SetRandSeed) and libc rand() from the group's rng.
"""
import json
import logging
import math
import os
import re
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from toolkit.data import kaldi
from toolkit.data.audio import resample
from toolkit.fileio import atomic_write_text
from toolkit.tts import SynthError, Voice, word_char_starts
from toolkit.tts.engines import ENGINES, Engine, engine_class
from toolkit.tts.espeak import (ACCENTS, INSTALL_HINT, MAX_RANDOM_VOICES, Espeak,
                                espeak_fingerprint, espeak_paths, espeak_voices,
                                loaded_in_this_process, private_espeak_data, random_voices)
from toolkit.tts.pool import run_forked, single_thread_blas
from toolkit.tts.signal import (active_power, babble_noise, colored_noise, mix_at_snr,
                                speech_bounds, to_int16)

logger = logging.getLogger(__name__)

FORMAT_VERSION = 3           # bump when the outputs change, so old stamps are stale
                             # (2: kw_times, the keyword's span in each positive;
                             # 3: dict/tts_engines, kw_times of flite positives)
SPLITS = ("train", "dev", "test")
GROUP_SIZE = 64              # utterances per forked renderer; fixed => nj-independent
STAMP_NAME = ".synth_kws_data.json"
NOISE_TEXT = "<noise>"
# Fraction of the utterances spoken by the engines asked for besides espeak-ng, shared alike
# (measured with flite: README).
OTHER_ENGINES_SHARE = 0.2
VOICE_SPLIT = {"dev": 0.1, "test": 0.2}   # per accent (espeak) or engine; the rest is train
# Engines reserved for the unseen-engine test: never in a training set, only in corpora
# made with test_only (all their voices then go to test).
TEST_ONLY_ENGINES = ("festival",)

RATE_WPM = (120, 220)        # espeak default is 175
PITCH = (20, 80)             # espeak 0-100, default 50
PITCH_RANGE = (20, 80)
LEVEL_DBFS = (-32.0, -14.0)  # active-speech RMS level, i.e. the volume gain
SILENCE_S = (0.1, 1.0)       # leading and trailing, filled with the same noise
NOISE_ONLY_S = (1.0, 4.0)
NOISE_TYPES = ("white", "pink", "brown", "babble")
BABBLE_POOL = 6              # babble sentences synthesized per group
NEG_MIX = {"noise": 0.1, "conf": 0.3}     # rest of the negatives: random word sequences
# Train split only: the share of confusables among negatives, and the share of those that are
# near-homophones of the whole keyword (category `substitute`, or `similar` for a one-word
# keyword). Categories taken in turn give each of the ~90 "hey snips" substitutes ~3 training
# copies while the one "snips hey" gets 300, and the substitutes are what fires on unseen
# voices (measured: the top test false alarms). The recipe sets 0.5 and 0.5.
TRAIN_CONF_SHARE = 0.3
TRAIN_HARD_SHARE = 0.0
# Share of those whole-keyword near-homophones whose changed word is any vocabulary word,
# among random words ("brother she snips coffee"), instead of a similar-sounding one. It
# halved such false alarms on the recipe's test, but as it takes the place of similar-word
# near-homophones, those ("hey sneeps") fired three times as often (README).
TRAIN_SWAP_SHARE = 0.0
# Share of the other near-homophones spoken inside a carrier phrase ("okay hey sneeps"), as
# positives are: when every near-homophone is a bare phrase, "bare" itself is a sign of
# "negative" (the recipe's default model misses the keyword alone 3.5x as often as in a
# carrier). It helped the bare positives and cost the carried ones (README).
TRAIN_CARRIER_SHARE = 0.0
# Share of the whole-keyword near-homophones made as minimal pairs of a training positive:
# the same voice, rate, pitch, level, noise, SNR, silences and carrier words, with only the
# keyword changed ("okay hey snips" -> "okay hey sneeps"). Nothing but the changed phoneme
# then tells the pair apart, so voice or context cannot stand in for it.
TRAIN_PAIR_SHARE = 0.0
RANDOM_WORDS = (2, 8)
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

# Hand-written near-homophones; the rule-based generator below covers everything else.
CONFUSION_TABLE = {
    "hey": ("hay", "hi", "say", "hello", "they", "heya"),
    "hi": ("hey", "high", "my", "bye"),
    "ok": ("oak", "okra", "hokey"), "okay": ("ok", "croquet", "hokey", "obey"),
    "computer": ("commuter", "compute", "competer", "computing"),
    "alexa": ("alexis", "alexander", "a lexus", "election"),
    "google": ("goggle", "googly", "noodle", "doodle"),
    "siri": ("serious", "sierra", "cereal", "series"),
    "snips": ("snaps", "ships", "snip", "tips", "snipes", "slips"),
    "jarvis": ("davis", "jars", "harvest", "service"),
    "marvin": ("marvel", "martin", "marlin", "carving"),
}
_ONSETS = ("b", "d", "f", "g", "h", "k", "l", "m", "n", "p", "r", "s", "t", "w", "ch",
           "sh", "th", "bl", "br", "cl", "cr", "dr", "fl", "gr", "pl", "sl", "sn", "sp",
           "st", "tr")
_VOWELS = ("a", "e", "i", "o", "u", "ee", "ay", "oo", "oa", "ai", "ow", "ie")
_WORD_RE = re.compile(r"^[a-z0-9']+$")


# --------------------------------------------------------------------------------------
# Text: keywords, negatives, confusables
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


def similar_words(word: str) -> List[str]:
    """Spellings that sound close to `word`: table entries, changed first consonant
    cluster, changed vowel groups, and a dropped or added final `s`. Sorted, deterministic,
    works for any word (espeak pronounces nonsense spellings by its letter rules)."""
    out = set(CONFUSION_TABLE.get(word, ()))
    onset = re.match(r"y?[^aeiouy]*", word).group(0)   # a leading y is a consonant
    rest = word[len(onset):]
    for o in _ONSETS:
        if o != onset and rest:
            out.add(o + rest)
    for g in re.finditer(r"[aeiouy]+", word):
        if g.start() == 0 and g.group(0) == "y":
            continue                        # a leading y is a consonant (yes, you)
        for v in _VOWELS:
            if v != g.group(0):
                out.add(word[:g.start()] + v + word[g.end():])
    if word.endswith("s") and len(word) > 3:
        out.add(word[:-1])
    else:
        out.add(word + "s")
    if len(word) > 3 and word[-1] not in "aeiouy":
        out.add(word[:-1])                  # dropped final consonant: snips -> snip
    return sorted(w for w in out if w != word and len(w.replace(" ", "")) >= 2
                  and all(_WORD_RE.match(p) for p in w.split()))


def confusable_categories(keyword: str) -> Dict[str, List[str]]:
    """Candidate confusable phrases for one keyword, by category (unfiltered).
    `context` is generated at sampling time (keyword pieces inside random words)."""
    words = keyword.split()
    n = len(words)
    cats: Dict[str, List[str]] = {}
    cats["alone"] = sorted(set(words)) if n > 1 else []
    cats["partial"] = sorted({" ".join(words[i:j]) for i in range(n) for j in range(i + 2, n + 1)
                              if j - i < n})
    cats["reorder"] = sorted({f"{words[x]} {words[y]}" for x in range(n) for y in range(n)
                              if x != y and y != x + 1})   # not in keyword order
    sims = {w: similar_words(w) for w in sorted(set(words))}
    cats["common"] = sorted({s for w in words for s in CONFUSION_TABLE.get(w, ())})
    cats["similar"] = sorted({s for lst in sims.values() for s in lst})
    cats["substitute"] = sorted({" ".join(words[:i] + [s] + words[i + 1:])
                                 for i, w in enumerate(words) for s in sims[w]} if n > 1 else [])
    return cats


# --------------------------------------------------------------------------------------
# Planning (parent process): every random choice except the noise waveforms
# --------------------------------------------------------------------------------------

@dataclass
class UttSpec:
    utt: str
    spk: str
    kind: str         # pos | neg | conf | noise
    text: str
    voice: Optional[Voice]
    rate: int = 175
    pitch: int = 50
    prange: int = 50
    level_db: float = -20.0
    noise: str = "white"
    snr_db: float = 20.0
    lead_s: float = 0.5
    trail_s: float = 0.5
    noise_s: float = 0.0          # duration of pure-noise utterances
    kw_words: Optional[Tuple[int, int]] = None   # positives: word range [a, b) of the keyword


@dataclass
class Group:
    split: str
    index: int
    seed: Tuple[int, ...]
    specs: List[UttSpec]
    babble: List[UttSpec] = field(default_factory=list)


def _rng(seed: int, *stream: int) -> np.random.Generator:
    return np.random.default_rng([int(seed), *stream])


def split_voices(voices: Sequence[Voice], seed: int) -> Dict[str, List[Voice]]:
    """Disjoint voice sets per split, stratified by accent (espeak) or engine (the others)
    so that every split hears every accent, but never a voice of another split."""
    rng = _rng(seed, 0)
    strata: Dict[str, List[Voice]] = {}
    for v in voices:
        key = v.name.split("+")[0] if v.engine == "espeak" else v.engine
        strata.setdefault(key, []).append(v)
    out: Dict[str, List[Voice]] = {s: [] for s in SPLITS}
    for key in sorted(strata):
        group = sorted(strata[key], key=lambda v: v.spk)
        order = [group[i] for i in rng.permutation(len(group))]
        n = len(order)
        n_test = max(1, round(VOICE_SPLIT["test"] * n)) if n >= 3 else (1 if n == 2 else 0)
        n_dev = max(1, round(VOICE_SPLIT["dev"] * n)) if n >= 3 else 0
        out["test"] += order[:n_test]
        out["dev"] += order[n_test:n_test + n_dev]
        out["train"] += order[n_test + n_dev:]
    return {s: sorted(v, key=lambda x: x.spk) for s, v in out.items()}


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


def _clean_phonemes(s: str) -> str:
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


def _sample_params(rng: np.random.Generator, voices: Sequence[Voice], snr: Tuple[float, float],
                   other_share: float) -> dict:
    """Voice, prosody, level, noise, SNR and padding of one utterance. `other_share` of
    them go to the engines other than espeak-ng, when `voices` hold both."""
    esp = [v for v in voices if v.engine == "espeak"]
    others = [v for v in voices if v.engine != "espeak"]
    pool = others if others and (not esp or rng.random() < other_share) else esp
    if pool is others:
        names = sorted({v.engine for v in others})
        if len(names) > 1:      # engines alike, whatever their voice counts
            name = names[int(rng.integers(len(names)))]
            pool = [v for v in others if v.engine == name]
    return dict(
        voice=pool[int(rng.integers(len(pool)))],
        rate=int(rng.integers(RATE_WPM[0], RATE_WPM[1] + 1)),
        pitch=int(rng.integers(PITCH[0], PITCH[1] + 1)),
        prange=int(rng.integers(PITCH_RANGE[0], PITCH_RANGE[1] + 1)),
        level_db=float(rng.uniform(*LEVEL_DBFS)),
        noise=NOISE_TYPES[int(rng.integers(len(NOISE_TYPES)))],
        snr_db=float(rng.uniform(*snr)),
        lead_s=float(rng.uniform(*SILENCE_S)),
        trail_s=float(rng.uniform(*SILENCE_S)),
    )


def _random_words(rng: np.random.Generator, lo: int, hi: int) -> List[str]:
    return [VOCAB[int(i)] for i in rng.integers(len(VOCAB), size=int(rng.integers(lo, hi + 1)))]


def _positive_text(rng, kw: str, keywords: Sequence[str]) -> str:
    """Keyword alone or in a carrier phrase that adds no other keyword."""
    for _ in range(50):
        if rng.random() < POS_ALONE:
            return kw
        text = CARRIERS[int(rng.integers(len(CARRIERS)))].format(kw=kw)
        words, kww = text.split(), kw.split()
        if all(count_phrase(words, o.split()) == count_phrase(kww, o.split()) for o in keywords):
            return text
    return kw


def _negative_text(rng, filt: TextFilter, lo: int = RANDOM_WORDS[0],
                   hi: int = RANDOM_WORDS[1]) -> str:
    """Random vocabulary words that neither contain nor sound like a keyword."""
    for _ in range(200):
        text = " ".join(_random_words(rng, lo, hi))
        if filt.is_negative(text):
            return text
    raise SynthError("could not draw a random negative free of the keywords")


def _confusable_text(i: int, rng, keywords: Sequence[str], cats: Dict[str, Dict[str, List[str]]],
                     filt: TextFilter) -> str:
    """The i-th confusable: keywords and categories taken in turn (so the first ones cover
    every keyword word alone), the item random within its category."""
    kw = keywords[i % len(keywords)]
    j = i // len(keywords)
    kcats = cats[kw]
    names = [c for c in ("alone", "reorder", "common", "similar", "substitute", "partial")
             if kcats[c]]
    names.append("context")
    name = names[j % len(names)]
    words = kw.split()
    for attempt in range(100):
        if name == "alone":       # deterministic walk: covers each word early
            items = kcats["alone"]
            text = items[(j // len(names) + attempt) % len(items)]
        elif name == "context":   # a piece of the keyword among random words
            if len(words) > 1:
                a = int(rng.integers(len(words)))
                b = int(rng.integers(a + 1, len(words) + 1))
                piece = words[a:b - 1] if b - a == len(words) else words[a:b]   # proper part
            else:
                sims = kcats["similar"]
                piece = [sims[int(rng.integers(len(sims)))]] if sims else []
            text = " ".join(_random_words(rng, 0, 2) + piece + _random_words(rng, 1, 3))
        else:
            items = kcats[name]
            text = items[int(rng.integers(len(items)))]
        if filt.is_negative(text):
            return text
    return _negative_text(rng, filt)


def _hard_confusable_text(i: int, rng, keywords: Sequence[str],
                          cats: Dict[str, Dict[str, List[str]]], filt: TextFilter,
                          swap_share: float = 0.0, carrier_share: float = 0.0) -> str:
    """The i-th hard confusable: a near-homophone of the whole keyword (one word changed in
    a phrase, the word changed for a one-word keyword), keywords taken in turn. With
    probability `swap_share` (phrases only) the word is changed for a random vocabulary
    word and the phrase put among random words; otherwise, with probability
    `carrier_share`, the near-homophone is put in one of the positives' carrier phrases."""
    kw = keywords[i % len(keywords)]
    words = kw.split()
    if len(words) > 1 and swap_share > 0 and rng.random() < swap_share:
        for _ in range(100):
            at = int(rng.integers(len(words)))
            phrase = words[:at] + _random_words(rng, 1, 1) + words[at + 1:]
            text = " ".join(_random_words(rng, 0, 2) + phrase + _random_words(rng, 0, 3))
            if filt.is_negative(text):
                return text
    items = cats[kw]["substitute"] or cats[kw]["similar"]
    carrier = None
    if carrier_share > 0 and rng.random() < carrier_share:
        carrier = CARRIERS[int(rng.integers(len(CARRIERS)))]
    for _ in range(100):
        if not items:
            break
        text = items[int(rng.integers(len(items)))]
        if carrier is not None:
            text = carrier.format(kw=text)
        if filt.is_negative(text):
            return text
    return _confusable_text(i, rng, keywords, cats, filt)


def plan_split(split: str, n_pos: int, n_neg: int, keywords: Sequence[str],
               voices: Sequence[Voice], filt: TextFilter, cats, seed: int,
               snr: Tuple[float, float], other_share: float = OTHER_ENGINES_SHARE,
               conf_share: float = NEG_MIX["conf"], hard_share: float = 0.0,
               swap_share: float = 0.0, carrier_share: float = 0.0,
               pair_share: float = 0.0) -> List[Group]:
    """All utterances of one split, in fixed groups of GROUP_SIZE. `conf_share` of the
    negatives are confusables, `hard_share` of those near-homophones of a whole keyword,
    `swap_share` of these with a random word in the keyword's place and `carrier_share` of
    the others inside a carrier phrase; `pair_share` of the near-homophones are remade as
    minimal pairs of positives (see `_pair_with_positives`)."""
    si = SPLITS.index(split)
    rng = _rng(seed, 1, si)
    n_noise = int(round(NEG_MIX["noise"] * n_neg))
    n_conf = int(round(conf_share * n_neg))
    n_conf = min(n_conf, n_neg - n_noise)
    kinds = ["pos"] * n_pos + ["conf"] * n_conf + ["noise"] * n_noise + \
        ["neg"] * (n_neg - n_conf - n_noise)
    kinds = [kinds[i] for i in rng.permutation(len(kinds))]
    width = max(5, len(str(len(kinds))))
    specs: List[UttSpec] = []
    n_seen = {"pos": 0, "conf": 0, "hard": 0}
    hard: List[int] = []
    for i, kind in enumerate(kinds):
        p = _sample_params(rng, voices, snr, other_share)
        kw_words = None
        counter = kind
        if kind == "pos":
            kw = keywords[n_seen["pos"] % len(keywords)]
            text = _positive_text(rng, kw, keywords)
            words, kww = text.split(), kw.split()
            a = next(j for j in range(len(words)) if words[j:j + len(kww)] == kww)
            kw_words = (a, a + len(kww))
        elif kind == "conf" and hard_share > 0 and rng.random() < hard_share:
            text = _hard_confusable_text(n_seen["hard"], rng, keywords, cats, filt, swap_share,
                                         carrier_share)
            counter = "hard"            # the in-turn walk counts only its own picks
            hard.append(i)
        elif kind == "conf":
            text = _confusable_text(n_seen["conf"], rng, keywords, cats, filt)
        elif kind == "neg":
            text = _negative_text(rng, filt)
        else:
            text = NOISE_TEXT
        n_seen[counter] = n_seen.get(counter, 0) + 1
        if kind == "noise":
            spk = f"noise_{split}"     # no voice: a per-split pseudo speaker
            spec = UttSpec(f"{spk}-{kind}-{i:0{width}d}", spk, kind, text, None,
                           level_db=float(rng.uniform(-50.0, -20.0)), noise=p["noise"],
                           noise_s=float(rng.uniform(*NOISE_ONLY_S)))
        else:
            spk = p["voice"].spk
            spec = UttSpec(f"{spk}-{kind}-{i:0{width}d}", spk, kind, text, **p,
                           kw_words=kw_words)
        specs.append(spec)
    if pair_share > 0:   # drawn after the loop: every other utterance stays as it was
        to_pair = [i for i in hard if rng.random() < pair_share]
        _pair_with_positives(specs, to_pair, rng, cats, filt, width)
    groups = []
    for g, start in enumerate(range(0, len(specs), GROUP_SIZE)):
        babble = []
        for _ in range(BABBLE_POOL):
            p = _sample_params(rng, voices, snr, other_share)
            text = _negative_text(rng, filt, 8, 14)
            babble.append(UttSpec("babble", p["voice"].spk, "babble", text, **p))
        groups.append(Group(split, g, (int(seed), 2, si, g), specs[start:start + GROUP_SIZE], babble))
    return groups


def _pair_with_positives(specs: List[UttSpec], indices: Sequence[int], rng,
                         cats: Dict[str, Dict[str, List[str]]], filt: TextFilter,
                         width: int) -> None:
    """Remakes the near-homophones at `indices` in place as minimal pairs: each copies a
    positive (in a random order; one is used twice only when there are more pairs than
    positives) with its keyword words replaced by a near-homophone of that keyword."""
    positives = [s for s in specs if s.kind == "pos" and s.kw_words is not None]
    if not positives:
        return
    order: List[int] = []
    while len(order) < len(indices):
        order += [int(j) for j in rng.permutation(len(positives))]
    for i, j in zip(indices, order):
        pos = positives[j]
        words = pos.text.split()
        a, b = pos.kw_words
        kw = " ".join(words[a:b])
        items = cats[kw]["substitute"] or cats[kw]["similar"]
        for _ in range(100 if items else 0):
            sub = items[int(rng.integers(len(items)))]
            text = " ".join(words[:a] + sub.split() + words[b:])
            if filt.is_negative(text):
                specs[i] = replace(pos, utt=f"{pos.spk}-conf-{i:0{width}d}", kind="conf",
                                   text=text, kw_words=None)
                break


# --------------------------------------------------------------------------------------
# Rendering (forked children)
# --------------------------------------------------------------------------------------

def keyword_span(text: str, word_range: Tuple[int, int], word_starts: Sequence[Tuple[int, int]],
                 rate_in: int, rate_out: int, bounds: Tuple[int, int]) -> Optional[Tuple[float, float]]:
    """(start, end) seconds of words [a, b) of `text` in the trimmed output audio: from
    the first word's onset to the next word's onset (or the end of speech). None when
    the TTS did not report those onsets (espeak-ng reports none for some function words,
    e.g. "the" in "turn on the lights")."""
    starts = dict(word_starts)
    chars = word_char_starts(text)
    a, b = word_range
    if chars[a] not in starts or (b < len(chars) and chars[b] not in starts):
        return None
    to_out = lambda sample: sample * rate_out / rate_in - bounds[0]
    length = bounds[1] - bounds[0]
    start = min(max(to_out(starts[chars[a]]), 0.0), length)
    end = length if b >= len(chars) else min(max(to_out(starts[chars[b]]), start), length)
    return start / rate_out, end / rate_out


class Renderer:
    """TTS front end of one child process: speaks a spec at the output rate. Each engine
    is made on its first utterance (espeak-ng is loaded only where it speaks)."""

    def __init__(self, sample_rate: int, tmp_dir: str, espeak_data: Optional[str] = None):
        self.sr = sample_rate
        self.tmp_dir = tmp_dir
        self._options = {"espeak": {"data_path": espeak_data}}
        self._engines: Dict[str, Engine] = {}

    def _engine(self, name: str) -> Engine:
        if name not in self._engines:
            self._engines[name] = ENGINES.get(name)(self.tmp_dir, **self._options.get(name, {}))
        return self._engines[name]

    def speak(self, spec: UttSpec, seed: int) -> Tuple[np.ndarray, Optional[Tuple[float, float]]]:
        """Trimmed speech, and for positives the keyword's (start, end) seconds in it: from
        the engine's word onsets, or the whole speech when the text is the keyword alone
        and the engine times no words; None when neither applies."""
        v = spec.voice
        speech = self._engine(v.engine).synth(spec.text, v, spec.rate, spec.pitch, spec.prange,
                                              seed, time_words=spec.kw_words is not None)
        audio = resample(speech.audio, speech.sample_rate, self.sr)
        bounds = speech_bounds(audio)
        span = None
        if spec.kw_words is not None:
            if speech.word_onsets:
                span = keyword_span(spec.text, spec.kw_words, speech.word_onsets,
                                    speech.sample_rate, self.sr, bounds)
            elif speech.word_onsets is None and spec.kw_words == (0, len(spec.text.split())):
                span = (0.0, (bounds[1] - bounds[0]) / self.sr)
        return audio[bounds[0]:bounds[1]], span


def render_utterance(spec: UttSpec, speech: Optional[np.ndarray], rng: np.random.Generator,
                     babble_pool: Sequence[np.ndarray], sr: int) -> np.ndarray:
    """Speech at its level, padded with silence, in noise at the spec's SNR -> int16."""
    def noise(n):
        return babble_noise(n, babble_pool, rng) if spec.noise == "babble" \
            else colored_noise(n, spec.noise, rng, sr)

    level = 10 ** (spec.level_db / 20)
    if speech is None:
        return to_int16(noise(max(1, int(round(spec.noise_s * sr)))) * level)
    lead, trail = int(round(spec.lead_s * sr)), int(round(spec.trail_s * sr))
    speech = speech / (math.sqrt(active_power(speech)) + 1e-12) * level
    clean = np.zeros(lead + len(speech) + trail, np.float32)
    clean[lead:lead + len(speech)] = speech
    mixed, _ = mix_at_snr(clean, noise(len(clean)), spec.snr_db)
    return to_int16(mixed)


def _render_group(group: Group, out_dir: str, sr: int, espeak_data: Optional[str] = None
                  ) -> List[Tuple[str, int, Optional[Tuple[float, float]]]]:
    """Child body: babble pool first, then every utterance; writes WAVs, returns
    (utterance, samples, keyword span in seconds or None)."""
    import soundfile as sf
    single_thread_blas()
    rng = np.random.default_rng(list(group.seed))
    wav_dir = os.path.join(out_dir, "wavs", group.split)
    with tempfile.TemporaryDirectory(prefix="synth_") as tmp:
        tts = Renderer(sr, tmp, espeak_data)
        pool = [tts.speak(b, int(rng.integers(2 ** 31)))[0] for b in group.babble]
        out = []
        for spec in group.specs:
            tts_seed = int(rng.integers(2 ** 31))
            speech, span = (None, None) if spec.kind == "noise" else tts.speak(spec, tts_seed)
            if speech is not None and len(speech) == 0:
                raise SynthError(f"{spec.utt}: TTS produced no audio for {spec.text!r}")
            audio = render_utterance(spec, speech, rng, pool, sr)
            sf.write(os.path.join(wav_dir, spec.utt + ".wav"), audio, sr, subtype="PCM_16")
            if span is not None:
                lead = int(round(spec.lead_s * sr)) / sr      # as render_utterance pads
                span = (lead + span[0], lead + span[1])
            out.append((spec.utt, len(audio), span))
    return out


def _probe(words: Sequence[str], voices: Sequence[Voice], espeak_data: Optional[str] = None,
           procedural: Sequence[Voice] = ()) -> dict:
    """Child body: checks espeak-ng works, which `voices` exist, that the `procedural`
    voices load their variant files, and phonemizes `words`."""
    es = Espeak(espeak_data)
    ok = [v for v in voices if v.engine != "espeak" or es.set_voice(v.name)]
    for v in procedural:
        # espeak falls back to the plain accent, silently, when a variant file is missing
        if not (es.set_voice(v.name) and
                es.current_identifier().endswith("+" + v.name.split("+")[1])):
            raise SynthError(f"espeak-ng ignored the procedural voice {v.name} "
                             f"(variant file not found in {espeak_data})")
    phon = {a: {w: _clean_phonemes(es.phonemes(w, a)) for w in words}
            for a in ACCENTS if es.set_voice(a)}
    return {"voices": ok, "phonemes": phon, "rate": es.rate}


# --------------------------------------------------------------------------------------
# Output
# --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class TrainMix:
    """How the training negatives differ from dev/test (see TRAIN_CONF_SHARE and below)."""
    conf_share: float = TRAIN_CONF_SHARE
    hard_share: float = TRAIN_HARD_SHARE
    swap_share: float = TRAIN_SWAP_SHARE
    carrier_share: float = TRAIN_CARRIER_SHARE
    pair_share: float = TRAIN_PAIR_SHARE


@dataclass(frozen=True)
class Sizes:
    train_pos: int = 2000
    train_neg: int = 6000
    dev_pos: int = 300
    dev_neg: int = 900
    test_pos: int = 400
    test_neg: int = 1800

    def of(self, split: str) -> Tuple[int, int]:
        return getattr(self, f"{split}_pos"), getattr(self, f"{split}_neg")


# kw_times: `utt start end` (seconds) of the keyword in each positive whose TTS reports
# word onsets; a plain table outside Kaldi's utt2* family because it covers positives only.
DATA_FILES = ("wav.scp", "text", "utt2dur", "utt2spk", "spk2utt", "utt2kind", "kw_times")


ENGINES_FILE = "tts_engines"    # in dict/: `<engine> <share>`, see the module docstring


def write_data_dir(data_dir: str, wav_dir: str, specs: Sequence[UttSpec],
                   lengths: Dict[str, int], sr: int,
                   spans: Optional[Dict[str, Tuple[float, float]]] = None) -> None:
    """Kaldi data dir through the toolkit's writer (C-order keys, atomic files)."""
    wav_dir = os.path.abspath(wav_dir)
    spans = spans or {}
    kaldi.write_data_dir(data_dir, {
        "wav.scp": {s.utt: os.path.join(wav_dir, s.utt + ".wav") for s in specs},
        "text": {s.utt: s.text for s in specs},
        "utt2dur": {s.utt: f"{lengths[s.utt] / sr:.3f}" for s in specs},
        "utt2spk": {s.utt: s.spk for s in specs},         # spk2utt follows from it
        "utt2kind": {s.utt: s.kind for s in specs},
        "kw_times": {s.utt: f"{spans[s.utt][0]:.3f} {spans[s.utt][1]:.3f}"
                     for s in specs if s.utt in spans},
    })


def check_engines(engines: Sequence[str]) -> List[str]:
    """The engine names, espeak first then sorted (the stamp's form); SynthError, before
    any work, for an unknown, repeated or unavailable one. Only these are looked at."""
    names = [str(e).strip() for e in engines]
    if not names or "" in names:
        raise SynthError(f"--engines needs engine names, e.g. espeak or espeak,flite; got "
                         f"{','.join(names)!r}")
    if len(set(names)) != len(names):
        raise SynthError(f"engine named twice in --engines: {','.join(names)}")
    for name in names:
        reason = engine_class(name).unavailable_reason()
        if reason:
            raise SynthError(f"{name} was asked for (--engines) but {reason}")
    return sorted(names, key=lambda n: (n != "espeak", n))


def engine_shares(engines: Sequence[str]) -> Dict[str, float]:
    """Planned fraction of the speech per engine: OTHER_ENGINES_SHARE to the engines other
    than espeak-ng when it is among them (all of it otherwise), shared alike."""
    others = [e for e in engines if e != "espeak"]
    if "espeak" not in engines:
        return {e: 1.0 / len(others) for e in others}
    if not others:
        return {"espeak": 1.0}
    return {"espeak": 1.0 - OTHER_ENGINES_SHARE,
            **{e: OTHER_ENGINES_SHARE / len(others) for e in others}}


def _stamp_config(keywords, seed, sizes: Sizes, sample_rate, snr, engines: Sequence[str],
                  other_voices: Sequence[Voice], train_mix: TrainMix,
                  train_random_voices: int = 0) -> dict:
    voices: Dict[str, List[str]] = {}
    for v in other_voices:          # espeak-ng's voices are fixed here; its build is below
        voices.setdefault(v.engine, []).append(v.name)
    return {"format": FORMAT_VERSION, "keywords": list(keywords), "seed": int(seed),
            "sizes": asdict(sizes), "sample_rate": int(sample_rate),
            "snr_db": [float(snr[0]), float(snr[1])],
            "engines": list(engines), "engine_shares": engine_shares(engines),
            "engine_voices": voices,
            **{f"train_{k}": float(v) for k, v in asdict(train_mix).items()},
            "train_random_voices": int(train_random_voices),
            "espeak": espeak_fingerprint()}


def is_complete(out_dir: str, config: dict, splits: Sequence[str] = SPLITS) -> bool:
    """Stamp matches `config` and every data file and listed WAV of `splits` exists."""
    try:
        with open(os.path.join(out_dir, STAMP_NAME), encoding="utf-8") as f:
            if json.load(f) != config:
                return False
        if not all(os.path.exists(os.path.join(out_dir, "dict", n))
                   for n in ("keywords.txt", ENGINES_FILE)):
            return False
        for split in splits:
            d = os.path.join(out_dir, split)
            if not all(os.path.exists(os.path.join(d, n)) for n in DATA_FILES):
                return False
            with open(os.path.join(d, "wav.scp"), encoding="utf-8") as f:
                if not all(os.path.exists(line.split(maxsplit=1)[1].strip()) for line in f):
                    return False
    except (OSError, ValueError, IndexError):
        return False
    return True


def _clean_outputs(out_dir: str) -> None:
    """Removes only what this generator writes (stale features in the split dirs too)."""
    for name in (STAMP_NAME, "wavs", "dict", ".synth_tmp") + SPLITS:
        p = os.path.join(out_dir, name)
        if os.path.isdir(p) and not os.path.islink(p):
            shutil.rmtree(p)
        elif os.path.lexists(p):
            os.unlink(p)


def generate_corpus(keywords: Sequence[str], out_dir: str, seed: int = 777,
                    sizes: Sizes = Sizes(), nj: int = 2, sample_rate: int = 16000,
                    snr_db: Tuple[float, float] = (5.0, 30.0),
                    engines: Sequence[str] = ("espeak",),
                    train_conf_share: float = TRAIN_CONF_SHARE,
                    train_hard_share: float = TRAIN_HARD_SHARE,
                    train_swap_share: float = TRAIN_SWAP_SHARE,
                    train_carrier_share: float = TRAIN_CARRIER_SHARE,
                    train_pair_share: float = TRAIN_PAIR_SHARE,
                    train_random_voices: int = 0, test_only: bool = False) -> dict:
    """Writes the corpus; returns {split: {"utts": n, "hours": h, ...}}. Skips the work
    when `out_dir` already holds a complete corpus made with the same arguments.
    The `train_*_share` arguments shape the training negatives only (see TRAIN_CONF_SHARE
    and the shares after it); dev and test do not depend on them, nor on `train_random_voices`,
    the number of procedural espeak-ng voices added to the training voices. `engines`: the
    TTS engines that speak (toolkit.tts.engines names; see OTHER_ENGINES_SHARE); those of
    TEST_ONLY_ENGINES only with `test_only`, which writes the test split alone (the same
    held-out voices as the full corpus of this seed, plus every voice of a test-only
    engine): an evaluation set from other engines."""
    keywords = [normalize_keyword(k) for k in keywords]
    if not keywords:
        raise SynthError("no keyword given: use --keyword 'hey snips'")
    if len(set(keywords)) != len(keywords):
        raise SynthError(f"duplicate keywords: {keywords}")
    if seed < 0:
        raise SynthError(f"seed must be >= 0, got {seed}")
    if snr_db[0] > snr_db[1]:
        raise SynthError(f"bad SNR range {snr_db}: min > max")
    if nj < 1:
        raise SynthError(f"nj must be >= 1, got {nj}")
    if sample_rate < 8000:
        raise SynthError(f"sample rate {sample_rate} too low (need >= 8000)")
    for split in SPLITS:
        if min(sizes.of(split)) < 0:
            raise SynthError(f"negative size for {split}: {sizes.of(split)}")
    if not 0.0 <= train_conf_share <= 1.0 - NEG_MIX["noise"]:
        raise SynthError(f"train confusable share {train_conf_share} is outside "
                         f"[0, {1.0 - NEG_MIX['noise']}] (the rest holds the noise-only share)")
    for name, share in (("hard-confusable", train_hard_share), ("swap", train_swap_share),
                        ("carrier", train_carrier_share), ("pair", train_pair_share)):
        if not 0.0 <= share <= 1.0:
            raise SynthError(f"train {name} share {share} is outside [0, 1]")
    if not 0 <= train_random_voices <= MAX_RANDOM_VOICES:
        raise SynthError(f"train random voices {train_random_voices} is outside "
                         f"[0, {MAX_RANDOM_VOICES}] (espeak-ng lists at most 349 voice files)")
    reserved = [e for e in TEST_ONLY_ENGINES if e in [str(n).strip() for n in engines]]
    if reserved and not test_only:      # before looking for it: refused even when absent
        raise SynthError(
            f"{', '.join(reserved)} is reserved for the unseen-engine test and never speaks in "
            f"a training set: make its evaluation set alone with --test-only (e.g. "
            f"synth_kws_data --test-only --engines {reserved[0]} --out-dir data_test_{reserved[0]})")
    splits = ("test",) if test_only else SPLITS
    espeak_paths()   # clear message before any work when the TTS is not installed
    engines = check_engines(engines)
    if train_random_voices and "espeak" not in engines:
        raise SynthError("train random voices are espeak-ng voices: add espeak to --engines")
    if loaded_in_this_process():
        logger.warning("espeak-ng was loaded in this process: output may not be reproducible")
    other_voices = [v for e in engines if e != "espeak" for v in engine_class(e).voices()]
    train_mix = TrainMix(train_conf_share, train_hard_share, train_swap_share,
                         train_carrier_share, train_pair_share)
    config = _stamp_config(keywords, seed, sizes, sample_rate, snr_db, engines, other_voices,
                           train_mix, train_random_voices)
    if test_only:
        config["splits"] = list(splits)      # only then: full corpora keep their stamp
    if is_complete(out_dir, config, splits):
        logger.info("%s is complete for these arguments; nothing to do", out_dir)
        return summarize(out_dir, splits)

    t0 = time.time()
    _clean_outputs(out_dir)
    tmp_dir = os.path.join(out_dir, ".synth_tmp")
    os.makedirs(tmp_dir)
    try:
        groups, espeak_data = plan_corpus(keywords, seed, sizes, snr_db, other_voices, tmp_dir,
                                          train_mix, train_random_voices,
                                          use_espeak="espeak" in engines, splits=splits)
        logger.info("planned %d utterances in %d groups (%.1f s); rendering with nj=%d",
                    sum(len(g.specs) for g in groups), len(groups), time.time() - t0, nj)
        from toolkit.progress import Progress
        bar = Progress(len(groups), "rendering", "groups", interval_s=10.0, log=logger)

        def progress(done, total):
            bar.update(done - bar.done)

        out_abs = os.path.abspath(out_dir)
        for split in splits:
            os.makedirs(os.path.join(out_abs, "wavs", split))
        results = run_forked(lambda g: _render_group(g, out_abs, sample_rate, espeak_data),
                             groups, nj, tmp_dir, progress)
        bar.close()
    finally:
        shutil.rmtree(tmp_dir, ignore_errors=True)
    lengths = {utt: n for res in results for utt, n, _ in res}
    spans = {utt: span for res in results for utt, _, span in res if span is not None}
    for split in splits:
        specs = [s for g in groups if g.split == split for s in g.specs]
        write_data_dir(os.path.join(out_dir, split), os.path.join(out_dir, "wavs", split),
                       specs, lengths, sample_rate, spans)
    atomic_write_text(os.path.join(out_dir, "dict", "keywords.txt"),
                      "".join(k + "\n" for k in keywords))
    kaldi.write_table(os.path.join(out_dir, "dict", ENGINES_FILE),
                      {e: f"{share:g}" for e, share in engine_shares(engines).items()})
    with open(os.path.join(out_dir, STAMP_NAME), "w", encoding="utf-8") as f:
        json.dump(config, f, indent=1, sort_keys=True)   # written last: marks completion
    logger.info("wrote %s in %.1f s", out_dir, time.time() - t0)
    return summarize(out_dir, splits)


def plan_corpus(keywords: Sequence[str], seed: int, sizes: Sizes, snr_db: Tuple[float, float],
                other_voices: Sequence[Voice], tmp_dir: str,
                train_mix: TrainMix = TrainMix(),
                train_random_voices: int = 0,
                use_espeak: bool = True,
                splits: Sequence[str] = SPLITS) -> Tuple[List[Group], Optional[str]]:
    """Every group of every split, and the private espeak-ng data dir that the procedural
    voices need (None without them). The speakers: espeak-ng's fixed voices when
    `use_espeak`, and `other_voices` (other engines). espeak is only asked (in a forked
    probe) which voices exist and how words sound; the plan itself is pure numpy
    randomness from `seed`."""
    voices = (espeak_voices() if use_espeak else []) + list(other_voices)
    # Procedural voices join the training split only, after the fixed voices are split,
    # so dev and test are the same with or without them.
    procedural = random_voices(train_random_voices, ACCENTS, seed)
    espeak_data = private_espeak_data(procedural, tmp_dir)
    words = lexicon_words(keywords)
    # the first and last variant file: espeak-ng's voice list is filled in order
    probe = run_forked(lambda _: _probe(words, voices, espeak_data,
                                        procedural[:1] + procedural[-1:]), [None], 1, tmp_dir)[0]
    if not probe["phonemes"]:
        raise SynthError(f"espeak-ng has none of the English voices {ACCENTS}: {INSTALL_HINT}")
    by_split = split_voices([v for v in probe["voices"] if v.engine not in TEST_ONLY_ENGINES],
                            seed)
    unseen = [v for v in probe["voices"] if v.engine in TEST_ONLY_ENGINES]
    if unseen:
        by_split["test"] = sorted(by_split["test"] + unseen, key=lambda v: v.spk)
    accents = set(probe["phonemes"])
    by_split["train"] += [v for v in procedural if v.name.split("+")[0] in accents]
    for split in splits:
        if not by_split[split]:
            raise SynthError(f"no voices left for {split}")
    filt = TextFilter(keywords, probe["phonemes"])
    cats = {k: confusable_categories(k) for k in keywords}
    groups: List[Group] = []
    for split in splits:
        mix = asdict(train_mix) if split == "train" else {}
        groups += plan_split(split, *sizes.of(split), keywords, by_split[split], filt, cats,
                             seed, snr_db, **mix)
    return groups, espeak_data


def summarize(out_dir: str, splits: Sequence[str] = SPLITS) -> dict:
    """Per split: utterance count, hours, and hours per kind (from utt2dur/utt2kind)."""
    out = {}
    for split in splits:
        d = os.path.join(out_dir, split)
        dur = dict(line.split() for line in open(os.path.join(d, "utt2dur"), encoding="utf-8"))
        kind = dict(line.split() for line in open(os.path.join(d, "utt2kind"), encoding="utf-8"))
        per = {}
        for u, s in dur.items():
            per[kind[u]] = per.get(kind[u], 0.0) + float(s) / 3600
        out[split] = {"utts": len(dur), "hours": sum(per.values()),
                      "hours_by_kind": {k: round(v, 3) for k, v in sorted(per.items())}}
    return out
