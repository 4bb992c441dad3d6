"""From a checkpoint to deployable files: TorchScript, ONNX, safetensors + config.json.

Every format carries what a runtime needs (sample rate, fbank options, cache size,
keyword list, recommended threshold; CMVN lives inside the weights) and is checked
against the PyTorch model on real features, whole-utterance and chunk by chunk.
"""
import dataclasses
import json
import logging
import os
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
from torch import nn

from toolkit.models import MODELS, build_model
from toolkit.trainer.checkpoint import load_payload

logger = logging.getLogger(__name__)
METADATA_KEY = "toolkit_metadata"


class StreamingScorer(nn.Module):
    """Deployment graph: raw fbank chunk + cache -> keyword posteriors + new cache."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model
        # Keyword detectors score each keyword independently (sigmoid); utterance
        # classifiers choose one class (softmax).
        self.classify = not getattr(model, "streaming", True)

    def forward(self, feats: torch.Tensor, cache: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        logits, new_cache = self.model(feats, cache)
        if self.classify:
            return torch.softmax(logits, dim=-1), new_cache
        return torch.sigmoid(logits), new_cache


def model_from_checkpoint(path: str) -> nn.Module:
    """Model in eval mode from a training or averaged checkpoint (weights_only load)."""
    payload = load_payload(path)
    raw = dict(payload["model_config"])
    cls = MODELS.get(raw["type"])
    config = cls.Config(**raw)
    model = build_model(config)
    model.load_state_dict(payload["model"])
    return model.eval()


def build_metadata(model: nn.Module, fbank: dict, keywords: Sequence[str],
                   threshold: Optional[float]) -> dict:
    return {
        "format_version": 1,
        "model_type": model.config.type,
        "model_config": dataclasses.asdict(model.config),
        "feature": fbank,
        "cache_size": int(model.cache_size),
        "keywords": list(keywords),
        "threshold": threshold,
        "output": ("sigmoid posteriors (batch, frames, keywords)" if getattr(model, "streaming", True)
                   else "softmax posteriors (batch, classes)"),
        "cmvn": {"mean": model.cmvn.mean.tolist(), "inv_std": model.cmvn.inv_std.tolist(),
                 "applied_inside_model": True},
    }


def export_torchscript(model: nn.Module, path: str, metadata: dict) -> None:
    scripted = torch.jit.script(StreamingScorer(model).eval())
    scripted.save(path, _extra_files={"metadata.json": json.dumps(metadata)})


def export_onnx(model: nn.Module, path: str, metadata: dict, opset: int = 17) -> None:
    import onnx
    scorer = StreamingScorer(model).eval()
    dim = model.config.input_dim
    feats = torch.zeros(1, 20, dim)
    cache = torch.zeros(1, model.cache_size)
    torch.onnx.export(
        scorer, (feats, cache), path, dynamo=False, opset_version=opset,
        input_names=["feats", "cache"], output_names=["probs", "new_cache"],
        dynamic_axes={"feats": {0: "batch", 1: "frames"}, "cache": {0: "batch"},
                      "probs": {0: "batch", 1: "frames"}, "new_cache": {0: "batch"}})
    proto = onnx.load(path)
    entry = proto.metadata_props.add()
    entry.key, entry.value = METADATA_KEY, json.dumps(metadata)
    onnx.save(proto, path)


def export_safetensors(model: nn.Module, path: str, metadata: dict) -> None:
    from safetensors.torch import save_file
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    save_file(state, path, metadata={"format": "pt"})
    side = os.path.join(os.path.dirname(os.path.abspath(path)), "config.json")
    with open(side, "w", encoding="utf-8") as f:
        json.dump(dict(metadata, model=metadata["model_config"]), f, indent=1)


# --------------------------------------------------------------------------- parity

def run_chunked(fn, feats: np.ndarray, cache_size: int, chunk: int) -> np.ndarray:
    """Feeds (T, D) features `chunk` frames at a time through fn(feats, cache)."""
    cache = np.zeros((1, cache_size), dtype=np.float32)
    outs = []
    for start in range(0, len(feats), chunk):
        probs, cache = fn(feats[None, start:start + chunk].astype(np.float32), cache)
        outs.append(probs[0])
    return np.concatenate(outs, axis=0)


def torch_fn(module: nn.Module):
    def fn(feats: np.ndarray, cache: np.ndarray):
        with torch.no_grad():
            probs, new_cache = module(torch.from_numpy(feats), torch.from_numpy(cache))
        return probs.numpy(), new_cache.numpy()
    return fn


def onnx_fn(path: str):
    import onnxruntime as ort
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    session = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])

    def fn(feats: np.ndarray, cache: np.ndarray):
        probs, new_cache = session.run(None, {"feats": feats, "cache": cache})
        return probs, new_cache
    return fn


def check_parity(model: nn.Module, paths: Dict[str, str], features: List[np.ndarray],
                 tolerance: float = 1e-4, chunks: Sequence[int] = (0, 1, 16)) -> Dict[str, float]:
    """Max |diff| of every exported format against PyTorch, whole-utterance (chunk 0)
    and streamed in chunks. Raises when any exceeds `tolerance`."""
    if not getattr(model, "streaming", True):
        chunks = (0,)      # a classifier sees whole clips only
    reference = torch_fn(StreamingScorer(model).eval())
    runners = {}
    if "torchscript" in paths:
        runners["torchscript"] = torch_fn(torch.jit.load(paths["torchscript"]).eval())
    if "onnx" in paths:
        runners["onnx"] = onnx_fn(paths["onnx"])
    worst: Dict[str, float] = {name: 0.0 for name in runners}
    for i, feats in enumerate(features):
        expected = run_chunked(reference, feats, model.cache_size, len(feats))
        for name, fn in runners.items():
            # Frame-by-frame streaming is the slowest check: two utterances suffice.
            for chunk in (c for c in chunks if c != 1 or i < 2):
                got = run_chunked(fn, feats, model.cache_size, chunk or len(feats))
                worst[name] = max(worst[name], float(np.max(np.abs(got - expected))))
    failed = {k: v for k, v in worst.items() if v > tolerance}
    for name, diff in worst.items():
        logger.info("parity %s vs PyTorch: max abs diff %.3g over %d utterances", name, diff,
                    len(features))
    if failed:
        raise RuntimeError("exported model disagrees with PyTorch beyond tolerance "
                           f"{tolerance}: " + ", ".join(f"{k} {v:.3g}" for k, v in failed.items()))
    return worst


def read_metadata(path: str) -> dict:
    """Metadata of any exported format (or a checkpoint, minimal)."""
    if path.endswith(".onnx"):
        import onnx
        proto = onnx.load(path, load_external_data=False)
        for entry in proto.metadata_props:
            if entry.key == METADATA_KEY:
                return json.loads(entry.value)
        raise ValueError(f"{path}: no {METADATA_KEY} in ONNX metadata")
    if path.endswith(".zip") or path.endswith(".jit") or path.endswith(".ts"):
        extra = {"metadata.json": ""}
        torch.jit.load(path, _extra_files=extra)
        return json.loads(extra["metadata.json"])
    if path.endswith(".safetensors"):
        with open(os.path.join(os.path.dirname(os.path.abspath(path)), "config.json")) as f:
            return json.load(f)
    raise ValueError(f"{path}: unknown model format (expected .onnx, .zip, .safetensors)")


def set_threshold(export_dir: str, threshold: float) -> None:
    """Stores the recommended threshold (chosen by scoring) in every exported format."""
    import onnx
    onnx_path = os.path.join(export_dir, "model.onnx")
    proto = onnx.load(onnx_path)
    for entry in proto.metadata_props:
        if entry.key == METADATA_KEY:
            meta = json.loads(entry.value)
            meta["threshold"] = threshold
            entry.value = json.dumps(meta)
    onnx.save(proto, onnx_path)
    ts_path = os.path.join(export_dir, "model.zip")
    extra = {"metadata.json": ""}
    module = torch.jit.load(ts_path, _extra_files=extra)
    meta = json.loads(extra["metadata.json"])
    meta["threshold"] = threshold
    module.save(ts_path, _extra_files={"metadata.json": json.dumps(meta)})
    side = os.path.join(export_dir, "config.json")
    with open(side, encoding="utf-8") as f:
        meta = json.load(f)
    meta["threshold"] = threshold
    with open(side, "w", encoding="utf-8") as f:
        json.dump(meta, f, indent=1)
