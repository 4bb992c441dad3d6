"""flite, the Debian binary (`apt-get install flite`), one fresh process per clip.

The CLI reports no word onsets, but `-psdur` prints every phone segment with its end
time; `flite_word_onsets` assigns the segments to words by each word's phone count (from
a second run on the words separated by commas, where flite pauses between words) and
gives up, returning None, when the counts do not add up.
"""
import os
import re
import shutil
import subprocess
from typing import List, Optional, Tuple

import numpy as np

from toolkit.voicebank import SynthError, WordOnsets, word_char_starts

INSTALL_HINT = "apt-get install flite"
FLITE_VOICES = ("kal16", "awb", "rms", "slt")
_SEGMENT = re.compile(r"(\S+):(-?[0-9.]+)")
_SILENCE = "pau"


def flite_voices() -> List[str]:
    """FLITE_VOICES that the `flite` on PATH provides; [] when there is no flite."""
    exe = shutil.which("flite")
    if not exe:
        return []
    try:
        res = subprocess.run([exe, "-lv"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return []
    listed = set((res.stdout + res.stderr).replace(":", " ").split())
    return [v for v in FLITE_VOICES if v in listed]


def flite_synth(text: str, voice: str, rate: int, tmp_dir: str
                ) -> Tuple[np.ndarray, int, List[Tuple[str, float]]]:
    """One flite clip (fresh process each time, hence deterministic) and its phone
    segments as (name, end time in seconds); [] when flite prints none. Pitch is not
    varied: flite's f0 targets are per voice and not queryable from the CLI."""
    import soundfile as sf
    path = os.path.join(tmp_dir, "flite.wav")
    # -psdur only prints (the waveform is the same with or without it).
    cmd = ["flite", "-voice", voice, "-psdur", "-t", text, "-o", path,
           "--setf", f"duration_stretch={175.0 / rate:.3f}"]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        raise SynthError(f"flite failed for voice {voice}: {res.stderr.strip()[:200]}")
    audio, sr = sf.read(path, dtype="float32", always_2d=True)
    segments = [(m.group(1), float(m.group(2))) for m in _SEGMENT.finditer(res.stdout)]
    return audio[:, 0], int(sr), segments


def _phone_counts(text: str, voice: str) -> Optional[List[int]]:
    """Phones per word of `text` as flite says them; None when that cannot be told."""
    words = text.split()
    res = subprocess.run(["flite", "-voice", voice, "-ps", "-t", ", ".join(words), "-o", "none"],
                         capture_output=True, text=True)
    if res.returncode != 0:
        return None
    counts, current = [], 0
    for phone in res.stdout.split() + [_SILENCE]:
        if phone != _SILENCE:
            current += 1
        elif current:
            counts.append(current)
            current = 0
    return counts if len(counts) == len(words) else None


def flite_word_onsets(text: str, voice: str, segments: List[Tuple[str, float]],
                      sample_rate: int) -> Optional[WordOnsets]:
    """Word onsets (toolkit.voicebank.WordOnsets) from flite's phone segments: each word starts
    where its first phone starts. None when there are no segments or the words' phone
    counts do not match the utterance's phones (a rule that changed a word in context)."""
    if not segments:
        return None
    phone_starts, previous_end = [], 0.0
    for name, end in segments:
        if name != _SILENCE:
            phone_starts.append(previous_end)
        previous_end = end
    counts = _phone_counts(text, voice)
    if counts is None or sum(counts) != len(phone_starts):
        return None
    onsets, at = [], 0
    for char, count in zip(word_char_starts(text), counts):
        onsets.append((char, int(round(phone_starts[at] * sample_rate))))
        at += count
    return onsets
