"""Two more wake-word peers for oww_compare.py, with the interface of its OwwSystem: `name`,
`feature` (the key its features are cached under), `extractor.compute(audio)` (float32 at
16 kHz -> what `scores` reads), `scores(feats)` -> (n, 1) float32 in [0, 1] and
`frame_end_s(n)` (each score's end in seconds of the clip given to `compute`).

  MicroWakeWordSystem: microWakeWord's builtin streaming models (pymicro-wakeword 2.5.0,
    Apache-2.0: TFLite models by Kevin Ahrendt, its own libtensorflowlite_c) on its
    micro-frontend features (pymicro-features, Apache-2.0). One score per model step: the
    package's streaming probability, the mean of the last 5 outputs.
  PocketSphinxSystem: CMU PocketSphinx 5.1.1 (BSD) keyphrase spotting with its bundled en-us
    acoustic model and dictionary. One score per candidate detection, at its end.

Both load their models on first use (in oww_compare's scoring workers) and run on the
calling thread only. `bash tools/install_kws_peers.sh` installs them.
"""
import math
from typing import Dict, Optional

import numpy as np

RATE = 16000
INSTALL = "bash tools/install_kws_peers.sh"


def pcm16(audio: np.ndarray) -> np.ndarray:
    """float samples in [-1, 1] -> int16, as both packages read 16-bit PCM."""
    return np.clip(np.round(np.asarray(audio, np.float64) * 32768.0), -32768, 32767
                   ).astype(np.int16)


def missing(module: str) -> str:
    """Why `module` (pymicro_wakeword or pocketsphinx) cannot be used here, "" if it can."""
    import importlib
    try:
        importlib.import_module(module)
    except ImportError as err:
        return f"{module} is not installed ({err}): {INSTALL}"
    return ""


# ----------------------------------------------------------------------------- microWakeWord

MWW_MODELS = {"hey jarvis": "hey_jarvis", "alexa": "alexa"}
# The micro frontend: a 30 ms window every 10 ms; feature k ends at 30 + 10 k ms.
MWW_WINDOW_S, MWW_SHIFT_S = 0.030, 0.010


class MicroFeatures:
    """float audio -> (F, 40) micro-frontend features. A new front end per clip: it adapts
    its noise estimate as it goes, so one shared across clips would carry state."""

    def compute(self, audio: np.ndarray) -> np.ndarray:
        from pymicro_wakeword import MicroWakeWordFeatures
        frames = list(MicroWakeWordFeatures().process_streaming(pcm16(audio).tobytes()))
        if not frames:
            return np.zeros((0, 40))
        return np.concatenate([f.reshape(1, -1) for f in frames])


class MicroWakeWordSystem:
    feature = {"type": "micro_wakeword"}

    def __init__(self, keyword: str):
        if keyword not in MWW_MODELS:
            raise ValueError(f"microWakeWord has no builtin model for {keyword!r}; "
                             f"known: {', '.join(MWW_MODELS)}")
        self.keyword = keyword
        self.name = self.title(keyword)
        self.extractor = MicroFeatures()
        self._model = None

    @staticmethod
    def title(keyword: str) -> str:
        return f"microWakeWord {MWW_MODELS[keyword]}.tflite"

    def model(self):
        if self._model is None:
            from pymicro_wakeword import MicroWakeWord, Model
            # Created without interpreter options: TFLite then runs on the calling thread
            # (measured: no thread is started).
            self._model = MicroWakeWord.from_builtin(Model(MWW_MODELS[self.keyword]))
        return self._model

    def frame_end_s(self, n: int) -> np.ndarray:
        """Step j (from 0) reads features j stride .. (j + 1) stride - 1 and ends with the
        last of them."""
        stride = self.model().stride
        return MWW_WINDOW_S + MWW_SHIFT_S * ((np.arange(n) + 1) * stride - 1)

    def scores(self, feats: np.ndarray) -> np.ndarray:
        model = self.model()
        model.reset()               # reloads the interpreter: no streaming state from the last clip
        out = []
        for i, row in enumerate(feats):
            prob = model.process_streaming_prob(row.reshape(1, 1, -1))
            # It returns 0.0 between steps too: only every stride-th feature runs the model.
            if (i + 1) % model.stride == 0:
                out.append(prob)
        return np.asarray(out, np.float32).reshape(-1, 1)


# ----------------------------------------------------------------------------- PocketSphinx

# The decoder's candidate filter: a keyphrase is reported where its path beats the phone
# loop's by `kws_threshold`; 1e-100 reports every candidate (on 120 espeak-ng clips padded
# as oww_compare pads them, 1e-300 reported the same ones, 1e-40 a quarter fewer).
PS_THRESHOLD = 1e-100
# The phone loop's per-phone probability. At the default 0.1 the loop outscores the
# keyphrase almost everywhere on espeak-ng speech: a candidate in 1 of 12 voices' "hey
# jarvis" (6 of 12 "alexa"), whatever the threshold. At 1e-20 every keyword clip has one;
# unrelated sentences have none in 34 of 48 clips for "hey jarvis", 3 of 48 for "alexa".
# (1e-40 adds candidates; AUC of clip peaks, keyword vs other: 0.988 / 0.800 against 0.981 /
# 0.837 at 1e-20.)
PS_PHONE_LOOP = 1e-20
# Score = 1 / (1 + exp(-(ln(prob) - C) / S)), ln(prob) being the detection's keyphrase vs
# phone loop log score (`Segment.prob` is its exp, above 1 for strong detections; the
# decoder counts in units of ln(1.0001) = 1e-4). On those 120 clips ln(prob) spans -0.28
# (candidates in unrelated speech) to +0.05 (up to +0.16 with kws_plp 1e-40): C and S map
# that to 0.037 .. 0.994, where one decoder unit moves the score by >= 1e-5, far above
# float32's spacing, so distinct log scores stay distinct.
PS_CENTER, PS_SCALE = -0.15, 0.04
# Frames: 10 ms shift, 25.625 ms window (the decoder's -frate and -wlen defaults).
PS_SHIFT, PS_WINDOW = 160, 410


class Pcm16:
    """The decoder reads the clip itself: float audio -> int16 samples."""

    def compute(self, audio: np.ndarray) -> np.ndarray:
        return pcm16(audio)


class PocketSphinxSystem:
    feature = {"type": "pcm16"}

    def __init__(self, keyword: str):
        self.keyword = keyword.lower()
        self.name = self.title(keyword)
        self.extractor = Pcm16()
        self._decoder = None
        self._ends = np.zeros(0)

    @staticmethod
    def title(keyword: str) -> str:
        return f"PocketSphinx keyphrase search ({keyword.lower()!r})"

    def decoder(self):
        if self._decoder is None:
            from pocketsphinx import Decoder
            # lm=None: keyphrase search only (not the bundled trigram LM).
            decoder = Decoder(lm=None, keyphrase=self.keyword, kws_threshold=PS_THRESHOLD,
                              kws_plp=PS_PHONE_LOOP, loglevel="ERROR")
            # An unknown word only logs an error and the search never fires: say so instead.
            unknown = [w for w in self.keyword.split() if decoder.lookup_word(w) is None]
            if unknown:
                raise ValueError(f"PocketSphinx's dictionary has no {unknown} (keyphrase "
                                 f"{self.keyword!r}); it cannot spot it")
            self._decoder = decoder
        return self._decoder

    def frame_end_s(self, n: int) -> np.ndarray:
        """The end times of the last `scores` call's frames (they depend on the clip)."""
        if len(self._ends) != n:
            raise ValueError(f"frame_end_s({n}) after scores() of {len(self._ends)} frames")
        return self._ends

    def scores(self, pcm: np.ndarray) -> np.ndarray:
        """One frame per distinct detection end (the best there), and a frame of 0 at the
        clip's end unless a detection ends there: every clip keeps a frame, and one with no
        detection scores 0."""
        decoder = self.decoder()
        # The front end adapts across utterances (CMN, noise removal): without this reset a
        # clip's scores depended on the clip before it.
        decoder.reinit_feat()
        decoder.start_utt()
        if len(pcm):
            decoder.process_raw(np.ascontiguousarray(pcm, np.int16).tobytes(), full_utt=True)
        decoder.end_utt()
        duration = len(pcm) / RATE
        best: Dict[float, float] = {}
        for seg in decoder.seg() or ():
            end = min(len(pcm), seg.end_frame * PS_SHIFT + PS_WINDOW) / RATE
            score = self.map_score(seg.prob)
            best[end] = max(best.get(end, 0.0), score)
        best.setdefault(duration, 0.0)
        ends = sorted(best)
        self._ends = np.asarray(ends, np.float64)
        return np.asarray([best[e] for e in ends], np.float32).reshape(-1, 1)

    @staticmethod
    def map_score(prob: Optional[float]) -> float:
        if not prob or prob <= 0:
            return 0.0
        z = (math.log(prob) - PS_CENTER) / PS_SCALE
        return 1.0 / (1.0 + math.exp(-z)) if z >= 0 else math.exp(z) / (1.0 + math.exp(z))
