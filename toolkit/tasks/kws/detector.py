"""Streaming wake-word detection: waveform chunks in, detections out.

    detector = Detector.from_path("exp/ds_tcn/export/model.onnx", threshold=0.6)
    for chunk in microphone():                # int16 or float samples, any chunk size
        for d in detector.accept_waveform(chunk):
            print(d.keyword_name, d.start_s, d.end_s, d.score)

Features (the streaming extractor of the model's feature type: kaldi-native-fbank, or
openWakeWord's speech embeddings), model caches and the decision state are carried
across calls, so feeding audio in pieces gives what the whole file gives.
Backends: ONNX Runtime, TorchScript, or a training checkpoint, chosen by extension;
`Detector.zero_shot(["hey jarvis"])` needs no model of the keyword at all, and
`Detector.from_path(path, fuse_zero_shot=True)` scores a head on phone posteriors together
with that search. `enrolled=` (an enrolment of toolkit.tasks.kws.enrol) keeps only the
detections said in the enrolled voice: "only my voice wakes it".
"""
import json
import os
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import numpy as np

from toolkit.data.features import StreamingFbank, streaming_extractor  # noqa: F401
from toolkit.tasks.kws.decision import (DEFAULT_FRAME_SHIFT_MS, DEFAULT_MAX_KEYWORD_FRAMES,
                                        DEFAULT_REFRACTORY_FRAMES, DEFAULT_SMOOTH_FRAMES,
                                        DecisionState, nested_pairs)
from toolkit.registry import Registry

BACKENDS: Registry = Registry("model format")


class Backend:
    """step(feats (T, D) float32) -> posteriors (T, K); keeps the model cache."""
    metadata: dict

    def reset(self) -> None:
        self.cache = np.zeros((1, int(self.metadata["cache_size"])), dtype=np.float32)

    def step(self, feats: np.ndarray) -> np.ndarray:
        if len(feats) == 0:
            return np.zeros((0, len(self.metadata["keywords"])), dtype=np.float32)
        probs, self.cache = self._run(feats[None].astype(np.float32, copy=False), self.cache)
        return probs[0]

    def _run(self, feats: np.ndarray, cache: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
        raise NotImplementedError


@BACKENDS.register(".onnx")
class OnnxBackend(Backend):
    def __init__(self, path: str, threads: int = 1):
        import onnxruntime as ort
        from toolkit.export import read_metadata
        self.metadata = read_metadata(path)
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
        self.session = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
        self.reset()

    def _run(self, feats, cache):
        probs, cache = self.session.run(None, {"feats": feats, "cache": cache})
        return probs, cache


class _TorchBackend(Backend):
    def _run(self, feats, cache):
        import torch
        with torch.no_grad():
            probs, cache = self.module(torch.from_numpy(feats), torch.from_numpy(cache))
        return probs.numpy(), cache.numpy()


class ModuleBackend(_TorchBackend):
    """An in-memory scorer module (e.g. StreamingScorer(model)) with its metadata."""

    def __init__(self, module, metadata: dict):
        self.module, self.metadata = module.eval(), metadata
        self.reset()


@BACKENDS.register(".zip")
class TorchScriptBackend(_TorchBackend):
    def __init__(self, path: str, threads: int = 1):
        import torch
        torch.set_num_threads(threads)
        extra = {"metadata.json": ""}
        self.module = torch.jit.load(path, _extra_files=extra).eval()
        self.metadata = json.loads(extra["metadata.json"])
        self.reset()


@BACKENDS.register(".pt")
class CheckpointBackend(_TorchBackend):
    """A training/averaged checkpoint; feature options and keywords come from the
    experiment dir beside it (config.yaml, inventory.txt)."""

    def __init__(self, path: str, threads: int = 1, exp_dir: Optional[str] = None):
        import torch
        from toolkit.data.features import build_extractor
        from toolkit.tasks.kws.export import StreamingScorer, build_metadata, model_from_checkpoint
        from toolkit.trainer.experiment import load_exp_config, read_exp_inventory
        torch.set_num_threads(threads)
        exp_dir = exp_dir or os.path.dirname(os.path.abspath(path))
        cfg = load_exp_config(exp_dir)
        model = model_from_checkpoint(path)
        self.module = StreamingScorer(model).eval()
        feature = build_extractor(cfg.dataset.feature, cfg.dataset.sample_rate).metadata()
        self.metadata = build_metadata(model, feature, read_exp_inventory(exp_dir), None)
        self.reset()


@BACKENDS.register(".safetensors")
class SafetensorsBackend(_TorchBackend):
    """safetensors weights + the config.json beside them (written by export)."""

    def __init__(self, path: str, threads: int = 1):
        import torch
        from safetensors.torch import load_file
        from toolkit.export import read_metadata
        from toolkit.tasks.kws.export import StreamingScorer
        from toolkit.tasks.kws.models import MODELS, build_model
        torch.set_num_threads(threads)
        self.metadata = read_metadata(path)
        raw = dict(self.metadata["model_config"])
        model = build_model(MODELS.get(raw["type"]).Config(**raw))
        model.load_state_dict(load_file(path))
        self.module = StreamingScorer(model).eval()
        self.reset()


def load_backend(path: str, threads: int = 1, fuse_zero_shot: bool = False) -> Backend:
    if not os.path.exists(path):
        from toolkit.errors import MissingInputError
        raise MissingInputError(f"model {path} not found (run the export stage first)")
    ext = os.path.splitext(path)[1]
    backend = BACKENDS.get(ext)(path, threads=threads)
    if fuse_zero_shot:
        from toolkit.tasks.kws.search import FusedBackend
        return FusedBackend(backend)
    return backend


@dataclass
class NamedDetection:
    keyword: int
    keyword_name: str
    start_s: float
    end_s: float
    score: float
    speaker_score: Optional[float] = None    # set by a speaker gate (Detector(enrolled=...))


class _RecentAudio:
    """The stream's recent samples with the absolute index of the first one kept, so a
    detection's window can be cut after the fact. Forgetting only moves an offset; the kept
    samples are moved to the front when an append finds no room: amortised O(1)."""

    def __init__(self):
        self.reset()

    def reset(self) -> None:
        self.data = np.zeros(0, np.float32)
        self.head = 0       # data[head:head + size] are the kept samples
        self.size = 0
        self.start = 0      # absolute index of data[head]

    @property
    def end(self) -> int:
        return self.start + self.size

    def append(self, samples: np.ndarray) -> None:
        if self.head + self.size + len(samples) > len(self.data):
            kept = self.data[self.head:self.head + self.size]
            if self.size + len(samples) > len(self.data) // 2:
                self.data = np.zeros(max(2 * (self.size + len(samples)), 1024), np.float32)
            self.data[:self.size] = kept
            self.head = 0
        self.data[self.head + self.size:self.head + self.size + len(samples)] = samples
        self.size += len(samples)

    def drop_before(self, sample: int) -> None:
        """Forget the samples before absolute index `sample`."""
        cut = min(max(0, sample - self.start), self.size)
        self.head, self.start, self.size = self.head + cut, self.start + cut, self.size - cut

    def cut(self, a: int, b: int) -> np.ndarray:
        if a < self.start:
            raise RuntimeError(f"speaker gate: samples from {a} asked, the buffer keeps them "
                               f"from {self.start} (its look-back is too short)")
        lo = self.head + a - self.start
        return self.data[lo:self.head + min(b, self.end) - self.start].copy()


def frames_for_seconds(default_frames: int, frame_shift_ms: float) -> int:
    """A default given in frames at 10 ms, as frames of `frame_shift_ms` (the same time)."""
    return int(round(default_frames * DEFAULT_FRAME_SHIFT_MS / frame_shift_ms))


class Detector:
    """`refractory_frames` / `max_keyword_frames` default to 1 s / 2 s in the model's
    frames (100 / 200 at fbank's 10 ms, 12 / 25 at 80 ms embeddings). Each keyword decides
    for itself; a keyword inside another ("hey" in "hey jarvis") is reported only when the
    longer one does not fire over it, so its detections wait until the longer keyword can
    no longer overlap them, or until `flush()` at the end of a stream
    (toolkit.tasks.kws.decision, rule 5).

    `enrolled` (an Enrolment, a SpeakerGate or the path of a .enrol file, see
    toolkit.tasks.kws.enrol) gates every detection by its speaker: the keyword's window and
    the enrolment's context either side are embedded and scored against the enrolment; a
    detection is kept (with `speaker_score`) only when the gate accepts it, and counted in
    `rejected` otherwise. The speaker encoder runs only when the keyword fires. A detection
    waits for its trailing context (`context_s` of audio after it) or `flush()`."""

    def __init__(self, backend: Backend, threshold: Optional[float] = None,
                 smooth_frames: int = DEFAULT_SMOOTH_FRAMES,
                 refractory_frames: Optional[int] = None,
                 max_keyword_frames: Optional[int] = None, enrolled=None):
        from toolkit.errors import DataError
        self.backend = backend
        meta = backend.metadata
        shift_ms = float(meta["feature"]["frame_shift_ms"])
        if refractory_frames is None:
            refractory_frames = frames_for_seconds(DEFAULT_REFRACTORY_FRAMES, shift_ms)
        if max_keyword_frames is None:
            max_keyword_frames = max(1, frames_for_seconds(DEFAULT_MAX_KEYWORD_FRAMES, shift_ms))
        self.keywords: List[str] = list(meta["keywords"])
        if threshold is None:
            threshold = meta.get("threshold")
        if threshold is None:
            stored = "fused_threshold" if meta.get("fusion") else "threshold"
            raise DataError(f"no threshold given and the model of {', '.join(self.keywords)} "
                            f"stores no {stored} (the recipe's stage 6 stores it): pass "
                            "--threshold, or calibrate one with --calibrate")
        self.threshold = float(threshold)
        self.sample_rate = int(meta["feature"]["sample_rate"])
        # The model's feature type picks the streaming front end (metadata `feature.type`).
        self.frontend = streaming_extractor(meta["feature"])
        self.fbank = self.frontend        # the name from when fbank was the only front end
        # A search knows how long each keyword may last: a nested keyword waits that long.
        bounds = getattr(backend, "max_keyword_frames", None)
        self.decision = DecisionState(self.threshold, smooth_frames=smooth_frames,
                                      refractory_frames=refractory_frames,
                                      max_keyword_frames=max_keyword_frames,
                                      frame_shift_ms=shift_ms,
                                      num_keywords=len(self.keywords),
                                      nested=nested_pairs(self.keywords),
                                      hold_frames=max(bounds) if bounds else None)
        self.gate = None
        self.rejected = 0        # detections the speaker gate refused, since construction
        if enrolled is not None:
            self._init_gate(enrolled, bounds)

    def _init_gate(self, enrolled, bounds) -> None:
        from toolkit.errors import DataError
        from toolkit.tasks.kws.enrol import SpeakerGate
        self.gate = enrolled if isinstance(enrolled, SpeakerGate) else SpeakerGate(enrolled)
        if self.gate.sample_rate != self.sample_rate:
            raise DataError(f"the speaker encoder reads {self.gate.sample_rate} Hz audio, the "
                            f"keyword model {self.sample_rate} Hz")
        self.context_s = float(self.gate.enrolment.context_s)
        # How far back from the decision's current frame a window still to be reported may
        # begin: a held nested keyword (rule 5) fired up to hold_frames ago, its onset lies
        # up to the longest keyword before that (a search's path may begin one slow phone
        # before its bound: the lead of its first phone), then the context before it.
        longest = self.decision.max_keyword_frames
        if bounds:
            from toolkit.tasks.kws.search import FRAMES_PER_PHONE
            longest = max(longest, max(bounds) + FRAMES_PER_PHONE)
        hold = self.decision.hold_frames if self.decision.nested else 0
        self._lookback_frames = longest + hold + 1
        self._recent = _RecentAudio()
        self._pending: List[NamedDetection] = []

    @classmethod
    def from_path(cls, path: str, threshold: Optional[float] = None, threads: int = 1,
                  fuse_zero_shot: bool = False, **kwargs) -> "Detector":
        """`fuse_zero_shot`: a head on phone posteriors scored together with zero-shot
        search of its keywords (toolkit.tasks.kws.search.FusedBackend)."""
        return cls(load_backend(path, threads, fuse_zero_shot), threshold, **kwargs)

    @classmethod
    def zero_shot(cls, keywords: Sequence[str], frontend: str = "",
                  threshold: Optional[float] = None, **kwargs) -> "Detector":
        """Keywords with no training: their espeak-ng phones searched in the posteriors of
        a phone front end (default pretrained:phone-voicebank-v2; toolkit.tasks.kws.search)."""
        from toolkit.tasks.kws.search import ZERO_SHOT_THRESHOLD, ZeroShotBackend
        return cls(ZeroShotBackend(keywords, frontend),
                   ZERO_SHOT_THRESHOLD if threshold is None else threshold, **kwargs)

    def reset(self) -> None:
        self.backend.reset()
        self.frontend.reset()
        self.decision.reset()
        if self.gate is not None:
            self._recent.reset()
            self._pending = []

    def _named(self, detections) -> List[NamedDetection]:
        return [NamedDetection(d.keyword, self.keywords[d.keyword], d.start_s, d.end_s, d.score)
                for d in detections]

    def accept_waveform(self, samples: Sequence) -> List[NamedDetection]:
        """Samples at the model's rate: int16, or float in [-1, 1]."""
        samples = np.asarray(samples)
        if samples.dtype == np.int16:
            samples = samples.astype(np.float32) / 32768.0
        samples = samples.astype(np.float32, copy=False)
        if self.gate is not None:
            self._recent.append(samples)
        probs = self.backend.step(self.frontend.accept(samples))
        # A search reports where each keyword's path began: the detection's true start.
        path = getattr(self.backend, "path_frames", None)
        if path is not None and path.shape != probs.shape:
            path = None
        found = self._named(self.decision.step(probs, path))
        return found if self.gate is None else self._gated(found, final=False)

    def flush(self) -> List[NamedDetection]:
        """The end of a stream: detections still held for a longer keyword (rule 5), and
        with a speaker gate those still waiting for their trailing context."""
        found = self._named(self.decision.flush())
        return found if self.gate is None else self._gated(found, final=True)

    def _gated(self, found: List[NamedDetection], final: bool) -> List[NamedDetection]:
        """Detections whose window is complete (or the stream ended), scored by the gate;
        those it accepts, with their speaker score."""
        from toolkit.errors import DataError
        from toolkit.tasks.kws.enrol import window_bounds
        rate, end = self.sample_rate, self._recent.end
        self._pending += found
        kept, waiting = [], []
        for det in self._pending:
            a, b = window_bounds(det.start_s, det.end_s, self.context_s, rate,
                                 end if final else None)
            if b > end:
                waiting.append(det)
                continue
            try:
                det.speaker_score = self.gate.score(self.gate.embed(self._recent.cut(a, b)))
            except DataError:            # too little audio to embed: the speaker is unknown
                det.speaker_score = None
            if det.speaker_score is not None and self.gate.accepts(det.speaker_score):
                kept.append(det)
            else:
                self.rejected += 1
        self._pending = waiting
        # Keep what a window still to come may need, and no more.
        shift_s = float(self.backend.metadata["feature"]["frame_shift_ms"]) / 1000.0
        first = (self.decision.frame_index - self._lookback_frames) * shift_s - self.context_s
        starts = [window_bounds(d.start_s, d.end_s, self.context_s, rate)[0] for d in waiting]
        self._recent.drop_before(min(starts + [int(np.floor(first * rate))]))
        return sorted(kept, key=lambda d: (d.end_s, d.keyword))
