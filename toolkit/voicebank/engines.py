"""TTS engines by name, so that recipes name the engines they speak with instead of
branching on them:

    cls = engine_class("flite")                 # SynthError for an unknown name
    if not cls.available(): raise SynthError(cls.unavailable_reason())
    voices = cls.voices()
    speech = cls(work_dir).synth("hey snips", voices[0], rate=175)   # a Speech

The class methods (available, unavailable_reason, voices) load nothing into the calling
process (flite and festival are asked in a subprocess), so a parent may call them. An
instance speaks and may hold engine state (espeak-ng does): make it in the process that
renders, e.g. a toolkit.voicebank.pool child. Given text, voice, rate, pitch, range and seed,
each engine's output is the same every time (espeak-ng: in a fresh process).

Registered: espeak (libespeak-ng, 8 English accents x 28 variants, word onsets), flite
(Debian `flite`, 4 voices, word onsets from its phone segments when they add up),
festival (Debian `text2wave`, 3 voices, no word onsets; reserved for evaluation), and
from their own modules: kokoro (toolkit.voicebank.kokoro: Kokoro-82M, 28 English voices and
their blends) and rhvoice, pico, mbrola (toolkit.voicebank.debian), each opt-in through
`bash tools/install_voices.sh NAME`.

An engine with `cache_clips` set keeps its clips in the clip cache (toolkit.voicebank.cache):
`synth` looks the clip up under a key of the engine, its `fingerprint()` (package
versions), the voice's identity, the text and `effective_args` (the arguments that
change its samples), and calls the engine's `_synth` only on a miss.
"""
import shutil
from typing import Any, Dict, List, Optional, Type

import numpy as np

from toolkit.registry import Registry
from toolkit.voicebank import Speech, SynthError, Voice, espeak, festival, flite

ENGINES: Registry = Registry("TTS engine")


class Engine:
    """Base of the registered engines; `work_dir` holds the engine's temporary files."""
    name = ""
    install_hint = ""
    cache_clips = False      # keep clips in toolkit.voicebank.cache (slow engines)

    def __init__(self, work_dir: str):
        self.work_dir = work_dir

    @classmethod
    def unavailable_reason(cls) -> str:
        """Why the engine cannot speak here, with how to install it; "" when it can."""
        raise NotImplementedError

    @classmethod
    def available(cls) -> bool:
        return not cls.unavailable_reason()

    @classmethod
    def voices(cls) -> List[Voice]:
        """The engine's voices here ([] when it is not available)."""
        raise NotImplementedError

    @classmethod
    def fingerprint(cls) -> str:
        """Versions of what makes the engine's samples (packages, model files): part of
        every cached clip's key, so an upgrade never returns an old clip."""
        return ""

    @classmethod
    def blends(cls, n: int, seed: int) -> List[Voice]:
        """`n` new voices mixed from this engine's unreserved voices, a pure function of
        the arguments (an engine whose voices cannot be mixed refuses any)."""
        if n:
            raise SynthError(f"{cls.name} voices cannot be blended (asked for {n} blends)")
        return []

    def effective_args(self, rate: int, pitch: int, prange: int, seed: int,
                       time_words: bool) -> Dict[str, Any]:
        """The synth arguments that change this engine's output (the clip key's part):
        an engine drops those it ignores, so that clips differing only there are shared."""
        return {"rate": int(rate), "pitch": int(pitch), "prange": int(prange),
                "seed": int(seed), "time_words": bool(time_words)}

    def synth(self, text: str, voice: Voice, rate: int = 175, pitch: int = 50,
              prange: int = 50, seed: int = 0, time_words: bool = True) -> Speech:
        """`rate` in words per minute (175: each engine's default); `pitch` and `prange`
        on espeak's 0-100 scale (50: the voice's own), ignored by engines that cannot set
        them; `seed` fixes an engine's own noise sources. `time_words=False` skips the
        word onsets where they cost extra work (flite). Through the clip cache when the
        engine keeps clips and the cache is on."""
        if voice.engine != self.name:
            raise SynthError(f"voice {voice.spk} belongs to {voice.engine}, not {self.name}")
        from toolkit.voicebank.cache import clip_cache, clip_key
        cache = clip_cache() if self.cache_clips else None
        if cache is None:
            return self._synth(text, voice, rate, pitch, prange, seed, time_words)
        key = clip_key(self.name, type(self).fingerprint(), voice, text,
                       self.effective_args(rate, pitch, prange, seed, time_words))
        speech = cache.load(key, self.name)
        if speech is None:
            speech = self._synth(text, voice, rate, pitch, prange, seed, time_words)
            speech = Speech(np.asarray(speech.audio, np.float32), int(speech.sample_rate),
                            speech.word_onsets)
            cache.store(key, self.name, speech)
        return speech

    def _synth(self, text: str, voice: Voice, rate: int, pitch: int, prange: int,
               seed: int, time_words: bool) -> Speech:
        """The engine's own synthesis (see synth)."""
        raise NotImplementedError


def package_versions(packages: List[str]) -> str:
    """`name=version` of Debian packages, for fingerprints ("name=?" when unknown)."""
    import subprocess
    try:
        res = subprocess.run(["dpkg-query", "-W", "-f", "${Package}=${Version}\\n"] + packages,
                             capture_output=True, text=True, timeout=60)
        found = dict(line.split("=", 1) for line in res.stdout.splitlines() if "=" in line)
    except (OSError, subprocess.SubprocessError):
        found = {}
    return ",".join(f"{p}={found.get(p, '?')}" for p in packages)


@ENGINES.register("espeak")
class EspeakEngine(Engine):
    name = "espeak"
    install_hint = espeak.INSTALL_HINT

    def __init__(self, work_dir: str, data_path: Optional[str] = None):
        """`data_path`: a private espeak-ng data dir (procedural voices), else the wheel's."""
        super().__init__(work_dir)
        self.data_path = data_path
        self._espeak: Optional[espeak.Espeak] = None    # loaded on the first synth

    @classmethod
    def unavailable_reason(cls) -> str:
        try:
            espeak.espeak_paths()
        except SynthError as err:
            return str(err)
        return ""

    @classmethod
    def voices(cls) -> List[Voice]:
        return espeak.espeak_voices() if cls.available() else []

    def _synth(self, text: str, voice: Voice, rate: int, pitch: int, prange: int,
               seed: int, time_words: bool) -> Speech:
        if self._espeak is None:
            self._espeak = espeak.Espeak(self.data_path)
        self._espeak.seed(seed)
        audio = self._espeak.synth(text, voice.name, rate, pitch, prange)
        return Speech(audio, self._espeak.rate, list(self._espeak.word_starts))


@ENGINES.register("flite")
class FliteEngine(Engine):
    name = "flite"
    install_hint = flite.INSTALL_HINT

    @classmethod
    def unavailable_reason(cls) -> str:
        if not shutil.which("flite"):
            return f"no `flite` binary is on PATH: {cls.install_hint}"
        if not flite.flite_voices():
            return (f"`flite -lv` lists none of the voices {' '.join(flite.FLITE_VOICES)}: "
                    f"{cls.install_hint}")
        return ""

    @classmethod
    def voices(cls) -> List[Voice]:
        return [Voice(f"flite_{v}", "flite", v) for v in flite.flite_voices()]

    def _synth(self, text: str, voice: Voice, rate: int, pitch: int, prange: int,
               seed: int, time_words: bool) -> Speech:
        audio, sr, segments = flite.flite_synth(text, voice.name, rate, self.work_dir)
        onsets = flite.flite_word_onsets(text, voice.name, segments, sr) if time_words else None
        return Speech(audio, sr, onsets)


@ENGINES.register("festival")
class FestivalEngine(Engine):
    name = "festival"
    install_hint = festival.INSTALL_HINT
    cache_clips = True           # a process per clip: ~0.1-0.5 s
    _fingerprint: Optional[str] = None

    @classmethod
    def fingerprint(cls) -> str:
        if cls._fingerprint is None:
            cls._fingerprint = package_versions(["festival"] + sorted(
                set(festival.FESTIVAL_VOICES.values())))
        return cls._fingerprint

    def effective_args(self, rate, pitch, prange, seed, time_words):
        return {"rate": int(rate)}      # festival takes neither pitch nor a seed

    @classmethod
    def unavailable_reason(cls) -> str:
        missing = festival.festival_missing()
        if missing:
            return f"{missing}: {cls.install_hint}"
        if not festival.festival_voices():
            return (f"festival lists none of the voices {' '.join(festival.FESTIVAL_VOICES)}: "
                    f"{cls.install_hint}")
        return ""

    @classmethod
    def voices(cls) -> List[Voice]:
        return [Voice(f"festival_{v}", "festival", v) for v in festival.festival_voices()]

    def _synth(self, text: str, voice: Voice, rate: int, pitch: int, prange: int,
               seed: int, time_words: bool) -> Speech:
        audio, sr = festival.festival_synth(text, voice.name, rate, self.work_dir)
        return Speech(audio, sr, None)


# Registered by their own modules, imported on first use (they import this one).
ENGINES.register_lazy("kokoro", "toolkit.voicebank.kokoro")
for _name in ("rhvoice", "pico", "mbrola", "mbrola_accent"):
    ENGINES.register_lazy(_name, "toolkit.voicebank.debian")


def engine_class(name: str) -> Type[Engine]:
    """The registered engine `name`; SynthError naming the known ones otherwise."""
    if name not in ENGINES:
        raise SynthError(f"unknown TTS engine {name!r}; known: {', '.join(ENGINES.names())}")
    return ENGINES.get(name)
