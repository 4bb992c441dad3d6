"""The trainer's side of a training step: the StepContext a task's train_step and
eval_step get (toolkit.task.StepContext), and what a zero-weight step needs (running
statistics kept unchanged)."""
import contextlib
from typing import Dict

import torch
from torch import nn

from toolkit.config import Ramp

@contextlib.contextmanager
def frozen_norm_stats(modules):
    """Keeps running statistics unchanged for zero-weight steps: BatchNorm's (momentum
    0), and those of any submodule that declares a `statistics_frozen` flag (e.g. EMA
    codebooks), which is set for the step."""
    saved, flagged = [], []
    for module in modules:
        for m in module.modules():
            if isinstance(m, nn.modules.batchnorm._BatchNorm):
                saved.append((m, m.momentum))
                m.momentum = 0.0
            if isinstance(getattr(m, "statistics_frozen", None), bool):
                flagged.append((m, m.statistics_frozen))
                m.statistics_frozen = True
    try:
        yield
    finally:
        for m, momentum in saved:
            m.momentum = momentum
        for m, flag in flagged:
            m.statistics_frozen = flag


class TrainerStepContext:
    """The trainer's toolkit.task.StepContext for one micro-batch: `weight` scales its
    losses (0 for a stand-in batch), `factor` its optimizer steps' gradients (the mean over
    the step's real micro-batches), `boundary` says whether it ends an accumulation group."""

    # `trainer`: the toolkit.trainer.trainer.Trainer running the step (not imported here:
    # that module imports this one).
    def __init__(self, trainer, training: bool, boundary: bool = True,
                 weight: float = 1.0, factor: float = 1.0):
        self.t = trainer
        self.training = training
        self.boundary = boundary
        self.weight = weight
        self.factor = factor
        self.step_index = trainer.step
        self.total_steps = trainer.total_steps
        self.epoch = trainer.epoch
        self.device = trainer.device
        self.results: Dict[str, Dict[str, float]] = {}

    @property
    def progress(self) -> float:
        return self.step_index / max(1, self.total_steps)

    def value(self, ramp: Ramp) -> float:
        return ramp.value(self.step_index, self.t.ramp_total(ramp, self.step_index))

    def module(self, name: str) -> nn.Module:
        if self.training:
            return self.t.wrapped.get(name, self.t.views[name])
        return self.t.views[name]

    def raw(self, name: str) -> nn.Module:
        return self.t.modules[name]

    def autocast(self):
        dtype = self.t.amp_dtype
        return torch.autocast(self.device.type, dtype=dtype or torch.float32,
                              enabled=dtype is not None)

    def fp32(self):
        return torch.autocast(self.device.type, enabled=False)

    def active(self, optimizer: str) -> bool:
        return self.t.optimizer_active(optimizer, self.step_index)

    @contextlib.contextmanager
    def frozen(self, *modules: str):
        params = [p for m in modules for p in self.t.modules[m].parameters() if p.requires_grad]
        for p in params:
            p.requires_grad_(False)
        try:
            yield
        finally:
            for p in params:
                p.requires_grad_(True)

    def backward(self, loss: torch.Tensor, optimizer: str) -> None:
        scaled = loss * self.weight if self.weight != 1.0 else loss
        scaler = self.t.scalers.get(optimizer)
        if scaler is not None:
            scaled = scaler.scale(scaled)
        scaled.backward()

    def step(self, optimizer: str) -> None:
        # Before its phase an optimizer does nothing (its schedule starts with the phase).
        if self.boundary and self.training and self.active(optimizer):
            self.results[optimizer] = self.t.optimizer_step(optimizer, self.factor)
