"""Festival through Debian's `text2wave`, one fresh process per clip (deterministic: the
same text, voice and rate give the same bytes).

    apt-get install festival festvox-kallpc16k festvox-kdlpc16k festvox-us-slt-hts

Rate is set per clip (the diphone voices' Duration_Stretch, the HTS voice's speed); pitch
is left to the voice. No word onsets: text2wave reports none.
"""
import os
import shutil
import subprocess
from typing import List, Tuple

import numpy as np

from toolkit.voicebank import SynthError

INSTALL_HINT = "apt-get install festival festvox-kallpc16k festvox-kdlpc16k festvox-us-slt-hts"
# voice -> the Debian package that holds it; kal_diphone is festival's default voice.
FESTIVAL_VOICES = {
    "kal_diphone": "festvox-kallpc16k",
    "ked_diphone": "festvox-kdlpc16k",
    "cmu_us_slt_arctic_hts": "festvox-us-slt-hts",
}


def festival_missing() -> str:
    """Why festival cannot speak here ("" when it can)."""
    missing = [exe for exe in ("text2wave", "festival") if not shutil.which(exe)]
    return f"no `{'` or `'.join(missing)}` on PATH" if missing else ""


def festival_voices() -> List[str]:
    """FESTIVAL_VOICES that festival lists (voice.list); [] without festival."""
    if festival_missing():
        return []
    try:
        res = subprocess.run(["festival", "-b", "(print (voice.list))"], capture_output=True,
                             text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return []
    listed = set(res.stdout.replace("(", " ").replace(")", " ").split())
    return [v for v in FESTIVAL_VOICES if v in listed]


def _rate_setting(voice: str, rate: int) -> str:
    """Scheme that sets the speaking rate (words per minute, 175 = the voice's own)."""
    if voice.endswith("_hts"):     # hts_engine's speed factor; Duration_Stretch is ignored
        return f"(set! hts_engine_params (append hts_engine_params '((\"-r\" {rate / 175.0:.3f}))))"
    return f"(Parameter.set 'Duration_Stretch {175.0 / rate:.3f})"


def festival_synth(text: str, voice: str, rate: int, tmp_dir: str) -> Tuple[np.ndarray, int]:
    """One clip at the voice's own sample rate (16 kHz diphones, 32 kHz HTS)."""
    import soundfile as sf
    text_path = os.path.join(tmp_dir, "festival.txt")
    wav_path = os.path.join(tmp_dir, "festival.wav")
    with open(text_path, "w", encoding="utf-8") as f:
        f.write(text + "\n")
    cmd = ["text2wave", "-eval", f"(voice_{voice})", "-eval", _rate_setting(voice, rate),
           "-o", wav_path, text_path]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0 or not os.path.exists(wav_path):
        raise SynthError(f"festival (text2wave) failed for voice {voice}: "
                         f"{(res.stderr or res.stdout).strip()[:200]}")
    audio, sr = sf.read(wav_path, dtype="float32", always_2d=True)
    os.unlink(wav_path)
    return audio[:, 0], int(sr)
