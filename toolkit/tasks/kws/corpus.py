"""Synthetic wake-word corpus: TTS speech mixed with noise.

Produces Kaldi data dirs ``{train,dev,test}`` (wav.scp, text, utt2dur, utt2spk, spk2utt,
utt2kind, kw_times), the WAVs under ``wavs/<split>/``, ``dict/keywords.txt`` (line i =
class i), ``dict/tts_engines`` and the voice inventory ``voices.tsv``.

This module is the corpus design (utterance kinds and their mix, voices and prosody, the
plan, the output); the texts (keywords, carriers, negatives, confusables) are
toolkit.tasks.kws.corpus_text; rendering an utterance, its kw_times and the corpus
toolkit.tasks.kws.corpus_render; the general negatives (random words, noise alone: the same
for every keyword, dropped where they hold one, kept in the negatives cache)
toolkit.tasks.kws.negatives; engines and voices are toolkit.voicebank.corpus, the forked
rendering, the stamp and the output dir toolkit.voicebank.corpus_dir.
Engines: those named in ``engines`` speak (espeak-ng alone by default); the engines besides
espeak-ng speak OTHER_ENGINES_SHARE of the utterances, shared alike. espeak-ng is needed
whatever speaks: its phonemes keep keyword sound-alikes out of the negatives.
``dict/tts_engines`` holds one ``<engine> <share>`` line per engine (its planned share of
the utterances; a split without voices of an engine gets none of it). Voices are split by
accent (espeak-ng) or engine; reserved voices (festival's, flite's) speak only in a
``test_only`` corpus.

Keyword timings (kw_times, positives only) come from the engine's word onsets (espeak-ng;
flite, from its phone segments, when they add up: toolkit.voicebank.flite). From an engine that
times no words (festival, or flite when they do not add up), a positive that is the
keyword alone spans its whole speech and one in a carrier phrase gets no kw_times line.

espeak-ng seeds its own noise generator (breath/echo voices) from the clock, so every
utterance reseeds it (espeak_ng_SetRandSeed) and libc rand() from the group's generator.
"""
import logging
import os
import time
from dataclasses import asdict, dataclass
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np

from toolkit.data import kaldi
from toolkit.fileio import atomic_write_text
from toolkit.tasks.kws.corpus_text import (TextFilter, accent_text, accent_variants,
                                           clean_phonemes, confusable_categories,
                                           confusable_text, hard_confusable_text,
                                           lexicon_words, negative_text, normalize_keyword,
                                           positive_text)
from toolkit.tasks.kws.corpus_render import render_corpus
from toolkit.tasks.kws.negatives import drop_for_keywords, log_dropped, write_records
from toolkit.voicebank import SynthError, Voice, seeded_rng
from toolkit.voicebank.corpus import (OTHER_ENGINES_SHARE, SPLITS, Engines, corpus_stamp,
                                      engine_blends, engine_shares, open_engines, split_by_stratum,
                                      split_with_blends)
from toolkit.voicebank.corpus_dir import CorpusDir, Group, data_dir_summary
from toolkit.voicebank.espeak import ACCENTS, INSTALL_HINT, Espeak, espeak_voices
from toolkit.voicebank.pool import run_forked
from toolkit.voicebank.signal import NOISE_TYPES

logger = logging.getLogger(__name__)

FORMAT_VERSION = 6           # bump when the outputs change, so old stamps are stale
                             # (2: kw_times, the keyword's span in each positive;
                             # 3: dict/tts_engines, kw_times of flite positives;
                             # 4: the stamp and voices.tsv of toolkit.voicebank.corpus;
                             # 5: lexicon neighbours, utt2cat, accent variants in test;
                             # 6: general negatives planned apart, the same for any keyword)
GROUP_SIZE = 64              # utterances per forked renderer; fixed => nj-independent
# Streams of seeded_rng(seed, stream, split index): the keyword's own utterances and their
# groups' generators; the general negatives and theirs (no keyword enters these two).
KEYWORD_STREAM, KEYWORD_GROUPS, GENERAL_STREAM, GENERAL_GROUPS = 1, 2, 3, 4
NO_FILTER = TextFilter([], {})      # the general negatives are filtered per keyword later
STAMP_NAME = ".synth_kws_data.json"
NOISE_TEXT = "<noise>"
# Held-out voices per accent (espeak) or engine; the rest is train. Test holds more than
# dev: its false-alarm rate per hour needs hours of negatives from unseen voices.
VOICE_SPLIT = {"dev": 0.1, "test": 0.2}

RATE_WPM = (120, 220)        # espeak default is 175
PITCH = (20, 80)             # espeak 0-100, default 50
PITCH_RANGE = (20, 80)
LEVEL_DBFS = (-32.0, -14.0)  # active-speech RMS level, i.e. the volume gain
SILENCE_S = (0.1, 1.0)       # leading and trailing, filled with the same noise
NOISE_ONLY_S = (1.0, 4.0)
BABBLE_POOL = 6              # babble sentences synthesized per group
NEG_MIX = {"noise": 0.1, "conf": 0.3}     # rest of the negatives: random word sequences
# Utterance kinds the engines besides espeak-ng may speak (noise has no voice). Fewer kinds
# buy their voices where they pay: a neural engine's second per clip spent on short keyword
# clips rather than on long random-word negatives, which espeak-ng speaks in a millisecond.
SPOKEN_KINDS = ("pos", "conf", "neg")
# Test splits also hold accent variants of the keyword (utt2kind `accent`: "hey jarvus"),
# this many per positive, spoken like positives: a detector should accept them; scoring
# measures them apart (toolkit.tasks.kws.product), and no other split holds any.
ACCENT_SHARE = 0.2
# Train split only: the share of confusables among negatives, and the share of those that
# are near-homophones of the whole keyword (category `substitute`, or `similar` for a
# one-word keyword). Categories taken in turn give each of the ~90 "hey snips" substitutes
# a few training copies while the one "snips hey" gets hundreds, yet the near-homophones
# are the negatives a detector most easily fires on: the hard share gives them their own
# draw. Dev and test keep NEG_MIX, so that their figures do not move with these.
TRAIN_CONF_SHARE = 0.3
TRAIN_HARD_SHARE = 0.0


# --------------------------------------------------------------------------------------
# Planning (parent process): every random choice except the noise waveforms
# --------------------------------------------------------------------------------------

@dataclass
class UttSpec:
    utt: str
    spk: str
    kind: str         # pos | neg | conf | noise | accent
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
    category: str = ""            # conf: its neighbour category; accent: "accent"


def split_voices(voices: Sequence[Voice], seed: int) -> Dict[str, List[Voice]]:
    """Disjoint voice sets per split, stratified by accent (espeak) or engine (the others)
    so that every split hears every accent, but never a voice of another split."""
    return split_by_stratum(voices, seed, VOICE_SPLIT)


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


def negative_counts(n_neg: int, conf_share: float) -> Tuple[int, int, int]:
    """(noise-only, confusable, random-word) counts of `n_neg` negatives."""
    n_noise = int(round(NEG_MIX["noise"] * n_neg))
    n_conf = min(int(round(conf_share * n_neg)), n_neg - n_noise)
    return n_noise, n_conf, n_neg - n_conf - n_noise


def plan_split(split: str, n_pos: int, n_neg: int, keywords: Sequence[str],
               voices: Sequence[Voice], filt: TextFilter, cats, seed: int,
               snr: Tuple[float, float], other_share: float = OTHER_ENGINES_SHARE,
               conf_share: float = NEG_MIX["conf"], hard_share: float = 0.0,
               other_kinds: Sequence[str] = SPOKEN_KINDS,
               accents: Optional[Dict[str, List[str]]] = None) -> List[Group]:
    """All utterances of one split, in fixed groups of GROUP_SIZE. `conf_share` of the
    negatives are confusables, `hard_share` of those near-homophones of a whole keyword;
    `other_share` of the utterances of `other_kinds` go to the engines besides espeak-ng.
    The test split adds ACCENT_SHARE accent variants (`accents`: keyword -> variants) per
    positive. The keyword's own utterances (pos, conf, accent) come first, from a stream
    of the keyword's; the general negatives (noise alone, random words) follow in groups of
    their own, from a stream no keyword enters and unfiltered: the same for every keyword,
    so that they are made once (toolkit.tasks.kws.negatives: the cache, and the filter
    that drops those that hold a keyword)."""
    si = SPLITS.index(split)
    n_noise, n_conf, n_rand = negative_counts(n_neg, conf_share)
    accent_kws = [k for k in keywords if (accents or {}).get(k)]
    n_accent = int(round(ACCENT_SHARE * n_pos)) if split == "test" and accent_kws else 0
    common = dict(voices=voices, snr=snr, other_share=other_share, other_kinds=other_kinds)
    own = _plan_kinds(split, ["pos"] * n_pos + ["conf"] * n_conf + ["accent"] * n_accent,
                      seeded_rng(seed, KEYWORD_STREAM, si), (int(seed), KEYWORD_GROUPS, si),
                      filt, keywords, cats, hard_share, accents or {}, **common)
    general = _plan_kinds(split, ["noise"] * n_noise + ["neg"] * n_rand,
                          seeded_rng(seed, GENERAL_STREAM, si), (int(seed), GENERAL_GROUPS, si),
                          NO_FILTER, (), {}, 0.0, {}, **common)
    return own + general


def _plan_kinds(split: str, kinds: List[str], rng: np.random.Generator, group_seed: Tuple,
                filt: TextFilter, keywords: Sequence[str], cats, hard_share: float,
                accents: Dict[str, List[str]], voices: Sequence[Voice],
                snr: Tuple[float, float], other_share: float,
                other_kinds: Sequence[str]) -> List[Group]:
    """Utterances of `kinds` in a random order drawn from `rng`, in groups seeded by
    `group_seed` + (group index,), each with its babble pool (texts passing `filt`)."""
    kinds = [kinds[i] for i in rng.permutation(len(kinds))]
    accent_kws = [k for k in keywords if accents.get(k)]
    width = max(5, len(str(len(kinds))))
    specs: List[UttSpec] = []
    n_seen = {"pos": 0, "conf": 0, "hard": 0, "accent": 0}
    for i, kind in enumerate(kinds):
        # A share of 0 draws the same numbers: the plan of the other kinds stays as it was.
        # Accent variants are spoken as positives are.
        share_kind = "pos" if kind == "accent" else kind
        p = _sample_params(rng, voices, snr, other_share if share_kind in other_kinds else 0.0)
        kw_words = None
        category = ""
        counter = kind
        if kind == "pos":
            kw = keywords[n_seen["pos"] % len(keywords)]
            text = positive_text(rng, kw, keywords)
            words, kww = text.split(), kw.split()
            a = next(j for j in range(len(words)) if words[j:j + len(kww)] == kww)
            kw_words = (a, a + len(kww))
        elif kind == "conf" and hard_share > 0 and rng.random() < hard_share:
            text, category = hard_confusable_text(n_seen["hard"], rng, keywords, cats, filt)
            counter = "hard"            # the in-turn walk counts only its own picks
        elif kind == "conf":
            text, category = confusable_text(n_seen["conf"], rng, keywords, cats, filt)
        elif kind == "accent":
            variants = accents[accent_kws[n_seen["accent"] % len(accent_kws)]]
            text = accent_text(rng, variants[int(rng.integers(len(variants)))])
            category = "accent"
        elif kind == "neg":
            text = negative_text(rng, filt)
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
                           kw_words=kw_words, category=category)
        specs.append(spec)
    # Babble is noise: espeak-ng speaks it when it can (~1 ms a sentence, where a neural
    # engine takes a second), so its cost does not grow with the other engines' share.
    talkers = [v for v in voices if v.engine == "espeak"] or list(voices)
    groups = []
    for g, start in enumerate(range(0, len(specs), GROUP_SIZE)):
        babble = []
        for _ in range(BABBLE_POOL):
            p = _sample_params(rng, talkers, snr, other_share)
            text = negative_text(rng, filt, 8, 14)
            babble.append(UttSpec("babble", p["voice"].spk, "babble", text, **p))
        groups.append(Group(split, g, group_seed + (g,), specs[start:start + GROUP_SIZE], babble))
    return groups


# --------------------------------------------------------------------------------------
# Probing espeak-ng (a forked child)
# --------------------------------------------------------------------------------------

def _probe(words: Sequence[str], voices: Sequence[Voice]) -> dict:
    """Child body: checks espeak-ng works, which `voices` exist, and phonemizes `words`."""
    es = Espeak()
    ok = [v for v in voices if v.engine != "espeak" or es.set_voice(v.name)]
    phon = {a: {w: clean_phonemes(es.phonemes(w, a)) for w in words}
            for a in ACCENTS if es.set_voice(a)}
    return {"voices": ok, "phonemes": phon, "rate": es.rate}


# --------------------------------------------------------------------------------------
# Output
# --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class TrainMix:
    """How the training negatives differ from dev/test (see TRAIN_CONF_SHARE)."""
    conf_share: float = TRAIN_CONF_SHARE
    hard_share: float = TRAIN_HARD_SHARE


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
# utt2cat: the category of each confusable (toolkit.tasks.kws.neighbours.CATEGORIES, or
# `context`) and `accent` for each accent variant.
DATA_FILES = ("wav.scp", "text", "utt2dur", "utt2spk", "spk2utt", "utt2kind", "kw_times",
              "utt2cat")
ENGINES_FILE = "tts_engines"    # in dict/: `<engine> <share>`, see the module docstring
DICT_FILES = ("keywords.txt", ENGINES_FILE)


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
        "utt2cat": {s.utt: s.category for s in specs if s.category},
    })


def corpus_dir(out_dir: str) -> CorpusDir:
    return CorpusDir(out_dir, STAMP_NAME, ("dict",) + SPLITS)


def generate_corpus(keywords: Sequence[str], out_dir: str, seed: int = 777,
                    sizes: Sizes = Sizes(), nj: int = 2, sample_rate: int = 16000,
                    snr_db: Tuple[float, float] = (5.0, 30.0),
                    engines: Sequence[str] = ("espeak",),
                    train_conf_share: float = TRAIN_CONF_SHARE,
                    train_hard_share: float = TRAIN_HARD_SHARE,
                    other_share: float = OTHER_ENGINES_SHARE, blends: int = 0,
                    test_only: bool = False,
                    other_kinds: Sequence[str] = SPOKEN_KINDS, neg_cache: bool = False,
                    outside_dev: bool = False, exclude_voices: Sequence[str] = ()) -> dict:
    """Writes the corpus; returns {split: {"utts": n, "hours": h, ...}}. Skips the work
    when `out_dir` already holds a complete corpus made with the same arguments.
    `train_conf_share` and `train_hard_share` shape the training negatives only (see
    TRAIN_CONF_SHARE). `engines`: the TTS engines that speak (toolkit.voicebank.engines names;
    `other_share` of the utterances of `other_kinds` go to those besides espeak-ng; see
    SPOKEN_KINDS). `blends`: that many
    blended voices of each engine that mixes voices (Kokoro) join the voices; the voices
    they are made of then all train, the blends are shared out like other voices.
    `test_only` writes the test split alone: the same held-out
    voices as the full corpus of this seed plus every reserved voice of the engines (all
    of festival's): an evaluation set from other voices and engines. `outside_dev` writes
    the dev split alone, spoken by every voice of the engines that no test reserves (no
    blends): a set to choose on (fusion weights, a front end) from voices unlike the
    training ones, when no training corpus holds the voices left. `exclude_voices`:
    speaker ids (voices.tsv's) that speak in no split, e.g. the voices a pretrained front
    end was trained on, so that an outside dev set holds none of them. `neg_cache`: the
    general negatives come from the negatives cache (toolkit.tasks.kws.negatives), made
    there once for every keyword; the corpus is the same as without it. With or without,
    the general negatives that hold a keyword are dropped (logged; counted in the summary's
    `dropped_negatives`)."""
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
    if not 0.0 <= train_hard_share <= 1.0:
        raise SynthError(f"train hard-confusable share {train_hard_share} is outside [0, 1]")
    if not 0.0 <= other_share <= 1.0:
        raise SynthError(f"other-engine share {other_share} is outside [0, 1]")
    if blends < 0:
        raise SynthError(f"blends must be >= 0, got {blends}")
    other_kinds = check_other_kinds(other_kinds)
    if test_only and outside_dev:
        raise SynthError("--test-only and --outside-dev each write one split: choose one")
    splits = ("test",) if test_only else ("dev",) if outside_dev else SPLITS
    if outside_dev and blends:
        raise SynthError("--outside-dev speaks with the engines' own voices: no --blends")
    exclude_voices = sorted(set(exclude_voices))
    if exclude_voices and blends:     # a blend would still carry an excluded voice's timbre
        raise SynthError("--exclude-voices keeps voices out of every split: no --blends")
    named = open_engines(engines, test_only, needs_espeak=True)
    settings = {"keywords": list(keywords), "seed": int(seed), "sizes": asdict(sizes),
                "sample_rate": int(sample_rate), "snr_db": [float(snr_db[0]), float(snr_db[1])],
                "engine_shares": engine_shares(named.names, other_share), "blends": int(blends),
                "train_conf_share": float(train_conf_share),
                "train_hard_share": float(train_hard_share)}
    if other_kinds != SPOKEN_KINDS:     # absent by default: older stamps stay valid
        settings["other_kinds"] = list(other_kinds)
    if outside_dev:
        settings["outside_dev"] = True
    if exclude_voices:
        settings["exclude_voices"] = exclude_voices
    config = corpus_stamp(FORMAT_VERSION, settings, named, tools=("espeak",))
    out = corpus_dir(out_dir)
    required = {**{s: DATA_FILES for s in splits}, "dict": DICT_FILES}
    if out.is_complete(config, required):
        logger.info("%s is complete for these arguments; nothing to do", out_dir)
        return summarize(out_dir, splits)

    t0 = time.time()
    with out.workspace(config) as tmp_dir:
        plan = plan_corpus(keywords, seed, sizes, snr_db, named, tmp_dir,
                           TrainMix(train_conf_share, train_hard_share), splits,
                           other_share, blends, other_kinds, outside_dev, exclude_voices)
        logger.info("planned %d utterances in %d groups (%.1f s); rendering with nj=%d",
                    sum(len(g.specs) for g in plan.groups), len(plan.groups), time.time() - t0,
                    nj)
        dropped = log_dropped(plan.dropped, plan.groups, keywords)
        lengths, spans, entry = render_corpus(out, plan.groups, plan.dropped, config, nj,
                                              tmp_dir, sample_rate, splits, neg_cache)
    for split in splits:
        specs = [s for g in plan.groups if g.split == split for s in g.specs
                 if s.utt not in plan.dropped]
        write_data_dir(os.path.join(out_dir, split), out.wav_dir(split), specs, lengths,
                       sample_rate, spans)
    if entry is not None:
        write_records(out_dir, entry, plan.groups, plan.dropped)
    atomic_write_text(os.path.join(out_dir, "dict", "keywords.txt"),
                      "".join(k + "\n" for k in keywords))
    kaldi.write_table(os.path.join(out_dir, "dict", ENGINES_FILE),
                      {e: f"{share:g}" for e, share in
                       engine_shares(named.names, other_share).items()})
    out.write_inventory(plan.by_split, {s.spk for g in plan.groups for s in g.specs
                                        if s.utt not in plan.dropped},
                        config["engine_versions"])
    out.write_stamp(config)
    logger.info("wrote %s in %.1f s", out_dir, time.time() - t0)
    summary = summarize(out_dir, splits)
    for split, n in dropped.items():
        summary[split]["dropped_negatives"] = n
    return summary


class Plan(NamedTuple):
    groups: List[Group]                 # every split's, general negatives unfiltered
    by_split: Dict[str, List[Voice]]    # the voices of each split
    dropped: Dict[str, str]             # general negatives that hold a keyword: utt -> why


def plan_corpus(keywords: Sequence[str], seed: int, sizes: Sizes, snr_db: Tuple[float, float],
                engines: Engines, tmp_dir: str,
                train_mix: TrainMix = TrainMix(), splits: Sequence[str] = SPLITS,
                other_share: float = OTHER_ENGINES_SHARE, blends: int = 0,
                other_kinds: Sequence[str] = SPOKEN_KINDS, outside_dev: bool = False,
                exclude_voices: Sequence[str] = ()) -> Plan:
    """Every group of `splits`, the voices of every split, and the general negatives the
    keywords drop (toolkit.tasks.kws.negatives). The speakers: espeak-ng's
    fixed voices when it speaks, and the other engines' voices; reserved voices join the
    test split of a test-only corpus. espeak is only asked (in a forked probe) which voices
    exist and how words sound; the plan itself is pure numpy randomness from `seed`."""
    voices = (espeak_voices() if "espeak" in engines.names else []) + list(engines.voices)
    mixed = engine_blends(engines.names, blends, seed)
    words = lexicon_words(keywords)
    probe = run_forked(lambda _: _probe(words, voices), [None], 1, tmp_dir)[0]
    if not probe["phonemes"]:
        raise SynthError(f"espeak-ng has none of the English voices {ACCENTS}: {INSTALL_HINT}")
    free, reserved = engines.usable(probe["voices"])
    known = sorted(v.spk for v in probe["voices"])      # reserved ones too: excluding is moot
    unknown = sorted(set(exclude_voices) - set(known))
    if unknown:
        raise SynthError(f"--exclude-voices {','.join(unknown)}: no such voice of the engines "
                         f"{','.join(engines.names)}; they have {','.join(known)}")
    free = [v for v in free if v.spk not in set(exclude_voices)]
    if outside_dev:             # every unreserved voice chooses; none trains or tests
        by_split = {"train": [], "dev": sorted(free, key=lambda v: v.spk), "test": []}
    else:
        by_split = split_with_blends(free, mixed, seed, VOICE_SPLIT,
                                     lambda vs: split_voices(vs, seed))
    if reserved:
        by_split["test"] = sorted(engines.outside_test(by_split["test"], reserved),
                                  key=lambda v: v.spk)
    for split in splits:
        if not by_split[split]:
            raise SynthError(f"no voices left for {split}")
    filt = TextFilter(keywords, probe["phonemes"])
    cats = {k: confusable_categories(k) for k in keywords}
    accents = {k: accent_variants(k) for k in keywords}
    groups: List[Group] = []
    for split in splits:
        mix = asdict(train_mix) if split == "train" else {}
        groups += plan_split(split, *sizes.of(split), keywords, by_split[split], filt, cats,
                             seed, snr_db, other_share, other_kinds=other_kinds,
                             accents=accents, **mix)
    return Plan(groups, by_split, drop_for_keywords(groups, filt))


def check_other_kinds(kinds: Sequence[str]) -> Tuple[str, ...]:
    """The kinds in SPOKEN_KINDS order; SynthError for an unknown or missing one."""
    unknown = sorted(set(kinds) - set(SPOKEN_KINDS))
    if unknown or not kinds:
        raise SynthError(f"other-engine kinds {list(kinds)}: each must be one of "
                         f"{','.join(SPOKEN_KINDS)}, at least one")
    return tuple(k for k in SPOKEN_KINDS if k in kinds)


def summarize(out_dir: str, splits: Sequence[str] = SPLITS) -> dict:
    """Per split: utterance count, hours, speakers and hours per kind."""
    out = {}
    for split in splits:
        d = os.path.join(out_dir, split)
        dur = kaldi.read_table(os.path.join(d, "utt2dur"))
        kind = kaldi.read_table(os.path.join(d, "utt2kind"))
        per: Dict[str, float] = {}
        for u, s in dur.items():
            per[kind[u]] = per.get(kind[u], 0.0) + float(s) / 3600
        out[split] = {**data_dir_summary(d),
                      "hours_by_kind": {k: round(v, 3) for k, v in sorted(per.items())}}
    return out
