"""Synthetic read speech from many voices, for the codec (and any model that needs speech
but no labels): Kaldi data dirs ``{train,dev,test}`` of noise-free speech and, with
``noisy``, parallel dirs ``{train,dev,test}_noisy`` holding the same utterances in white,
pink, brown or babble noise (same keys, same speech samples: noisy = clean + noise, to
int16 rounding). WAVs under ``wavs/<dir>/``, the voice inventory ``voices.tsv``.
This module is the corpus design (a sentence grammar, the voice pool, per-split plans,
clean and noisy versions); engines and voices are toolkit.voicebank.corpus, the forked
rendering, the stamp and the output dir toolkit.voicebank.corpus_dir.

Texts are sentences from a small grammar (statements, questions, requests, numbers and
names), one to three per utterance, so that the prosody is that of read sentences rather
than of word lists. Voices: espeak-ng's fixed voices (8 English accents x 28 variants),
optionally procedural espeak-ng voices (random vocal tracts and sources,
toolkit.voicebank.espeak.random_voices), the voices of the other engines named, and blends of
the voices of an engine that mixes them (Kokoro: ``blends`` per engine). The engines
besides espeak-ng speak ``other_share`` of the utterances, shared alike. Train, dev and
test never share a voice; the split is stratified by accent (espeak-ng) or engine, so
that every split hears every accent; the voices blends are made of all train, and the
blends are shared out like other voices. Reserved voices (festival's, seven of Kokoro's:
toolkit.voicebank.RESERVED_VOICES) speak only in a test-only corpus (``test_only``), whose test
split is the held-out test voices of the full corpus of the same seed plus the reserved
ones (an engine that reserves voices is heard through those alone).
"""
import logging
import os
import time
from dataclasses import asdict, dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from toolkit.data import kaldi
from toolkit.voicebank import SynthError, Voice, seeded_rng
from toolkit.voicebank.corpus import (OTHER_ENGINES_SHARE, SPLITS, Engines, corpus_stamp,
                                      engine_blends, engine_shares, espeak_voices_here,
                                      open_engines, split_by_stratum, split_with_blends)
from toolkit.voicebank.corpus_dir import CorpusDir, Group, data_dir_summary
from toolkit.voicebank.espeak import (ACCENTS, INSTALL_HINT, MAX_RANDOM_VOICES, espeak_voices,
                                      private_espeak_data, random_voices)
from toolkit.voicebank.render import Renderer
from toolkit.voicebank.signal import NOISE_TYPES, background_noise, mix_at_snr, peak_gain, \
    pcm16, place_at_level

logger = logging.getLogger(__name__)

FORMAT_VERSION = 3            # bump when the outputs change, so that old stamps are stale
                              # (2: the stamp and voices.tsv of toolkit.voicebank.corpus;
                              # 3: blends and the other engines' share in the stamp)
NOISY_SUFFIX = "_noisy"
GROUP_SIZE = 32               # utterances per forked renderer; fixed => nj-independent
STAMP_NAME = ".synth_codec_data.json"
LEGACY_VOICES_FILE = "voices.txt"   # written before voices.tsv; removed with the rest
VOICE_SHARE = {"test": 0.1, "dev": 0.1}    # per accent or engine; the rest is train

RATE_WPM = (130, 210)         # espeak default 175
PITCH = (25, 75)              # espeak 0-100, 50: the voice's own
PITCH_RANGE = (20, 80)
LEVEL_DBFS = (-22.0, -12.0)   # active-speech RMS level (DAC trains on speech at -16 dB LUFS)
SILENCE_S = (0.1, 0.4)        # leading and trailing silence
SENTENCES = (1, 3)            # sentences per utterance
DATA_FILES = ("wav.scp", "text", "utt2spk", "spk2utt", "utt2dur")
NOISY_FILES = DATA_FILES + ("utt2noise", "utt2snr")


# --------------------------------------------------------------------------------------
# Text: a sentence grammar
# --------------------------------------------------------------------------------------

NAMES = ("Anna", "Peter", "Maria", "John", "Lucy", "David", "Emma", "Robert", "Sarah",
         "Thomas", "Helen", "Michael", "Laura", "James", "Alice", "George", "Julia", "Frank",
         "Nina", "Oscar", "Rachel", "Samuel", "Tina", "Victor", "Grace", "Henry", "Irene",
         "Kevin", "Olivia", "Walter")
# (singular, plural)
NOUNS = tuple((n, n + "s") for n in """
apple basket bottle bridge candle castle chair coat cup desk door engine farmer garden
glass hammer horse island jacket key kettle ladder lamp letter machine map mirror
mountain needle orange painter pencil picture pillow plate pocket river road rocket
sailor shelf ship shoe soldier station stone student table teacher ticket tower
train tree truck umbrella village wall window wagon""".split()) + (
    ("box", "boxes"), ("bus", "buses"), ("child", "children"), ("city", "cities"),
    ("knife", "knives"), ("man", "men"), ("woman", "women"), ("mouse", "mice"),
    ("story", "stories"), ("family", "families"), ("watch", "watches"), ("fish", "fish"),
    ("sheep", "sheep"), ("leaf", "leaves"), ("glove", "gloves"), ("dish", "dishes"))
ADJECTIVES = tuple("""
old new small large heavy light bright dark quiet loud warm cold wet dry clean dirty
empty full narrow wide strange famous careful lazy happy tired angry brave gentle
yellow green purple silver golden wooden broken hidden expensive cheap ancient modern
lucky simple difficult beautiful ugly friendly hungry thirsty sleepy""".split())
# (base, past) of transitive verbs
VERBS = (("carry", "carried"), ("find", "found"), ("paint", "painted"), ("open", "opened"),
         ("close", "closed"), ("clean", "cleaned"), ("move", "moved"), ("build", "built"),
         ("break", "broke"), ("bring", "brought"), ("buy", "bought"), ("sell", "sold"),
         ("throw", "threw"), ("catch", "caught"), ("hide", "hid"), ("lose", "lost"),
         ("borrow", "borrowed"), ("repair", "repaired"), ("wash", "washed"),
         ("push", "pushed"), ("pull", "pulled"), ("watch", "watched"), ("draw", "drew"),
         ("fill", "filled"), ("drop", "dropped"), ("keep", "kept"), ("send", "sent"),
         ("describe", "described"), ("measure", "measured"), ("examine", "examined"))
# (base, past) of intransitive verbs
INTRANSITIVE = (("arrive", "arrived"), ("wait", "waited"), ("sleep", "slept"),
                ("laugh", "laughed"), ("sing", "sang"), ("run", "ran"), ("swim", "swam"),
                ("walk", "walked"), ("shout", "shouted"), ("disappear", "disappeared"),
                ("fall", "fell"), ("stay", "stayed"), ("travel", "travelled"),
                ("return", "returned"), ("listen", "listened"))
ADVERBS = tuple("""
quickly slowly carefully quietly loudly suddenly happily badly easily gently finally
nearly early again together""".split())
PLACES = ("in the kitchen", "near the station", "behind the old church", "on the roof",
          "across the river", "under the bridge", "in the garden", "at the market",
          "outside the school", "by the window", "in the forest", "along the coast",
          "on the second floor", "at the end of the street", "inside the museum",
          "next to the harbor", "on the top shelf", "in the village")
TIMES = ("yesterday", "this morning", "last winter", "on Monday", "at seven o'clock",
         "after dinner", "before sunrise", "every Sunday", "in nineteen ninety two",
         "two weeks ago", "tomorrow evening", "at half past nine", "in the spring",
         "late at night", "on the third of May", "during the storm")
EXCLAIM = ("Oh", "Wow", "Look", "Listen", "Well", "Hey")
DETERMINERS = ("the", "a", "my", "our", "her", "his", "that", "this")
PRONOUNS = ("she", "he", "we", "they", "I")
TEMPLATES = (
    "The {adj} {noun} {vpast} {det} {noun2} {place}.",
    "{name} {vpast} {det} {adj} {noun} {time}.",
    "{Time}, {name} and {name2} {ipast} {place}.",
    "Did {name} {vbase} the {noun} {time}?",
    "Please {vbase} the {adj} {noun} {place}.",
    "There were {num} {nouns} {place}, but {pron} only {vpast} {num2}.",
    "Why is the {noun} so {adj}?",
    "I think the {noun} {ipast} {adv} {time}.",
    "We {vpast} {det} {noun} because it was {adj}.",
    "{name} said that the {nouns} were {adj} and {adj2}.",
    "How many {nouns} did you {vbase} {time}?",
    "The {noun} {place} is {adj}, {adj2} and very {adj3}.",
    "It cost {price} dollars, so {pron} {vpast} only one.",
    "{name}, can you {vbase} the {noun} for me?",
    "{exclaim}! The {noun} {ipast} {adv}!",
    "When the {nouns} {ipast}, {pron} {vpast} the {adj} {noun2} {adv}.",
    "Room {room} is on the {ordinal} floor, {place}.",
)
ORDINALS = ("first", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth")


def _pick(rng: np.random.Generator, items: Sequence):
    return items[int(rng.integers(len(items)))]


def sentence(rng: np.random.Generator) -> str:
    """One random sentence of the grammar; a pure function of the generator's state."""
    template = _pick(rng, TEMPLATES)
    (noun, _), (noun2, _), (_, nouns) = (_pick(rng, NOUNS) for _ in range(3))
    verb, intransitive = _pick(rng, VERBS), _pick(rng, INTRANSITIVE)
    names = rng.permutation(len(NAMES))[:2]
    adjectives = rng.permutation(len(ADJECTIVES))[:3]
    time_phrase = _pick(rng, TIMES)
    count = int(rng.integers(3, 40))
    fields = dict(
        adj=ADJECTIVES[adjectives[0]], adj2=ADJECTIVES[adjectives[1]],
        adj3=ADJECTIVES[adjectives[2]], noun=noun, noun2=noun2, nouns=nouns,
        vbase=verb[0], vpast=verb[1], ipast=intransitive[1], det=_pick(rng, DETERMINERS),
        place=_pick(rng, PLACES), time=time_phrase,
        Time=time_phrase[0].upper() + time_phrase[1:], name=NAMES[names[0]],
        name2=NAMES[names[1]], pron=_pick(rng, PRONOUNS), adv=_pick(rng, ADVERBS),
        num=str(count), num2=str(int(rng.integers(1, count))),
        price=f"{int(rng.integers(2, 500))}", room=str(int(rng.integers(10, 99))),
        ordinal=_pick(rng, ORDINALS), exclaim=_pick(rng, EXCLAIM))
    text = template.format(**fields)
    return text[0].upper() + text[1:]


def utterance_text(rng: np.random.Generator, sentences: Tuple[int, int] = SENTENCES) -> str:
    return " ".join(sentence(rng) for _ in range(int(rng.integers(sentences[0],
                                                                  sentences[1] + 1))))


# --------------------------------------------------------------------------------------
# Voices and engines
# --------------------------------------------------------------------------------------

def split_voices(voices: Sequence[Voice], seed: int, max_voices: int = 0
                 ) -> Dict[str, List[Voice]]:
    """Disjoint voice lists per split, stratified by accent or engine (a stratum of three
    or more voices gives each split at least one), each list interleaved across strata.
    `max_voices` > 0 keeps that many in all: 10 % (at least one) each for test and dev."""
    out = split_by_stratum(voices, seed, VOICE_SHARE, interleave=True)
    if max_voices:
        if max_voices < 3:
            raise SynthError(f"max voices {max_voices}: need at least 3 (one per split)")
        n_held = max(1, round(0.1 * max_voices))
        caps = {"test": n_held, "dev": n_held, "train": max_voices - 2 * n_held}
        out = {s: out[s][:caps[s]] for s in SPLITS}
    return out


# --------------------------------------------------------------------------------------
# Planning (parent process)
# --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Sizes:
    train: int = 2000
    dev: int = 100
    test: int = 100


@dataclass
class UttSpec:
    utt: str
    spk: str
    text: str
    voice: Voice
    rate: int
    pitch: int
    prange: int
    level_db: float
    lead_s: float
    trail_s: float
    noise: str
    snr_db: float


def plan_split(split: str, n: int, voices: Sequence[Voice], seed: int,
               snr_db: Tuple[float, float], shares: Dict[str, float],
               sentences: Tuple[int, int] = SENTENCES, part: int = 0) -> List[Group]:
    """The utterances of one split in groups of GROUP_SIZE. Each engine's voices are
    taken in turn (a seeded order), so that every voice speaks about as often. A `part`
    > 0 draws from streams of its own (other texts, prosody and noise; the same voices)
    and tags its utterance ids, so that parts never collide."""
    si = SPLITS.index(split)
    tail = (part,) if part else ()
    rng = seeded_rng(seed, 1, si, *tail)
    by_engine: Dict[str, List[Voice]] = {}
    for v in voices:
        by_engine.setdefault(v.engine, []).append(v)
    engines = [e for e in sorted(by_engine) if shares.get(e, 0) > 0]
    weights = np.array([shares[e] for e in engines], np.float64)
    weights /= weights.sum()
    orders = {e: [by_engine[e][i] for i in rng.permutation(len(by_engine[e]))] for e in engines}
    used = {e: 0 for e in engines}
    width = max(5, len(str(n)))
    tag = f"p{part:03d}-" if part else ""
    specs = []
    for i in range(n):
        engine = engines[int(rng.choice(len(engines), p=weights))]
        voice = orders[engine][used[engine] % len(orders[engine])]
        used[engine] += 1
        specs.append(UttSpec(
            utt=f"{voice.spk}-{tag}{i:0{width}d}", spk=voice.spk, text=utterance_text(rng, sentences),
            voice=voice, rate=int(rng.integers(RATE_WPM[0], RATE_WPM[1] + 1)),
            pitch=int(rng.integers(PITCH[0], PITCH[1] + 1)),
            prange=int(rng.integers(PITCH_RANGE[0], PITCH_RANGE[1] + 1)),
            level_db=float(rng.uniform(*LEVEL_DBFS)), lead_s=float(rng.uniform(*SILENCE_S)),
            trail_s=float(rng.uniform(*SILENCE_S)), noise=_pick(rng, NOISE_TYPES),
            snr_db=float(rng.uniform(*snr_db))))
    return [Group(split, g, (int(seed), 2, si, g, *tail), specs[start:start + GROUP_SIZE])
            for g, start in enumerate(range(0, len(specs), GROUP_SIZE))]


# --------------------------------------------------------------------------------------
# Rendering (forked children)
# --------------------------------------------------------------------------------------

def _render_group(group: Group, tts: Renderer, rng: np.random.Generator, out_dir: str,
                  noisy: bool) -> List[Tuple[str, int, str]]:
    """Child body: every utterance's speech first (the babble pool is the group's other
    utterances), then the clean and noisy WAVs. Returns (utt, samples, noise used)."""
    import soundfile as sf
    sr = tts.sample_rate
    speech = [tts.utterance(s.utt, s.text, s.voice, s.rate, s.pitch, s.prange,
                            int(rng.integers(2 ** 31))).audio for s in group.specs]
    out = []
    for i, spec in enumerate(group.specs):
        clean = place_at_level(speech[i], sr, spec.level_db, spec.lead_s, spec.trail_s)
        noise_used, mixed = "", None
        if noisy:
            others = speech[:i] + speech[i + 1:]
            noise_used = spec.noise if spec.noise != "babble" or others else "pink"
            background = background_noise(len(clean), noise_used, rng, sr, others)
            mixed, _ = mix_at_snr(clean, background, spec.snr_db)
        # one gain for both: the noisy file stays the clean one plus noise
        gain = peak_gain(clean, mixed) if noisy else peak_gain(clean)
        sf.write(os.path.join(out_dir, "wavs", group.split, spec.utt + ".wav"),
                 pcm16(clean * gain), sr, subtype="PCM_16")
        if noisy:
            sf.write(os.path.join(out_dir, "wavs", group.split + NOISY_SUFFIX,
                                  spec.utt + ".wav"), pcm16(mixed * gain), sr, subtype="PCM_16")
        out.append((spec.utt, len(clean), noise_used))
    return out


# --------------------------------------------------------------------------------------
# Output
# --------------------------------------------------------------------------------------

def output_dirs(noisy: bool, splits: Sequence[str] = SPLITS) -> List[str]:
    return list(splits) + ([s + NOISY_SUFFIX for s in splits] if noisy else [])


def corpus_dir(out_dir: str) -> CorpusDir:
    return CorpusDir(out_dir, STAMP_NAME, [LEGACY_VOICES_FILE] + output_dirs(True))


def summarize(out_dir: str, names: Sequence[str]) -> Dict[str, dict]:
    """Per data dir: utterances, hours, voices."""
    out = {}
    for name in names:
        info = data_dir_summary(os.path.join(out_dir, name))
        out[name] = {"utts": info["utts"], "hours": info["hours"], "voices": info["speakers"]}
    return out


def plan_corpus(seed: int, sizes: Sizes, snr_db: Tuple[float, float], engines: Engines,
                n_random_voices: int, max_voices: int, sentences: Tuple[int, int],
                tmp_dir: str, splits: Sequence[str] = SPLITS,
                other_share: float = OTHER_ENGINES_SHARE, blends: int = 0, part: int = 0
                ) -> Tuple[List[Group], Dict[str, List[Voice]], Optional[str]]:
    """Groups of `splits`, the voices of every split, and the private espeak-ng data dir of
    the procedural voices (None without them)."""
    voices = list(engines.voices)
    espeak_data = None
    if "espeak" in engines.names:
        procedural = random_voices(n_random_voices, ACCENTS, seed)
        espeak_data = private_espeak_data(procedural, tmp_dir)
        fixed, _ = espeak_voices_here(espeak_voices() + procedural, tmp_dir, espeak_data)
        if not fixed:
            raise SynthError(f"espeak-ng has none of the English voices {ACCENTS}: "
                             f"{INSTALL_HINT}")
        voices += fixed
    free, reserved = engines.usable(voices)
    mixed = engine_blends(engines.names, blends, seed)
    by_split = split_with_blends(free, mixed, seed, VOICE_SHARE,
                                 lambda vs: split_voices(vs, seed, max_voices))
    if reserved:
        by_split["test"] = engines.outside_test(by_split["test"], reserved)
    for split in splits:
        if not by_split[split]:
            raise SynthError(f"no voices left for {split} ({len(voices)} voices in all)")
    shares = engine_shares(engines.names, other_share)
    groups = [g for split in splits
              for g in plan_split(split, getattr(sizes, split), by_split[split], seed,
                                  snr_db, shares, sentences, part)]
    return groups, by_split, espeak_data


def generate_speech(out_dir: str, seed: int = 1234, sizes: Sizes = Sizes(), nj: int = 2,
                    sample_rate: int = 16000, engines: Sequence[str] = ("espeak",),
                    n_random_voices: int = 0, max_voices: int = 0,
                    snr_db: Tuple[float, float] = (5.0, 25.0), noisy: bool = True,
                    sentences: Tuple[int, int] = SENTENCES, test_only: bool = False,
                    other_share: float = OTHER_ENGINES_SHARE, blends: int = 0,
                    part: int = 0) -> Dict[str, dict]:
    """Writes the corpus (module docstring) and returns summarize()'s figures. Does
    nothing when `out_dir` already holds a complete corpus of the same arguments.
    `n_random_voices`: procedural espeak-ng voices added to the pool before the split;
    `max_voices` > 0: at most that many voices in all (split_voices; the voices blends are
    made of come on top). `other_share`: the share of the utterances the engines besides
    espeak-ng speak, alike. `blends`: that many blended voices of each named engine that
    mixes voices (Kokoro). `test_only`: the test dirs alone, on the test voices of the full
    corpus of this seed plus every reserved voice of `engines` (festival's; Kokoro's seven,
    and no other Kokoro voice or blend). `part` > 0: more training speech for the
    corpus of this seed (part 0, the full corpus): the train dirs alone, the same voice
    split, texts and conditions of the part's own (plan_split), so that a corpus grows by
    parts in directories of their own and finished parts are never made again."""
    if part < 0 or (part and test_only):
        raise SynthError(f"part {part}: parts are >= 0 and add training speech, not with "
                         "test-only")
    splits = ("test",) if test_only else ("train",) if part else SPLITS
    for split in splits:
        if getattr(sizes, split) < 1:
            raise SynthError(f"{split}: need at least one utterance, got {getattr(sizes, split)}")
    if seed < 0 or nj < 1:
        raise SynthError(f"seed must be >= 0 and nj >= 1, got seed {seed}, nj {nj}")
    if sample_rate < 8000:
        raise SynthError(f"sample rate {sample_rate} too low (need >= 8000)")
    if snr_db[0] > snr_db[1] or not 1 <= sentences[0] <= sentences[1]:
        raise SynthError(f"bad ranges: SNR {snr_db}, sentences {sentences}")
    if not 0.0 <= other_share <= 1.0:
        raise SynthError(f"other-engine share {other_share} is outside [0, 1]")
    if blends < 0:
        raise SynthError(f"blends must be >= 0, got {blends}")
    if not 0 <= n_random_voices <= MAX_RANDOM_VOICES:
        raise SynthError(f"random voices {n_random_voices} is outside [0, {MAX_RANDOM_VOICES}] "
                         "(espeak-ng lists at most 349 voice files)")
    named = open_engines(engines, test_only)
    if n_random_voices and "espeak" not in named.names:
        raise SynthError("random voices are espeak-ng voices: add espeak to --engines")
    settings = {"seed": int(seed), "sizes": asdict(sizes), "sample_rate": int(sample_rate),
                "snr_db": [float(x) for x in snr_db],
                "engine_shares": engine_shares(named.names, other_share), "blends": int(blends),
                "random_voices": int(n_random_voices), "max_voices": int(max_voices),
                "noisy": bool(noisy), "sentences": [int(x) for x in sentences]}
    if part:                 # absent for part 0: the stamps of whole corpora stay valid
        settings["part"] = int(part)
    config = corpus_stamp(FORMAT_VERSION, settings, named)
    out = corpus_dir(out_dir)
    names = output_dirs(noisy, splits)
    required = {n: NOISY_FILES if n.endswith(NOISY_SUFFIX) else DATA_FILES for n in names}
    if out.is_complete(config, required):
        logger.info("%s is complete for these arguments; nothing to do", out_dir)
        return summarize(out_dir, names)

    t0 = time.time()
    with out.workspace(config) as tmp_dir:
        groups, by_split, espeak_data = plan_corpus(seed, sizes, snr_db, named, n_random_voices,
                                                    max_voices, sentences, tmp_dir, splits,
                                                    other_share, blends, part)
        logger.info("planned %d utterances (%s voices) in %d groups; rendering with nj=%d",
                    sum(len(g.specs) for g in groups),
                    "/".join(str(len(by_split[s])) for s in splits), len(groups), nj)
        results = out.render(groups, lambda g, tts, rng: _render_group(
            g, tts, rng, out.abspath, noisy), nj, tmp_dir, sample_rate, names, espeak_data)
    rendered = {utt: (n, noise) for res in results for utt, n, noise in res}
    for split in splits:
        specs = [s for g in groups if g.split == split for s in g.specs]
        tables = {"text": {s.utt: s.text for s in specs},
                  "utt2spk": {s.utt: s.spk for s in specs},
                  "utt2dur": {s.utt: f"{rendered[s.utt][0] / sample_rate:.3f}" for s in specs}}
        for name in (split, split + NOISY_SUFFIX):
            if name not in names:
                continue
            extra = {}
            if name != split:
                extra = {"utt2noise": {s.utt: rendered[s.utt][1] for s in specs},
                         "utt2snr": {s.utt: f"{s.snr_db:.2f}" for s in specs}}
            kaldi.write_data_dir(os.path.join(out_dir, name), {
                "wav.scp": {s.utt: os.path.join(out.wav_dir(name), s.utt + ".wav")
                            for s in specs}, **tables, **extra})
    out.write_inventory(by_split, {s.spk for g in groups for s in g.specs},
                        config["engine_versions"])
    out.write_stamp(config)
    logger.info("wrote %s in %.1f s", out_dir, time.time() - t0)
    return summarize(out_dir, names)
