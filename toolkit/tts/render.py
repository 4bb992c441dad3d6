"""Turning planned utterances into audio, for any corpus made of TTS speech: an engine
front end that speaks at the corpus rate (engines made on first use, in the process that
renders), and the placement of that speech at a level, between silences, in noise.

Both belong in a forked renderer child (toolkit.tts.pool): espeak-ng keeps state."""
import math
from typing import Dict, Optional, Sequence

import numpy as np

from toolkit.data.audio import resample
from toolkit.tts import Voice
from toolkit.tts.engines import ENGINES, Engine
from toolkit.tts.signal import active_power, babble_noise, colored_noise, mix_at_snr, \
    trim_silence, to_int16

NOISE_TYPES = ("white", "pink", "brown", "babble")


class Renderer:
    """Speaks text with any registered engine, resampled to `sample_rate` and without the
    engine's own leading and trailing silence."""

    def __init__(self, sample_rate: int, tmp_dir: str, espeak_data: Optional[str] = None):
        self.sample_rate = sample_rate
        self.tmp_dir = tmp_dir
        self._options = {"espeak": {"data_path": espeak_data}}
        self._engines: Dict[str, Engine] = {}

    def engine(self, name: str) -> Engine:
        if name not in self._engines:
            self._engines[name] = ENGINES.get(name)(self.tmp_dir, **self._options.get(name, {}))
        return self._engines[name]

    def speak(self, text: str, voice: Voice, rate: int = 175, pitch: int = 50,
              prange: int = 50, seed: int = 0) -> np.ndarray:
        speech = self.engine(voice.engine).synth(text, voice, rate, pitch, prange, seed,
                                                 time_words=False)
        return trim_silence(resample(speech.audio, speech.sample_rate, self.sample_rate))


def place_in_noise(speech: np.ndarray, rng: np.random.Generator, sample_rate: int,
                   level_db: float, noise: str, snr_db: float, lead_s: float, trail_s: float,
                   babble_pool: Sequence[np.ndarray] = ()) -> np.ndarray:
    """`speech` at an active level of `level_db` dBFS, after `lead_s` and before `trail_s`
    seconds of silence, in `noise` (white, pink, brown, or babble of `babble_pool`) at
    `snr_db` over the whole clip -> int16."""
    lead, trail = int(round(lead_s * sample_rate)), int(round(trail_s * sample_rate))
    level = 10 ** (level_db / 20)
    clean = np.zeros(lead + len(speech) + trail, np.float32)
    clean[lead:lead + len(speech)] = speech / (math.sqrt(active_power(speech)) + 1e-12) * level
    if noise == "babble":
        background = babble_noise(len(clean), babble_pool, rng)
    else:
        background = colored_noise(len(clean), noise, rng, sample_rate)
    mixed, _ = mix_at_snr(clean, background, snr_db)
    return to_int16(mixed)
