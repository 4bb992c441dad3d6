"""The generic training executor: torchrun DDP, exact resume, AMP, several optimizers,
clipping, accumulation, validation, logging. It knows no model family: a Task (see
toolkit.task) supplies modules, data processing and the training step."""
import contextlib
import logging
import math
import os
import random
import time
from typing import Dict, List, Optional, Tuple

import numpy as np
import torch
from torch import nn

from toolkit.config import Config, Ramp, redact, to_dict
from toolkit.data.datalist import BAD_REASONS, BadCounter, DataList
from toolkit.data.pipeline import FeaturePipeline
from toolkit.data.plan import rank_batches
from toolkit.data.sources import DataSource, has_input, open_split
from toolkit.config import ConfigError
from toolkit.errors import DataError, UserError
from toolkit.progress import Progress, format_duration
from toolkit.task import Batch, Task
from toolkit.trainer import checkpoint as ckpt
from toolkit.trainer import distributed as dist_util
from toolkit.trainer.clip import clip_and_step
from toolkit.trainer.distributed import DistInfo
from toolkit.trainer.experiment import load_init_weights
from toolkit.memory import release_free_memory
from toolkit.nn.lean import plain_pass
from toolkit.trainer.optim import build_optimizer, build_schedule
from toolkit.trainer.tracking import open_metric_writer

logger = logging.getLogger(__name__)
PAYLOAD_FORMAT = 2


class TrainingError(UserError, RuntimeError):
    """Training cannot go on (too many bad inputs or non-finite updates): one line."""


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


def amp_dtype(cfg: Config, device: torch.device) -> Optional[torch.dtype]:
    t = cfg.training
    if not t.use_amp:
        return None
    if t.amp_dtype == "bfloat16":
        if device.type == "cuda" and not torch.cuda.is_bf16_supported():
            raise TrainingError(f"training.amp_dtype=bfloat16 but {torch.cuda.get_device_name(device)}"
                                " does not support bfloat16; use float16")
        return torch.bfloat16
    return torch.float16


def set_determinism(enabled: bool, device: torch.device) -> None:
    """Bitwise-reproducible kernels. On CUDA a nondeterministic op is then an error
    (cuBLAS needs CUBLAS_WORKSPACE_CONFIG, set by run.py before CUDA starts)."""
    if not enabled:
        return
    torch.use_deterministic_algorithms(True, warn_only=device.type != "cuda")
    if torch.backends.cudnn.is_available():
        torch.backends.cudnn.benchmark = False
        torch.backends.cudnn.deterministic = True


class _StepContext:
    """The trainer's side of toolkit.task.StepContext for one micro-batch."""

    def __init__(self, trainer: "Trainer", training: bool, boundary: bool = True,
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


class Trainer:
    def __init__(self, cfg: Config, task: Task, exp_dir: str, info: DistInfo):
        self.cfg = cfg
        self.task = task
        self.exp_dir = exp_dir
        self.info = info
        self.device = info.device
        t = cfg.training
        if t.max_epoch <= 0 and t.max_steps <= 0:
            raise ConfigError("training.max_epoch or training.max_steps must be given: say how "
                              "long to train (both: whichever is reached first)")
        torch.manual_seed(t.seed)
        np.random.seed(t.seed % (2 ** 32))
        random.seed(t.seed)
        set_determinism(t.deterministic, self.device)

        self.train_list = self._load_list("train")
        self.dev_list = self._load_list("dev") if has_input(cfg.dataset, "dev") else None
        task.check_data("train", self.train_list)
        if self.dev_list is not None:
            task.check_data("dev", self.dev_list)

        self.modules: Dict[str, nn.Module] = {n: m.to(self.device)
                                              for n, m in task.build_modules().items()}
        self.views = {n: task.training_view(n, m) for n, m in self.modules.items()}
        self.optimizer_modules = task.optimizer_modules()
        unknown = {m for ms in self.optimizer_modules.values() for m in ms} - set(self.modules)
        if unknown or set(self.optimizer_modules) != set(task.optimizers):
            raise RuntimeError(f"task {task.name}: optimizer_modules() names modules "
                               f"{sorted(unknown)} / optimizers {sorted(self.optimizer_modules)} "
                               f"that it does not build / declare")
        self.optimizers = {name: build_optimizer(self._params(name), cfg.optim[name])
                           for name in task.optimizers}
        self.amp_dtype = amp_dtype(cfg, self.device)
        self.scalers = ({name: torch.amp.GradScaler(self.device.type) for name in task.optimizers}
                        if self.amp_dtype == torch.float16 else {})

        self.steps_per_epoch = self._steps_in_plan(len(self._global_plan(0)), 0)
        if self.steps_per_epoch == 0:
            raise TrainingError(f"{self.train_list.path}: the batch plan is empty (every "
                                "utterance is outside dataset.min_duration/max_duration)")
        # Start step of every optimizer phase that has begun (restored from checkpoints):
        # a later change of the total moves only the boundaries of phases not yet begun.
        self.phase_starts: Dict[str, int] = {}
        self.total_steps = self._planned_total(self.steps_per_epoch * t.max_epoch)
        # (first step, total steps) of each run whose total differed from the one before:
        # a fraction ramp that began under a total keeps that total's switch points.
        self.ramp_totals: List[Tuple[int, int]] = [(0, self.total_steps)]
        self.schedules = {name: build_schedule(opt, cfg.optim[name].scheduler,
                                               self._schedule_total(name))
                          for name, opt in self.optimizers.items()}
        # Each rank has its own dropout randomness; restored per rank on resume.
        torch.manual_seed(t.seed + 1000003 * info.rank)

        self.step = 0
        self.epoch = 0
        self.global_pos = 0       # global batches of the current epoch already trained
        self.nonfinite_run = {n: 0 for n in task.optimizers}
        self.nonfinite_total = {n: 0 for n in task.optimizers}
        self.epoch_bad = BadCounter()
        self.epoch_seen = 0
        self.writer = None
        self.save_seconds = 0.0
        self.wrapped: Dict[str, nn.Module] = {}
        self.trace = None
        self.trim_interval = t.malloc_trim_interval if self.device.type == "cpu" else 0
        self.lean_units = t.lean_units
        self.num_threads = torch.get_num_threads()
        noise = DataList.load(cfg.dataset.noise.noise_list, require_label=False) \
            if cfg.dataset.noise.noise_list and _ever_positive(cfg.dataset.noise.prob) else None
        rirs = DataList.load(cfg.dataset.reverb.rir_list, require_label=False) \
            if cfg.dataset.reverb.rir_list and _ever_positive(cfg.dataset.reverb.prob) else None
        # The task gets its pipelines ready: the dataset section's decoding, augmentation
        # (training only, with the noise and RIR lists and the steps ramps follow) and
        # features; its builder adds what its examples need.
        self.train_builder = task.example_builder(FeaturePipeline(
            cfg.dataset, t.seed, True, noise, rirs, self.steps_per_epoch, self.total_steps))
        self.dev_builder = task.example_builder(FeaturePipeline(cfg.dataset, t.seed, False))
        if self.train_list.has_features():
            waveform_aug = [name for name, on in (
                ("speed_perturb", bool(cfg.dataset.speed_perturb)),
                ("volume_range", bool(cfg.dataset.volume_range)),
                ("noise", noise is not None), ("reverb", rirs is not None)) if on]
            if waveform_aug:
                logger.warning("training from precomputed features: waveform augmentations "
                               "%s are off", ", ".join(waveform_aug))
        self.workers = workers_per_rank(cfg.dataset.num_workers, info.local_world_size)
        if info.is_main:
            outside = (f" ({self.train_list.outside_duration} outside the duration limits "
                       "left out)" if self.train_list.outside_duration else "")
            logger.info("%s; %d train utterances (%.2f h)%s, %d optimizer steps/epoch, "
                        "%d loader workers per rank", task.describe(self.modules),
                        len(self.train_list), self.train_list.total_hours(), outside,
                        self.steps_per_epoch, self.workers)

    # ------------------------------------------------------------------ setup helpers

    def _params(self, optimizer: str) -> List[nn.Parameter]:
        return [p for m in self.optimizer_modules[optimizer]
                for p in self.modules[m].parameters() if p.requires_grad]

    def _planned_total(self, by_epochs: int) -> int:
        """The steps this run trains: the limit the config gives (max_steps, or the
        `by_epochs` steps of max_epoch epochs), the smaller one when it gives both."""
        t = self.cfg.training
        limits = [n for n, given in ((t.max_steps, t.max_steps > 0),
                                     (by_epochs, t.max_epoch > 0)) if given]
        return max(1, min(limits))

    def _limit_reached(self) -> Optional[str]:
        """The configured limit that ends training now, or None."""
        t = self.cfg.training
        if t.max_steps > 0 and self.step >= t.max_steps:
            return f"training.max_steps={t.max_steps} reached at epoch {self.epoch}"
        if t.max_epoch > 0 and self.epoch >= t.max_epoch:
            return f"training.max_epoch={t.max_epoch} reached at step {self.step}"
        return None

    def _schedule_total(self, name: str) -> int:
        explicit = self.cfg.optim[name].scheduler.total_steps
        start = self.start_step(name)
        return explicit or max(1, self.total_steps - start)

    def start_step(self, optimizer: str) -> int:
        if optimizer in self.phase_starts:
            return self.phase_starts[optimizer]
        # The same step at which a Ramp starting at that fraction switches on.
        return int(math.ceil(self.cfg.optim[optimizer].start_fraction * self.total_steps - 1e-9))

    def optimizer_active(self, optimizer: str, step: int) -> bool:
        return step >= self.start_step(optimizer)

    def _record_phase_starts(self) -> None:
        """Notes the phases active at the step being taken (self.step), once each."""
        for name in self.optimizers:
            if name not in self.phase_starts and self.optimizer_active(name, self.step):
                self.phase_starts[name] = self.start_step(name)

    def _load_list(self, name: str) -> DataSource:
        try:
            source = open_split(self.cfg.dataset, name, self.task.data_requirements(name),
                                self.task.example_frames)
        except UserError:
            raise
        except (ValueError, OSError) as err:
            raise DataError(str(err)) from None
        path = source.path
        total = len(source) + source.bad.total()
        if total == 0 or len(source) == 0:
            raise TrainingError(f"{path}: no usable entries ({source.bad.summary()})")
        if source.bad.total() / total > self.cfg.dataset.max_bad_fraction:
            raise TrainingError(
                f"{path}: {source.bad.total()} of {total} entries are bad, above "
                f"dataset.max_bad_fraction={self.cfg.dataset.max_bad_fraction}: "
                f"{source.bad.summary()}")
        return source

    def _global_plan(self, epoch: int) -> List[np.ndarray]:
        return self.train_list.plan(self.cfg.dataset, self.cfg.training.seed, epoch, True)

    def _steps_in_plan(self, num_global: int, done: int) -> int:
        micro = math.ceil(max(0, num_global - done) / self.info.world_size)
        return max(1, math.ceil(micro / self.cfg.training.accum_grad)) if micro else 0

    # ------------------------------------------------------------------ checkpoints

    def _payload(self) -> dict:
        per_rank = dist_util.all_gather_object({
            "rng": ckpt.rng_state(cuda=self.device.type == "cuda"),
            "epoch_bad": dict(self.epoch_bad.counts), "epoch_seen": self.epoch_seen,
            "epoch_bad_examples": {k: list(v) for k, v in self.epoch_bad.examples.items()},
        }, self.info)
        return {
            "format": PAYLOAD_FORMAT,
            "task": self.task.name,
            "modules": {n: m.state_dict() for n, m in self.modules.items()},
            "optimizers": {n: o.state_dict() for n, o in self.optimizers.items()},
            "schedules": {n: s.state_dict() for n, s in self.schedules.items()},
            "scalers": {n: s.state_dict() for n, s in self.scalers.items()},
            "task_state": self.task.state_dict(),
            "step": self.step, "epoch": self.epoch, "global_batch_pos": self.global_pos,
            "phase_starts": dict(self.phase_starts),
            "ramp_totals": [list(x) for x in self.ramp_totals],
            "nonfinite_run": dict(self.nonfinite_run),
            "nonfinite_total": dict(self.nonfinite_total),
            "per_rank": per_rank, "world_size": self.info.world_size,
            "num_threads": self.num_threads,
            "config": redact(to_dict(self.cfg)),
        }

    def save(self, dev_metric: Optional[float] = None) -> None:
        started = time.time()
        try:
            payload = self._payload()          # collective: every rank takes part
            if not self.info.is_main:
                return
            meta = {"epoch": self.epoch, "global_batch_pos": self.global_pos,
                    "dev_metric": dev_metric, "dev_metric_name": self.task.selection_metric,
                    "time": time.strftime("%Y-%m-%d %H:%M:%S")}
            if self.writer:     # a run killed once the checkpoint exists lost no scalar of it
                self.writer.flush()
            t0 = time.time()
            path = ckpt.save_checkpoint(self.exp_dir, self.step, payload, meta)
            ckpt.prune(self.exp_dir, self.cfg.training.keep_last, self.cfg.training.keep_best)
            logger.info("saved %s (%.2f s)", os.path.basename(path), time.time() - t0)
        finally:
            self.save_seconds += time.time() - started

    def restore(self, resume_path: Optional[str]) -> str:
        """Resumes from `resume_path` (chosen by rank 0) or initialises from
        training.init_checkpoint; returns what happened, for the log."""
        if resume_path is None:
            init = self.cfg.training.init_checkpoint
            if init:
                names = load_init_weights(self.modules, self.task, init,
                                          self.cfg.training.init_allow_missing)
                return f"initialised {', '.join(names)} from {init} (weights only)"
            return "started from random initialisation"
        state = ckpt.load_payload(resume_path)
        if state.get("format") != PAYLOAD_FORMAT or state.get("task") != self.task.name:
            raise ConfigError(f"{resume_path} is not a {self.task.name} checkpoint of this "
                              "toolkit version; start a new exp dir")
        for name, module in self.modules.items():
            module.load_state_dict(state["modules"][name])
        for name, opt in self.optimizers.items():
            opt.load_state_dict(state["optimizers"][name])
            self._apply_optimizer_config(name)
        for name, sched in self.schedules.items():
            sched.load_state_dict(state["schedules"][name])
            # An allowed LR change applies on resume: the schedule follows the config.
            sched.set_base_lr(self.cfg.optim[name].lr)
        for name, scaler in self.scalers.items():
            if state["scalers"].get(name):
                scaler.load_state_dict(state["scalers"][name])
        self.task.load_state_dict(state["task_state"])
        self.step, self.epoch = state["step"], state["epoch"]
        self.global_pos = state["global_batch_pos"]
        self._restore_phase_starts(state)
        self.nonfinite_run.update(state["nonfinite_run"])
        self.nonfinite_total.update(state["nonfinite_total"])
        saved_world = state["world_size"]
        per_rank = state["per_rank"]
        if saved_world == self.info.world_size:
            mine = per_rank[self.info.rank]
            ckpt.set_rng_state(mine["rng"])
            self._restore_counts([mine])
        elif self.info.is_main:        # the epoch's counts so far, summed, live on rank 0
            self._restore_counts(per_rank)
        if saved_world != self.info.world_size:
            self._rescale_for_world_size(saved_world)
        if state.get("num_threads") not in (None, self.num_threads) and self.info.is_main:
            logger.warning("this run uses %d CPU threads per process, the checkpoint's run "
                           "%s: results stay correct but are no longer bitwise those of an "
                           "uninterrupted run (set OMP_NUM_THREADS to match)",
                           self.num_threads, state["num_threads"])
        self._restore_ramp_totals(state)
        return (f"resumed from {resume_path}: epoch {self.epoch}, global batch "
                f"{self.global_pos}, step {self.step}")

    def _restore_phase_starts(self, state: dict) -> None:
        """Phases that had begun stay on whatever total this run computes (a changed
        max_steps / max_epoch or world size). Checkpoints written before the starts were
        recorded tell them by the steps each optimizer's schedule has taken."""
        if "phase_starts" in state:
            starts = {n: int(v) for n, v in state["phase_starts"].items() if n in self.optimizers}
        else:
            starts = {n: max(0, self.step - int(s["step_count"]))
                      for n, s in state["schedules"].items()
                      if n in self.optimizers and int(s["step_count"]) > 0}
        moved = {n: (self.start_step(n), v) for n, v in starts.items()
                 if self.start_step(n) != v}
        self.phase_starts = starts
        for name, sched in self.schedules.items():
            sched.total_steps = max(1, self._schedule_total(name))
            sched.reapply()
        if moved and self.info.is_main:
            logger.info("optimizer phase(s) %s began before this run's total of %d steps moved "
                        "their start; they stay on from the recorded step(s) %s",
                        ", ".join(moved), self.total_steps,
                        ", ".join(str(v) for _, v in moved.values()))

    def _restore_ramp_totals(self, state: dict) -> None:
        history = [(int(a), int(b)) for a, b in state.get("ramp_totals", [])]
        if not history:             # a checkpoint from before the totals were recorded
            history = [(0, self.total_steps)]
        if history[-1][1] != self.total_steps:
            history.append((self.step, self.total_steps))
        self.ramp_totals = history

    def ramp_total(self, ramp: Ramp, step: int) -> int:
        """The total a fraction ramp is evaluated against at `step`: that of the run in
        which it reached its start, so a switched-on loss stays on when a resume extends
        max_steps / max_epoch (or a world-size change moves the total)."""
        if ramp.unit != "fraction" or len(self.ramp_totals) == 1:
            return self.total_steps
        for i, (first, total) in enumerate(self.ramp_totals):
            last = self.ramp_totals[i + 1][0] if i + 1 < len(self.ramp_totals) else step + 1
            begins = max(first, int(math.ceil(ramp.start * total - 1e-9)))
            if begins < min(last, step + 1):
                return total
        return self.total_steps

    def _restore_counts(self, ranks: List[dict]) -> None:
        for r in ranks:
            counter = BadCounter()
            counter.counts.update(r["epoch_bad"])
            counter.examples = {k: list(v) for k, v in r.get("epoch_bad_examples", {}).items()}
            self.epoch_bad.merge(counter)
            self.epoch_seen += r["epoch_seen"]

    def _apply_optimizer_config(self, name: str) -> None:
        """Optimizer.load_state_dict restores the saved hyperparameters; the config's
        (possibly changed, allowed) values win."""
        o = self.cfg.optim[name]
        values = {"weight_decay": o.weight_decay, "eps": o.eps, "betas": tuple(o.betas),
                  "momentum": o.momentum, "amsgrad": o.amsgrad}
        for group in self.optimizers[name].param_groups:
            for key, value in values.items():
                if key in group:
                    group[key] = value

    def _rescale_for_world_size(self, saved_world: int) -> None:
        """Another world size: the rest of the epoch is dealt to the new ranks (exact data
        accounting); the LR schedule now ends when the data does."""
        t = self.cfg.training
        remaining = self._steps_in_plan(len(self._global_plan(self.epoch)), self.global_pos)
        per_epoch = self._steps_in_plan(len(self._global_plan(0)), 0)
        self.total_steps = self._planned_total(self.step + remaining + per_epoch * max(
            0, t.max_epoch - self.epoch - 1))
        self.steps_per_epoch = per_epoch
        for name, sched in self.schedules.items():
            sched.total_steps = self._schedule_total(name)
            sched.reapply()
        if self.info.is_main:
            logger.warning("world size changed (%d -> %d): the rest of epoch %d (global batches "
                           "%d on) is dealt to the %d ranks, so every utterance is still seen "
                           "once; the schedule now ends at step %d; random streams are not "
                           "those of an uninterrupted run", saved_world, self.info.world_size,
                           self.epoch, self.global_pos, self.info.world_size, self.total_steps)

    def wrap_ddp(self) -> None:
        """DDP per module with trainable parameters (after any weights are loaded)."""
        if not self.info.distributed:
            return
        for name, module in self.modules.items():
            if not any(p.requires_grad for p in module.parameters()):
                continue
            self.wrapped[name] = nn.parallel.DistributedDataParallel(
                self.views[name], device_ids=[self.device.index] if self.device.type == "cuda" else None,
                find_unused_parameters=self.task.find_unused_parameters(name))

    # ------------------------------------------------------------------ steps

    def optimizer_step(self, name: str, factor: float) -> Dict[str, float]:
        t = self.cfg.training
        optimizer = self.optimizers[name]
        clip = self.cfg.optim[name].grad_clip or t.grad_clip
        if factor == 0.0:
            # No rank had data for this step (every utterance of its batches was bad).
            optimizer.zero_grad(set_to_none=True)
            self.schedules[name].step()
            return {"grad_norm": 0.0, "skipped": 1.0}
        norm, applied = clip_and_step(self._params(name), optimizer, clip,
                                      self.scalers.get(name), factor)
        optimizer.zero_grad(set_to_none=True)
        self.schedules[name].step()
        if applied:
            self.nonfinite_run[name] = 0
        else:
            self.nonfinite_run[name] += 1
            self.nonfinite_total[name] += 1
            logger.warning("step %d: non-finite gradient norm of optimizer %s (%s); update "
                           "skipped (%d in a row, %d in total)", self.step, name, norm,
                           self.nonfinite_run[name], self.nonfinite_total[name])
            if self.nonfinite_run[name] >= t.max_nonfinite_steps:
                raise TrainingError(
                    f"{self.nonfinite_run[name]} consecutive non-finite gradient norms "
                    f"(optimizer {name}, training.max_nonfinite_steps); lower the learning "
                    "rate or check the data")
        return {"grad_norm": norm, "skipped": 0.0 if applied else 1.0}

    def _micro_step(self, batch: Batch, boundary: bool, factor: float) -> Dict[str, float]:
        empty = len(batch) == 0
        if empty:
            batch = self.task.dummy_batch()
        sync = contextlib.ExitStack()
        if self.info.distributed and not boundary:
            for ddp in self.wrapped.values():
                sync.enter_context(ddp.no_sync())
        if boundary:
            self._record_phase_starts()
        frozen = frozen_norm_stats(self.modules.values()) if empty else contextlib.nullcontext()
        ctx = _StepContext(self, True, boundary, 0.0 if empty else 1.0, factor)
        plain = contextlib.nullcontext() if self.lean_units else plain_pass()
        with sync, frozen, plain:
            metrics = self.task.train_step(batch, ctx)
        if boundary:
            for name in self.optimizers:
                if name not in ctx.results:
                    # Not stepped this time (inactive phase): drop stray gradients.
                    self.optimizers[name].zero_grad(set_to_none=True)
            self.last_step_results = ctx.results
        if empty:
            return {"n": 0}
        return dict(metrics, n=len(batch))

    # ------------------------------------------------------------------ validation

    @torch.no_grad()
    def validate(self) -> Optional[Dict[str, float]]:
        if self.dev_list is None:
            return None
        for m in self.modules.values():
            m.eval()
        started = time.time()
        batches = self.dev_list.plan(self.cfg.dataset, self.cfg.training.seed, 0, False)
        mine = rank_batches(batches, self.info.rank, self.info.world_size)
        loader = self.dev_list.loader(mine, self.dev_builder, 0, 0, self.workers,
                                      self.cfg.dataset.prefetch_factor, self.cfg.training.seed)
        state = self.task.eval_begin()
        # A long validation says how far it is (a bar on a terminal, log lines otherwise).
        bar = Progress(len(mine), "validation", "batches", interval_s=30.0) \
            if self.info.is_main else None
        for batch in loader:
            if bar is not None:
                bar.update()
            if len(batch) == 0:
                continue
            self.task.eval_batch(batch, _StepContext(self, False), state)
        if bar is not None and bar.bar is not None:
            bar.bar.close()
        result = self.task.eval_end(dist_util.all_gather_object(state, self.info))
        for m in self.modules.values():
            m.train()
        if not result.get("count"):
            raise TrainingError(f"{self.dev_list.path}: no usable dev utterances")
        result["seconds"] = time.time() - started
        return result

    def _after_validation(self, result: Optional[Dict[str, float]], tag: str) -> Optional[float]:
        if result is None:
            return None
        metric = result[self.task.selection_metric]
        for name, sched in self.schedules.items():
            # A plateau schedule judges its own optimizer's steps: none before its phase.
            if self.optimizer_active(name, max(0, self.step - 1)):
                sched.on_validation(metric)
        if self.info.is_main:
            shown = " ".join(f"{k} {v:.5f}" for k, v in result.items()
                             if k not in ("count", "seconds"))
            logger.info("%s dev: %s over %d utterances (step %d, %.1f s)", tag, shown,
                        int(result["count"]), self.step, result["seconds"])
            if self.writer:
                for k, v in result.items():
                    if k not in ("count", "seconds"):
                        self.writer.add_scalar(f"dev/{k}", v, self.step)
        return metric

    # ------------------------------------------------------------------ bad input

    def _check_bad(self, final: bool) -> None:
        vec = dist_util.all_reduce_sum(self.epoch_bad.vector() + [self.epoch_seen], self.info)
        bad_total, seen = sum(vec[:-1]), vec[-1]
        if self.info.is_main and self.writer and final:
            for reason, n in zip(BAD_REASONS, vec[:-1]):
                if n:
                    self.writer.add_scalar(f"bad_input/{reason}", n, self.step)
        denominator = bad_total + seen
        if final and self.info.is_main:
            outside = self.train_list.outside_duration
            logger.info("epoch %d input: %d utterances used, %d skipped%s%s", self.epoch,
                        int(seen), int(bad_total),
                        f" ({self.epoch_bad.summary()} on rank 0)" if bad_total else "",
                        f"; {outside} outside the duration limits were not planned"
                        if outside else "")
        if denominator and bad_total / denominator > self.cfg.dataset.max_bad_fraction \
                and (final or denominator >= 1000):
            raise TrainingError(
                f"{int(bad_total)} of {int(denominator)} utterances were bad this epoch, above "
                f"dataset.max_bad_fraction={self.cfg.dataset.max_bad_fraction}. Top reasons "
                f"(this rank): {self.epoch_bad.summary()}")

    # ------------------------------------------------------------------ main loop

    def _open_trace(self) -> None:
        if self.cfg.training.trace_keys:
            path = os.path.join(self.exp_dir, "log", f"keys.rank{self.info.rank}.txt")
            self.trace = open(path, "a", encoding="utf-8", buffering=1)

    def _real_in_group(self, local: int) -> float:
        """Real micro-batches of this optimizer step over all ranks (its gradient is their
        mean: an empty rank or a short last group weighs nothing)."""
        return dist_util.all_reduce_sum([float(local)], self.info)[0]

    def train(self) -> None:
        t = self.cfg.training
        if self.info.is_main:
            self.writer = open_metric_writer(self.cfg, self.exp_dir, self.step)
        self._open_trace()
        run_start = time.time()
        start_step = self.step
        for m in self.modules.values():
            m.train()
        # The limit the config gives ends the run: max_epoch at an epoch end, max_steps at
        # that step (however many epochs it takes); with both, the first one reached.
        ended_by = self._limit_reached()
        while ended_by is None:
            plan = self._global_plan(self.epoch)
            if not plan:
                raise TrainingError(f"{self.train_list.path}: epoch {self.epoch} plans "
                                    "no batches")
            done = min(self.global_pos, len(plan))
            mine = rank_batches(plan[done:], self.info.rank, self.info.world_size)
            loader = self.train_list.loader(mine, self.train_builder, self.epoch, 0,
                                            self.workers, self.cfg.dataset.prefetch_factor,
                                            t.seed + self.epoch)
            window = self._new_window()
            waited = time.time()
            group_real = 0
            for index, batch in zip(range(len(mine)), loader):
                window["wait"] += time.time() - waited
                self.epoch_bad.merge(batch.bad)
                self.epoch_seen += len(batch)
                boundary = (index + 1) % t.accum_grad == 0 or index + 1 == len(mine)
                group_real += 1 if len(batch) else 0
                factor = 1.0
                if boundary:
                    real = (self._real_in_group(group_real) if self.info.distributed
                            else float(group_real))
                    # DDP averages over ranks; the step's gradient becomes the mean over
                    # its real micro-batches (an empty rank or a short last group adds
                    # nothing). 1.0 for one process without accumulation.
                    factor = self.info.world_size / real if real else 0.0
                    group_real = 0
                if self.trace is not None and len(batch):
                    self.trace.write(f"{self.epoch} {self.step + 1} {' '.join(batch.keys)}\n")
                stats = self._micro_step(batch, boundary, factor)
                self._accumulate(window, stats, batch)
                if not boundary:
                    waited = time.time()
                    continue
                self.step += 1
                self.global_pos = min(len(plan), done + (index + 1) * self.info.world_size)
                if self.trim_interval and self.step % self.trim_interval == 0:
                    release_free_memory()
                self._log_step()
                if self.step % t.log_interval == 0:
                    self._log(window, run_start, start_step)
                    self._check_bad(final=False)
                    window = self._new_window()
                if t.max_steps > 0 and self.step >= t.max_steps:
                    break
                dev = None
                if t.val_interval_steps and self.step % t.val_interval_steps == 0 \
                        and index + 1 < len(mine):
                    dev = self._after_validation(self.validate(), f"step {self.step}")
                if (t.save_interval_steps and self.step % t.save_interval_steps == 0
                        and index + 1 < len(mine)) or dev is not None:
                    self.save(dev)
                waited = time.time()
            epoch_done = self.global_pos >= len(plan)
            if epoch_done:
                self._check_bad(final=True)
            dev = self._after_validation(self.validate(),
                                         f"epoch {self.epoch}" if epoch_done else f"step {self.step}")
            if epoch_done:
                self.epoch += 1
                self.global_pos = 0
                self.epoch_bad = BadCounter()
                self.epoch_seen = 0
            self.save(dev)
            ended_by = self._limit_reached()
        if self.writer:
            self.writer.close()
        if self.trace is not None:
            self.trace.close()
        # Every rank logs it: ranks that drifted apart (a sync bug) are visible at a glance.
        logger.info("rank %d final parameter checksum %s", self.info.rank, self.checksum())
        if self.info.is_main:
            import resource
            wall = time.time() - run_start
            usage = resource.getrusage(resource.RUSAGE_SELF)
            workers = resource.getrusage(resource.RUSAGE_CHILDREN)
            logger.info("training finished: %d steps (%s), %s this run (%.2f steps/s); "
                        "checkpointing %.2f s = %.2f%% of wall time; peak RSS %.2f GB (loader "
                        "workers %.2f GB); CPU user %.0f s, system %.0f s", self.step,
                        ended_by, format_duration(wall),
                        (self.step - start_step) / max(wall, 1e-9),
                        self.save_seconds, 100.0 * self.save_seconds / max(wall, 1e-9),
                        usage.ru_maxrss / 2 ** 20, workers.ru_maxrss / 2 ** 20,
                        usage.ru_utime + workers.ru_utime, usage.ru_stime + workers.ru_stime)
            if self.device.type == "cuda":
                logger.info("CUDA peak memory %.2f GB allocated, %.2f GB reserved",
                            torch.cuda.max_memory_allocated(self.device) / 2 ** 30,
                            torch.cuda.max_memory_reserved(self.device) / 2 ** 30)

    def checksum(self) -> str:
        import hashlib
        h = hashlib.sha256()
        for name in sorted(self.modules):
            for key, value in self.modules[name].state_dict().items():
                if value.is_floating_point() and "running" not in key:
                    h.update(value.detach().cpu().contiguous().numpy().tobytes())
        return h.hexdigest()[:16]

    # ------------------------------------------------------------------ logging

    @staticmethod
    def _new_window() -> dict:
        """Sums over the steps between two log lines."""
        return {"metrics": {}, "n": 0, "audio": 0.0, "wait": 0.0, "t0": time.time()}

    @staticmethod
    def _accumulate(window: dict, stats: Dict[str, float], batch: Batch) -> None:
        n = stats.pop("n")
        if n:
            for k, v in stats.items():
                total, count = window["metrics"].get(k, (0.0, 0))
                window["metrics"][k] = (total + float(v) * n, count + n)
        window["n"] += n
        window["audio"] += batch.audio_seconds

    def _log_step(self) -> None:
        if not self.writer:
            return
        for name, result in getattr(self, "last_step_results", {}).items():
            suffix = "" if len(self.optimizers) == 1 else f"_{name}"
            self.writer.add_scalar(f"train/lr{suffix}", self.schedules[name].lr(), self.step)
            self.writer.add_scalar(f"train/grad_norm{suffix}", result["grad_norm"], self.step)
            self.writer.add_scalar(f"train/skipped_steps{suffix}", self.nonfinite_total[name],
                                   self.step)

    def _log(self, window, run_start, start_step) -> None:
        # Every rank reduces the same vector: the metric names come from the task.
        names = list(self.task.train_metric_names())
        values = dist_util.all_reduce_sum(
            [window["n"], window["audio"]]
            + [v for k in names for v in window["metrics"].get(k, (0.0, 0))], self.info)
        if not self.info.is_main:
            return
        n, audio = values[:2]
        means = {k: values[2 + 2 * i] / values[3 + 2 * i]
                 for i, k in enumerate(names) if values[3 + 2 * i] > 0}
        elapsed = max(1e-6, time.time() - window["t0"])
        done = self.step - start_step
        rate = done / max(1e-6, time.time() - run_start)
        eta = (self.total_steps - self.step) / rate if rate > 0 else float("nan")
        lrs = " ".join(f"lr{'' if len(self.schedules) == 1 else '_' + k} {s.lr():.3g}"
                       for k, s in self.schedules.items())
        shown = " ".join(f"{k} {v:.5f}" for k, v in means.items())
        logger.info("epoch %d step %d/%d %s %s | %.0f utt/s %.0f audio-s/s loader wait %.0f%% "
                    "| ETA %s", self.epoch, self.step, self.total_steps, shown, lrs,
                    n / elapsed, audio / elapsed, 100.0 * window["wait"] / elapsed,
                    format_duration(eta))
        if self.writer:
            for k, v in means.items():
                self.writer.add_scalar(f"train/{k}", v, self.step)
            self.writer.add_scalar("train/utts_per_s", n / elapsed, self.step)
            self.writer.add_scalar("train/audio_s_per_s", audio / elapsed, self.step)
            self.writer.add_scalar("train/loader_wait_s", window["wait"], self.step)


def _ever_positive(ramp: Ramp) -> bool:
    return ramp.initial > 0 or ramp.final > 0


def workers_per_rank(configured: int, local_world_size: int) -> int:
    """The configured worker count is per node; share it among the local ranks."""
    if configured <= 0:
        return 0
    return max(1, configured // max(1, local_world_size))
