"""Keyword models to deployable files: the streaming graph (feature chunk + cache ->
posteriors + cache) in TorchScript, ONNX and safetensors + config.json, parity-checked
against PyTorch whole-utterance and chunk by chunk, with what a runtime needs (the
feature type and its options, cache size, keyword list, recommended threshold; CMVN is
inside the weights). A front end from another package (speech_embedding) is named,
versioned and fingerprinted in the metadata, never included."""
import dataclasses
import logging
import os
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
from torch import nn

from toolkit import export as writers
from toolkit.export import (ParityError, check_finite_reference, onnx_runner,  # noqa: F401
                            output_difference, read_metadata, torch_runner, update_metadata)
from toolkit.tasks.kws.models import MODELS, build_model
from toolkit.trainer.checkpoint import load_payload, module_states_from_file

logger = logging.getLogger(__name__)


ACTIVATIONS = ("sigmoid", "softmax", "log_softmax")


class StreamingScorer(nn.Module):
    """Deployment graph: raw feature chunk + cache -> keyword posteriors + new cache."""

    def __init__(self, model: nn.Module, activation: str = ""):
        super().__init__()
        self.model = model
        # Keyword detectors score each keyword independently (sigmoid); utterance
        # classifiers choose one class (softmax); a phone front end gives log posteriors
        # over its units (log_softmax), what CTC keyword search adds up.
        if not activation:
            activation = "sigmoid" if getattr(model, "streaming", True) else "softmax"
        if activation not in ACTIVATIONS:
            raise ValueError(f"output activation {activation!r}: one of {ACTIVATIONS}")
        self.activation = activation

    def forward(self, feats: torch.Tensor, cache: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        logits, new_cache = self.model(feats, cache)
        if self.activation == "softmax":
            return torch.softmax(logits, dim=-1), new_cache
        if self.activation == "log_softmax":
            return torch.log_softmax(logits.float(), dim=-1), new_cache
        return torch.sigmoid(logits), new_cache


def model_config_from_payload(payload: dict) -> dict:
    cfg = payload.get("config", {})
    if "model" in cfg:
        return dict(cfg["model"])
    return dict(payload["model_config"])          # checkpoints before the task contract


def model_from_checkpoint(path: str) -> nn.Module:
    """Model in eval mode from a training or averaged checkpoint (weights_only load)."""
    payload = load_payload(path)
    raw = model_config_from_payload(payload)
    config = MODELS.get(raw["type"]).Config(**raw)
    model = build_model(config)
    states = module_states_from_file(path)
    model.load_state_dict(states.get("model", states.get("")))
    return model.eval()


def build_metadata(model: nn.Module, feature: dict, keywords: Sequence[str],
                   threshold: Optional[float]) -> dict:
    return {
        "format_version": 1,
        "task": "kws",
        "model_type": model.config.type,
        "model_config": dataclasses.asdict(model.config),
        "feature": feature,
        "cache_size": int(model.cache_size),
        "keywords": list(keywords),
        "threshold": threshold,
        "output": ("sigmoid posteriors (batch, frames, keywords)" if getattr(model, "streaming", True)
                   else "softmax posteriors (batch, classes)"),
        "cmvn": {"mean": model.cmvn.mean.tolist(), "inv_std": model.cmvn.inv_std.tolist(),
                 "applied_inside_model": True},
    }


def export_torchscript(model: nn.Module, path: str, metadata: dict) -> None:
    writers.export_torchscript(StreamingScorer(model, metadata.get("activation", "")), path,
                                metadata)


def export_onnx(model: nn.Module, path: str, metadata: dict, opset: int = 17) -> None:
    """The streaming graph with dynamic batch and frame axes: feats (B, T, D) and cache
    (B, cache_size) -> probs (B, T, K) and new_cache."""
    example = (torch.zeros(1, 20, model.config.input_dim), torch.zeros(1, model.cache_size))
    scorer = StreamingScorer(model, metadata.get("activation", ""))
    writers.export_onnx(scorer, example, path, ["feats", "cache"], ["probs", "new_cache"],
                        {"feats": {0: "batch", 1: "frames"}, "cache": {0: "batch"},
                         "probs": {0: "batch", 1: "frames"}, "new_cache": {0: "batch"}},
                        metadata, opset)


def export_safetensors(model: nn.Module, path: str, metadata: dict) -> None:
    writers.export_safetensors(model, path, metadata, metadata["model_config"])


def export_model_files(model: nn.Module, out_dir: str, metadata: dict) -> Dict[str, str]:
    """Writes model.zip, model.onnx, model.safetensors (+ config.json); returns paths."""
    os.makedirs(out_dir, exist_ok=True)
    paths = {"torchscript": os.path.join(out_dir, "model.zip"),
             "onnx": os.path.join(out_dir, "model.onnx"),
             "safetensors": os.path.join(out_dir, "model.safetensors")}
    export_torchscript(model, paths["torchscript"], metadata)
    export_onnx(model, paths["onnx"], metadata)
    export_safetensors(model, paths["safetensors"], metadata)
    return paths


def run_chunked(fn, feats: np.ndarray, cache_size: int, chunk: int) -> np.ndarray:
    """Feeds (T, D) features `chunk` frames at a time through fn(feats, cache)."""
    cache = np.zeros((1, cache_size), dtype=np.float32)
    outs = []
    for start in range(0, len(feats), chunk):
        probs, cache = fn(feats[None, start:start + chunk].astype(np.float32), cache)
        outs.append(probs[0])
    return np.concatenate(outs, axis=0)


def check_parity(model: nn.Module, paths: Dict[str, str], features: List[np.ndarray],
                 tolerance: float = 1e-4, chunks: Sequence[int] = (0, 1, 16),
                 activation: str = "") -> Dict[str, float]:
    """Max |diff| of every exported format against PyTorch, whole-utterance (chunk 0)
    and streamed in chunks. Raises when any exceeds `tolerance`."""
    if not getattr(model, "streaming", True):
        chunks = (0,)      # a classifier sees whole clips only
    reference = torch_runner(StreamingScorer(model, activation).eval())
    runners = {}
    if "torchscript" in paths:
        runners["torchscript"] = torch_runner(torch.jit.load(paths["torchscript"]).eval())
    if "onnx" in paths:
        runners["onnx"] = onnx_runner(paths["onnx"])
    if "safetensors" in paths:
        runners["safetensors"] = torch_runner(StreamingScorer(
            model_from_safetensors(paths["safetensors"]), activation).eval())
    worst: Dict[str, float] = {name: 0.0 for name in runners}
    problems: Dict[str, str] = {}
    for i, feats in enumerate(features):
        expected = run_chunked(reference, feats, model.cache_size, len(feats))
        check_finite_reference([expected], "exported keyword model")
        for name, fn in runners.items():
            # Frame-by-frame streaming is the slowest check: two utterances suffice.
            for chunk in (c for c in chunks if c != 1 or i < 2):
                got = run_chunked(fn, feats, model.cache_size, chunk or len(feats))
                diff, problem = output_difference([expected], [got])
                worst[name] = max(worst[name], diff)
                if problem:
                    problems.setdefault(name, problem)
    failed = {k: v for k, v in worst.items() if not v <= tolerance}
    for name, diff in worst.items():
        logger.info("parity %s vs PyTorch: max abs diff %.3g over %d utterances", name, diff,
                    len(features))
    if failed:
        raise ParityError("exported model disagrees with PyTorch beyond tolerance "
                          f"{tolerance}: " + ", ".join(
                              f"{k} {v:.3g}" + (f" ({problems[k]})" if k in problems else "")
                              for k, v in failed.items()))
    return worst


def model_from_safetensors(path: str) -> nn.Module:
    """The model of an export's model.safetensors + config.json, eval mode."""
    from safetensors.torch import load_file
    raw = dict(read_metadata(path)["model_config"])
    model = build_model(MODELS.get(raw["type"]).Config(**raw))
    model.load_state_dict(load_file(path))
    return model.eval()


def stream_in_chunks(stream, wave: np.ndarray, sizes: Sequence[int] = (1, 37, 160, 999, 4000)
                     ) -> np.ndarray:
    """Frames of `wave` fed to a streaming extractor in chunks cycling through `sizes`."""
    stream.reset()
    outs, start, i = [], 0, 0
    while start < len(wave):
        n = sizes[i % len(sizes)]
        outs.append(stream.accept(wave[start:start + n]))
        start, i = start + n, i + 1
    return np.concatenate(outs) if outs else stream.accept(wave[:0])


def check_frontend_parity(feature_meta: dict, extractor, waves: Sequence[np.ndarray],
                          tolerance: float = 1e-4) -> float:
    """Max |diff| between the streaming front end a runtime builds from `feature_meta`
    (chunks of odd sizes) and `extractor`'s whole-utterance features. Raises above
    `tolerance`."""
    from toolkit.data.features import streaming_extractor
    stream = streaming_extractor(feature_meta)
    worst = 0.0
    for wave in waves:
        offline = extractor.compute(wave)
        streamed = stream_in_chunks(stream, wave)
        if streamed.shape != offline.shape:
            raise RuntimeError(f"streamed front end gave {streamed.shape} frames, whole-"
                               f"utterance {offline.shape}")
        if offline.size:
            worst = max(worst, float(np.max(np.abs(streamed - offline))))
    logger.info("parity streamed front end vs whole utterance: max abs diff %.3g over %d "
                "utterances", worst, len(waves))
    if worst > tolerance:
        raise RuntimeError(f"streamed front end disagrees with whole-utterance features by "
                           f"{worst:.3g} (> {tolerance})")
    return worst


def set_threshold(export_dir: str, threshold: float, key: str = "threshold") -> None:
    """Stores the recommended threshold (chosen by scoring) in every exported format: the
    head's own (`threshold`) or that of the head fused with zero-shot search
    (`fused_threshold`)."""
    if key not in ("threshold", "fused_threshold"):
        raise ValueError(f"threshold key {key!r}: threshold or fused_threshold")
    update_metadata(export_dir, {key: threshold})
