"""Turning planned utterances into audio, for any corpus made of TTS speech: an engine
front end that speaks at the corpus rate (engines made on first use, in the process that
renders), and the placement of that speech at a level, between silences, in noise.

Both belong in a forked renderer child (toolkit.voicebank.pool): espeak-ng keeps state.
Every corpus generator speaks through `Renderer.clip`, the one place engines are called."""
from typing import Dict, NamedTuple, Optional, Sequence, Tuple

import numpy as np

from toolkit.data.audio import resample
from toolkit.voicebank import SynthError, Voice, WordOnsets
from toolkit.voicebank.engines import ENGINES, Engine
from toolkit.voicebank.signal import background_noise, mix_at_snr, place_at_level, samples, \
    speech_bounds, to_int16


class Clip(NamedTuple):
    audio: np.ndarray                   # at the corpus rate, without the engine's own silence
    bounds: Tuple[int, int]             # where `audio` lies in the resampled engine output
    word_onsets: Optional[WordOnsets]   # the engine's, in its own samples; None: untimed
    engine_rate: int


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

    def clip(self, text: str, voice: Voice, rate: int = 175, pitch: int = 50,
             prange: int = 50, seed: int = 0, time_words: bool = False) -> Clip:
        """`time_words`: ask for word onsets (some engines spend extra work on them)."""
        speech = self.engine(voice.engine).synth(text, voice, rate, pitch, prange, seed,
                                                 time_words=time_words)
        audio = resample(speech.audio, speech.sample_rate, self.sample_rate)
        bounds = speech_bounds(audio)
        return Clip(audio[bounds[0]:bounds[1]], bounds, speech.word_onsets, speech.sample_rate)

    def utterance(self, utt: str, text: str, voice: Voice, rate: int = 175, pitch: int = 50,
                  prange: int = 50, seed: int = 0, time_words: bool = False) -> Clip:
        """clip() of a corpus utterance: SynthError naming it when the engine says nothing."""
        clip = self.clip(text, voice, rate, pitch, prange, seed, time_words)
        if len(clip.audio) == 0:
            raise SynthError(f"{utt}: {voice.engine} voice {voice.name} produced no audio "
                             f"for {text!r}")
        return clip


def place_in_noise(speech: np.ndarray, rng: np.random.Generator, sample_rate: int,
                   level_db: float, noise: str, snr_db: float, lead_s: float, trail_s: float,
                   babble_pool: Sequence[np.ndarray] = ()) -> np.ndarray:
    """`speech` at an active level of `level_db` dBFS, after `lead_s` and before `trail_s`
    seconds of silence, in `noise` (white, pink, brown, or babble of `babble_pool`) at
    `snr_db` over the whole clip -> int16."""
    clean = place_at_level(speech, sample_rate, level_db, lead_s, trail_s)
    background = background_noise(len(clean), noise, rng, sample_rate, babble_pool)
    mixed, _ = mix_at_snr(clean, background, snr_db)
    return to_int16(mixed)


def noise_clip(rng: np.random.Generator, sample_rate: int, level_db: float, noise: str,
               duration_s: float, babble_pool: Sequence[np.ndarray] = ()) -> np.ndarray:
    """`duration_s` seconds (one sample at least) of `noise` at an RMS of `level_db`
    dBFS, no speech -> int16."""
    n = max(1, samples(duration_s, sample_rate))
    return to_int16(background_noise(n, noise, rng, sample_rate, babble_pool) *
                    10 ** (level_db / 20))
