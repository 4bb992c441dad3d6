"""Debian's opt-in TTS engines (contrib/non-free), each a binary run in a fresh process
per clip, so the same text, voice and arguments give the same samples every time:

- rhvoice: `RHVoice-test` (packages rhvoice, rhvoice-english), 6 English voices,
  24 kHz; rate and pitch in percent of the voice's own.
- pico: `pico2wave` (libttspico-utils), SVOX Pico en-US and en-GB, 16 kHz; rate and
  pitch through Pico's own <speed>/<pitch> markup.
- mbrola: Debian's `espeak-ng` CLI with its `mb-*` voices, which turn text into MBROLA
  phonemes and run the `mbrola` binary on the diphone databases us1, us2, us3 (American)
  and en1 (British), 16 kHz; rate in words per minute and pitch on espeak's 0-100 scale.
  (The espeakng-loader wheel the toolkit speaks espeak-ng with has no MBROLA voices.)
- mbrola_accent: English through 16 MBROLA databases of other languages' speakers
  (Afrikaans, German, French, Greek, Hungarian, Dutch, Polish, Romanian, Swedish), with
  espeak-ng's `mb-<db>-en` voices, which map its English phonemes onto each database's
  phones: real speakers' diphones, heard with a foreign accent; 16 kHz.

None reports word onsets. Install: `bash tools/install_voices.sh rhvoice pico mbrola
mbrola_accent`.
Clips go through the clip cache (toolkit.voicebank.cache), keyed by the packages' versions.
"""
import os
import shutil
import subprocess
from typing import Dict, List, Optional, Sequence

import numpy as np

from toolkit.voicebank import Speech, SynthError, Voice, pitch_ratio
from toolkit.voicebank.engines import ENGINES, Engine, package_versions

RHVOICE_VOICES = ("alan", "bdl", "clb", "evgeniy-eng", "lyubov", "slt")
RHVOICE_DATA = "/usr/share/RHVoice/voices"
PICO_VOICES = ("en-US", "en-GB")
PICO_DATA = "/usr/share/pico/lang"
MBROLA_VOICES = ("us1", "us2", "us3", "en1")
MBROLA_DATA = "/usr/share/mbrola"
# The databases espeak-ng speaks English with (its voices/mb/mb-<db>-en).
MBROLA_ACCENT_VOICES = ("af1", "de1", "de2", "de3", "de4", "de5", "de6", "fr1", "fr4", "gr2",
                        "hu1", "nl2", "pl1", "ro1", "sw1", "sw2")
_TIMEOUT_S = 120


def _read_wav(path: str, what: str):
    import soundfile as sf
    try:
        audio, sr = sf.read(path, dtype="float32", always_2d=True)
    except (RuntimeError, OSError) as err:
        raise SynthError(f"{what} wrote no readable audio ({path}: {err})") from None
    return audio[:, 0], int(sr)


def _run(cmd: Sequence[str], what: str, stdin: Optional[str] = None) -> None:
    try:
        res = subprocess.run(list(cmd), input=stdin, capture_output=True, text=True,
                             timeout=_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise SynthError(f"{what} did not finish within {_TIMEOUT_S} s") from None
    except OSError as err:
        raise SynthError(f"{what} could not run: {err}") from None
    if res.returncode != 0:
        raise SynthError(f"{what} failed (exit {res.returncode}): "
                         f"{(res.stderr or res.stdout).strip()[:200]}")


def _espeak_cli_voice_files() -> frozenset:
    """The voice files (e.g. mb/mb-de4-en) the espeak-ng CLI lists; empty without it."""
    if not shutil.which("espeak-ng"):
        return frozenset()
    try:
        res = subprocess.run(["espeak-ng", "--voices=mb"], capture_output=True, text=True,
                             timeout=_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return frozenset()
    return frozenset(f for line in res.stdout.splitlines()[1:] for f in line.split()
                     if f.startswith("mb/"))


class _DebianEngine(Engine):
    """A Debian binary per clip; subclasses name the binary, packages and voices."""
    binaries: Sequence[str] = ()
    packages: Sequence[str] = ()
    cache_clips = True
    _fingerprints: Dict[str, str] = {}

    @classmethod
    def installed_voices(cls) -> List[str]:
        raise NotImplementedError

    @classmethod
    def unavailable_reason(cls) -> str:
        missing = [b for b in cls.binaries if not shutil.which(b)]
        if missing:
            return f"no `{'` or `'.join(missing)}` on PATH: {cls.install_hint}"
        if not cls.installed_voices():
            return f"none of the {cls.name} voices is installed: {cls.install_hint}"
        return ""

    @classmethod
    def voices(cls) -> List[Voice]:
        if not cls.available():
            return []
        return [Voice(f"{cls.name}_{v.lower()}", cls.name, v) for v in cls.installed_voices()]

    @classmethod
    def fingerprint(cls) -> str:
        if cls.name not in cls._fingerprints:
            cls._fingerprints[cls.name] = package_versions(list(cls.packages))
        return cls._fingerprints[cls.name]

    def effective_args(self, rate, pitch, prange, seed, time_words):
        # No engine here has a noise source, a pitch range or word onsets.
        return {"rate": int(rate), "pitch": int(pitch)}

    def _wav_path(self) -> str:
        return os.path.join(self.work_dir, f"{self.name}.wav")


@ENGINES.register("rhvoice")
class RHVoiceEngine(_DebianEngine):
    name = "rhvoice"
    install_hint = "bash tools/install_voices.sh rhvoice"
    binaries = ("RHVoice-test",)
    packages = ("rhvoice", "rhvoice-english")

    @classmethod
    def installed_voices(cls) -> List[str]:
        return [v for v in RHVOICE_VOICES if os.path.isdir(os.path.join(RHVOICE_DATA, v))]

    def _synth(self, text, voice, rate, pitch, prange, seed, time_words) -> Speech:
        path = self._wav_path()
        _run(["RHVoice-test", "-p", voice.name, "-r", str(round(100 * rate / 175)),
              "-t", str(round(100 * pitch_ratio(pitch))), "-o", path],
             f"RHVoice-test (voice {voice.name})", stdin=text + "\n")
        audio, sr = _read_wav(path, "RHVoice-test")
        os.unlink(path)
        return Speech(audio, sr, None)


@ENGINES.register("pico")
class PicoEngine(_DebianEngine):
    name = "pico"
    install_hint = "bash tools/install_voices.sh pico"
    binaries = ("pico2wave",)
    packages = ("libttspico-utils", "libttspico0", "libttspico-data")

    @classmethod
    def installed_voices(cls) -> List[str]:
        return [v for v in PICO_VOICES if os.path.isfile(os.path.join(PICO_DATA, f"{v}_ta.bin"))]

    def _synth(self, text, voice, rate, pitch, prange, seed, time_words) -> Speech:
        path = self._wav_path()
        # Pico reads <...> as its own markup: the text's angle brackets are dropped.
        plain = text.replace("<", " ").replace(">", " ")
        marked = (f"<speed level='{round(100 * rate / 175)}'>"
                  f"<pitch level='{round(100 * pitch_ratio(pitch))}'>{plain}</pitch></speed>")
        _run(["pico2wave", "-l", voice.name, "-w", path, marked],
             f"pico2wave (voice {voice.name})")
        audio, sr = _read_wav(path, "pico2wave")
        os.unlink(path)
        return Speech(audio, sr, None)


@ENGINES.register("mbrola")
class MbrolaEngine(_DebianEngine):
    name = "mbrola"
    install_hint = "bash tools/install_voices.sh mbrola"
    binaries = ("espeak-ng", "mbrola")
    packages = ("espeak-ng", "libespeak-ng1", "espeak-ng-data", "mbrola") + tuple(
        f"mbrola-{v}" for v in MBROLA_VOICES)

    @classmethod
    def installed_voices(cls) -> List[str]:
        return [v for v in MBROLA_VOICES if os.path.isfile(os.path.join(MBROLA_DATA, v, v))]

    @staticmethod
    def espeak_voice(database: str) -> str:
        return f"mb-{database}"

    def _synth(self, text, voice, rate, pitch, prange, seed, time_words) -> Speech:
        path = self._wav_path()
        espeak_voice = self.espeak_voice(voice.name)
        # `--` ends the options: a text starting with "-" is still text.
        _run(["espeak-ng", "-v", espeak_voice, "-s", str(int(rate)),
              "-p", str(int(min(max(pitch, 0), 99))), "-w", path, "--", text],
             f"espeak-ng with MBROLA voice {espeak_voice}")
        audio, sr = _read_wav(path, "espeak-ng (mbrola)")
        os.unlink(path)
        if not np.any(audio):
            raise SynthError(f"MBROLA voice {espeak_voice} produced silence for {text!r} "
                             f"(is {MBROLA_DATA}/{voice.name}/{voice.name} readable?)")
        return Speech(audio, sr, None)


@ENGINES.register("mbrola_accent")
class MbrolaAccentEngine(MbrolaEngine):
    """English in other languages' MBROLA voices: a separate engine (not more voices of
    `mbrola`), so that the corpora already made with `mbrola` keep their voice splits."""
    name = "mbrola_accent"
    install_hint = "bash tools/install_voices.sh mbrola_accent"
    packages = ("espeak-ng", "libespeak-ng1", "espeak-ng-data", "mbrola") + tuple(
        f"mbrola-{v}" for v in MBROLA_ACCENT_VOICES)

    @classmethod
    def installed_voices(cls) -> List[str]:
        known = _espeak_cli_voice_files()
        return [v for v in MBROLA_ACCENT_VOICES
                if os.path.isfile(os.path.join(MBROLA_DATA, v, v))
                and f"mb/{cls.espeak_voice(v)}" in known]

    @staticmethod
    def espeak_voice(database: str) -> str:
        return f"mb-{database}-en"
