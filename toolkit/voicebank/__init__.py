"""Text-to-speech engines for recipes that make their own speech (keyword spotting,
speaker verification from TTS voices, codecs that need many voices).

Modules: `engines` (the registry: name -> engine with available/voices/synth), `espeak`
(libespeak-ng through ctypes, procedural voices), `flite` and `festival` (Debian
binaries), `kokoro` (Kokoro-82M neural voices and their blends, `kokoro_assets` installs
them, `kokoro_graph` rewrites its ONNX graph), `debian` (the opt-in Debian engines
rhvoice, pico, mbrola), `cache` (synthesized clips kept across runs), `signal` (noise,
levels, SNR mixing), `channel` (rooms, telephone band, codecs, microphone colouring,
clipping) and `conditions` (a data dir copied under them), `render` (speech of any engine
placed at a level in noise), `pool`
(deterministic rendering in forked children), `corpus` (what every corpus generator
shares: engines, voice splits, the output directory). This package knows nothing about
any task; the shared vocabulary is defined here, with the voices reserved for evaluation
and the seeded generators (seeded_rng) plans draw from.
"""
import os
import re
from dataclasses import dataclass
from typing import List, NamedTuple, Optional, Tuple

import numpy as np

from toolkit.errors import UserError


class SynthError(UserError, RuntimeError):
    """A problem the user can fix (bad argument, TTS missing); its message says which."""


class AssetError(UserError):
    """A download, part or checksum problem of an engine's assets (Kokoro's model and
    voices); the message names the file or URL."""


# (engine voice name, weight) of a blend's components, in the order they are mixed
Mix = Tuple[Tuple[str, float], ...]


@dataclass(frozen=True)
class Voice:
    spk: str          # speaker id, e.g. en-us_f3 (recipes use it as utterance-key prefix)
    engine: str       # name in toolkit.voicebank.engines.ENGINES: espeak | flite | kokoro | ...
    name: str         # the engine's own voice name, e.g. en-us+f3 (a blend: its mix spelled out)
    variant: Optional[str] = None   # espeak variant file text of a procedural voice
    mix: Mix = ()     # a blend of the engine's voices (Kokoro style vectors); () otherwise

    @property
    def components(self) -> Tuple[str, ...]:
        """The engine voices this voice is made of: its mix's, else its own name."""
        return tuple(name for name, _ in self.mix) if self.mix else (self.name,)

    def as_dict(self) -> dict:
        """JSON-ready fields (stamps, inventories); from_dict reads them back."""
        out = {"spk": self.spk, "engine": self.engine, "name": self.name}
        if self.variant:
            out["variant"] = self.variant
        if self.mix:
            out["mix"] = [[name, weight] for name, weight in self.mix]
        return out

    @classmethod
    def from_dict(cls, d: dict) -> "Voice":
        return cls(d["spk"], d["engine"], d["name"], d.get("variant"),
                   tuple((str(n), float(w)) for n, w in d.get("mix", ())))

    def identity(self) -> str:
        """Exact, printable identity (inventories, clip cache keys): engine, name, and a
        procedural voice's variant file or a blend's weights."""
        out = f"{self.engine}:{self.name}"
        if self.mix:
            out += "=" + "+".join(f"{name}*{weight!r}" for name, weight in self.mix)
        if self.variant:
            import hashlib
            out += "#variant:" + hashlib.sha256(self.variant.encode()).hexdigest()[:16]
        return out


# Voices kept out of every training list and every blend: the outside test sets of the
# recipes speak with them. Festival and flite (festival's speakers: kal, awb, rms, slt),
# every voice; Kokoro, these seven.
RESERVED_ENGINES = frozenset({"festival", "flite"})
RESERVED_VOICES = frozenset({
    ("kokoro", "af_heart"), ("kokoro", "af_nicole"), ("kokoro", "af_sky"),
    ("kokoro", "am_michael"), ("kokoro", "am_fenrir"), ("kokoro", "bf_emma"),
    ("kokoro", "bm_george"),
    # RHVoice's slt is the CMU ARCTIC speaker of festival's and flite's slt voices.
    ("rhvoice", "slt"),
    # Never trained on for their licences (CC BY-NC-ND 4.0: no commercial use, no
    # derivatives), whereas the weights are Apache-2.0; RHVoice's alan, bdl and clb are
    # LGPL-2.1+ like its engine.
    ("rhvoice", "evgeniy-eng"), ("rhvoice", "lyubov")})


def is_reserved(voice: Voice) -> bool:
    """True for a voice of a reserved engine, a reserved voice, or a blend with one in it."""
    return voice.engine in RESERVED_ENGINES or \
        any((voice.engine, name) in RESERVED_VOICES for name in voice.components)


def training_voices(voices) -> List[Voice]:
    """`voices` without the reserved ones (see is_reserved)."""
    return [v for v in voices if not is_reserved(v)]


def seeded_rng(seed: int, *stream: int) -> np.random.Generator:
    """The generator of one stream of `seed` (entropy [seed, *stream]): each part of a plan
    draws from a stream of its own, so that drawing more in one never shifts another."""
    return np.random.default_rng([int(seed), *stream])


def toolkit_cache_dir() -> str:
    """Where downloaded models and synthesized clips live, outside any repository:
    $TOOLKIT_CACHE, else ~/.cache/toolkit."""
    return os.path.abspath(os.path.expanduser(
        os.environ.get("TOOLKIT_CACHE") or os.path.join("~", ".cache", "toolkit")))


# (1-based character position of a word in the text, its first sample): espeak-ng's own
# convention, which the other engines follow when they can time words.
WordOnsets = List[Tuple[int, int]]


class Speech(NamedTuple):
    audio: np.ndarray                    # float32 in [-1, 1], mono
    sample_rate: int
    word_onsets: Optional[WordOnsets]    # None: the engine cannot time words


# Engines that shift pitch map espeak's 0-100 pitch scale (50: the voice's own) onto
# +-PITCH_SEMITONES at 0 and 100; recipes draw 25-75, i.e. within +-2 semitones.
PITCH_SEMITONES = 4.0


def pitch_ratio(pitch: float) -> float:
    """Frequency ratio of `pitch` on the 0-100 scale (1.0 at 50)."""
    return 2.0 ** ((float(pitch) - 50.0) / 50.0 * PITCH_SEMITONES / 12.0)


def word_char_starts(text: str) -> List[int]:
    """1-based character position of each whitespace-separated word (espeak's text_position)."""
    return [m.start() + 1 for m in re.finditer(r"\S+", text)]
