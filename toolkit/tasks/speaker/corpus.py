"""Synthetic speaker-verification corpus: TTS voices are the speakers.

Writes Kaldi data dirs ``{train,dev,test}`` (wav.scp, text, utt2spk, spk2utt, utt2dur,
spk2voice), the WAVs under ``wavs/<split>/``, and ``test/trials`` (Kaldi form: every pair
of test utterances, `enroll test target|nontarget`).

Speakers. espeak-ng's fixed voices (toolkit.tts.espeak: accents x variants) come in
families: the accents of one variant share its voice design (formants, pitch, voice
source), so a family is never split across train, dev and test; test and dev take whole
families, training the rest, one voice of each remaining family in turn. When the fixed
voices do not cover the sizes asked for, procedural espeak-ng voices (random variant
files) fill the gap, test first, then dev, then train; each is a family of its own. Other
engines speak only when named (``engines``), never because they are installed; flite's
voices are families of their own like the fixed ones, festival's go to test only (voices
of an engine never heard in training).

Each speaker has its own speaking rate, pitch and pitch range (drawn from a stream of its
own name, so a speaker sounds the same at any corpus size); each utterance varies them
around it, says 8-16 random English words, at its own level, between silences, in white,
pink, brown or babble noise at its own SNR.

Determinism: planned in the parent (every choice except noise waveforms), rendered in
fixed groups, each in a freshly forked child that loads the engines itself
(toolkit.tts.pool); group composition never depends on ``nj``, so the files are
byte-identical for any ``nj``. The parent never loads espeak-ng.
"""
import json
import logging
import os
import shutil
import tempfile
import time
import zlib
from dataclasses import asdict, dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from toolkit.data import kaldi
from toolkit.tts import SynthError, Voice
from toolkit.tts.engines import engine_class
from toolkit.tts.espeak import (ACCENTS, MAX_RANDOM_VOICES, Espeak, espeak_fingerprint,
                                espeak_paths, espeak_voices, loaded_in_this_process,
                                private_espeak_data, random_voices)
from toolkit.tts.pool import run_forked, single_thread_blas
from toolkit.tts.render import NOISE_TYPES, Renderer, place_in_noise
from toolkit.tts.text import random_words

logger = logging.getLogger(__name__)

FORMAT_VERSION = 1           # bump when the outputs change, so old stamps are stale
SPLITS = ("train", "dev", "test")
GROUP_SIZE = 32              # utterances per forked renderer; fixed => nj-independent
STAMP_NAME = ".synth_speaker_data.json"
TEST_ONLY_ENGINES = ("festival",)
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


@dataclass
class Group:
    split: str
    index: int
    seed: Tuple[int, ...]
    specs: List[UttSpec]
    babble: List[UttSpec] = field(default_factory=list)


def _rng(seed: int, *stream: int) -> np.random.Generator:
    return np.random.default_rng([int(seed), *stream])


def _name_stream(name: str) -> int:
    return zlib.crc32(name.encode("utf-8"))


# --------------------------------------------------------------------------------------
# Speakers
# --------------------------------------------------------------------------------------

def voice_family(voice: Voice) -> str:
    """espeak-ng fixed voices: their variant (en+f3 and en-us+f3 are one design in two
    accents); any other voice is a family of its own."""
    if voice.engine == "espeak" and not voice.variant:
        return "espeak+" + voice.name.split("+", 1)[1]
    return f"{voice.engine}:{voice.name}"


def assign_voices(voices: Sequence[Voice], sizes: Sizes, seed: int,
                  test_only: Sequence[Voice] = ()) -> Tuple[Dict[str, List[Voice]], Dict[str, int]]:
    """Voices of each split, families never shared, and how many speakers each split still
    lacks. `test_only` voices (festival) are test speakers first."""
    rng = _rng(seed, 0)
    families: Dict[str, List[Voice]] = {}
    for v in sorted(voices, key=lambda v: v.spk):
        families.setdefault(voice_family(v), []).append(v)
    keys = sorted(families)
    queue = [keys[i] for i in rng.permutation(len(keys))]
    members = {k: [families[k][i] for i in rng.permutation(len(families[k]))] for k in queue}
    out: Dict[str, List[Voice]] = {s: [] for s in SPLITS}
    out["test"] = sorted(test_only, key=lambda v: v.spk)[:sizes.test_speakers]
    for split in ("test", "dev"):
        while len(out[split]) < sizes.speakers(split) and queue:
            fam = members[queue.pop(0)]
            out[split] += fam[:sizes.speakers(split) - len(out[split])]
    # Training: one voice of every remaining family in turn, for the most voice designs.
    while len(out["train"]) < sizes.train_speakers and any(members[k] for k in queue):
        for k in queue:
            if members[k] and len(out["train"]) < sizes.train_speakers:
                out["train"].append(members[k].pop(0))
    missing = {s: sizes.speakers(s) - len(out[s]) for s in SPLITS}
    return out, missing


def speaker_profile(voice: Voice, seed: int) -> Speaker:
    """A voice's own rate, pitch and range, from a stream of its name."""
    rng = _rng(seed, 1, _name_stream(voice.spk))
    return Speaker(voice.spk, voice, int(rng.integers(BASE_RATE_WPM[0], BASE_RATE_WPM[1] + 1)),
                   int(rng.integers(BASE_PITCH[0], BASE_PITCH[1] + 1)),
                   int(rng.integers(BASE_RANGE[0], BASE_RANGE[1] + 1)))


def _clip(value: float, low: int, high: int) -> int:
    return int(min(max(round(value), low), high))


def plan_utterances(speaker: Speaker, count: int, seed: int, snr_db: Tuple[float, float]
                    ) -> List[UttSpec]:
    """`count` utterances of one speaker, from a stream of the speaker's name: the first
    n of them are the same whatever `count` is."""
    rng = _rng(seed, 2, _name_stream(speaker.spk))
    specs = []
    for u in range(count):
        rate = speaker.rate * (1 + float(rng.uniform(-RATE_SPREAD, RATE_SPREAD)))
        specs.append(UttSpec(
            utt=f"{speaker.spk}-{u:03d}", spk=speaker.spk,
            text=random_words(rng, *WORDS_PER_UTT), voice=speaker.voice,
            rate=_clip(rate, 80, 450),
            pitch=_clip(speaker.pitch + rng.uniform(-PITCH_SPREAD, PITCH_SPREAD), 0, 100),
            prange=_clip(speaker.prange + rng.uniform(-RANGE_SPREAD, RANGE_SPREAD), 0, 100),
            level_db=float(rng.uniform(*LEVEL_DBFS)),
            noise=NOISE_TYPES[int(rng.integers(len(NOISE_TYPES)))],
            snr_db=float(rng.uniform(*snr_db)),
            lead_s=float(rng.uniform(*SILENCE_S)), trail_s=float(rng.uniform(*SILENCE_S))))
    return specs


def plan_groups(split: str, speakers: Sequence[Speaker], utts: int, seed: int,
                snr_db: Tuple[float, float]) -> List[Group]:
    si = SPLITS.index(split)
    specs = [s for spk in sorted(speakers, key=lambda s: s.spk)
             for s in plan_utterances(spk, utts, seed, snr_db)]
    rng = _rng(seed, 3, si)
    groups = []
    for g, start in enumerate(range(0, len(specs), GROUP_SIZE)):
        babble = []
        for _ in range(BABBLE_POOL):
            talker = speakers[int(rng.integers(len(speakers)))]
            babble.append(UttSpec("babble", talker.spk, random_words(rng, 12, 20), talker.voice,
                                  talker.rate, talker.pitch, talker.prange))
        groups.append(Group(split, g, (int(seed), 4, si, g), specs[start:start + GROUP_SIZE],
                            babble))
    return groups


def plan_corpus(seed: int, sizes: Sizes, snr_db: Tuple[float, float], engines: Sequence[str],
                other_voices: Sequence[Voice], tmp_dir: str
                ) -> Tuple[List[Group], Dict[str, List[Speaker]], Optional[str]]:
    """Groups of every split, the speakers, and the private espeak-ng data dir of the
    procedural voices (None without them)."""
    fixed: List[Voice] = []
    accents: List[str] = []
    if "espeak" in engines:
        probe = run_forked(lambda _: _probe_fixed(espeak_voices()), [None], 1, tmp_dir)[0]
        fixed, accents = probe["voices"], probe["accents"]
        if not accents:
            raise SynthError(f"espeak-ng has none of the English voices {ACCENTS}")
    test_only = [v for v in other_voices if v.engine in TEST_ONLY_ENGINES]
    pool = fixed + [v for v in other_voices if v.engine not in TEST_ONLY_ENGINES]
    by_split, missing = assign_voices(pool, sizes, seed, test_only)
    need = sum(missing.values())
    espeak_data = None
    if need:
        have = len(pool) + len(test_only)
        if "espeak" not in engines:
            raise SynthError(f"{sum(sizes.speakers(s) for s in SPLITS)} speakers asked for, "
                             f"but {','.join(engines)} have {have} voices (add espeak to "
                             f"--engines for procedural voices)")
        if need > MAX_RANDOM_VOICES:
            raise SynthError(f"{sum(sizes.speakers(s) for s in SPLITS)} speakers asked for: "
                             f"the voices here cover at most {have + MAX_RANDOM_VOICES} "
                             f"({have} fixed and {MAX_RANDOM_VOICES} procedural)")
        procedural = random_voices(need, accents, seed)
        espeak_data = private_espeak_data(procedural, tmp_dir)
        run_forked(lambda _: _probe_procedural(procedural[:1] + procedural[-1:], espeak_data),
                   [None], 1, tmp_dir)
        start = 0
        for split in ("test", "dev", "train"):
            by_split[split] += procedural[start:start + missing[split]]
            start += missing[split]
    speakers = {s: [speaker_profile(v, seed) for v in sorted(by_split[s], key=lambda v: v.spk)]
                for s in SPLITS}
    for split in SPLITS:
        if sizes.speakers(split) and len(speakers[split]) < 2:
            raise SynthError(f"{split} needs at least 2 speakers, got {len(speakers[split])}")
    groups = [g for s in SPLITS for g in plan_groups(s, speakers[s], sizes.utts(s), seed, snr_db)]
    return groups, speakers, espeak_data


def _probe_fixed(voices: Sequence[Voice]) -> dict:
    """Child body: the fixed espeak-ng voices that exist here."""
    es = Espeak()
    return {"voices": [v for v in voices if es.set_voice(v.name)],
            "accents": [a for a in ACCENTS if es.set_voice(a)]}


def _probe_procedural(voices: Sequence[Voice], espeak_data: str) -> bool:
    """Child body: espeak-ng loads the procedural voices' variant files (it falls back to
    the plain accent, silently, when one is missing)."""
    es = Espeak(espeak_data)
    for v in voices:
        if not (es.set_voice(v.name)
                and es.current_identifier().endswith("+" + v.name.split("+")[1])):
            raise SynthError(f"espeak-ng ignored the procedural voice {v.name} "
                             f"(variant file not found in {espeak_data})")
    return True


# --------------------------------------------------------------------------------------
# Rendering (forked children)
# --------------------------------------------------------------------------------------

def _render_group(group: Group, out_dir: str, sr: int, espeak_data: Optional[str]
                  ) -> List[Tuple[str, int]]:
    """Child body: babble pool first, then every utterance; returns (utterance, samples)."""
    import soundfile as sf
    single_thread_blas()
    rng = np.random.default_rng(list(group.seed))
    wav_dir = os.path.join(out_dir, "wavs", group.split)
    out = []
    with tempfile.TemporaryDirectory(prefix="synth_") as tmp:
        tts = Renderer(sr, tmp, espeak_data)
        pool = [tts.speak(b.text, b.voice, b.rate, b.pitch, b.prange, int(rng.integers(2 ** 31)))
                for b in group.babble]
        for s in group.specs:
            speech = tts.speak(s.text, s.voice, s.rate, s.pitch, s.prange,
                               int(rng.integers(2 ** 31)))
            if len(speech) == 0:
                raise SynthError(f"{s.utt}: TTS produced no audio for {s.text!r}")
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
    from toolkit.tasks.speaker.data import make_trials
    order = sorted(range(len(keys)), key=lambda i: kaldi.c_order(keys[i]))
    keys = [keys[i] for i in order]
    speakers = [speakers[i] for i in order]
    n = len(keys)
    if n * (n - 1) // 2 <= MAX_TRIALS:
        rows = [f"{keys[a]} {keys[b]} {'target' if speakers[a] == speakers[b] else 'nontarget'}"
                for a in range(n) for b in range(a + 1, n)]
    else:
        enroll, test, labels = make_trials(keys, speakers, seed, MAX_TRIALS // 11, 10.0)
        rows = [f"{e} {t} {'target' if lab else 'nontarget'}"
                for e, t, lab in zip(enroll, test, labels)]
    from toolkit.fileio import atomic_write_text
    atomic_write_text(path, "".join(r + "\n" for r in rows))
    return len(rows)


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


def _stamp_config(seed: int, sizes: Sizes, sample_rate: int, snr_db, engines: Sequence[str],
                  other_voices: Sequence[Voice]) -> dict:
    voices: Dict[str, List[str]] = {}
    for v in other_voices:
        voices.setdefault(v.engine, []).append(v.name)
    return {"format": FORMAT_VERSION, "seed": int(seed), "sizes": asdict(sizes),
            "sample_rate": int(sample_rate), "snr_db": [float(snr_db[0]), float(snr_db[1])],
            "engines": list(engines), "engine_voices": voices, "espeak": espeak_fingerprint()}


def is_complete(out_dir: str, config: dict) -> bool:
    """Stamp matches `config` and every data file and listed WAV exists."""
    try:
        with open(os.path.join(out_dir, STAMP_NAME), encoding="utf-8") as f:
            if json.load(f) != config:
                return False
        if not os.path.exists(os.path.join(out_dir, "test", "trials")):
            return False
        for split in SPLITS:
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
    """Removes what this generator writes (and what later stages left in the split dirs)."""
    for name in (STAMP_NAME, "wavs", ".synth_tmp") + SPLITS:
        p = os.path.join(out_dir, name)
        if os.path.isdir(p) and not os.path.islink(p):
            shutil.rmtree(p)
        elif os.path.lexists(p):
            os.unlink(p)


def check_engines(engines: Sequence[str]) -> List[str]:
    """Engine names, espeak first then sorted; SynthError for an unknown, repeated or
    unavailable one, before any work. Only these are looked at."""
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


def generate_corpus(out_dir: str, seed: int = 777, sizes: Sizes = Sizes(), nj: int = 2,
                    sample_rate: int = 16000, snr_db: Tuple[float, float] = SNR_DB,
                    engines: Sequence[str] = ("espeak",)) -> dict:
    """Writes the corpus; returns the summary (`summarize`). Does nothing when `out_dir`
    already holds a complete corpus made with the same arguments."""
    if seed < 0:
        raise SynthError(f"seed must be >= 0, got {seed}")
    if nj < 1:
        raise SynthError(f"nj must be >= 1, got {nj}")
    if sample_rate < 8000:
        raise SynthError(f"sample rate {sample_rate} too low (need >= 8000)")
    if snr_db[0] > snr_db[1]:
        raise SynthError(f"bad SNR range {snr_db}: min > max")
    for split in SPLITS:
        if sizes.speakers(split) < 2 or sizes.utts(split) < 2:
            raise SynthError(f"{split} needs at least 2 speakers of at least 2 utterances "
                             f"(trials need same- and different-speaker pairs), got "
                             f"{sizes.speakers(split)} x {sizes.utts(split)}")
        if sizes.utts(split) > 1000:
            raise SynthError(f"{split}: at most 1000 utterances per speaker")
    engines = check_engines(engines)
    if "espeak" in engines:
        espeak_paths()
    if loaded_in_this_process():
        logger.warning("espeak-ng was loaded in this process: output may not be reproducible")
    other_voices = [v for e in engines if e != "espeak" for v in engine_class(e).voices()]
    config = _stamp_config(seed, sizes, sample_rate, snr_db, engines, other_voices)
    if is_complete(out_dir, config):
        logger.info("%s is complete for these arguments; nothing to do", out_dir)
        return summarize(out_dir)

    t0 = time.time()
    _clean_outputs(out_dir)
    tmp_dir = os.path.join(out_dir, ".synth_tmp")
    os.makedirs(tmp_dir)
    try:
        groups, speakers, espeak_data = plan_corpus(seed, sizes, snr_db, engines, other_voices,
                                                    tmp_dir)
        logger.info("planned %d utterances of %s speakers in %d groups; rendering with nj=%d",
                    sum(len(g.specs) for g in groups),
                    "/".join(str(len(speakers[s])) for s in SPLITS), len(groups), nj)
        step = max(1, len(groups) // 10)

        def progress(done, total):
            if done % step == 0 or done == total:
                logger.info("rendered %d/%d groups (%.1f s)", done, total, time.time() - t0)

        out_abs = os.path.abspath(out_dir)
        for split in SPLITS:
            os.makedirs(os.path.join(out_abs, "wavs", split))
        results = run_forked(lambda g: _render_group(g, out_abs, sample_rate, espeak_data),
                             groups, nj, tmp_dir, progress)
    finally:
        shutil.rmtree(tmp_dir, ignore_errors=True)
    lengths = {utt: n for res in results for utt, n in res}
    for split in SPLITS:
        specs = [s for g in groups if g.split == split for s in g.specs]
        write_split(out_dir, split, specs, speakers[split], lengths, sample_rate)
    test = [s for g in groups if g.split == "test" for s in g.specs]
    write_trials(os.path.join(out_dir, "test", "trials"), [s.utt for s in test],
                 [s.spk for s in test], seed)
    with open(os.path.join(out_dir, STAMP_NAME), "w", encoding="utf-8") as f:
        json.dump(config, f, indent=1, sort_keys=True)     # written last: marks completion
    logger.info("wrote %s in %.1f s", out_dir, time.time() - t0)
    return summarize(out_dir)


def summarize(out_dir: str) -> dict:
    """Per split: speakers, utterances and hours; the test trial counts."""
    out = {}
    for split in SPLITS:
        d = os.path.join(out_dir, split)
        dur = kaldi.read_table(os.path.join(d, "utt2dur"))
        spk = kaldi.read_table(os.path.join(d, "utt2spk"))
        out[split] = {"speakers": len(set(spk.values())), "utts": len(dur),
                      "hours": sum(float(v) for v in dur.values()) / 3600}
    with open(os.path.join(out_dir, "test", "trials"), encoding="utf-8") as f:
        labels = [line.split()[2] for line in f if line.strip()]
    out["trials"] = {"trials": len(labels), "targets": labels.count("target")}
    return out
