"""TTS engines by name, so that recipes name the engines they speak with instead of
branching on them:

    cls = engine_class("flite")                 # SynthError for an unknown name
    if not cls.available(): raise SynthError(cls.unavailable_reason())
    voices = cls.voices()
    speech = cls(work_dir).synth("hey snips", voices[0], rate=175)   # a Speech

The class methods (available, unavailable_reason, voices) load nothing into the calling
process (flite and festival are asked in a subprocess), so a parent may call them. An
instance speaks and may hold engine state (espeak-ng does): make it in the process that
renders, e.g. a toolkit.tts.pool child. Given text, voice, rate, pitch, range and seed,
each engine's output is the same every time (espeak-ng: in a fresh process).

Registered: espeak (libespeak-ng, 8 English accents x 28 variants, word onsets), flite
(Debian `flite`, 4 voices, word onsets from its phone segments when they add up),
festival (Debian `text2wave`, 3 voices, no word onsets).
"""
import shutil
from typing import List, Optional, Type

from toolkit.registry import Registry
from toolkit.tts import Speech, SynthError, Voice, espeak, festival, flite

ENGINES: Registry = Registry("TTS engine")


class Engine:
    """Base of the registered engines; `work_dir` holds the engine's temporary files."""
    name = ""
    install_hint = ""

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

    def synth(self, text: str, voice: Voice, rate: int = 175, pitch: int = 50,
              prange: int = 50, seed: int = 0, time_words: bool = True) -> Speech:
        """`rate` in words per minute (175: each engine's default); `pitch` and `prange`
        on espeak's 0-100 scale (50: the voice's own), ignored by engines that cannot set
        them; `seed` fixes an engine's own noise sources. `time_words=False` skips the
        word onsets where they cost extra work (flite)."""
        raise NotImplementedError


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

    def synth(self, text: str, voice: Voice, rate: int = 175, pitch: int = 50,
              prange: int = 50, seed: int = 0, time_words: bool = True) -> Speech:
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

    def synth(self, text: str, voice: Voice, rate: int = 175, pitch: int = 50,
              prange: int = 50, seed: int = 0, time_words: bool = True) -> Speech:
        audio, sr, segments = flite.flite_synth(text, voice.name, rate, self.work_dir)
        onsets = flite.flite_word_onsets(text, voice.name, segments, sr) if time_words else None
        return Speech(audio, sr, onsets)


@ENGINES.register("festival")
class FestivalEngine(Engine):
    name = "festival"
    install_hint = festival.INSTALL_HINT

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

    def synth(self, text: str, voice: Voice, rate: int = 175, pitch: int = 50,
              prange: int = 50, seed: int = 0, time_words: bool = True) -> Speech:
        audio, sr = festival.festival_synth(text, voice.name, rate, self.work_dir)
        return Speech(audio, sr, None)


def engine_class(name: str) -> Type[Engine]:
    """The registered engine `name`; SynthError naming the known ones otherwise."""
    if name not in ENGINES:
        raise SynthError(f"unknown TTS engine {name!r}; known: {', '.join(ENGINES.names())}")
    return ENGINES.get(name)
