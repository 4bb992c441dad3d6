"""Optimizer and learning-rate scheduler registries."""
import math

import torch

from toolkit.registry import Registry

OPTIMIZERS: Registry = Registry("optimizer")
SCHEDULERS: Registry = Registry("scheduler")


@OPTIMIZERS.register("adam")
def _adam(params, cfg):
    return torch.optim.Adam(params, lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.eps,
                            weight_decay=cfg.weight_decay, amsgrad=cfg.amsgrad)


@OPTIMIZERS.register("adamw")
def _adamw(params, cfg):
    return torch.optim.AdamW(params, lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.eps,
                             weight_decay=cfg.weight_decay, amsgrad=cfg.amsgrad)


@OPTIMIZERS.register("sgd")
def _sgd(params, cfg):
    return torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum, nesterov=cfg.momentum > 0,
                           weight_decay=cfg.weight_decay)


def build_optimizer(params, optim_cfg) -> torch.optim.Optimizer:
    return OPTIMIZERS.get(optim_cfg.type)(params, optim_cfg)


class Schedule:
    """Per-step learning-rate multiplier; `on_validation` lets plateau schedules react to
    dev loss. State is plain numbers so checkpoints stay weights_only-loadable."""

    def __init__(self, optimizer, cfg, total_steps: int):
        self.optimizer = optimizer
        self.cfg = cfg
        self.total_steps = max(1, total_steps)
        self.base_lrs = [g["lr"] for g in optimizer.param_groups]
        self.step_count = 0
        self.scale = 1.0          # plateau reductions multiply into this
        self.best = math.inf
        self.bad_validations = 0
        self._apply()

    def factor(self, step: int) -> float:
        return 1.0

    def _apply(self) -> None:
        f = self.factor(self.step_count) * self.scale
        for group, base in zip(self.optimizer.param_groups, self.base_lrs):
            group["lr"] = base * f

    def step(self) -> None:
        self.step_count += 1
        self._apply()

    def on_validation(self, dev_loss: float) -> None:
        pass

    def lr(self) -> float:
        return self.optimizer.param_groups[0]["lr"]

    def state_dict(self) -> dict:
        return {"step_count": self.step_count, "scale": self.scale, "best": self.best,
                "bad_validations": self.bad_validations}

    def load_state_dict(self, state: dict) -> None:
        self.step_count = int(state["step_count"])
        self.scale = float(state["scale"])
        self.best = float(state["best"])
        self.bad_validations = int(state["bad_validations"])
        self._apply()

    def set_base_lr(self, lr: float) -> None:
        self.base_lrs = [lr for _ in self.base_lrs]
        self._apply()

    def reapply(self) -> None:
        """Sets the LR again after total_steps changed (a resume on another world size)."""
        self._apply()


def _warmup(step: int, warmup: int) -> float:
    return 1.0 if warmup <= 0 or step >= warmup else (step + 1) / warmup


@SCHEDULERS.register("constant")
class ConstantSchedule(Schedule):
    def factor(self, step):
        return _warmup(step, self.cfg.warmup_steps)


@SCHEDULERS.register("warmup_linear")
class WarmupLinear(Schedule):
    def factor(self, step):
        w = self.cfg.warmup_steps
        if step < w:
            return _warmup(step, w)
        frac = min(1.0, (step - w) / max(1, self.total_steps - w))
        return 1.0 - (1.0 - self.cfg.final_lr_ratio) * frac


@SCHEDULERS.register("warmup_cosine")
class WarmupCosine(Schedule):
    def factor(self, step):
        w = self.cfg.warmup_steps
        if step < w:
            return _warmup(step, w)
        frac = min(1.0, (step - w) / max(1, self.total_steps - w))
        low = self.cfg.final_lr_ratio
        return low + (1.0 - low) * 0.5 * (1.0 + math.cos(math.pi * frac))


@SCHEDULERS.register("exponential")
class WarmupExponential(Schedule):
    """Warm-up, then a constant decay per step: `gamma` when set (DAC/HiFi-GAN style),
    else the rate that reaches `final_lr_ratio` at `total_steps`."""

    def factor(self, step):
        w = self.cfg.warmup_steps
        if step < w:
            return _warmup(step, w)
        gamma = self.cfg.gamma or self.cfg.final_lr_ratio ** (1.0 / max(1, self.total_steps - w))
        return max(gamma ** (step - w), 0.0)


@SCHEDULERS.register("reduce_on_plateau")
class ReduceOnPlateau(Schedule):
    def factor(self, step):
        return _warmup(step, self.cfg.warmup_steps)

    def on_validation(self, dev_loss: float) -> None:
        if dev_loss < self.best - 1e-6:
            self.best, self.bad_validations = dev_loss, 0
            return
        self.bad_validations += 1
        if self.bad_validations > self.cfg.patience:
            self.scale *= self.cfg.factor
            self.bad_validations = 0
        self._apply()


def build_schedule(optimizer, sched_cfg, total_steps: int) -> Schedule:
    return SCHEDULERS.get(sched_cfg.type)(optimizer, sched_cfg, total_steps)
