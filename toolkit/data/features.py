"""Feature extraction, selected by `dataset.feature.type` from the FEATURES registry:

- `fbank` (default): Kaldi-compatible log-mel filterbank through kaldi-native-fbank (the
  same code the deployment runtimes use, so training and inference features agree);
- `speech_embedding`: openWakeWord's frozen speech front end (its melspectrogram.onnx and
  embedding_model.onnx, run with ONNX Runtime), one 96-d embedding every 80 ms. Opt-in:
  `pip install --no-deps openwakeword==0.5.1`; its models are CC BY-NC-SA 4.0 and are
  never copied into anything this toolkit writes.

Every type computes whole utterances (`compute`) and streams (`streaming().accept`) with
the same results, and describes itself in exported models (`metadata`), from which a
runtime rebuilds it (`extractor_from_metadata`)."""
import hashlib
import importlib.util
import os
from typing import Dict, Optional

import numpy as np
import kaldi_native_fbank as knf

from toolkit.errors import DataError, MissingInputError
from toolkit.registry import Registry

FEATURES: Registry = Registry("feature type")


def fbank_options(num_mel_bins: int = 40, frame_length_ms: float = 25.0,
                  frame_shift_ms: float = 10.0, dither: float = 0.0,
                  sample_rate: int = 16000) -> "knf.FbankOptions":
    opts = knf.FbankOptions()
    opts.frame_opts.samp_freq = float(sample_rate)
    opts.frame_opts.frame_length_ms = float(frame_length_ms)
    opts.frame_opts.frame_shift_ms = float(frame_shift_ms)
    opts.frame_opts.dither = float(dither)
    opts.frame_opts.snip_edges = True
    opts.mel_opts.num_bins = int(num_mel_bins)
    return opts


def options_from_config(feature_cfg, sample_rate: int) -> "knf.FbankOptions":
    return fbank_options(feature_cfg.num_mel_bins, feature_cfg.frame_length_ms,
                         feature_cfg.frame_shift_ms, feature_cfg.dither, sample_rate)


def compute_fbank(wave: np.ndarray, opts: "knf.FbankOptions") -> np.ndarray:
    """wave: float samples in [-1, 1] -> (frames, bins) float32. Kaldi expects int16 scale."""
    extractor = knf.OnlineFbank(opts)
    extractor.accept_waveform(opts.frame_opts.samp_freq, (wave * 32768.0).astype(np.float32))
    extractor.input_finished()
    n = extractor.num_frames_ready
    if n == 0:
        return np.zeros((0, opts.mel_opts.num_bins), dtype=np.float32)
    return np.stack([extractor.get_frame(i) for i in range(n)]).astype(np.float32, copy=False)


def num_frames(num_samples: int, opts_or_rate, frame_length_ms: float = 25.0,
               frame_shift_ms: float = 10.0) -> int:
    """Frame count with snip_edges=True, for planning batches from durations."""
    if isinstance(opts_or_rate, knf.FbankOptions):
        rate = opts_or_rate.frame_opts.samp_freq
        frame_length_ms = opts_or_rate.frame_opts.frame_length_ms
        frame_shift_ms = opts_or_rate.frame_opts.frame_shift_ms
    else:
        rate = opts_or_rate
    win = int(rate * frame_length_ms / 1000)
    hop = int(rate * frame_shift_ms / 1000)
    if num_samples < win:
        return 0
    return 1 + (num_samples - win) // hop


def fbank_metadata(opts: "knf.FbankOptions") -> dict:
    """What a runtime needs to reproduce the features (stored in exported models)."""
    return {
        "type": "kaldi_fbank",
        "sample_rate": int(opts.frame_opts.samp_freq),
        "num_mel_bins": int(opts.mel_opts.num_bins),
        "frame_length_ms": float(opts.frame_opts.frame_length_ms),
        "frame_shift_ms": float(opts.frame_opts.frame_shift_ms),
        "dither": float(opts.frame_opts.dither),
        "window_type": str(opts.frame_opts.window_type),
        "snip_edges": bool(opts.frame_opts.snip_edges),
        "input_scale": 32768.0,
    }


# ----------------------------------------------------------------------------- registry

# The field of a precomputed entry (toolkit.bin.compute_feats) recording the model its
# features came from, for feature types computed by one (FeatureExtractor.stored_tag).
STORED_TAG = "feat_frontend"


class FeatureExtractor:
    """One feature type. Subclasses set the class attributes and implement the methods."""
    metadata_type = ""     # `type` in exported metadata
    mel_bins = False       # features are mel bins along frequency (VTLP, voice perturbation)
    dim: int
    sample_rate: int
    frame_shift_ms: float

    @classmethod
    def check_config(cls, dataset_cfg) -> Optional[str]:
        """What is wrong with this type under `dataset_cfg` (a message), or None."""
        return None

    @classmethod
    def from_config(cls, feature_cfg, sample_rate: int) -> "FeatureExtractor":
        raise NotImplementedError

    @classmethod
    def from_metadata(cls, meta: dict, **paths) -> "FeatureExtractor":
        raise NotImplementedError

    @classmethod
    def config_fields(cls, meta: dict, **paths) -> dict:
        """FeatureConfig fields reproducing exported `meta` (compute_posteriors)."""
        raise NotImplementedError

    def compute(self, wave: np.ndarray) -> np.ndarray:
        """Float samples in [-1, 1] of a whole utterance -> (frames, dim) float32."""
        raise NotImplementedError

    def frames_for_samples(self, num_samples: np.ndarray) -> np.ndarray:
        """Frame count of each sample count (batch planning)."""
        raise NotImplementedError

    def frame_end_times(self, num_frames: int) -> Optional[np.ndarray]:
        """Where each frame's input ends, in seconds from the utterance start; None for a
        type whose keyword end frame keeps the fraction-of-duration rule (fbank)."""
        return None

    def metadata(self) -> dict:
        raise NotImplementedError

    def streaming(self):
        """A fresh streaming extractor: accept(samples) -> the frames completed by them."""
        raise NotImplementedError

    def stored_tag(self) -> Optional[dict]:
        """What a precomputed entry records of the model that made its features (a type
        computed by a model file), checked by `check_stored` on reading; None: nothing."""
        return None

    def check_stored(self, entry: dict, where: str = "") -> None:
        """Raises DataError when precomputed `entry` was made by another model."""


def build_extractor(feature_cfg, sample_rate: int) -> FeatureExtractor:
    return FEATURES.get(getattr(feature_cfg, "type", "fbank")).from_config(feature_cfg,
                                                                          sample_rate)


def extractor_class_for_metadata(meta: dict):
    kind = meta.get("type", "kaldi_fbank")
    for name in FEATURES.names():
        cls = FEATURES.get(name)
        if cls.metadata_type == kind:
            return cls
    raise DataError(f"exported model needs feature type {kind!r}, which this toolkit does "
                    f"not know (known: {', '.join(FEATURES.names())})")


def extractor_from_metadata(meta: dict, **paths) -> FeatureExtractor:
    return extractor_class_for_metadata(meta).from_metadata(meta, **paths)


def streaming_extractor(meta: dict, **paths):
    """The streaming extractor an exported model's `feature` metadata asks for."""
    return extractor_from_metadata(meta, **paths).streaming()


# ----------------------------------------------------------------------------- fbank

class StreamingFbank:
    """kaldi-native-fbank online extractor built from exported feature metadata."""

    def __init__(self, feature: dict):
        self.feature = feature
        self.opts = fbank_options(feature["num_mel_bins"], feature["frame_length_ms"],
                                  feature["frame_shift_ms"], feature.get("dither", 0.0),
                                  feature["sample_rate"])
        self.scale = float(feature.get("input_scale", 32768.0))
        self.reset()

    def reset(self) -> None:
        self.extractor = knf.OnlineFbank(self.opts)
        self.consumed = 0

    def accept(self, samples: np.ndarray) -> np.ndarray:
        self.extractor.accept_waveform(self.opts.frame_opts.samp_freq,
                                       (samples * self.scale).astype(np.float32))
        ready = self.extractor.num_frames_ready
        frames = [self.extractor.get_frame(i) for i in range(self.consumed, ready)]
        self.consumed = ready
        if not frames:
            return np.zeros((0, self.opts.mel_opts.num_bins), dtype=np.float32)
        return np.asarray(frames, dtype=np.float32)


@FEATURES.register("fbank")
class FbankFeatures(FeatureExtractor):
    metadata_type = "kaldi_fbank"
    mel_bins = True

    def __init__(self, opts: "knf.FbankOptions"):
        self.opts = opts
        self.dim = int(opts.mel_opts.num_bins)
        self.sample_rate = int(opts.frame_opts.samp_freq)
        self.frame_shift_ms = float(opts.frame_opts.frame_shift_ms)

    @classmethod
    def from_config(cls, feature_cfg, sample_rate: int) -> "FbankFeatures":
        return cls(options_from_config(feature_cfg, sample_rate))

    @classmethod
    def from_metadata(cls, meta: dict, **paths) -> "FbankFeatures":
        return cls(fbank_options(meta["num_mel_bins"], meta["frame_length_ms"],
                                 meta["frame_shift_ms"], meta.get("dither", 0.0),
                                 meta["sample_rate"]))

    @classmethod
    def config_fields(cls, meta: dict, **paths) -> dict:
        return {"num_mel_bins": int(meta["num_mel_bins"]),
                "frame_length_ms": float(meta["frame_length_ms"]),
                "frame_shift_ms": float(meta["frame_shift_ms"]),
                "dither": float(meta.get("dither", 0.0))}

    def compute(self, wave: np.ndarray) -> np.ndarray:
        return compute_fbank(wave, self.opts)

    def frames_for_samples(self, num_samples: np.ndarray) -> np.ndarray:
        rate = self.sample_rate
        win = int(rate * self.opts.frame_opts.frame_length_ms / 1000)
        hop = int(rate * self.frame_shift_ms / 1000)
        return np.maximum(0, 1 + (np.asarray(num_samples) - win) // hop).astype(np.int64)

    def metadata(self) -> dict:
        return fbank_metadata(self.opts)

    def streaming(self) -> StreamingFbank:
        return StreamingFbank(self.metadata())


# ----------------------------------------------------------------------------- speech embedding

OWW_PACKAGE = "openwakeword"
OWW_VERSION = "0.5.1"
OWW_INSTALL = f"pip install --no-deps {OWW_PACKAGE}=={OWW_VERSION}"
MEL_MODEL = "melspectrogram.onnx"
EMBEDDING_MODEL = "embedding_model.onnx"
OWW_RATE = 16000
MEL_HOP = 160            # samples between mel frames (10 ms)
# Samples each mel frame depends on: frame i is a function of samples [160 i, 160 i + 512)
# alone (measured on melspectrogram.onnx; for N a multiple of 160 the model returns
# N / 160 - 3 frames, as a 640-sample window would, but its last 128 samples are unused).
MEL_WINDOW = 512
MEL_BINS = 32
MEL_SCALE, MEL_OFFSET = 0.1, 2.0   # openWakeWord's transform of the model output: x/10 + 2
WINDOW_FRAMES = 76       # mel frames per embedding window
STRIDE_FRAMES = 8        # mel frames between embeddings (80 ms)
# melspectrogram.onnx floors its output at (the maximum over the whole input tensor) - 80
# dB, so a frame's quiet bins depend on what else is in the call. Mel frames are therefore
# computed in fixed blocks of 8, one call each (as openWakeWord's own streaming does), with
# block edges at frames 4 + 8 k: every embedding window ends on an edge, so no embedding
# waits for frames after its own window.
BLOCK_OFFSET = WINDOW_FRAMES % STRIDE_FRAMES
OWW_DIM = 96
# Digital silence before every utterance (0.702 s) so that embedding j ends 80 (j + 1) ms
# into the audio, as on a stream that has been running: every 80 ms of audio gives one
# embedding and a clip shorter than one window still gives features.
LEAD_SAMPLES = MEL_HOP * (WINDOW_FRAMES - 1) + MEL_WINDOW - MEL_HOP * STRIDE_FRAMES
EMBEDDING_HOP = MEL_HOP * STRIDE_FRAMES            # 1280 samples
_sha_cache: Dict[tuple, str] = {}


def sha256_of(path: str) -> str:
    st = os.stat(path)
    key = (os.path.abspath(path), st.st_size, st.st_mtime_ns)
    if key not in _sha_cache:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        _sha_cache[key] = h.hexdigest()
    return _sha_cache[key]


def oww_model_dir() -> Optional[str]:
    """resources/models of the installed openwakeword package (found without importing
    it: its own imports want tflite), or None."""
    spec = importlib.util.find_spec(OWW_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    return os.path.join(list(spec.submodule_search_locations)[0], "resources", "models")


def oww_version() -> Optional[str]:
    try:
        from importlib.metadata import PackageNotFoundError, version
        return version(OWW_PACKAGE)
    except (ImportError, PackageNotFoundError):
        return None


def oww_model_path(name: str, override: str = "") -> str:
    """`override`, or the model file `name` of the installed package; a clear error
    naming the install command when neither exists."""
    if override:
        if not os.path.isfile(override):
            raise MissingInputError(f"speech_embedding model {override} not found")
        return override
    folder = oww_model_dir()
    path = os.path.join(folder, name) if folder else ""
    if not path or not os.path.isfile(path):
        raise MissingInputError(
            f"feature type speech_embedding needs openWakeWord's {name}: {OWW_INSTALL} "
            f"(opt-in; its models are CC BY-NC-SA 4.0, non-commercial), or give the file "
            f"with dataset.feature.mel_model / embedding_model")
    return path


def _session(path: str):
    import onnxruntime as ort
    opts = ort.SessionOptions()
    # One thread each: loader workers and feature jobs already run in parallel.
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    return ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])


@FEATURES.register("speech_embedding")
class SpeechEmbeddingFeatures(FeatureExtractor):
    """Mel frames (10 ms hop) -> x/10 + 2 -> embeddings of 76-frame windows every 8 frames.
    Sessions are created on first use in each process: data loader workers are forked,
    and an ONNX Runtime session does not survive a fork."""
    metadata_type = "speech_embedding"
    dim = OWW_DIM
    sample_rate = OWW_RATE
    frame_shift_ms = 1000.0 * EMBEDDING_HOP / OWW_RATE

    def __init__(self, mel_model: str, embedding_model: str):
        self.mel_path, self.embedding_path = mel_model, embedding_model
        self._sessions = None
        self._pid = None

    @classmethod
    def check_config(cls, dataset_cfg) -> Optional[str]:
        if dataset_cfg.sample_rate != OWW_RATE:
            return (f"dataset.feature.type speech_embedding works at {OWW_RATE} Hz, not "
                    f"dataset.sample_rate={dataset_cfg.sample_rate}")
        if dataset_cfg.vtlp_range or dataset_cfg.voice_perturb.prob > 0:
            return ("dataset.vtlp_range and dataset.voice_perturb warp mel bins: they do not "
                    "apply to dataset.feature.type speech_embedding (set vtlp_range: [] and "
                    "voice_perturb.prob: 0)")
        return None

    @classmethod
    def from_config(cls, feature_cfg, sample_rate: int) -> "SpeechEmbeddingFeatures":
        if sample_rate != OWW_RATE:
            raise DataError(f"speech_embedding features need {OWW_RATE} Hz audio, got {sample_rate}")
        return cls(oww_model_path(MEL_MODEL, getattr(feature_cfg, "mel_model", "")),
                   oww_model_path(EMBEDDING_MODEL, getattr(feature_cfg, "embedding_model", "")))

    @classmethod
    def _paths_for(cls, meta: dict, mel_model: str = "", embedding_model: str = ""):
        front = meta.get("frontend", {})
        paths = []
        for role, override in (("mel_model", mel_model), ("embedding_model", embedding_model)):
            name = front.get(role, MEL_MODEL if role == "mel_model" else EMBEDDING_MODEL)
            path = oww_model_path(name, override)
            want = front.get("sha256", {}).get(name)
            if want and sha256_of(path) != want:
                raise DataError(
                    f"{path} is not the {name} this model was trained with (sha256 "
                    f"{sha256_of(path)[:12]}..., expected {want[:12]}... from "
                    f"{front.get('package', OWW_PACKAGE)} {front.get('version')}): "
                    f"pip install --no-deps {front.get('package', OWW_PACKAGE)}=="
                    f"{front.get('version', OWW_VERSION)}, or pass the right file")
            paths.append(path)
        return paths

    @classmethod
    def from_metadata(cls, meta: dict, mel_model: str = "", embedding_model: str = "",
                      **_) -> "SpeechEmbeddingFeatures":
        return cls(*cls._paths_for(meta, mel_model, embedding_model))

    @classmethod
    def config_fields(cls, meta: dict, mel_model: str = "", embedding_model: str = "",
                      **_) -> dict:
        mel, emb = cls._paths_for(meta, mel_model, embedding_model)
        return {"type": "speech_embedding", "mel_model": mel, "embedding_model": emb}

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_sessions"], state["_pid"] = None, None
        return state

    def sessions(self):
        if self._sessions is None or self._pid != os.getpid():
            self._sessions = (_session(self.mel_path), _session(self.embedding_path))
            self._pid = os.getpid()
        return self._sessions

    def mel(self, samples: np.ndarray) -> np.ndarray:
        """One block: 160 (n - 1) + 512 int16-scale samples -> (n, 32) transformed mel frames."""
        session = self.sessions()[0]
        out = session.run(None, {session.get_inputs()[0].name:
                                 samples[None].astype(np.float32, copy=False)})[0]
        return (out.reshape(-1, MEL_BINS) * MEL_SCALE + MEL_OFFSET).astype(np.float32)

    def embed(self, windows: np.ndarray) -> np.ndarray:
        """(n, 76, 32) mel windows -> (n, 96) embeddings."""
        if len(windows) == 0:
            return np.zeros((0, OWW_DIM), np.float32)
        session = self.sessions()[1]
        out = session.run(None, {session.get_inputs()[0].name:
                                 windows[..., None].astype(np.float32)})[0]
        return out.reshape(len(windows), OWW_DIM).astype(np.float32)

    def compute(self, wave: np.ndarray) -> np.ndarray:
        # The streaming path in one call: whole-utterance and streamed features are one code.
        return self.streaming().accept(wave)

    def frames_for_samples(self, num_samples: np.ndarray) -> np.ndarray:
        return (np.maximum(0, np.asarray(num_samples)) // EMBEDDING_HOP).astype(np.int64)

    def frame_end_times(self, num_frames: int) -> np.ndarray:
        # Embedding j ends where mel frame 8 j + 75 ends: sample 1280 (j + 1) of the audio.
        return (np.arange(1, num_frames + 1, dtype=np.float64) * EMBEDDING_HOP / OWW_RATE)

    def metadata(self) -> dict:
        mel_name, emb_name = os.path.basename(self.mel_path), os.path.basename(self.embedding_path)
        return {
            "type": self.metadata_type,
            "sample_rate": OWW_RATE,
            "frame_shift_ms": self.frame_shift_ms,
            "dim": OWW_DIM,
            "input_scale": 32768.0,
            # Named and fingerprinted, never included: a runtime finds them in the package.
            "frontend": {"package": OWW_PACKAGE, "version": oww_version() or OWW_VERSION,
                         "mel_model": mel_name, "embedding_model": emb_name,
                         "sha256": {mel_name: sha256_of(self.mel_path),
                                    emb_name: sha256_of(self.embedding_path)},
                         "license": "openWakeWord code Apache-2.0; its models CC BY-NC-SA 4.0"},
            "mel_hop_samples": MEL_HOP, "mel_window_samples": MEL_WINDOW,
            "mel_bins": MEL_BINS, "mel_scale": MEL_SCALE, "mel_offset": MEL_OFFSET,
            "mel_block_frames": STRIDE_FRAMES, "mel_block_offset": BLOCK_OFFSET,
            "window_frames": WINDOW_FRAMES, "stride_frames": STRIDE_FRAMES,
            "lead_samples": LEAD_SAMPLES,
        }

    def streaming(self) -> "StreamingSpeechEmbedding":
        return StreamingSpeechEmbedding(self)


class StreamingSpeechEmbedding:
    """Chains the front end's windows over audio chunks of any size: a block of mel
    frames as soon as its samples are in, an embedding every 8 new mel frames once 76
    exist. Indices are global (from the stream start, lead silence included) and every
    model call sees the same inputs whatever the chunking, so the frames computed do not
    depend on how the audio was cut."""

    def __init__(self, extractor: SpeechEmbeddingFeatures):
        self.extractor = extractor
        self.reset()

    def reset(self) -> None:
        self._samples = np.zeros(LEAD_SAMPLES, np.float32)   # int16 scale
        self._sample0 = 0                 # global index of _samples[0]
        self._mel = np.zeros((0, MEL_BINS), np.float32)
        self._mel0 = 0                    # global index of _mel[0]
        self.num_mel = 0
        self.num_frames = 0

    def accept(self, samples: np.ndarray) -> np.ndarray:
        """Float samples in [-1, 1] -> (n, 96) embeddings completed by them."""
        samples = np.asarray(samples, dtype=np.float32).reshape(-1)
        self._samples = np.concatenate([self._samples, samples * np.float32(32768.0)])
        end = self._sample0 + len(self._samples)
        blocks = [self._mel]
        while True:
            stop = BLOCK_OFFSET if self.num_mel == 0 else self.num_mel + STRIDE_FRAMES
            last_sample = (stop - 1) * MEL_HOP + MEL_WINDOW
            if last_sample > end:
                break
            first = self.num_mel * MEL_HOP - self._sample0
            blocks.append(self.extractor.mel(
                self._samples[first:last_sample - self._sample0]))
            self.num_mel = stop
        if len(blocks) > 1:
            self._mel = np.concatenate(blocks)
        drop = self.num_mel * MEL_HOP - self._sample0
        self._samples = self._samples[drop:]
        self._sample0 += drop
        total = 0 if self.num_mel < WINDOW_FRAMES else \
            (self.num_mel - WINDOW_FRAMES) // STRIDE_FRAMES + 1
        out = np.zeros((0, OWW_DIM), np.float32)
        if total > self.num_frames:
            starts = np.arange(self.num_frames, total) * STRIDE_FRAMES - self._mel0
            windows = np.stack([self._mel[s:s + WINDOW_FRAMES] for s in starts])
            out = self.extractor.embed(windows)
            self.num_frames = total
        keep_from = self.num_frames * STRIDE_FRAMES - self._mel0
        self._mel = self._mel[keep_from:]
        self._mel0 += keep_from
        return out
