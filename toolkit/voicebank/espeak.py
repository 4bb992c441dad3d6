"""espeak-ng through ctypes (the espeakng-loader wheel: library and data dir), and
procedural espeak-ng voices (random variant files in a private copy of the data dir).

libespeak-ng keeps internal waveform state from one utterance to the next and nothing
resets it, and it seeds its own noise generator (breath/echo voices) from the clock: for
reproducible audio, load it only in a process that renders a fixed sequence of texts (see
toolkit.voicebank.pool) and reseed it before every utterance (Espeak.seed).
"""
import ctypes
import hashlib
import logging
import os
import weakref
from typing import List, Optional, Sequence, Tuple

import numpy as np

from toolkit.voicebank import SynthError, Voice, seeded_rng

logger = logging.getLogger(__name__)
# The voice the process's one libespeak-ng holds (every Espeak instance shares it).
_voice_in_use: Optional[str] = None

INSTALL_HINT = "install the TTS extra: pip install -e .[tts]  (package espeakng-loader)"

# espeak-ng accents whose voices exist in the espeakng-loader data (`en-gb` is not one:
# it falls back to `en` and ignores the variant).
ACCENTS = ("en", "en-us", "en-us-nyc", "en-gb-scotland", "en-gb-x-rp",
           "en-gb-x-gbclan", "en-gb-x-gbcwmd", "en-029")
# Voice variants checked to change the waveform for every accent above (a fresh process
# per accent+variant, same text: all hashes differ).  Novelty variants (whisper, croak,
# robosoft, ...) are left out; `fast` is left out because it only changes the rate,
# which is set per utterance anyway.
VARIANTS = ("f1", "f2", "f3", "f4", "f5", "m1", "m2", "m3", "m4", "m5", "m6", "m7",
            "klatt", "klatt2", "klatt3", "klatt4", "Andy", "Annie", "adam", "anika",
            "belinda", "benjamin", "david", "linda", "max", "michael", "paul", "steph")
# Procedural espeak-ng voices: variant files drawn at random and written into a private copy
# of the espeak-ng data dir: random vocal tracts (formant frequencies, strengths, bandwidths),
# voice sources (pitch, flutter, roughness, breath, voicing) and klatt modes.
RANDOM_VOICE_PREFIX = "kwsrv"
# espeak-ng lists the voice files of its data dir at start-up and stops at 349: the private
# copy keeps only the English languages and the fixed variants, leaving room for these.
MAX_RANDOM_VOICES = 300

_AUDIO_OUTPUT_SYNCHRONOUS = 2
_INIT_DONT_EXIT = 0x8000          # return an error instead of calling exit()
_CHARS_UTF8 = 1
_POS_CHARACTER = 1
_PARAM_RATE, _PARAM_PITCH, _PARAM_RANGE = 1, 3, 4
_SYNTH_CB = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_short), ctypes.c_int,
                             ctypes.c_void_p)
_EVENT_WORD = 1


class _EspeakEvent(ctypes.Structure):
    """espeak_EVENT of speak_lib.h; a list of them ends with type 0."""
    _fields_ = [("type", ctypes.c_int), ("unique_identifier", ctypes.c_uint),
                ("text_position", ctypes.c_int), ("length", ctypes.c_int),
                ("audio_position", ctypes.c_int), ("sample", ctypes.c_int),
                ("user_data", ctypes.c_void_p), ("id", ctypes.c_char * 8)]


class _EspeakVoice(ctypes.Structure):
    """espeak_VOICE of speak_lib.h."""
    _fields_ = [("name", ctypes.c_char_p), ("languages", ctypes.c_char_p),
                ("identifier", ctypes.c_char_p), ("gender", ctypes.c_ubyte),
                ("age", ctypes.c_ubyte), ("variant", ctypes.c_ubyte), ("xx1", ctypes.c_ubyte),
                ("score", ctypes.c_int), ("spare", ctypes.c_void_p)]


_espeak_pid: Optional[int] = None     # pid of the process that loaded espeak-ng, if any
# libespeak-ng is one per process: one data dir and one synthesis callback for all the
# Espeak objects in it. Each object takes them back before it speaks (Espeak._claim).
_library_data: Optional[str] = None   # the data dir it was last initialised with
_owner = None                         # weakref to the Espeak its callback collects for


def loaded_in_this_process() -> bool:
    """True once an Espeak was made here: this process's later audio depends on its past."""
    return _espeak_pid == os.getpid()


def espeak_paths() -> Tuple[str, str]:
    """(library, data dir) of the espeakng-loader wheel; SynthError names what is missing."""
    try:
        import espeakng_loader
    except ImportError:
        raise SynthError(f"espeak-ng is missing (Python package espeakng_loader not found): "
                         f"{INSTALL_HINT}") from None
    lib = espeakng_loader.get_library_path()
    try:
        data = espeakng_loader.get_data_path()
    except RuntimeError as err:
        raise SynthError(f"espeak-ng data dir missing ({err}): {INSTALL_HINT}") from None
    if not os.path.exists(lib):
        raise SynthError(f"espeak-ng library missing at {lib}: {INSTALL_HINT}")
    return lib, data


def _libc_srand(value: int) -> None:
    try:
        ctypes.CDLL(None).srand(ctypes.c_uint(value & 0xFFFFFFFF))
    except (OSError, AttributeError):
        pass


class Espeak:
    """Synchronous espeak-ng synthesizer returning float32 samples at `self.rate` Hz."""

    def __init__(self, data_path: Optional[str] = None):
        """`data_path`: an espeak-ng data dir other than the wheel's (procedural voices)."""
        global _espeak_pid
        lib_path, wheel_data = espeak_paths()
        data_path = data_path or wheel_data
        try:
            lib = ctypes.CDLL(lib_path)
        except OSError as err:
            raise SynthError(f"cannot load espeak-ng library {lib_path}: {err}; {INSTALL_HINT}")
        _espeak_pid = os.getpid()
        lib.espeak_Initialize.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
        lib.espeak_SetVoiceByName.argtypes = [ctypes.c_char_p]
        lib.espeak_SetParameter.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int]
        lib.espeak_Synth.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_uint,
                                     ctypes.c_int, ctypes.c_uint, ctypes.c_uint,
                                     ctypes.c_void_p, ctypes.c_void_p]
        lib.espeak_GetCurrentVoice.restype = ctypes.POINTER(_EspeakVoice)
        lib.espeak_TextToPhonemes.restype = ctypes.c_char_p
        lib.espeak_TextToPhonemes.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int,
                                              ctypes.c_int]
        self.lib, self.data_path = lib, data_path
        self.rate = self._initialise()
        # espeak-ng's own noise generator (breath, echo voices such as +f3/+f5) is seeded
        # from the clock at initialisation: without a fixed seed no two runs match.
        self._set_seed = getattr(lib, "espeak_ng_SetRandSeed", None)
        if self._set_seed is None:
            logger.warning("libespeak-ng lacks espeak_ng_SetRandSeed: output is not reproducible")
        else:
            self._set_seed.argtypes = [ctypes.c_long]
        self._chunks: List[np.ndarray] = []
        # (1-based character position of the word in the text, its first output sample)
        self.word_starts: List[Tuple[int, int]] = []
        self._cb = _SYNTH_CB(self._collect)   # keep a reference: C holds the pointer
        self._claim()

    def _claim(self) -> None:
        """Makes the process's libespeak-ng this object's: initialised from its data dir
        (another Espeak may have initialised it from another since) and collecting into
        its buffers. Without this a second Espeak silently took the first one's audio."""
        global _owner
        if _owner is not None and _owner() is self:
            return
        if _library_data != self.data_path:
            self._initialise()
        self.lib.espeak_SetSynthCallback(self._cb)
        _owner = weakref.ref(self)

    def _initialise(self) -> int:
        """espeak_Initialize from this object's data dir; its sample rate."""
        global _voice_in_use, _library_data
        rate = self.lib.espeak_Initialize(_AUDIO_OUTPUT_SYNCHRONOUS, 0, self.data_path.encode(),
                                          _INIT_DONT_EXIT)
        if rate <= 0:
            raise SynthError(f"espeak-ng failed to initialise (data dir {self.data_path}): "
                             f"{INSTALL_HINT}")
        _voice_in_use = None                  # initialising leaves no voice we chose
        _library_data = self.data_path
        return int(rate)

    def _collect(self, wav, n, events):
        if n > 0 and wav:
            self._chunks.append(np.ctypeslib.as_array(wav, shape=(n,)).copy())
        if events:
            ev = ctypes.cast(events, ctypes.POINTER(_EspeakEvent))
            i = 0
            while ev[i].type != 0:
                if ev[i].type == _EVENT_WORD:
                    self.word_starts.append((int(ev[i].text_position), int(ev[i].sample)))
                i += 1
        return 0

    def seed(self, value: int) -> None:
        """Fixes espeak's internal random generator and libc rand() (klatt noise)."""
        self._claim()                  # initialising again would reseed from the clock
        if self._set_seed is not None:
            self._set_seed(int(value))
        _libc_srand(int(value))

    def set_voice(self, voice: str) -> bool:
        """False when espeak does not know the voice (it would silently fall back)."""
        global _voice_in_use
        self._claim()
        ok = self.lib.espeak_SetVoiceByName(voice.encode()) == 0
        _voice_in_use = voice if ok else None
        return ok

    def current_identifier(self) -> str:
        """Data-dir path of the voice in use, with `+variant` only when the variant file
        was found and applied, e.g. gmw/en-US+f3."""
        self._claim()
        return self.lib.espeak_GetCurrentVoice().contents.identifier.decode()

    def synth(self, text: str, voice: str, rate: int = 175, pitch: int = 50,
              prange: int = 50) -> np.ndarray:
        if not self.set_voice(voice):         # claims the library first
            raise SynthError(f"espeak-ng has no voice {voice!r}")
        for param, value in ((_PARAM_RATE, rate), (_PARAM_PITCH, pitch), (_PARAM_RANGE, prange)):
            self.lib.espeak_SetParameter(param, int(value), 0)
        self._chunks = []
        self.word_starts = []
        data = text.encode()
        err = self.lib.espeak_Synth(data, len(data) + 1, 0, _POS_CHARACTER, 0, _CHARS_UTF8,
                                    None, None)
        self.lib.espeak_Synchronize()
        if err != 0:
            raise SynthError(f"espeak_Synth failed ({err}) for {text!r} with voice {voice}")
        audio = np.concatenate(self._chunks) if self._chunks else np.zeros(0, np.int16)
        return audio.astype(np.float32) / 32768.0

    def phonemes(self, text: str, voice: str, separator: str = "") -> str:
        """espeak's ASCII phoneme string for `text` (all clauses joined); `separator`
        (one ASCII character) goes between the phonemes of a word."""
        # Loading a voice costs more than the lookup: a lexicon of thousands of words in
        # one voice loads it once (the library holds one voice for the whole process).
        self._claim()
        if _voice_in_use != voice and not self.set_voice(voice):
            raise SynthError(f"espeak-ng has no voice {voice!r}")
        # Bits 8-23 of the phoneme mode hold the separator character.
        mode = (ord(separator) << 8) if separator else 0
        buf = ctypes.create_string_buffer(text.encode())
        ptr = ctypes.c_void_p(ctypes.addressof(buf))
        out = []
        while ptr.value:
            res = self.lib.espeak_TextToPhonemes(ctypes.byref(ptr), _CHARS_UTF8, mode)
            if res:
                out.append(res.decode("utf-8", "replace"))
        return " ".join(out)


# --------------------------------------------------------------------------------------
# Voices
# --------------------------------------------------------------------------------------

def espeak_voices() -> List[Voice]:
    """The fixed voices: every accent with every variant."""
    return [Voice(f"{a}_{v}", "espeak", f"{a}+{v}") for a in ACCENTS for v in VARIANTS]


def random_variant(rng: np.random.Generator, name: str) -> str:
    """Text of an espeak-ng variant file for one random voice. Values are percentages of
    the language's default voice, within the spread of espeak's own variants (f1-f5, m1-m7,
    klatt*, david, anika, ...)."""
    female = rng.random() < 0.5
    base = rng.uniform(140, 250) if female else rng.uniform(65, 140)    # pitch, Hz
    tract = rng.uniform(1.0, 1.2) if female else rng.uniform(0.8, 1.05)  # formant scale
    lines = ["language variant", f"name {name}", f"gender {'female' if female else 'male'}",
             f"pitch {base:.0f} {base * rng.uniform(1.15, 1.7):.0f}"]
    for n in range(9):
        # formants 0-5 shape the vowels; 6-8 only add high-frequency colour
        strength = rng.uniform(60, 140) if n < 6 else rng.uniform(0, 100)
        lines.append(f"formant {n} {100 * tract * rng.uniform(0.93, 1.07):.0f} "
                     f"{strength:.0f} {rng.uniform(70, 170):.0f}")
    lines += [f"flutter {int(rng.integers(0, 16))}", f"roughness {int(rng.integers(0, 6))}",
              f"voicing {rng.uniform(40, 140):.0f}",
              f"consonants {rng.uniform(50, 150):.0f} {rng.uniform(50, 150):.0f}"]
    if rng.random() < 0.3:
        lines.append("breath " + " ".join(str(int(b)) for b in rng.integers(0, 7, size=8)))
    if rng.random() < 0.2:
        lines.append(f"echo {int(rng.integers(50, 151))} {int(rng.integers(5, 21))}")
    if rng.random() < 0.35:
        lines.append(f"klatt {int(rng.integers(1, 7))}")
    return "\n".join(lines) + "\n"


def random_voices(count: int, accents: Sequence[str], seed: int) -> List[Voice]:
    """`count` procedural voices, accents taken in turn; a pure function of the seed."""
    rng = seeded_rng(seed, 3)
    out = []
    for i in range(count):
        accent, name = accents[i % len(accents)], f"{RANDOM_VOICE_PREFIX}{i:04d}"
        out.append(Voice(f"{accent}_rv{i:04d}", "espeak", f"{accent}+{name}",
                         random_variant(rng, name)))
    return out


def private_espeak_data(voices: Sequence[Voice], tmp_dir: str) -> Optional[str]:
    """A copy of the espeak-ng data dir (files symlinked) with the variant files of the
    procedural voices among `voices` added; None when there are none."""
    variants = {v.name.split("+", 1)[1]: v.variant for v in voices if v.variant}
    if not variants:
        return None
    src, dst = espeak_paths()[1], os.path.join(tmp_dir, "espeak-ng-data")
    for root, _, files in os.walk(src):
        rel = os.path.relpath(root, src)
        top = rel.split(os.sep)[0]
        for name in files:
            if (top == "lang" and not name.lower().startswith("en")) or \
                    (top == "voices" and name not in VARIANTS):
                continue
            os.makedirs(os.path.join(dst, rel), exist_ok=True)
            os.symlink(os.path.join(root, name), os.path.join(dst, rel, name))
    os.makedirs(os.path.join(dst, "voices", "!v"), exist_ok=True)
    for name, text in variants.items():
        with open(os.path.join(dst, "voices", "!v", name), "w", encoding="utf-8") as f:
            f.write(text)
    return dst


def espeak_fingerprint() -> str:
    """Identifies the espeak-ng build without loading it (file size + data version)."""
    try:
        lib, data = espeak_paths()
    except SynthError:
        return "missing"
    h = hashlib.sha256(str(os.path.getsize(lib)).encode())
    for name in ("phondata", "en_dict"):
        p = os.path.join(data, name)
        if os.path.exists(p):
            h.update(f"{name}:{os.path.getsize(p)}".encode())
    return h.hexdigest()[:16]
