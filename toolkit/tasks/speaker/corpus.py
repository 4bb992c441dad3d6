"""Synthetic speaker-verification corpus: TTS voices are the speakers.

Writes Kaldi data dirs ``{train,dev,test}`` (wav.scp, text, utt2spk, spk2utt, utt2dur,
spk2voice), the WAVs under ``wavs/<split>/``, ``test/trials`` (Kaldi form: every pair of
test utterances, `enroll test target|nontarget`) and the voice inventory ``voices.tsv``.
This module is the corpus design (speakers, their prosody, utterances, trials); engines
and voices are toolkit.voicebank.corpus, the forked rendering, the stamp and the output
dir toolkit.voicebank.corpus_dir.

Speakers. espeak-ng's fixed voices (toolkit.voicebank.espeak: accents x variants) come in
families: the accents of one variant share its voice design (formants, pitch, voice
source), so a family is never split across train, dev and test (split_by_family). When the
fixed voices do not cover the espeak-ng sizes asked for, procedural espeak-ng voices
(random variant files) fill the gap, test first, then dev, then train; each is a family of
its own. The sizes count espeak-ng's speakers: the other engines speak only when named
(``engines``), with every voice they have besides those reserved, each voice a speaker;
an engine's held-out voices (ENGINE_SPLIT) follow from the seed and that engine's own
voice list alone, so that they are the same whatever else a corpus names. ``blends``
adds that many blended voices of each named engine that mixes voices (Kokoro), each a
speaker: the voices they are made of then all train, the blends themselves are shared
out by BLEND_SPLIT (toolkit.voicebank.corpus.split_with_blends).

Reserved voices (festival's, seven of Kokoro's: toolkit.voicebank.is_reserved) speak only in a
test-only corpus (``test_only``): its test split is the held-out test speakers of the
full corpus of the same seed and engines, plus every reserved voice; an engine with
reserved voices is heard there through those alone (Engines.outside_test).

Each speaker has its own speaking rate, pitch and pitch range (drawn from a stream of its
own name, so a speaker sounds the same at any corpus size); each utterance varies them
around it, says 8-16 random English words, at its own level, between silences, in white,
pink, brown or babble noise at its own SNR. A slow engine (Kokoro: about a CPU-second per
short clip, where espeak-ng takes a millisecond) can be given fewer training utterances
and fewer words per utterance (``engine_sizing``). Babble is spoken by the split's
espeak-ng voices when it has any, so that its cost does not grow with the other engines.

Trials: ``test/trials`` holds every pair of test utterances (cross-engine pairs among
them), and when the test split has speakers of more than one engine, ``test/trials_<engine>``
the pairs within each engine that has two speakers or more there (in a test-only corpus
of Kokoro, its reserved voices alone).
"""
import logging
import os
import time
from dataclasses import asdict, dataclass
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from toolkit.data import kaldi
from toolkit.fileio import atomic_write_text
from toolkit.voicebank import SynthError, Voice, seeded_rng
from toolkit.voicebank.corpus import (SPLITS, Engines, corpus_stamp, engine_blends,
                                      espeak_voices_here, name_stream, open_engines,
                                      split_by_family, split_by_stratum, split_with_blends)
from toolkit.voicebank.corpus_dir import CorpusDir, Group, data_dir_summary
from toolkit.voicebank.espeak import (ACCENTS, MAX_RANDOM_VOICES, espeak_voices,
                                      private_espeak_data, random_voices)
from toolkit.voicebank.render import Renderer, place_in_noise
from toolkit.voicebank.signal import NOISE_TYPES
from toolkit.voicebank.text import random_words

logger = logging.getLogger(__name__)

FORMAT_VERSION = 3           # bump when the outputs change, so old stamps are stale
                             # (2: the stamp and voices.tsv of toolkit.voicebank.corpus;
                             # 3: engines besides espeak-ng on top of its sizes, split
                             # per engine; blends; espeak-ng babble; trials per engine)
GROUP_SIZE = 32              # utterances per forked renderer; fixed => nj-independent
STAMP_NAME = ".synth_speaker_data.json"
# Every test pair is a trial up to this many; above, all targets (up to the same cap) and
# ten times as many sampled nontargets.
MAX_TRIALS = 500_000

# A speaker's own centre of each prosodic parameter, then each utterance's spread around it.
BASE_RATE_WPM = (140, 200)   # espeak's default is 175
RATE_SPREAD = 0.12           # +-12 % per utterance
BASE_PITCH = (30, 70)        # espeak 0-100, 50 the voice's own
PITCH_SPREAD = 6
BASE_RANGE = (30, 70)
RANGE_SPREAD = 10
WORDS_PER_UTT = (8, 16)      # about 3-6 s at those rates
LEVEL_DBFS = (-32.0, -14.0)  # active-speech level
SILENCE_S = (0.1, 0.5)       # leading and trailing, filled with the same noise
SNR_DB = (10.0, 30.0)
BABBLE_POOL = 4              # babble sentences per group, by voices of the same split
# Held-out voices of each engine besides espeak-ng (at least one test voice of two, one
# dev voice of three), and of the blends: blends are many, and a slow engine's.
ENGINE_SPLIT = {"dev": 0.1, "test": 0.2}
BLEND_SPLIT = {"dev": 0.05, "test": 0.05}
ENGINE_STREAM = 5            # seeded_rng stream of the engines' held-out voices


@dataclass(frozen=True)
class Sizes:
    train_speakers: int = 300
    dev_speakers: int = 24
    test_speakers: int = 40
    train_utts: int = 12     # per speaker
    dev_utts: int = 6
    test_utts: int = 10

    def speakers(self, split: str) -> int:
        return getattr(self, f"{split}_speakers")

    def utts(self, split: str) -> int:
        return getattr(self, f"{split}_utts")


@dataclass(frozen=True)
class EngineSizing:
    """One engine's own sizes, where they differ from the corpus's: utterances per
    training speaker, and the (fewest, most) words of an utterance in every split."""
    train_utts: Optional[int] = None
    words: Optional[Tuple[int, int]] = None


def check_engine_sizing(sizing: Mapping[str, EngineSizing], engines: Sequence[str]) -> None:
    """SynthError for sizing of an engine the corpus does not name, or bad values."""
    for name, own in sorted(sizing.items()):
        if name not in engines:
            raise SynthError(f"sizes given for the engine {name!r}, which --engines does not "
                             f"name ({','.join(engines)})")
        if own.train_utts is not None and not 2 <= own.train_utts <= 1000:
            raise SynthError(f"{name}: training utterances per speaker must be 2-1000, got "
                             f"{own.train_utts}")
        if own.words is not None and not 1 <= own.words[0] <= own.words[1] <= 100:
            raise SynthError(f"{name}: words per utterance must be a range 1 <= low <= high "
                             f"<= 100, got {own.words[0]}-{own.words[1]}")


@dataclass
class Speaker:
    spk: str
    voice: Voice
    rate: int
    pitch: int
    prange: int


@dataclass
class UttSpec:
    utt: str
    spk: str
    text: str
    voice: Voice
    rate: int
    pitch: int
    prange: int
    level_db: float = -20.0
    noise: str = "white"
    snr_db: float = 20.0
    lead_s: float = 0.3
    trail_s: float = 0.3


# --------------------------------------------------------------------------------------
# Speakers
# --------------------------------------------------------------------------------------

def assign_voices(voices: Sequence[Voice], sizes: Sizes, seed: int
                  ) -> Tuple[Dict[str, List[Voice]], Dict[str, int]]:
    """espeak-ng's voices of each split by family (toolkit.voicebank.corpus.split_by_family),
    and how many speakers each split still lacks."""
    return split_by_family(voices, {s: sizes.speakers(s) for s in SPLITS}, seed)


def split_engine_voices(voices: Sequence[Voice], seed: int) -> Dict[str, List[Voice]]:
    """The voices of the engines besides espeak-ng per split: each engine gives test and
    dev their ENGINE_SPLIT fractions (one test voice of two or more, one dev voice of
    three or more), drawn from a stream of the seed and the engine's name over its own
    voices alone, so that its held-out voices do not depend on the other engines named."""
    return split_by_stratum(voices, seed, ENGINE_SPLIT, stratum=lambda v: v.engine,
                            own_streams=ENGINE_STREAM)


def speaker_profile(voice: Voice, seed: int) -> Speaker:
    """A voice's own rate, pitch and range, from a stream of its name."""
    rng = seeded_rng(seed, 1, name_stream(voice.spk))
    return Speaker(voice.spk, voice, int(rng.integers(BASE_RATE_WPM[0], BASE_RATE_WPM[1] + 1)),
                   int(rng.integers(BASE_PITCH[0], BASE_PITCH[1] + 1)),
                   int(rng.integers(BASE_RANGE[0], BASE_RANGE[1] + 1)))


def _clip(value: float, low: int, high: int) -> int:
    return int(min(max(round(value), low), high))


def plan_utterances(speaker: Speaker, count: int, seed: int, snr_db: Tuple[float, float],
                    words: Tuple[int, int] = WORDS_PER_UTT) -> List[UttSpec]:
    """`count` utterances of one speaker, from a stream of the speaker's name: the first
    n of them are the same whatever `count` is."""
    rng = seeded_rng(seed, 2, name_stream(speaker.spk))
    specs = []
    for u in range(count):
        rate = speaker.rate * (1 + float(rng.uniform(-RATE_SPREAD, RATE_SPREAD)))
        specs.append(UttSpec(
            utt=f"{speaker.spk}-{u:03d}", spk=speaker.spk,
            text=random_words(rng, *words), voice=speaker.voice,
            rate=_clip(rate, 80, 450),
            pitch=_clip(speaker.pitch + rng.uniform(-PITCH_SPREAD, PITCH_SPREAD), 0, 100),
            prange=_clip(speaker.prange + rng.uniform(-RANGE_SPREAD, RANGE_SPREAD), 0, 100),
            level_db=float(rng.uniform(*LEVEL_DBFS)),
            noise=NOISE_TYPES[int(rng.integers(len(NOISE_TYPES)))],
            snr_db=float(rng.uniform(*snr_db)),
            lead_s=float(rng.uniform(*SILENCE_S)), trail_s=float(rng.uniform(*SILENCE_S))))
    return specs


def plan_groups(split: str, speakers: Sequence[Speaker], utts: int, seed: int,
                snr_db: Tuple[float, float],
                engine_sizing: Mapping[str, EngineSizing] = {}) -> List[Group]:
    si = SPLITS.index(split)
    specs = []
    for spk in sorted(speakers, key=lambda s: s.spk):
        own = engine_sizing.get(spk.voice.engine, EngineSizing())
        count = own.train_utts if split == "train" and own.train_utts else utts
        specs += plan_utterances(spk, count, seed, snr_db, own.words or WORDS_PER_UTT)
    # Babble is noise: espeak-ng speaks it when the split has its voices (~1 ms a
    # sentence, where a neural engine takes a second).
    talkers = [s for s in speakers if s.voice.engine == "espeak"] or list(speakers)
    rng = seeded_rng(seed, 3, si)
    groups = []
    for g, start in enumerate(range(0, len(specs), GROUP_SIZE)):
        babble = []
        for _ in range(BABBLE_POOL):
            talker = talkers[int(rng.integers(len(talkers)))]
            babble.append(UttSpec("babble", talker.spk, random_words(rng, 12, 20), talker.voice,
                                  talker.rate, talker.pitch, talker.prange))
        groups.append(Group(split, g, (int(seed), 4, si, g), specs[start:start + GROUP_SIZE],
                            babble))
    return groups


def plan_corpus(seed: int, sizes: Sizes, snr_db: Tuple[float, float], engines: Engines,
                tmp_dir: str, splits: Sequence[str] = SPLITS, blends: int = 0,
                engine_sizing: Mapping[str, EngineSizing] = {}
                ) -> Tuple[List[Group], Dict[str, List[Speaker]], Optional[str]]:
    """Groups of `splits`, the speakers of every split, and the private espeak-ng data
    dir of the procedural voices (None without them)."""
    fixed: List[Voice] = []
    accents: List[str] = []
    if "espeak" in engines.names:
        fixed, accents = espeak_voices_here(espeak_voices(), tmp_dir)
        if not accents:
            raise SynthError(f"espeak-ng has none of the English voices {ACCENTS}")
    free, reserved = engines.usable(fixed + list(engines.voices))
    espeak_sizes = sizes if "espeak" in engines.names else Sizes(0, 0, 0, 0, 0, 0)
    by_split, missing = assign_voices([v for v in free if v.engine == "espeak"],
                                      espeak_sizes, seed)
    # Procedural voices go to test first, so a test-only corpus needs only test's share.
    need = sum(missing[s] for s in splits)
    espeak_data = None
    if need:
        if need > MAX_RANDOM_VOICES:
            asked = sum(sizes.speakers(s) for s in splits)
            have = len(fixed)
            raise SynthError(f"{asked} espeak-ng speakers asked for: the voices here cover at "
                             f"most {have + MAX_RANDOM_VOICES} ({have} fixed and "
                             f"{MAX_RANDOM_VOICES} procedural)")
        procedural = random_voices(need, accents, seed)
        espeak_data = private_espeak_data(procedural, tmp_dir)
        # the first and last variant file: espeak-ng's voice list is filled in order
        espeak_voices_here(procedural[:1] + procedural[-1:], tmp_dir, espeak_data)
        start = 0
        for split in ("test", "dev", "train"):
            if split in splits:
                by_split[split] += procedural[start:start + missing[split]]
                start += missing[split]
    others = split_with_blends([v for v in free if v.engine != "espeak"],
                               engine_blends(engines.names, blends, seed), seed, BLEND_SPLIT,
                               lambda vs: split_engine_voices(vs, seed))
    for split in SPLITS:
        by_split[split] = list(by_split[split]) + others[split]
    if engines.test_only:
        by_split["test"] = Engines.outside_test(by_split["test"], reserved)
    speakers = {s: [speaker_profile(v, seed) for v in sorted(by_split[s], key=lambda v: v.spk)]
                for s in splits}
    for split in splits:
        if len(speakers[split]) < 2:
            raise SynthError(f"{split} needs at least 2 speakers, got {len(speakers[split])}")
    groups = [g for s in splits for g in plan_groups(s, speakers[s], sizes.utts(s), seed,
                                                     snr_db, engine_sizing)]
    return groups, speakers, espeak_data


# --------------------------------------------------------------------------------------
# Rendering (forked children)
# --------------------------------------------------------------------------------------

def _render_group(group: Group, tts: Renderer, rng: np.random.Generator, wav_dir: str
                  ) -> List[Tuple[str, int]]:
    """Child body: babble pool first, then every utterance; returns (utterance, samples)."""
    import soundfile as sf
    sr = tts.sample_rate
    pool = [tts.clip(b.text, b.voice, b.rate, b.pitch, b.prange, int(rng.integers(2 ** 31))).audio
            for b in group.babble]
    out = []
    for s in group.specs:
        speech = tts.utterance(s.utt, s.text, s.voice, s.rate, s.pitch, s.prange,
                               int(rng.integers(2 ** 31))).audio
        audio = place_in_noise(speech, rng, sr, s.level_db, s.noise, s.snr_db, s.lead_s,
                               s.trail_s, pool)
        sf.write(os.path.join(wav_dir, s.utt + ".wav"), audio, sr, subtype="PCM_16")
        out.append((s.utt, len(audio)))
    return out


# --------------------------------------------------------------------------------------
# Output
# --------------------------------------------------------------------------------------

DATA_FILES = ("wav.scp", "text", "utt2spk", "spk2utt", "utt2dur", "spk2voice")


def write_trials(path: str, keys: Sequence[str], speakers: Sequence[str], seed: int) -> int:
    """Every pair of `keys` (C order) as a Kaldi trial, or a sample above MAX_TRIALS."""
    order = sorted(range(len(keys)), key=lambda i: kaldi.c_order(keys[i]))
    keys = [keys[i] for i in order]
    speakers = [speakers[i] for i in order]
    n = len(keys)
    if n * (n - 1) // 2 <= MAX_TRIALS:
        rows = [f"{keys[a]} {keys[b]} {'target' if speakers[a] == speakers[b] else 'nontarget'}"
                for a in range(n) for b in range(a + 1, n)]
    else:
        from toolkit.tasks.speaker.data import make_trials   # imports torch: only when needed
        enroll, test, labels = make_trials(keys, speakers, seed, MAX_TRIALS // 11, 10.0)
        rows = [f"{e} {t} {'target' if lab else 'nontarget'}"
                for e, t, lab in zip(enroll, test, labels)]
    atomic_write_text(path, "".join(r + "\n" for r in rows))
    return len(rows)


def write_test_trials(test_dir: str, specs: Sequence[UttSpec], seed: int) -> List[str]:
    """`trials` (every pair), and `trials_<engine>` for each engine with two speakers or
    more when the test split hears more than one engine; returns the names written."""
    write_trials(os.path.join(test_dir, "trials"), [s.utt for s in specs],
                 [s.spk for s in specs], seed)
    names = ["trials"]
    engines = sorted({s.voice.engine for s in specs})
    for engine in engines if len(engines) > 1 else ():
        own = [s for s in specs if s.voice.engine == engine]
        if len({s.spk for s in own}) >= 2:
            write_trials(os.path.join(test_dir, f"trials_{engine}"), [s.utt for s in own],
                         [s.spk for s in own], seed)
            names.append(f"trials_{engine}")
    return names


def write_split(out_dir: str, split: str, specs: Sequence[UttSpec], speakers: Sequence[Speaker],
                lengths: Dict[str, int], sr: int) -> None:
    wav_dir = os.path.abspath(os.path.join(out_dir, "wavs", split))
    kaldi.write_data_dir(os.path.join(out_dir, split), {
        "wav.scp": {s.utt: os.path.join(wav_dir, s.utt + ".wav") for s in specs},
        "text": {s.utt: s.text for s in specs},
        "utt2dur": {s.utt: f"{lengths[s.utt] / sr:.3f}" for s in specs},
        "utt2spk": {s.utt: s.spk for s in specs},          # spk2utt follows from it
        "spk2voice": {p.spk: f"{p.voice.engine} {p.voice.name} rate={p.rate} pitch={p.pitch} "
                             f"range={p.prange}" for p in speakers},
    })


def corpus_dir(out_dir: str) -> CorpusDir:
    return CorpusDir(out_dir, STAMP_NAME, SPLITS)


def generate_corpus(out_dir: str, seed: int = 777, sizes: Sizes = Sizes(), nj: int = 2,
                    sample_rate: int = 16000, snr_db: Tuple[float, float] = SNR_DB,
                    engines: Sequence[str] = ("espeak",), test_only: bool = False,
                    blends: int = 0, engine_sizing: Mapping[str, EngineSizing] = {}) -> dict:
    """Writes the corpus; returns the summary (`summarize`). Does nothing when `out_dir`
    already holds a complete corpus made with the same arguments. `sizes` count espeak-ng's
    speakers; the other `engines` add their voices, `blends` blended voices of each engine
    that mixes them (Kokoro). `engine_sizing`: an engine's own training utterances per
    speaker and words per utterance. `test_only` writes the test split alone (and its
    trials): the test speakers the full corpus of this seed holds out, plus every reserved
    voice of `engines` (see the module docstring)."""
    splits = ("test",) if test_only else SPLITS
    if seed < 0:
        raise SynthError(f"seed must be >= 0, got {seed}")
    if nj < 1:
        raise SynthError(f"nj must be >= 1, got {nj}")
    if sample_rate < 8000:
        raise SynthError(f"sample rate {sample_rate} too low (need >= 8000)")
    if snr_db[0] > snr_db[1]:
        raise SynthError(f"bad SNR range {snr_db}: min > max")
    if blends < 0:
        raise SynthError(f"blends must be >= 0, got {blends}")
    for split in splits:
        if sizes.speakers(split) < 2 or sizes.utts(split) < 2:
            raise SynthError(f"{split} needs at least 2 speakers of at least 2 utterances "
                             f"(trials need same- and different-speaker pairs), got "
                             f"{sizes.speakers(split)} x {sizes.utts(split)}")
        if sizes.utts(split) > 1000:
            raise SynthError(f"{split}: at most 1000 utterances per speaker")
    named = open_engines(engines, test_only)
    check_engine_sizing(engine_sizing, named.names)
    settings = {"seed": int(seed), "sizes": asdict(sizes), "sample_rate": int(sample_rate),
                "snr_db": [float(snr_db[0]), float(snr_db[1])], "blends": int(blends),
                "engine_sizing": {name: asdict(own) for name, own in sorted(engine_sizing.items())}}
    config = corpus_stamp(FORMAT_VERSION, settings, named)
    out = corpus_dir(out_dir)
    required = {s: DATA_FILES + (("trials",) if s == "test" else ()) for s in splits}
    if out.is_complete(config, required):
        logger.info("%s is complete for these arguments; nothing to do", out_dir)
        return summarize(out_dir, splits)

    t0 = time.time()
    with out.workspace(config) as tmp_dir:
        groups, speakers, espeak_data = plan_corpus(seed, sizes, snr_db, named, tmp_dir, splits,
                                                    blends, engine_sizing)
        planned = [s for g in groups for s in g.specs]
        per_engine = {e: sum(s.voice.engine == e for s in planned) for e in named.names}
        logger.info("planned %d utterances (%s) of %s speakers in %d groups; rendering with "
                    "nj=%d", len(planned), ", ".join(f"{e} {n}" for e, n in per_engine.items()),
                    "/".join(str(len(speakers[s])) for s in splits), len(groups), nj)
        results = out.render(groups, lambda g, tts, rng: _render_group(
            g, tts, rng, out.wav_dir(g.split)), nj, tmp_dir, sample_rate, splits, espeak_data)
    lengths = {utt: n for res in results for utt, n in res}
    for split in splits:
        specs = [s for g in groups if g.split == split for s in g.specs]
        write_split(out_dir, split, specs, speakers[split], lengths, sample_rate)
    write_test_trials(os.path.join(out_dir, "test"),
                      [s for g in groups if g.split == "test" for s in g.specs], seed)
    out.write_inventory({s: [p.voice for p in speakers[s]] for s in splits},
                        {p.spk for s in splits for p in speakers[s]}, config["engine_versions"])
    out.write_stamp(config)
    logger.info("wrote %s in %.1f s", out_dir, time.time() - t0)
    return summarize(out_dir, splits)


def summarize(out_dir: str, splits: Sequence[str] = SPLITS) -> dict:
    """Per split: speakers, utterances and hours; the counts of each test trial list
    (`trials` under "trials", `trials_<engine>` under "trials_<engine>")."""
    out = {split: data_dir_summary(os.path.join(out_dir, split)) for split in splits}
    test_dir = os.path.join(out_dir, "test")
    for name in sorted(os.listdir(test_dir)):
        if name == "trials" or name.startswith("trials_"):
            with open(os.path.join(test_dir, name), encoding="utf-8") as f:
                labels = [line.split()[2] for line in f if line.strip()]
            out[name] = {"trials": len(labels), "targets": labels.count("target")}
    return out
