"""What every synthetic TTS corpus shares, so that a generator (toolkit.tasks.<family>.corpus)
keeps only its design (texts, kinds, sizes, planning) and engines, voices and output
directories behave alike in every family.

Engines. Only the engines a corpus names speak (`open_engines`: one wording of every
engine error for every generator); what else happens to be installed is never looked at,
so it cannot change a corpus. An engine named but missing is an error before any work.
espeak-ng's voices follow from toolkit.voicebank.espeak; the other engines list theirs.

Reserved voices. A voice kept for evaluation (`reserved_for_evaluation`) never speaks in
train or dev: only in a test-only corpus, whose test split is the test voices the full
corpus of the same seed holds out plus every reserved voice of the named engines. A full
corpus that names an engine with nothing but reserved voices is refused. A test-only
corpus hears an engine that reserves voices (Kokoro) through those alone.

Voice splits. Train, dev and test never share a voice. Two rules: `split_by_stratum` (each
espeak-ng accent and each other engine is shared out by fixed fractions, so every split
hears every accent) and `split_by_family` (a voice design goes to one split with all its
accents, test and dev first, so that they hold designs training never heard).

The rendering of planned groups and the output directory (its stamp, claim, cleaning and
voice inventory) are toolkit.voicebank.corpus_dir.
"""
import functools
import importlib.metadata
import logging
import re
import subprocess
import zlib
from dataclasses import dataclass
from typing import Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from toolkit.voicebank import RESERVED_ENGINES, SynthError, Voice, is_reserved, seeded_rng
from toolkit.voicebank.engines import ENGINES, Engine, engine_class
from toolkit.voicebank.espeak import ACCENTS, Espeak, espeak_fingerprint, loaded_in_this_process
from toolkit.voicebank.pool import run_forked

logger = logging.getLogger(__name__)

SPLITS = ("train", "dev", "test")
# Planned share of the utterances of the engines named besides espeak-ng, shared alike:
# they have a handful of voices each against espeak-ng's hundreds.
OTHER_ENGINES_SHARE = 0.2
# Engines no training set hears, so that a test on them measures unseen-engine speech.
TEST_ONLY_ENGINES = tuple(sorted(RESERVED_ENGINES))


# --------------------------------------------------------------------------------------
# Command-line options every generator shares
# --------------------------------------------------------------------------------------

def add_voice_bank_arguments(parser, *, engines_note: str, blends_note: str,
                             test_only_note: str, other_share: bool = True) -> None:
    """--engines, --other-share, --blends and --test-only, worded alike in every generator;
    each note says what the option means for that generator's corpus design."""
    reserved = ",".join(TEST_ONLY_ENGINES)
    parser.add_argument(
        "--engines", default="espeak", metavar="LIST",
        help=f"comma-separated TTS engines that speak, of {','.join(ENGINES.names())}; "
             f"{engines_note}; one asked for but not installed is an error; {reserved} "
             "(reserved for evaluation) only with --test-only (default %(default)s)")
    if other_share:
        parser.add_argument(
            "--other-share", type=float, default=OTHER_ENGINES_SHARE, metavar="F",
            help="fraction of the utterances spoken by the engines besides espeak-ng, "
                 "shared alike among them (default %(default)s)")
    parser.add_argument(
        "--blends", type=int, default=0, metavar="N",
        help="N blended voices of each named engine whose voices mix (kokoro): the voices "
             f"they are made of then all train; {blends_note} (default %(default)s)")
    parser.add_argument(
        "--test-only", action="store_true",
        help=f"write <out-dir>/test alone{test_only_note}: an evaluation set from --engines "
             "on the test voices the full corpus of this --seed holds out plus every voice "
             f"reserved for evaluation (all of {reserved}'s, refused without this; Kokoro's "
             "seven reserved voices, and through those alone Kokoro is heard there). Use its "
             "own --out-dir")


# --------------------------------------------------------------------------------------
# Engines and reserved voices
# --------------------------------------------------------------------------------------

def reserved_for_evaluation(voice: Voice) -> bool:
    """True for a voice kept for evaluation: it never speaks in train or dev (nor in any
    blend), only in test-only corpora. Decided by toolkit.voicebank.is_reserved (festival, seven
    Kokoro voices, and any blend with one of those in it)."""
    return is_reserved(voice)


def check_engines(engines: Sequence[str]) -> List[str]:
    """The engine names, espeak first then sorted (the stamp's form); SynthError before any
    work for an empty, repeated, unknown or unavailable one. Only these are looked at."""
    names = [str(e).strip() for e in engines]
    if not names or "" in names:
        raise SynthError(f"--engines needs engine names, e.g. espeak or espeak,kokoro; got "
                         f"{','.join(names)!r}")
    if len(set(names)) != len(names):
        raise SynthError(f"engine named twice in --engines: {','.join(names)}")
    classes = [engine_class(name) for name in names]     # unknown names first
    for name, cls in zip(names, classes):
        reason = cls.unavailable_reason()
        if reason:
            raise SynthError(f"{name} was asked for (--engines) but {reason}")
    return sorted(names, key=lambda n: (n != "espeak", n))


def engine_shares(engines: Sequence[str], other_share: float = OTHER_ENGINES_SHARE
                  ) -> Dict[str, float]:
    """Planned fraction of the utterances per engine: `other_share` to the engines other
    than espeak-ng when it is among them (all of it otherwise), shared alike."""
    others = [e for e in engines if e != "espeak"]
    if "espeak" not in engines:
        return {e: 1.0 / len(others) for e in others}
    if not others:
        return {"espeak": 1.0}
    return {"espeak": 1.0 - other_share, **{e: other_share / len(others) for e in others}}


@dataclass(frozen=True)
class Engines:
    """The engines a corpus speaks with, checked, and the voices they list."""
    names: Tuple[str, ...]            # espeak first, then sorted
    voices: Tuple[Voice, ...]         # of the named engines other than espeak-ng
    test_only: bool

    def usable(self, voices: Iterable[Voice]) -> Tuple[List[Voice], List[Voice]]:
        """(voices for every split, reserved voices): the reserved ones are [] unless the
        corpus is test-only."""
        voices = list(voices)
        free = [v for v in voices if not reserved_for_evaluation(v)]
        kept = [v for v in voices if reserved_for_evaluation(v)] if self.test_only else []
        return free, kept

    @staticmethod
    def outside_test(test: Sequence[Voice], reserved: Sequence[Voice]) -> List[Voice]:
        """The test voices of a test-only corpus: the reserved voices, and the held-out
        `test` voices of the engines that reserve none (espeak-ng, pico, ...): an engine with
        reserved voices (Kokoro) is heard through those alone."""
        reserving = {v.engine for v in reserved}
        return [v for v in test if v.engine not in reserving] + list(reserved)


def open_engines(engines: Sequence[str], test_only: bool = False,
                 needs_espeak: bool = False) -> Engines:
    """Checks the named engines (check_engines), and espeak-ng too when the corpus needs
    it whatever speaks (`needs_espeak`); lists the other engines' voices; refuses a full
    corpus that names an engine whose voices are all reserved for evaluation."""
    names = check_engines(engines)
    if needs_espeak and "espeak" not in names:
        reason = engine_class("espeak").unavailable_reason()
        if reason:
            raise SynthError(f"espeak-ng is needed whatever speaks, but {reason}")
    if (needs_espeak or "espeak" in names) and loaded_in_this_process():
        logger.warning("espeak-ng was loaded in this process: output may not be reproducible")
    voices = [v for name in names if name != "espeak" for v in engine_class(name).voices()]
    if not test_only:
        for name in names:
            own = [v for v in voices if v.engine == name]
            if own and all(reserved_for_evaluation(v) for v in own):
                raise SynthError(
                    f"{name} is reserved for the unseen-engine test: its voices never speak in "
                    f"train or dev. Write its evaluation set alone with --test-only (and an "
                    f"--out-dir of its own)")
    return Engines(tuple(names), tuple(voices), bool(test_only))


def engine_blends(names: Sequence[str], n: int, seed: int) -> List[Voice]:
    """`n` blended voices of each named engine whose voices mix (Kokoro's style vectors),
    a pure function of the arguments; SynthError when `n` > 0 and none of them can."""
    if n <= 0:
        return []
    able = [name for name in names if name != "espeak" and
            engine_class(name).blends.__func__ is not Engine.blends.__func__]
    if not able:
        raise SynthError(f"{n} blended voices asked for, but none of the engines "
                         f"{','.join(names)} mixes voices (kokoro does)")
    return [v for name in able for v in engine_class(name).blends(n, seed)]


def split_with_blends(voices: Sequence[Voice], blends: Sequence[Voice], seed: int,
                      held_out: Mapping[str, float],
                      split: Callable[[Sequence[Voice]], Dict[str, List[Voice]]]
                      ) -> Dict[str, List[Voice]]:
    """`split(voices)`, except that the voices blends are made of all train (a held-out
    voice inside a training blend would not be unheard), and the blends, voices of their
    own, are shared out by the `held_out` fractions (split_by_stratum); then every list is
    sorted by speaker. Without blends, `split(voices)` as it comes."""
    if not blends:
        return split(voices)
    blended = {(b.engine, name) for b in blends for name in b.components}
    bases = [v for v in voices if not v.mix and (v.engine, v.name) in blended]
    out = split([v for v in voices if v not in bases])
    mixed = split_by_stratum(blends, seed, held_out)
    out["train"] = list(out["train"]) + bases
    return {s: sorted(list(out[s]) + mixed[s], key=lambda v: v.spk) for s in SPLITS}


def _dist_version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def _command_version(cmd: Sequence[str], pattern: str) -> str:
    try:
        res = subprocess.run(list(cmd), capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    match = re.search(pattern, res.stdout + res.stderr)
    return match.group(1) if match else "unknown"


# How each engine names its build, for engines that do not say it themselves (an engine
# class may define a `version()` class method instead). Asked without loading the engine.
_VERSION_PROBES: Dict[str, Callable[[], str]] = {
    "espeak": lambda: (f"espeakng-loader-{_dist_version('espeakng-loader')}"
                       f"+{espeak_fingerprint()}"),
    "flite": lambda: _command_version(["flite", "--version"], r"version:\s*(\S+)"),
    "festival": lambda: "festival-" + _command_version(["festival", "--version"],
                                                       r"System:\s*([^:\s]+)"),
}


@functools.lru_cache(maxsize=None)
def engine_version(name: str) -> str:
    """The engine's build as one word (recorded in the stamp and the inventory: a new
    build makes a corpus stale): its own version(), a probe above, else the engine's
    clip-cache fingerprint (packages and model files: Kokoro, the Debian engines)."""
    cls = engine_class(name)
    own = getattr(cls, "version", None)
    if callable(own):
        return str(own())
    probe = _VERSION_PROBES.get(name)
    if probe:
        return probe()
    return cls.fingerprint() or "unknown"


def _espeak_probe(voices: Sequence[Voice], espeak_data: Optional[str]) -> dict:
    """Child body of espeak_voices_here."""
    es = Espeak(espeak_data)
    ok = []
    for v in voices:
        loads = es.set_voice(v.name)
        # espeak-ng falls back to the plain accent, silently, when a variant file is missing
        if v.variant and not (loads and es.current_identifier().endswith(
                "+" + v.name.split("+")[1])):
            raise SynthError(f"espeak-ng ignored the procedural voice {v.name} (variant file "
                             f"not found in {espeak_data})")
        if loads:
            ok.append(v)
    return {"voices": ok, "accents": [a for a in ACCENTS if es.set_voice(a)]}


def espeak_voices_here(voices: Sequence[Voice], tmp_dir: str,
                       espeak_data: Optional[str] = None) -> Tuple[List[Voice], List[str]]:
    """(the espeak-ng voices among `voices` that load here, the ACCENTS it has), asked in a
    forked child so that this process never loads espeak-ng. A procedural voice that does
    not load its variant file is an error, not a silent fallback."""
    probe = run_forked(lambda _: _espeak_probe(voices, espeak_data), [None], 1, tmp_dir)[0]
    return probe["voices"], probe["accents"]


# --------------------------------------------------------------------------------------
# Voice splits
# --------------------------------------------------------------------------------------

def name_stream(name: str) -> int:
    """A stream number of a name (seeded_rng), the same in every run and process."""
    return zlib.crc32(name.encode("utf-8"))


def voice_stratum(voice: Voice) -> str:
    """espeak-ng: the accent (procedural voices a stratum of their own); else the engine."""
    if voice.engine != "espeak":
        return voice.engine
    return voice.name.split("+")[0] + (":procedural" if voice.variant else "")


def _interleave(strata: Mapping[str, List[Voice]]) -> List[Voice]:
    """Round robin over the strata, so that any prefix covers the accents evenly."""
    out, lists = [], [strata[k] for k in sorted(strata)]
    for i in range(max((len(v) for v in lists), default=0)):
        out += [v[i] for v in lists if i < len(v)]
    return out


def split_by_stratum(voices: Sequence[Voice], seed: int, held_out: Mapping[str, float],
                     interleave: bool = False,
                     stratum: Callable[[Voice], str] = voice_stratum,
                     own_streams: Optional[int] = None) -> Dict[str, List[Voice]]:
    """Disjoint voice lists per split: the one hold-out rule of every corpus. Each stratum
    (`stratum`, by default voice_stratum) gives test and dev their `held_out` fractions, at
    least one voice each when it has two (test) or three (dev) voices; train the rest. The
    strata draw their orders in turn from one stream of `seed`, or with `own_streams` each
    from a stream of its own name (seed, own_streams, crc32 of the name), so that a
    stratum's held-out voices do not depend on the other strata there. Each list is sorted
    by speaker, or with `interleave` taken round robin across the strata."""
    rng = seeded_rng(seed, 0)
    strata: Dict[str, List[Voice]] = {}
    for v in sorted(voices, key=lambda v: v.spk):
        strata.setdefault(stratum(v), []).append(v)
    per_split: Dict[str, Dict[str, List[Voice]]] = {s: {} for s in SPLITS}
    for key in sorted(strata):
        if own_streams is not None:
            rng = seeded_rng(seed, own_streams, name_stream(key))
        order = [strata[key][i] for i in rng.permutation(len(strata[key]))]
        n = len(order)
        n_test = max(1, round(held_out["test"] * n)) if n >= 2 else 0
        n_dev = max(1, round(held_out["dev"] * n)) if n >= 3 else 0
        per_split["test"][key] = order[:n_test]
        per_split["dev"][key] = order[n_test:n_test + n_dev]
        per_split["train"][key] = order[n_test + n_dev:]
    if interleave:
        return {s: _interleave(per_split[s]) for s in SPLITS}
    return {s: sorted((v for vs in per_split[s].values() for v in vs), key=lambda v: v.spk)
            for s in SPLITS}


def voice_family(voice: Voice) -> str:
    """espeak-ng's fixed voices: their variant (en+f3 and en-us+f3 are one design in two
    accents); any other voice is a family of its own."""
    if voice.engine == "espeak" and not voice.variant:
        return "espeak+" + voice.name.split("+", 1)[1]
    return f"{voice.engine}:{voice.name}"


def split_by_family(voices: Sequence[Voice], counts: Mapping[str, int], seed: int,
                    test_first: Sequence[Voice] = ()
                    ) -> Tuple[Dict[str, List[Voice]], Dict[str, int]]:
    """Voices of each split, families never shared, and how many of `counts` each split
    still lacks. Test and dev take whole families (`test_first` voices, e.g. reserved ones
    in a test-only corpus, before any); training one voice of every remaining family in
    turn, for the most voice designs."""
    rng = seeded_rng(seed, 0)
    families: Dict[str, List[Voice]] = {}
    for v in sorted(voices, key=lambda v: v.spk):
        families.setdefault(voice_family(v), []).append(v)
    keys = sorted(families)
    queue = [keys[i] for i in rng.permutation(len(keys))]
    members = {k: [families[k][i] for i in rng.permutation(len(families[k]))] for k in queue}
    out: Dict[str, List[Voice]] = {s: [] for s in SPLITS}
    out["test"] = sorted(test_first, key=lambda v: v.spk)[:counts["test"]]
    for split in ("test", "dev"):
        while len(out[split]) < counts[split] and queue:
            fam = members[queue.pop(0)]
            out[split] += fam[:counts[split] - len(out[split])]
    while len(out["train"]) < counts["train"] and any(members[k] for k in queue):
        for k in queue:
            if members[k] and len(out["train"]) < counts["train"]:
                out["train"].append(members[k].pop(0))
    missing = {s: counts[s] - len(out[s]) for s in SPLITS}
    return out, missing


# --------------------------------------------------------------------------------------
# The stamp's account of the engines
# --------------------------------------------------------------------------------------

def corpus_stamp(format_version: int, settings: Mapping, engines: Engines,
                 tools: Sequence[str] = ()) -> dict:
    """What makes a corpus: the generator's `settings`, the engines, the other engines'
    voices, the reserved ones among them, and the build of every engine used (`tools`:
    engines needed whatever speaks)."""
    voices: Dict[str, List[str]] = {}
    for v in engines.voices:          # espeak-ng's voices follow from its build
        voices.setdefault(v.engine, []).append(v.name)
    used = sorted(set(engines.names) | set(tools))
    return {"format": int(format_version), **settings, "engines": list(engines.names),
            "engine_voices": voices,
            "reserved_voices": sorted(v.spk for v in engines.voices
                                      if reserved_for_evaluation(v)),
            "engine_versions": {name: engine_version(name) for name in used},
            "test_only": engines.test_only}
