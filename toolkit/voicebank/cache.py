"""Synthesized clips kept across runs and recipes: a clip is stored under a key made of
everything that decides its samples (engine, the engine's package versions, the voice
with its blend weights or variant file, text, and the arguments the engine uses), so a
rerun, another stage or another recipe that asks for the same clip gets it back without
synthesizing, sample for sample and with the same word onsets.

Where: $TOOLKIT_TTS_CACHE, else <toolkit cache>/tts_clips ($TOOLKIT_CACHE or
~/.cache/toolkit); TOOLKIT_TTS_CACHE=off turns it off. Engines opt in with
`Engine.cache_clips` (Kokoro and the Debian engines; espeak-ng at ~1 ms a clip does not).
Nothing is evicted: delete the directory to reclaim the space (about 40 KB a second of
24 kHz audio, compressed).

Files are written to a private temporary name and renamed into place, so forked
renderers that make the same clip at once each leave a whole file and readers never see
a partial one. A file whose stored key differs is a miss; so is a damaged one (cut
short, bytes changed on disk: a broken zip, deflate stream or array), with a warning
naming it. Either is replaced, atomically, by the clip synthesized again.
"""
import hashlib
import json
import logging
import os
import tempfile
from typing import Any, Dict, Optional

import numpy as np

from toolkit.voicebank import Speech, Voice, toolkit_cache_dir

logger = logging.getLogger(__name__)

CACHE_ENV = "TOOLKIT_TTS_CACHE"
OFF = ("off", "0", "no", "false")
FORMAT = 1        # bump when the stored form changes: old clips then miss


def cache_root() -> Optional[str]:
    """The clip directory, or None when the cache is turned off."""
    value = os.environ.get(CACHE_ENV, "").strip()
    if value.lower() in OFF:
        return None
    return os.path.abspath(os.path.expanduser(value)) if value else \
        os.path.join(toolkit_cache_dir(), "tts_clips")


def clip_key(engine: str, fingerprint: str, voice: Voice, text: str,
             args: Dict[str, Any]) -> str:
    """The canonical text of a clip's key: what identifies its samples."""
    return json.dumps({"format": FORMAT, "engine": engine, "fingerprint": fingerprint,
                       "voice": voice.identity(), "text": text, "args": args},
                      sort_keys=True, ensure_ascii=False, separators=(",", ":"))


class ClipCache:
    def __init__(self, root: str):
        self.root = root
        self.hits = 0
        self.misses = 0

    def path(self, key: str, engine: str) -> str:
        digest = hashlib.sha256(key.encode()).hexdigest()
        return os.path.join(self.root, engine, digest[:2], digest + ".npz")

    def load(self, key: str, engine: str) -> Optional[Speech]:
        """The stored clip of `key`; None (a miss) when there is none, when it is another
        key's, or when the file is damaged (logged)."""
        path = self.path(key, engine)
        try:
            speech = _read_clip(path, key)
        except FileNotFoundError:
            return None
        # Whatever a damaged file makes numpy or zipfile raise (zlib.error, BadZipFile,
        # ValueError, EOFError, ...), a cache must only ever cost the saving.
        except Exception as err:
            logger.warning("clip cache: %s is damaged (%s: %s); synthesizing the clip again",
                           path, type(err).__name__, err)
            return None
        if speech is None:
            return None
        self.hits += 1
        return speech

    def store(self, key: str, engine: str, speech: Speech) -> None:
        """Best effort: a full disk or a read-only cache only loses the saving."""
        self.misses += 1
        audio = np.asarray(speech.audio, np.float32)
        as_int = np.round(audio * 32768.0)
        # 16-bit engines' float samples are exactly k / 32768: stored as int16, losslessly.
        if np.all(np.abs(as_int) <= 32767) and np.array_equal(as_int / 32768.0, audio):
            stored = as_int.astype(np.int16)
        else:
            stored = audio
        onsets = np.asarray(speech.word_onsets or [], np.int64).reshape(-1, 2)
        path = self.path(key, engine)
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".clip-", suffix=".tmp",
                                       dir=os.path.dirname(path))
            try:
                with os.fdopen(fd, "wb") as f:
                    np.savez_compressed(f, key=np.array(key), audio=stored,
                                        sample_rate=np.int64(speech.sample_rate),
                                        onsets=onsets,
                                        timed=np.bool_(speech.word_onsets is not None))
                os.replace(tmp, path)
            finally:
                if os.path.exists(tmp):
                    os.unlink(tmp)
        except OSError:
            pass


def _read_clip(path: str, key: str) -> Optional[Speech]:
    """The clip stored at `path`, None when it is another key's; raises on a damaged or
    inconsistent file."""
    with np.load(path, allow_pickle=False) as z:
        if str(z["key"]) != key:
            return None
        audio = z["audio"]
        onsets = np.asarray(z["onsets"])
        sample_rate = int(z["sample_rate"])
        timed = bool(z["timed"])
    if audio.ndim != 1 or audio.dtype not in (np.int16, np.float32) or sample_rate <= 0 \
            or onsets.ndim != 2 or onsets.shape[1] != 2:
        raise ValueError(f"inconsistent arrays (audio {audio.dtype} {audio.shape}, sample rate "
                         f"{sample_rate}, onsets {onsets.shape})")
    if audio.dtype == np.int16:
        audio = audio.astype(np.float32) / 32768.0
    return Speech(audio, sample_rate, [(int(c), int(s)) for c, s in onsets] if timed else None)


_caches: Dict[str, ClipCache] = {}


def clip_cache() -> Optional[ClipCache]:
    """This process's cache for the configured root (None when turned off)."""
    root = cache_root()
    if root is None:
        return None
    if root not in _caches:
        _caches[root] = ClipCache(root)
    return _caches[root]
