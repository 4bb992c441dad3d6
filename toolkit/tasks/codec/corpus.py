"""Synthetic read speech from many voices, for models that need speech but no labels
(codecs, enhancement, voice activity): Kaldi data dirs ``{train,dev,test}`` of noise-free
speech and, with ``noisy``, parallel dirs ``{train,dev,test}_noisy`` holding the same
utterances in white, pink, brown or babble noise (same keys, same speech samples: noisy =
clean + noise, to int16 rounding). WAVs under ``wavs/<dir>/``; ``voices.txt`` lists every
voice used (``<spk> <split> <engine> <engine voice>``).

Texts are sentences from a small grammar (statements, questions, requests, numbers and
names), one to three per utterance, so that the prosody is that of read sentences rather
than of word lists. Voices: espeak-ng's fixed voices (8 English accents x 28 variants),
optionally procedural espeak-ng voices (random vocal tracts and sources,
toolkit.tts.espeak.random_voices), and the voices of the other engines asked for. Train,
dev and test never share a voice; the split is stratified by accent (espeak-ng) or engine,
so that every split hears every accent.

Engines: only those named in ``engines`` are looked at (espeak-ng alone by default, so
that what happens to be installed never changes the data); one that is named but missing
is an error before any work. Festival in particular is used only when named.

Determinism: the plan (texts, voices, prosody, levels, noise, SNR) is drawn in the parent
from the seed alone; rendering runs in fixed groups of GROUP_SIZE utterances, each in a
freshly forked child that loads the engines itself (toolkit.tts.pool), and reseeds the TTS
before each utterance. Groups do not depend on ``nj``, so the files are byte-identical for
any ``nj``. The parent never loads espeak-ng.
"""
import json
import logging
import math
import os
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from toolkit.data import kaldi
from toolkit.data.audio import resample
from toolkit.fileio import atomic_write_text
from toolkit.tts import SynthError, Voice
from toolkit.tts.engines import ENGINES, engine_class
from toolkit.tts.espeak import (ACCENTS, INSTALL_HINT, MAX_RANDOM_VOICES, Espeak,
                                espeak_fingerprint, espeak_paths, espeak_voices,
                                loaded_in_this_process, private_espeak_data, random_voices)
from toolkit.tts.pool import run_forked, single_thread_blas
from toolkit.tts.signal import (active_power, babble_noise, colored_noise, mix_at_snr,
                                trim_silence)

logger = logging.getLogger(__name__)

FORMAT_VERSION = 1            # bump when the outputs change, so that old stamps are stale
SPLITS = ("train", "dev", "test")
NOISY_SUFFIX = "_noisy"
GROUP_SIZE = 32               # utterances per forked renderer; fixed => nj-independent
STAMP_NAME = ".synth_speech_data.json"
VOICES_FILE = "voices.txt"
VOICE_SHARE = {"test": 0.1, "dev": 0.1}    # per accent or engine; the rest is train
# Share of the utterances spoken by the engines named besides espeak-ng, shared alike:
# they have a handful of voices each against espeak-ng's hundreds.
OTHER_ENGINES_SHARE = 0.2

RATE_WPM = (130, 210)         # espeak default 175
PITCH = (25, 75)              # espeak 0-100, 50: the voice's own
PITCH_RANGE = (20, 80)
LEVEL_DBFS = (-22.0, -12.0)   # active-speech RMS level (DAC trains on speech at -16 dB LUFS)
SILENCE_S = (0.1, 0.4)        # leading and trailing silence
SENTENCES = (1, 3)            # sentences per utterance
NOISE_TYPES = ("white", "pink", "brown", "babble")
PEAK = 0.98                   # clean and noisy share one gain that keeps both below it
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

def check_engines(engines: Sequence[str]) -> List[str]:
    """The engine names, espeak first then sorted; SynthError before any work for an
    unknown, repeated or unavailable one. Engines not named are never looked at."""
    names = [str(e).strip() for e in engines]
    if not names or "" in names:
        raise SynthError(f"engines: need engine names such as espeak or espeak,flite; got "
                         f"{','.join(names)!r}")
    if len(set(names)) != len(names):
        raise SynthError(f"engine named twice: {','.join(names)}")
    for name in names:
        reason = engine_class(name).unavailable_reason()
        if reason:
            raise SynthError(f"{name} was asked for (--engines) but {reason}")
    return sorted(names, key=lambda n: (n != "espeak", n))


def engine_shares(engines: Sequence[str]) -> Dict[str, float]:
    """Planned share of the utterances per engine (OTHER_ENGINES_SHARE to the others
    when espeak-ng is among them, shared alike; all to them otherwise)."""
    others = [e for e in engines if e != "espeak"]
    if "espeak" not in engines:
        return {e: 1.0 / len(others) for e in others}
    return {"espeak": 1.0 - OTHER_ENGINES_SHARE * bool(others),
            **{e: OTHER_ENGINES_SHARE / len(others) for e in others}}


def _stratum(voice: Voice) -> str:
    if voice.engine != "espeak":
        return voice.engine
    return voice.name.split("+")[0] + (":procedural" if voice.variant else "")


def _interleave(strata: Dict[str, List[Voice]]) -> List[Voice]:
    """Round robin over the strata, so that any prefix covers the accents evenly."""
    out, lists = [], [strata[k] for k in sorted(strata)]
    for i in range(max((len(v) for v in lists), default=0)):
        out += [v[i] for v in lists if i < len(v)]
    return out


def split_voices(voices: Sequence[Voice], seed: int, max_voices: int = 0
                 ) -> Dict[str, List[Voice]]:
    """Disjoint voice lists per split, stratified by accent or engine (a stratum of three
    or more voices gives each split at least one), each list interleaved across strata.
    `max_voices` > 0 keeps that many in all: 10 % (at least one) each for test and dev."""
    rng = np.random.default_rng([int(seed), 0])
    strata: Dict[str, List[Voice]] = {}
    for v in sorted(voices, key=lambda v: v.spk):
        strata.setdefault(_stratum(v), []).append(v)
    per_split: Dict[str, Dict[str, List[Voice]]] = {s: {} for s in SPLITS}
    for key in sorted(strata):
        order = [strata[key][i] for i in rng.permutation(len(strata[key]))]
        n = len(order)
        n_test = max(1, round(VOICE_SHARE["test"] * n)) if n >= 2 else 0
        n_dev = max(1, round(VOICE_SHARE["dev"] * n)) if n >= 3 else 0
        per_split["test"][key] = order[:n_test]
        per_split["dev"][key] = order[n_test:n_test + n_dev]
        per_split["train"][key] = order[n_test + n_dev:]
    out = {s: _interleave(per_split[s]) for s in SPLITS}
    if max_voices:
        if max_voices < 3:
            raise SynthError(f"max voices {max_voices}: need at least 3 (one per split)")
        n_held = max(1, round(0.1 * max_voices))
        caps = {"test": n_held, "dev": n_held, "train": max_voices - 2 * n_held}
        out = {s: out[s][:caps[s]] for s in SPLITS}
    for s in SPLITS:
        if not out[s]:
            raise SynthError(f"no voices left for {s} ({len(voices)} voices in all)")
    return out


def _probe(voices: Sequence[Voice], espeak_data: Optional[str]) -> List[Voice]:
    """Child body: the espeak-ng voices among `voices` that load (a procedural one only
    when its variant file is applied: espeak falls back to the plain accent silently)."""
    es = Espeak(espeak_data)
    ok = []
    for v in voices:
        if not es.set_voice(v.name):
            continue
        if v.variant and not es.current_identifier().endswith("+" + v.name.split("+")[1]):
            raise SynthError(f"espeak-ng ignored the procedural voice {v.name} (variant file "
                             f"not found in {espeak_data})")
        ok.append(v)
    return ok


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


@dataclass
class Group:
    split: str
    index: int
    seed: Tuple[int, ...]
    specs: List[UttSpec]


def plan_split(split: str, n: int, voices: Sequence[Voice], seed: int,
               snr_db: Tuple[float, float], shares: Dict[str, float],
               sentences: Tuple[int, int] = SENTENCES) -> List[Group]:
    """The utterances of one split in groups of GROUP_SIZE. Each engine's voices are
    taken in turn (a seeded order), so that every voice speaks about as often."""
    si = SPLITS.index(split)
    rng = np.random.default_rng([int(seed), 1, si])
    by_engine: Dict[str, List[Voice]] = {}
    for v in voices:
        by_engine.setdefault(v.engine, []).append(v)
    engines = [e for e in sorted(by_engine) if shares.get(e, 0) > 0]
    weights = np.array([shares[e] for e in engines], np.float64)
    weights /= weights.sum()
    orders = {e: [by_engine[e][i] for i in rng.permutation(len(by_engine[e]))] for e in engines}
    used = {e: 0 for e in engines}
    width = max(5, len(str(n)))
    specs = []
    for i in range(n):
        engine = engines[int(rng.choice(len(engines), p=weights))]
        voice = orders[engine][used[engine] % len(orders[engine])]
        used[engine] += 1
        specs.append(UttSpec(
            utt=f"{voice.spk}-{i:0{width}d}", spk=voice.spk, text=utterance_text(rng, sentences),
            voice=voice, rate=int(rng.integers(RATE_WPM[0], RATE_WPM[1] + 1)),
            pitch=int(rng.integers(PITCH[0], PITCH[1] + 1)),
            prange=int(rng.integers(PITCH_RANGE[0], PITCH_RANGE[1] + 1)),
            level_db=float(rng.uniform(*LEVEL_DBFS)), lead_s=float(rng.uniform(*SILENCE_S)),
            trail_s=float(rng.uniform(*SILENCE_S)), noise=_pick(rng, NOISE_TYPES),
            snr_db=float(rng.uniform(*snr_db))))
    return [Group(split, g, (int(seed), 2, si, g), specs[start:start + GROUP_SIZE])
            for g, start in enumerate(range(0, len(specs), GROUP_SIZE))]


# --------------------------------------------------------------------------------------
# Rendering (forked children)
# --------------------------------------------------------------------------------------

def _speak(engines: dict, tmp: str, espeak_data: Optional[str], spec: UttSpec, sr: int,
           seed: int) -> np.ndarray:
    name = spec.voice.engine
    if name not in engines:     # made on first use: espeak-ng loads only in this child
        options = {"data_path": espeak_data} if name == "espeak" else {}
        engines[name] = ENGINES.get(name)(tmp, **options)
    speech = engines[name].synth(spec.text, spec.voice, spec.rate, spec.pitch, spec.prange,
                                 seed, time_words=False)
    audio = trim_silence(resample(speech.audio, speech.sample_rate, sr))
    if not len(audio):
        raise SynthError(f"{spec.utt}: {name} produced no audio for {spec.text!r}")
    return audio


def place(speech: np.ndarray, spec: UttSpec, sr: int) -> np.ndarray:
    """Speech at its active level between the leading and trailing silences (float32)."""
    lead, trail = int(round(spec.lead_s * sr)), int(round(spec.trail_s * sr))
    out = np.zeros(lead + len(speech) + trail, np.float32)
    out[lead:lead + len(speech)] = speech / (math.sqrt(active_power(speech)) + 1e-12) * \
        10 ** (spec.level_db / 20)
    return out


def _pcm16(x: np.ndarray) -> np.ndarray:
    return np.round(np.clip(x, -1.0, 1.0) * 32767).astype(np.int16)


def _render_group(group: Group, out_dir: str, sr: int, espeak_data: Optional[str],
                  noisy: bool) -> List[Tuple[str, int, str]]:
    """Child body: every utterance's speech first (the babble pool is the group's other
    utterances), then the clean and noisy WAVs. Returns (utt, samples, noise used)."""
    import soundfile as sf
    single_thread_blas()
    rng = np.random.default_rng(list(group.seed))
    with tempfile.TemporaryDirectory(prefix="speech_") as tmp:
        engines: dict = {}
        speech = [_speak(engines, tmp, espeak_data, s, sr, int(rng.integers(2 ** 31)))
                  for s in group.specs]
    out = []
    for i, spec in enumerate(group.specs):
        clean = place(speech[i], spec, sr)
        peak, noise_used, mixed = float(np.abs(clean).max()), "", None
        if noisy:
            others = speech[:i] + speech[i + 1:]
            noise_used = spec.noise if spec.noise != "babble" or others else "pink"
            background = (babble_noise(len(clean), others, rng) if noise_used == "babble"
                          else colored_noise(len(clean), noise_used, rng, sr))
            mixed, _ = mix_at_snr(clean, background, spec.snr_db)
            peak = max(peak, float(np.abs(mixed).max()))
        gain = min(1.0, PEAK / peak) if peak > 0 else 1.0
        sf.write(os.path.join(out_dir, "wavs", group.split, spec.utt + ".wav"),
                 _pcm16(clean * gain), sr, subtype="PCM_16")
        if noisy:
            sf.write(os.path.join(out_dir, "wavs", group.split + NOISY_SUFFIX,
                                  spec.utt + ".wav"), _pcm16(mixed * gain), sr, subtype="PCM_16")
        out.append((spec.utt, len(clean), noise_used))
    return out


# --------------------------------------------------------------------------------------
# Output
# --------------------------------------------------------------------------------------

def output_dirs(noisy: bool) -> List[str]:
    return list(SPLITS) + ([s + NOISY_SUFFIX for s in SPLITS] if noisy else [])


def _stamp_config(seed, sizes: Sizes, sample_rate, snr_db, engines, other_voices,
                  n_random_voices, max_voices, noisy, sentences) -> dict:
    voices: Dict[str, List[str]] = {}
    for v in other_voices:          # espeak-ng's voices follow from its build, below
        voices.setdefault(v.engine, []).append(v.name)
    return {"format": FORMAT_VERSION, "seed": int(seed), "sizes": asdict(sizes),
            "sample_rate": int(sample_rate), "snr_db": [float(x) for x in snr_db],
            "engines": list(engines), "engine_shares": engine_shares(engines),
            "engine_voices": voices, "random_voices": int(n_random_voices),
            "max_voices": int(max_voices), "noisy": bool(noisy),
            "sentences": [int(x) for x in sentences],
            "espeak": espeak_fingerprint() if "espeak" in engines else None}


def is_complete(out_dir: str, config: dict) -> bool:
    """The stamp matches `config` and every data file and listed WAV exists."""
    try:
        with open(os.path.join(out_dir, STAMP_NAME), encoding="utf-8") as f:
            if json.load(f) != config:
                return False
        for name in output_dirs(config["noisy"]):
            d = os.path.join(out_dir, name)
            files = NOISY_FILES if name.endswith(NOISY_SUFFIX) else DATA_FILES
            if not all(os.path.exists(os.path.join(d, n)) for n in files):
                return False
            with open(os.path.join(d, "wav.scp"), encoding="utf-8") as f:
                if not all(os.path.exists(line.split(maxsplit=1)[1].strip()) for line in f):
                    return False
    except (OSError, ValueError, IndexError, KeyError):
        return False
    return True


def _clean_outputs(out_dir: str) -> None:
    """Removes only what this generator writes (and what a rerun would leave stale)."""
    names = [STAMP_NAME, VOICES_FILE, "wavs", ".synth_tmp"] + output_dirs(True)
    for name in names:
        p = os.path.join(out_dir, name)
        if os.path.isdir(p) and not os.path.islink(p):
            shutil.rmtree(p)
        elif os.path.lexists(p):
            os.unlink(p)


def summarize(out_dir: str) -> Dict[str, dict]:
    """Per data dir: utterances, hours, voices."""
    with open(os.path.join(out_dir, STAMP_NAME), encoding="utf-8") as f:
        noisy = json.load(f)["noisy"]
    out = {}
    for name in output_dirs(noisy):
        d = os.path.join(out_dir, name)
        dur = kaldi.read_table(os.path.join(d, "utt2dur"))
        spk = kaldi.read_table(os.path.join(d, "spk2utt"))
        out[name] = {"utts": len(dur), "hours": sum(float(v) for v in dur.values()) / 3600,
                     "voices": len(spk)}
    return out


def generate_speech(out_dir: str, seed: int = 1234, sizes: Sizes = Sizes(), nj: int = 2,
                    sample_rate: int = 16000, engines: Sequence[str] = ("espeak",),
                    n_random_voices: int = 0, max_voices: int = 0,
                    snr_db: Tuple[float, float] = (5.0, 25.0), noisy: bool = True,
                    sentences: Tuple[int, int] = SENTENCES) -> Dict[str, dict]:
    """Writes the corpus (module docstring) and returns summarize()'s figures. Does
    nothing when `out_dir` already holds a complete corpus of the same arguments.
    `n_random_voices`: procedural espeak-ng voices added to the pool before the split;
    `max_voices` > 0: at most that many voices in all (split_voices)."""
    for split in SPLITS:
        if getattr(sizes, split) < 1:
            raise SynthError(f"{split}: need at least one utterance, got {getattr(sizes, split)}")
    if seed < 0 or nj < 1:
        raise SynthError(f"seed must be >= 0 and nj >= 1, got seed {seed}, nj {nj}")
    if sample_rate < 8000:
        raise SynthError(f"sample rate {sample_rate} too low (need >= 8000)")
    if snr_db[0] > snr_db[1] or not 1 <= sentences[0] <= sentences[1]:
        raise SynthError(f"bad ranges: SNR {snr_db}, sentences {sentences}")
    if not 0 <= n_random_voices <= MAX_RANDOM_VOICES:
        raise SynthError(f"random voices {n_random_voices} is outside [0, {MAX_RANDOM_VOICES}] "
                         "(espeak-ng lists at most 349 voice files)")
    engines = check_engines(engines)
    if n_random_voices and "espeak" not in engines:
        raise SynthError("random voices are espeak-ng voices: add espeak to --engines")
    if "espeak" in engines:
        espeak_paths()
        if loaded_in_this_process():
            logger.warning("espeak-ng was loaded in this process: output may not be "
                           "reproducible")
    other_voices = [v for e in engines if e != "espeak" for v in engine_class(e).voices()]
    config = _stamp_config(seed, sizes, sample_rate, snr_db, engines, other_voices,
                           n_random_voices, max_voices, noisy, sentences)
    if is_complete(out_dir, config):
        logger.info("%s is complete for these arguments; nothing to do", out_dir)
        return summarize(out_dir)

    t0 = time.time()
    _clean_outputs(out_dir)
    out_abs = os.path.abspath(out_dir)
    tmp_dir = os.path.join(out_abs, ".synth_tmp")
    os.makedirs(tmp_dir)
    try:
        voices = list(other_voices)
        espeak_data = None
        if "espeak" in engines:
            procedural = random_voices(n_random_voices, ACCENTS, seed)
            espeak_data = private_espeak_data(procedural, tmp_dir)
            fixed = run_forked(lambda _: _probe(espeak_voices() + procedural, espeak_data),
                               [None], 1, tmp_dir)[0]
            if not fixed:
                raise SynthError(f"espeak-ng has none of the English voices {ACCENTS}: "
                                 f"{INSTALL_HINT}")
            voices += fixed
        by_split = split_voices(voices, seed, max_voices)
        shares = engine_shares(engines)
        groups = [g for split in SPLITS
                  for g in plan_split(split, getattr(sizes, split), by_split[split], seed,
                                      snr_db, shares, sentences)]
        logger.info("planned %d utterances (%s voices) in %d groups; rendering with nj=%d",
                    sum(len(g.specs) for g in groups),
                    "/".join(str(len(by_split[s])) for s in SPLITS), len(groups), nj)
        for name in output_dirs(noisy):
            os.makedirs(os.path.join(out_abs, "wavs", name))
        from toolkit.progress import Progress
        bar = Progress(len(groups), "rendering", "groups", interval_s=10.0, log=logger)
        results = run_forked(lambda g: _render_group(g, out_abs, sample_rate, espeak_data, noisy),
                             groups, nj, tmp_dir, lambda done, _: bar.update(done - bar.done))
        bar.close()
    finally:
        shutil.rmtree(tmp_dir, ignore_errors=True)
    rendered = {utt: (n, noise) for res in results for utt, n, noise in res}
    for split in SPLITS:
        specs = [s for g in groups if g.split == split for s in g.specs]
        tables = {"text": {s.utt: s.text for s in specs},
                  "utt2spk": {s.utt: s.spk for s in specs},
                  "utt2dur": {s.utt: f"{rendered[s.utt][0] / sample_rate:.3f}" for s in specs}}
        for name in output_dirs(noisy):
            if name.split(NOISY_SUFFIX)[0] != split:
                continue
            extra = {}
            if name != split:
                extra = {"utt2noise": {s.utt: rendered[s.utt][1] for s in specs},
                         "utt2snr": {s.utt: f"{s.snr_db:.2f}" for s in specs}}
            wav_dir = os.path.join(out_abs, "wavs", name)
            kaldi.write_data_dir(os.path.join(out_dir, name), {
                "wav.scp": {s.utt: os.path.join(wav_dir, s.utt + ".wav") for s in specs},
                **tables, **extra})
    speaking = {s.spk for g in groups for s in g.specs}
    atomic_write_text(os.path.join(out_dir, VOICES_FILE), "".join(
        f"{v.spk} {split} {v.engine} {v.name}\n" for split in SPLITS for v in by_split[split]
        if v.spk in speaking))
    with open(os.path.join(out_dir, STAMP_NAME), "w", encoding="utf-8") as f:
        json.dump(config, f, indent=1, sort_keys=True)      # written last: marks completion
    logger.info("wrote %s in %.1f s", out_dir, time.time() - t0)
    return summarize(out_dir)
