"""Text-to-speech engines for recipes that make their own speech (keyword spotting,
speaker verification from TTS voices, codecs that need many voices).

Modules: `engines` (the registry: name -> engine with available/voices/synth), `espeak`
(libespeak-ng through ctypes, procedural voices), `flite` and `festival` (Debian binaries),
`signal` (noise, levels, SNR mixing), `pool` (deterministic rendering in forked children).
This package knows nothing about any task; the shared vocabulary is defined here.
"""
import re
from dataclasses import dataclass
from typing import List, NamedTuple, Optional, Tuple

import numpy as np

from toolkit.errors import UserError


class SynthError(UserError, RuntimeError):
    """A problem the user can fix (bad argument, TTS missing); its message says which."""


@dataclass(frozen=True)
class Voice:
    spk: str          # speaker id, e.g. en-us_f3 (recipes use it as utterance-key prefix)
    engine: str       # name in toolkit.tts.engines.ENGINES: espeak | flite | festival
    name: str         # the engine's own voice name, e.g. en-us+f3
    variant: Optional[str] = None   # espeak variant file text of a procedural voice


# (1-based character position of a word in the text, its first sample): espeak-ng's own
# convention, which the other engines follow when they can time words.
WordOnsets = List[Tuple[int, int]]


class Speech(NamedTuple):
    audio: np.ndarray                    # float32 in [-1, 1], mono
    sample_rate: int
    word_onsets: Optional[WordOnsets]    # None: the engine cannot time words


def word_char_starts(text: str) -> List[int]:
    """1-based character position of each whitespace-separated word (espeak's text_position)."""
    return [m.start() + 1 for m in re.finditer(r"\S+", text)]
