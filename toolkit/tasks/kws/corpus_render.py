"""Rendering the planned utterances of the synthetic wake-word corpus
(toolkit.tasks.kws.corpus) in forked children: each utterance's speech, the keyword's span
in a positive (kw_times), the speech placed in noise, a whole group written as WAVs, and
the whole corpus into its directory, its general negatives from the negatives cache when
asked (toolkit.tasks.kws.negatives)."""
import logging
import os
from typing import Collection, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from toolkit.entry_cache import Entry
from toolkit.tasks.kws.negatives import (CACHE_ENV, cache_root, cached_negatives, is_general,
                                         link_negatives)
from toolkit.voicebank import SynthError, word_char_starts
from toolkit.voicebank.corpus_dir import CorpusDir, Group
from toolkit.voicebank.render import Clip, Renderer, noise_clip, place_in_noise
from toolkit.voicebank.signal import samples

logger = logging.getLogger(__name__)
ENTRY_STAMP = ".negatives"      # a cache entry is rendered as a CorpusDir without a stamp


def keyword_span(text: str, word_range: Tuple[int, int], word_starts: Sequence[Tuple[int, int]],
                 rate_in: int, rate_out: int, bounds: Tuple[int, int]) -> Optional[Tuple[float, float]]:
    """(start, end) seconds of words [a, b) of `text` in the trimmed output audio: from
    the first word's onset to the next word's onset (or the end of speech). None when
    the TTS did not report those onsets (espeak-ng reports none for some function words,
    e.g. "the" in "turn on the lights")."""
    starts = dict(word_starts)
    chars = word_char_starts(text)
    a, b = word_range
    if chars[a] not in starts or (b < len(chars) and chars[b] not in starts):
        return None
    to_out = lambda sample: sample * rate_out / rate_in - bounds[0]
    length = bounds[1] - bounds[0]
    start = min(max(to_out(starts[chars[a]]), 0.0), length)
    end = length if b >= len(chars) else min(max(to_out(starts[chars[b]]), start), length)
    return start / rate_out, end / rate_out


def speak(tts: Renderer, spec, seed: int
          ) -> Tuple[np.ndarray, Optional[Tuple[float, float]]]:
    """Trimmed speech, and for positives the keyword's (start, end) seconds in it: from
    the engine's word onsets, or the whole speech when the text is the keyword alone
    and the engine times no words; None when neither applies."""
    clip: Clip = tts.utterance(spec.utt, spec.text, spec.voice, spec.rate, spec.pitch,
                               spec.prange, seed, time_words=spec.kw_words is not None)
    span = None
    if spec.kw_words is not None:
        if clip.word_onsets:
            span = keyword_span(spec.text, spec.kw_words, clip.word_onsets, clip.engine_rate,
                                tts.sample_rate, clip.bounds)
        elif clip.word_onsets is None and spec.kw_words == (0, len(spec.text.split())):
            span = (0.0, len(clip.audio) / tts.sample_rate)
    return clip.audio, span


def render_utterance(spec, speech: Optional[np.ndarray], rng: np.random.Generator,
                     babble_pool: Sequence[np.ndarray], sr: int) -> np.ndarray:
    """Speech at its level, padded with silence, in noise at the spec's SNR -> int16; a
    noise-only utterance (`speech` None) is its noise alone at its level."""
    if speech is None:
        return noise_clip(rng, sr, spec.level_db, spec.noise, spec.noise_s, babble_pool)
    return place_in_noise(speech, rng, sr, spec.level_db, spec.noise, spec.snr_db, spec.lead_s,
                          spec.trail_s, babble_pool)


def render_group(group: Group, tts: Renderer, rng: np.random.Generator, wav_dir: str,
                 skip: Collection[str] = ()) -> List[Tuple[str, int, Optional[Tuple[float, float]]]]:
    """Child body: babble pool first, then every utterance; writes WAVs (but those of the
    utterances in `skip`, rendered all the same: the generator's draws stay those of the
    whole group), returns (utterance, samples, keyword span in seconds or None)."""
    import soundfile as sf
    sr = tts.sample_rate
    pool = [tts.clip(b.text, b.voice, b.rate, b.pitch, b.prange, int(rng.integers(2 ** 31))).audio
            for b in group.babble]
    out = []
    for spec in group.specs:
        tts_seed = int(rng.integers(2 ** 31))
        speech, span = (None, None) if spec.kind == "noise" else speak(tts, spec, tts_seed)
        audio = render_utterance(spec, speech, rng, pool, sr)
        if spec.utt not in skip:
            sf.write(os.path.join(wav_dir, spec.utt + ".wav"), audio, sr, subtype="PCM_16")
        if span is not None:
            lead = samples(spec.lead_s, sr) / sr      # as place_in_noise pads
            span = (lead + span[0], lead + span[1])
        out.append((spec.utt, len(audio), span))
    return out


def render_corpus(out: CorpusDir, groups: Sequence[Group], dropped: Mapping[str, str],
                  stamp: dict, nj: int, tmp_dir: str, sample_rate: int, splits: Sequence[str],
                  neg_cache: bool) -> Tuple[Dict[str, int], Dict[str, Tuple[float, float]],
                                            Optional[Entry]]:
    """Renders `groups` into `out`: (utt -> samples, utt -> keyword span, the negatives
    cache entry used or None). Without the cache every group is rendered there, the
    `dropped` negatives unwritten; with it, the general negatives come from the cache
    (rendered into an entry first when it has none) and only the keyword's own groups are
    rendered. Either way the same bytes: each group renders in a fresh child from its seed."""
    def render(target: CorpusDir, todo: Sequence[Group], skip: Collection[str] = ()):
        wanted = sorted({g.split for g in todo} | set(splits if target is out else ()))
        return target.render(todo, lambda g, tts, rng: render_group(
            g, tts, rng, target.wav_dir(g.split), skip), nj, tmp_dir, sample_rate,
            [d for d in wanted if not os.path.isdir(target.wav_dir(d))])

    entry, lengths = None, {}
    if neg_cache and any(is_general(g) for g in groups):
        def build(todo: Sequence[Group], folder: str):
            return [r for res in render(CorpusDir(folder, ENTRY_STAMP, ()), todo) for r in res]
        for split in splits:
            os.makedirs(out.wav_dir(split), exist_ok=True)
        try:
            with cached_negatives(stamp, groups, build) as (entry, lengths):
                n = link_negatives(entry, groups, dropped, out.wav_dir)
        except OSError as err:
            raise SynthError(f"the negatives cache {cache_root()}: {err}; set {CACHE_ENV} to a "
                             "writable directory, or do without it (run.sh --neg-cache false)"
                             ) from None
        logger.info("%d general negatives from %s (%s)", n, entry.path,
                    "built now" if entry.built else "cached")
        results = render(out, [g for g in groups if not is_general(g)])
    else:
        results = render(out, groups, frozenset(dropped))
    lengths = {**lengths, **{utt: n for res in results for utt, n, _ in res}}
    spans = {utt: span for res in results for utt, _, span in res if span is not None}
    return lengths, spans, entry
