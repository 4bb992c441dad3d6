"""A trained phone front end (task phone_ctc) as a frozen streaming feature extractor.

`PhoneFrontEnd("pretrained:phone-voicebank-v2")` (or an export's model.safetensors) loads
the model with its fbank options and unit list. `stream()` turns audio chunks of any size
into log phone posteriors (or the encoder's hidden features) frame by frame; whole-
utterance and streamed outputs are the same, because the fbank and the causal model both
carry their state across chunks.

It is also the feature type `phone_frontend` (dataset.feature.type): a wake-word head
trains on these frames, computed once per corpus by toolkit.bin.compute_feats, and its
export names the front end (pretrained name or file, sha256) instead of including it.
"""
import os
from typing import List, Optional

import numpy as np
import torch

from toolkit.data.features import (FEATURES, STORED_TAG, FeatureExtractor, StreamingFbank,
                                   extractor_from_metadata, sha256_of)
from toolkit.errors import DataError, MissingInputError

OUTPUTS = ("posteriors", "hidden")      # log phone posteriors, or the encoder's last layer
DEFAULT_FRONTEND = "pretrained:phone-voicebank-v2"


def _weights_path(source: str) -> str:
    from toolkit.pretrained import PREFIX, weights
    if source.startswith(PREFIX):
        return weights(source[len(PREFIX):])
    if os.path.isdir(source):
        source = os.path.join(source, "model.safetensors")
    if not os.path.isfile(source):
        raise MissingInputError(f"phone front end {source} not found (give pretrained:NAME, "
                                "an export dir or its model.safetensors)")
    return source


def frontend_files(source: str = DEFAULT_FRONTEND) -> List[str]:
    """The files the front end `source` is read from: its weights, and the config.json
    beside them when there is one (a shipped model's): what keys features it computed."""
    path = _weights_path(source)
    config = os.path.join(os.path.dirname(path), "config.json")
    return [path] + ([config] if os.path.isfile(config) else [])


class PhoneFrontEnd:
    """The model of a phone_ctc export, eval mode. It leaves torch's thread count alone:
    the feature type below sets one thread in worker processes only."""

    def __init__(self, source: str = DEFAULT_FRONTEND, output: str = "posteriors"):
        from toolkit.export import read_metadata
        from toolkit.tasks.kws.export import model_from_safetensors
        if output not in OUTPUTS:
            raise ValueError(f"front end output {output!r}: one of {', '.join(OUTPUTS)}")
        self.source, self.output = source, output
        self.path = _weights_path(source)
        self.metadata = read_metadata(self.path)
        if self.metadata.get("task") != "phone_ctc":
            raise DataError(f"{self.path}: a {self.metadata.get('task')!r} export, not a phone "
                            "front end (task phone_ctc)")
        self.units: List[str] = list(self.metadata["units"])
        self.fbank_metadata: dict = self.metadata["feature"]
        self.fbank = extractor_from_metadata(self.fbank_metadata)
        self.model = model_from_safetensors(self.path)
        self.dim = len(self.units) if output == "posteriors" else int(
            self.model.classifier.in_features)
        self.sha256 = sha256_of(self.path)

    @torch.no_grad()
    def run(self, feats: np.ndarray, cache: Optional[torch.Tensor] = None):
        """(T, bins) fbank -> ((T, dim) float32 outputs, new model cache)."""
        x = torch.from_numpy(np.ascontiguousarray(feats, dtype=np.float32))[None]
        hidden, cache = self.model.encode(x, cache)
        if self.output == "hidden":
            return hidden[0].numpy(), cache
        return torch.log_softmax(self.model.classifier(hidden)[0], dim=-1).numpy(), cache

    def compute(self, wave: np.ndarray) -> np.ndarray:
        """A whole utterance (float samples in [-1, 1]) -> (frames, dim)."""
        feats = self.fbank.compute(wave)
        if len(feats) == 0:
            return np.zeros((0, self.dim), np.float32)
        return self.run(feats)[0]

    def stream(self) -> "PhoneStream":
        return PhoneStream(self)


class PhoneStream:
    """accept(samples) -> the output frames completed by them; reset() starts a stream."""

    def __init__(self, frontend: PhoneFrontEnd):
        self.frontend = frontend
        self.fbank = StreamingFbank(frontend.fbank_metadata)
        self.reset()

    def reset(self) -> None:
        self.fbank.reset()
        self.cache = self.frontend.model.zero_cache(1)

    def accept(self, samples: np.ndarray) -> np.ndarray:
        feats = self.fbank.accept(np.asarray(samples, dtype=np.float32).reshape(-1))
        if len(feats) == 0:
            return np.zeros((0, self.frontend.dim), np.float32)
        out, self.cache = self.frontend.run(feats, self.cache)
        return out


def _in_worker(built_in: int) -> bool:
    """A process forked or spawned to run beside others (a loader worker, a feature job):
    not the one that built the extractor, or a multiprocessing child."""
    import multiprocessing
    return os.getpid() != built_in or multiprocessing.parent_process() is not None


@FEATURES.register("phone_frontend")
class PhoneFrontEndFeatures(FeatureExtractor):
    """Feature type `phone_frontend`: the frozen front end's outputs every 10 ms
    (dataset.feature.frontend_model, .frontend_output). The model is loaded on first use
    in each process (loader workers are forked). Worker processes run it on one torch
    thread each (they already run side by side); the process that builds it (the trainer,
    whose heads train on these frames) keeps its own thread count."""
    metadata_type = "phone_frontend"

    def __init__(self, source: str, output: str, sha256: str = ""):
        self.source, self.output = source, output
        self._frontend: Optional[PhoneFrontEnd] = None
        self._built_in = os.getpid()
        self._one_thread_in = 0          # the worker process whose threads were set
        front = self.frontend
        if sha256 and front.sha256 != sha256:
            raise DataError(f"{front.path} is not the phone front end this model was trained "
                            f"on (sha256 {front.sha256[:12]}..., expected {sha256[:12]}...)")
        self.sha256 = front.sha256
        self.dim = front.dim
        self.sample_rate = int(front.fbank_metadata["sample_rate"])
        self.frame_shift_ms = float(front.fbank_metadata["frame_shift_ms"])

    @property
    def frontend(self) -> PhoneFrontEnd:
        if self._frontend is None:
            self._frontend = PhoneFrontEnd(self.source, self.output)
        return self._frontend

    def _worker_threads(self) -> None:
        pid = os.getpid()
        if self._one_thread_in != pid and _in_worker(self._built_in):
            torch.set_num_threads(1)
        self._one_thread_in = pid

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_frontend"] = None
        return state

    @classmethod
    def check_config(cls, dataset_cfg) -> Optional[str]:
        # An empty frontend_model means the default of this release: named here, so the
        # experiment's config.yaml records which front end it trains on and a later
        # release's other default is a refused change on resume, not a silent switch.
        if not dataset_cfg.feature.frontend_model:
            dataset_cfg.feature.frontend_model = DEFAULT_FRONTEND
        if dataset_cfg.vtlp_range or dataset_cfg.voice_perturb.prob > 0:
            return ("dataset.vtlp_range and dataset.voice_perturb warp mel bins: they do not "
                    "apply to dataset.feature.type phone_frontend (set vtlp_range: [] and "
                    "voice_perturb.prob: 0)")
        if dataset_cfg.feature.frontend_output not in OUTPUTS:
            return (f"dataset.feature.frontend_output {dataset_cfg.feature.frontend_output!r}: "
                    f"one of {', '.join(OUTPUTS)}")
        return None

    @classmethod
    def from_config(cls, feature_cfg, sample_rate: int) -> "PhoneFrontEndFeatures":
        out = cls(feature_cfg.frontend_model or DEFAULT_FRONTEND, feature_cfg.frontend_output)
        if sample_rate != out.sample_rate:
            raise DataError(f"phone front end {out.source} works at {out.sample_rate} Hz, not "
                            f"dataset.sample_rate={sample_rate}")
        return out

    @classmethod
    def _source(cls, meta: dict, frontend_model: str = "") -> str:
        return frontend_model or meta["frontend"]["source"]

    @classmethod
    def from_metadata(cls, meta: dict, frontend_model: str = "", **_) -> "PhoneFrontEndFeatures":
        front = meta["frontend"]
        return cls(cls._source(meta, frontend_model), front["output"], front.get("sha256", ""))

    @classmethod
    def config_fields(cls, meta: dict, frontend_model: str = "", **_) -> dict:
        return {"type": "phone_frontend", "frontend_model": cls._source(meta, frontend_model),
                "frontend_output": meta["frontend"]["output"]}

    def compute(self, wave: np.ndarray) -> np.ndarray:
        self._worker_threads()
        return self.frontend.compute(wave)

    def frames_for_samples(self, num_samples: np.ndarray) -> np.ndarray:
        return self.frontend.fbank.frames_for_samples(num_samples)

    def metadata(self) -> dict:
        front = self.frontend
        return {"type": self.metadata_type, "sample_rate": self.sample_rate,
                "frame_shift_ms": self.frame_shift_ms, "dim": self.dim,
                # frame t's input ends at t shift + length, as the fbank's under it
                "frame_length_ms": float(front.fbank_metadata["frame_length_ms"]),
                "input_scale": front.fbank_metadata.get("input_scale", 32768.0),
                # Named and fingerprinted, never included: a runtime loads it by name.
                "frontend": {"source": self.source, "output": self.output,
                             "sha256": front.sha256, "fbank": front.fbank_metadata,
                             "units": front.units}}

    def streaming(self) -> PhoneStream:
        self._worker_threads()
        return self.frontend.stream()

    # Precomputed features (toolkit.bin.compute_feats) name the front end that made them:
    # features of another front end (or another output) are never read as this one's.
    def stored_tag(self) -> dict:
        return {"sha256": self.sha256, "output": self.output}

    def check_stored(self, entry: dict, where: str = "") -> None:
        tag = entry.get(STORED_TAG)
        if tag == self.stored_tag():
            return
        made_by = (f"by the front end with sha256 {str(tag.get('sha256'))[:12]}... "
                   f"({tag.get('output')})" if isinstance(tag, dict) else
                   "without a record of their front end")
        raise DataError(f"{where or 'data list'}: the features of {entry.get('key')!r} were "
                        f"computed {made_by}, not by {self.source} (sha256 "
                        f"{self.sha256[:12]}..., {self.output}): recompute them with "
                        "toolkit.bin.compute_feats --config of this experiment")


# ----------------------------------------------------------------------------- export

def export_frontend_weights(weights: str, out_dir: str, test_data: Optional[str] = None,
                            num_check: int = 20, tolerance: float = 1e-4) -> dict:
    """The streaming graph of a phone front end's safetensors + config.json (a shipped
    model: toolkit.pretrained) as model.zip (TorchScript), model.onnx and model.safetensors
    + config.json, each checked against PyTorch whole and chunk by chunk on the fbank of
    `test_data`'s utterances, or without it of seeded noise of 1-4 s."""
    from toolkit.data.augment import load_mono
    from toolkit.export import parity_inputs, read_metadata
    from toolkit.tasks.kws.export import check_parity, export_model_files, model_from_safetensors
    metadata = read_metadata(weights)
    if metadata.get("task") != "phone_ctc":
        raise DataError(f"{weights}: a {metadata.get('task')!r} export, not a phone front end "
                        "(task phone_ctc)")
    model = model_from_safetensors(weights)
    fbank = extractor_from_metadata(metadata["feature"])
    rate = int(metadata["feature"]["sample_rate"])
    if test_data:
        features = parity_inputs(test_data, lambda e: fbank.compute(
            load_mono(e["wav"], rate)[:10 * rate]), num_check)
    else:
        rng = np.random.default_rng(0)
        features = [fbank.compute(rng.uniform(-0.3, 0.3, int(sec * rate)).astype(np.float32))
                    for sec in np.linspace(1.0, 4.0, max(1, min(num_check, 4)))]
    paths = export_model_files(model, out_dir, metadata)
    return check_parity(model, paths, features, tolerance,
                        activation=metadata.get("activation", "log_softmax"))


# ----------------------------------------------------------------------------- evaluation

def phone_error_rate(frontend: PhoneFrontEnd, entries, chunk_ms: float = 0.0) -> dict:
    """Greedy-decoding phone error rate of `entries` (data-list dicts with `wav` and
    `tokens`, ids into the front end's units): errors, reference phones, utterances and
    seconds. With `chunk_ms` the audio is streamed in chunks of that length."""
    from toolkit.data.augment import load_mono
    from toolkit.nn.ctc import edit_distance, greedy_decode
    rate = int(frontend.fbank_metadata["sample_rate"])
    errors = reference = count = 0
    seconds = 0.0
    for entry in entries:
        tokens = entry.get("tokens")
        if not isinstance(tokens, list):
            raise DataError(f"{entry.get('key')}: no `tokens` (make_datalist --lexicon --units "
                            "with the front end's unit list)")
        if any(not 0 < t < len(frontend.units) for t in tokens):
            raise DataError(f"{entry.get('key')}: token ids outside the front end's "
                            f"{len(frontend.units)} units: the list was made with another unit list")
        wave = load_mono(entry["wav"], rate)
        if chunk_ms > 0:
            stream, step = frontend.stream(), max(1, int(rate * chunk_ms / 1000))
            out = [stream.accept(wave[i:i + step]) for i in range(0, len(wave), step)]
            log_post = np.concatenate(out) if out else np.zeros((0, frontend.dim), np.float32)
        else:
            log_post = frontend.compute(wave)
        errors += edit_distance(greedy_decode(torch.from_numpy(log_post)), tokens)
        reference += len(tokens)
        count += 1
        seconds += len(wave) / rate
    return {"errors": errors, "reference": reference, "utterances": count, "seconds": seconds,
            "per": errors / max(1, reference)}


def streaming_rtf(frontend: PhoneFrontEnd, wave: np.ndarray, chunk_ms: float = 100.0) -> float:
    """Seconds of compute per second of audio, streaming `wave` in `chunk_ms` chunks
    (features included), on the threads torch is set to."""
    import time
    rate = int(frontend.fbank_metadata["sample_rate"])
    stream, step = frontend.stream(), max(1, int(rate * chunk_ms / 1000))
    begin = time.perf_counter()
    for i in range(0, len(wave), step):
        stream.accept(wave[i:i + step])
    return (time.perf_counter() - begin) / max(1e-9, len(wave) / rate)
