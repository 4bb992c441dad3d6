"""Frozen teachers of codec training: pretrained models whose features the codec learns
from, loaded from local files (TorchScript .pt/.zip or ONNX .onnx) and never trained.

- Semantic distillation (`teachers.distillation`, weight `loss.distillation`): a
  training-only head (`DistillationHead`, a 1x1 conv) maps the encoder output, or the first
  VQ stage's output, to the teacher's feature size; the loss pulls it towards the teacher's
  features of the same input audio (cosine distance or L1), the teacher's frames
  interpolated onto the code frames. The teacher only supplies targets, so an ONNX model
  works (no gradient passes through it).
- Perceptual loss (`teachers.perceptual`, weight `loss.perceptual`): L1 between the frozen
  model's features of the decoded audio and of the reference, scaled by the reference
  features' mean magnitude. The gradient passes through the teacher to the decoder, so only
  TorchScript teachers qualify; ONNX Runtime cannot differentiate.

A teacher reads mono float audio (batch, samples) at its own `sample_rate` (the audio is
resampled to it differentiably, with the data pipeline's band-limited resampler) and returns
features (batch, time, dim) (`time_axis: 1`) or (batch, dim, time) (`time_axis: 2`), possibly
as one of several outputs (`output`). Teachers live in the task, not among the trained
modules: no optimizer, checkpoint, DDP wrapper or export ever holds them; the distillation
head is a module of its own, trained with the generator, checkpointed for exact resume,
left out of exports and started fresh by `training.init_checkpoint`.
"""
import math
import os
from dataclasses import dataclass, field
from typing import Callable, Optional

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from toolkit.config import ConfigError
from toolkit.errors import DataError, MissingInputError

BUILTIN_PREFIX = "builtin:"       # a teacher computed by the toolkit (toolkit.tasks.codec.pitch)
TORCHSCRIPT_SUFFIXES = (".pt", ".zip")
ONNX_SUFFIXES = (".onnx",)


@dataclass
class TeacherConfig:
    # local TorchScript (.pt, .zip) or ONNX (.onnx) file, or builtin:periodicity (the
    # toolkit's own pitch features, toolkit.tasks.codec.pitch); empty: no teacher
    model: str = ""
    sample_rate: int = 16000      # rate the teacher reads; audio is resampled to it
    output: int = 0               # which of the model's outputs holds the features (0 for a single tensor)
    time_axis: int = 1            # feature axis that is time: 1 for (batch, time, dim), 2 for (batch, dim, time)


@dataclass
class DistillationTeacherConfig(TeacherConfig):
    # what the head reads: encoder (the encoder output) or first_stage (the first VQ stage's
    # output, SpeechTokenizer's choice: the first codebook carries the content)
    source: str = "encoder"
    loss: str = "cosine"          # cosine (1 - cosine similarity per frame) or l1


@dataclass
class PerceptualTeacherConfig(TeacherConfig):
    # local TorchScript (.pt, .zip) file (the loss backpropagates through it, which ONNX
    # Runtime cannot); empty: no teacher
    model: str = ""


@dataclass
class TeachersConfig:
    # semantic distillation target: features of the input audio (weight: loss.distillation)
    distillation: DistillationTeacherConfig = field(default_factory=DistillationTeacherConfig)
    # perceptual loss model: features of decoded vs reference audio (weight: loss.perceptual);
    # TorchScript only, as the gradient flows through it
    perceptual: PerceptualTeacherConfig = field(default_factory=PerceptualTeacherConfig)


DISTILLATION_SOURCES = ("encoder", "first_stage")
DISTILLATION_LOSSES = ("cosine", "l1")


def check_teacher_config(cfg: TeacherConfig, key: str, weight_on: bool,
                         needs_gradient: bool) -> None:
    """Schema-level checks of teachers.<key> (files are looked at when training loads them)."""
    where = f"teachers.{key}"
    if weight_on and not cfg.model:
        raise ConfigError(f"loss.{key} is positive but {where}.model is empty: name the "
                          "teacher's TorchScript or ONNX file")
    if not cfg.model:
        return
    if cfg.model.startswith(BUILTIN_PREFIX):
        from toolkit.tasks.codec.pitch import BUILTIN_TEACHERS
        name = cfg.model[len(BUILTIN_PREFIX):]
        if name not in BUILTIN_TEACHERS:
            raise ConfigError(f"{where}.model: unknown built-in teacher {name!r}; known: "
                              + ", ".join(BUILTIN_PREFIX + n for n in BUILTIN_TEACHERS))
        return
    suffix = os.path.splitext(cfg.model)[1].lower()
    if suffix not in TORCHSCRIPT_SUFFIXES + ONNX_SUFFIXES:
        raise ConfigError(f"{where}.model: {cfg.model!r} is neither TorchScript (.pt, .zip) "
                          "nor ONNX (.onnx)")
    if needs_gradient and suffix in ONNX_SUFFIXES:
        raise ConfigError(f"{where}.model: {cfg.model!r} is ONNX, but the perceptual loss "
                          "backpropagates through its teacher and ONNX Runtime computes no "
                          "gradients: give a TorchScript (.pt, .zip) export of the model "
                          "(ONNX teachers serve teachers.distillation)")
    if cfg.sample_rate <= 0:
        raise ConfigError(f"{where}.sample_rate must be positive, got {cfg.sample_rate}")
    if cfg.output < 0:
        raise ConfigError(f"{where}.output must be >= 0, got {cfg.output}")
    if cfg.time_axis not in (1, 2):
        raise ConfigError(f"{where}.time_axis: 1 (batch, time, dim) or 2 (batch, dim, time), "
                          f"got {cfg.time_axis}")


def check_distillation_config(cfg: DistillationTeacherConfig) -> None:
    if cfg.source not in DISTILLATION_SOURCES:
        raise ConfigError(f"teachers.distillation.source: expected "
                          f"{' or '.join(DISTILLATION_SOURCES)}, got {cfg.source!r}")
    if cfg.loss not in DISTILLATION_LOSSES:
        raise ConfigError(f"teachers.distillation.loss: expected "
                          f"{' or '.join(DISTILLATION_LOSSES)}, got {cfg.loss!r}")


# --------------------------------------------------------------------------- resampling

def _resampling_matrix(orig_sr: int, new_sr: int) -> np.ndarray:
    """The data pipeline's polyphase block matrix (toolkit.data.audio.resample)."""
    from toolkit.data.audio import _block_matrix
    g = math.gcd(orig_sr, new_sr)
    return _block_matrix(new_sr // g, orig_sr // g, 32, 0.93, 8.6)


class Resampler(nn.Module):
    """(B, T) at orig_sr -> (B, ceil(T * new_sr / orig_sr)) at new_sr: the same band-limited
    polyphase filter as toolkit.data.audio.resample (equal to float rounding), as one unfold
    and matmul, so gradients pass through it."""

    def __init__(self, orig_sr: int, new_sr: int):
        super().__init__()
        g = math.gcd(orig_sr, new_sr)
        self.up, self.down = new_sr // g, orig_sr // g
        self.identity = orig_sr == new_sr
        if self.identity:
            return
        mat = _resampling_matrix(orig_sr, new_sr)
        last_base = ((self.up - 1) * self.down) // self.up
        self.half = (mat.shape[1] - last_base) // 2         # k: taps either side
        self.register_buffer("matrix", torch.from_numpy(mat).t().contiguous(), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.identity:
            return x
        n_out = -(-x.shape[-1] * self.up // self.down)
        n_blocks = -(-n_out // self.up)
        width = self.matrix.shape[0]
        total = (n_blocks - 1) * self.down + width
        x = F.pad(x, (self.half - 1, max(0, total - (self.half - 1) - x.shape[-1])))
        blocks = x.unfold(-1, width, self.down)[:, :n_blocks]        # (B, blocks, width)
        return (blocks @ self.matrix).reshape(x.shape[0], -1)[:, :n_out]


# --------------------------------------------------------------------------- teachers

class FrozenTeacher:
    """A loaded teacher: `features(audio)` with audio (B, T) float32 at `sample_rate` gives
    (B, frames, dim) float32. Parameters of a TorchScript teacher collect no gradient; with
    `differentiable`, gradients flow through it to its input."""

    def __init__(self, cfg: TeacherConfig, key: str, device: torch.device,
                 differentiable: bool):
        self.cfg, self.key, self.device = cfg, key, device
        self.sample_rate = cfg.sample_rate
        self.where = f"teachers.{key}.model {cfg.model}"
        self.differentiable = differentiable
        self._resamplers = {}
        if cfg.model.startswith(BUILTIN_PREFIX):
            from toolkit.tasks.codec.pitch import BUILTIN_TEACHERS
            self.onnx = False
            self.module = BUILTIN_TEACHERS[cfg.model[len(BUILTIN_PREFIX):]]().to(device).eval()
            self._run = self.module
            return
        if not os.path.exists(cfg.model):
            raise MissingInputError(f"teachers.{key}.model: {cfg.model} not found")
        self.onnx = os.path.splitext(cfg.model)[1].lower() in ONNX_SUFFIXES
        if differentiable and self.onnx:           # check_config refuses this first
            raise ConfigError(f"{self.where}: an ONNX teacher passes no gradient")
        self._run: Callable[[torch.Tensor], object]
        if self.onnx:
            self._run = self._onnx_runner()
        else:
            try:
                module = torch.jit.load(cfg.model, map_location=device)
            except (RuntimeError, ValueError) as err:
                raise DataError(f"{self.where} is not a TorchScript model: "
                                f"{str(err).splitlines()[0]}") from None
            module.eval()
            for p in module.parameters():
                p.requires_grad_(False)
            self.module = module
            self._run = module

    def _onnx_runner(self):
        try:
            import onnxruntime as ort
        except ImportError:
            raise ConfigError(f"{self.where}: ONNX teachers need onnxruntime (installed by "
                              "tools/install.sh)") from None
        options = ort.SessionOptions()
        # One thread: the same reduction order every run (exact resume).
        options.intra_op_num_threads = options.inter_op_num_threads = 1
        try:
            session = ort.InferenceSession(self.cfg.model, options,
                                           providers=["CPUExecutionProvider"])
        except Exception as err:          # onnxruntime raises its own exception types
            raise DataError(f"{self.where} is not a usable ONNX model: "
                            f"{str(err).splitlines()[0]}") from None
        name = session.get_inputs()[0].name

        def run(audio: torch.Tensor):
            array = audio.detach().to("cpu", torch.float32).numpy()
            return [torch.from_numpy(o).to(self.device) for o in session.run(None, {name: array})]
        return run

    def resampler(self, rate: int) -> Resampler:
        if rate not in self._resamplers:
            self._resamplers[rate] = Resampler(rate, self.sample_rate).to(self.device)
        return self._resamplers[rate]

    def features(self, audio: torch.Tensor, rate: int) -> torch.Tensor:
        """audio (B, T) or (B, 1, T) at `rate` -> features (B, frames, dim) float32."""
        if audio.dim() == 3:
            audio = audio[:, 0]
        with torch.autocast(device_type=audio.device.type, enabled=False):
            audio = self.resampler(rate)(audio.float())
            if self.differentiable:
                out = self._run(audio)
            else:
                with torch.no_grad():
                    out = self._run(audio)
        return self._select(out)

    def _select(self, out) -> torch.Tensor:
        outputs = [out] if isinstance(out, torch.Tensor) else list(out)
        if self.cfg.output >= len(outputs):
            raise DataError(f"{self.where} returns {len(outputs)} output(s); "
                            f"teachers.{self.key}.output={self.cfg.output} is out of range")
        feats = outputs[self.cfg.output]
        if not isinstance(feats, torch.Tensor) or feats.dim() != 3:
            shape = tuple(feats.shape) if isinstance(feats, torch.Tensor) else type(feats).__name__
            raise DataError(f"{self.where}: output {self.cfg.output} is {shape}, expected "
                            "(batch, time, dim) or (batch, dim, time) features")
        feats = feats.float()
        return feats if self.cfg.time_axis == 1 else feats.transpose(1, 2)

    def feature_dim(self) -> int:
        """The feature size, from one second of silence."""
        probe = torch.zeros(1, self.sample_rate, device=self.device)
        with torch.no_grad():
            return int(self.features(probe, self.sample_rate).shape[-1])


class DistillationHead(nn.Module):
    """Training-only projection of the codec's latent frames onto the teacher's features:
    (B, latent_dim, frames) -> (B, teacher_dim, frames)."""

    def __init__(self, latent_dim: int, teacher_dim: int):
        super().__init__()
        self.project = nn.Conv1d(latent_dim, teacher_dim, kernel_size=1)

    def forward(self, latent: torch.Tensor) -> torch.Tensor:
        return self.project(latent)


def distillation_loss(prediction: torch.Tensor, target: torch.Tensor, kind: str) -> torch.Tensor:
    """prediction (B, dim, frames); target (B, teacher_frames, dim), interpolated linearly
    onto the prediction's frames. cosine: mean over frames of 1 - cos; l1: mean |difference|."""
    target = target.transpose(1, 2)
    if target.shape[-1] != prediction.shape[-1]:
        target = F.interpolate(target, size=prediction.shape[-1], mode="linear",
                               align_corners=False)
    prediction = prediction.float()
    if kind == "cosine":
        return (1.0 - F.cosine_similarity(prediction, target, dim=1, eps=1e-8)).mean()
    return F.l1_loss(prediction, target)


def perceptual_loss(fake: torch.Tensor, real: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """L1 between the teacher's features of decoded and reference audio, divided by the
    reference features' mean magnitude (so the weight does not depend on the teacher's
    feature scale); the reference side is detached."""
    real = real.detach()
    n = min(fake.shape[1], real.shape[1])
    return F.l1_loss(fake[:, :n], real[:, :n]) / (real[:, :n].abs().mean() + eps)
