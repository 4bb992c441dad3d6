"""The generic training executor: torchrun DDP, exact resume, AMP, several optimizers,
clipping, accumulation, validation, logging. It knows no model family: a Task (see
toolkit.task) supplies modules, data processing and the training step. The step context
a task's steps get is toolkit.trainer.context's; what a checkpoint holds and how a run
resumes from one, toolkit.trainer.resume's."""
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

from toolkit.config import Config, Ramp
from toolkit.data.datalist import BAD_REASONS, BadCounter, DataList
from toolkit.data.features_store import check_stored_features
from toolkit.data.pipeline import FeaturePipeline
from toolkit.data.plan import rank_batches
from toolkit.data.sources import DataSource, has_input, open_split
from toolkit.config import ConfigError
from toolkit.errors import DataError, UserError
from toolkit.progress import Progress
from toolkit.task import Batch, Task
from toolkit.trainer import distributed as dist_util
from toolkit.trainer.clip import clip_and_step
from toolkit.trainer.context import TrainerStepContext, frozen_norm_stats
from toolkit.trainer.report import Reporting
from toolkit.trainer.resume import Resumable
from toolkit.trainer.distributed import DistInfo
from toolkit.memory import release_free_memory
from toolkit.nn.lean import plain_pass
from toolkit.trainer.optim import build_optimizer, build_schedule
from toolkit.trainer.tracking import open_metric_writer

logger = logging.getLogger(__name__)


class TrainingError(UserError, RuntimeError):
    """Training cannot go on (too many bad inputs or non-finite updates): one line."""


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


class Trainer(Resumable, Reporting):
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
        self.stand_in: Optional[Batch] = None      # see _stand_in_batch
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
        train_pipeline = FeaturePipeline(cfg.dataset, t.seed, True, noise, rirs,
                                         self.steps_per_epoch, self.total_steps)
        self.train_builder = task.example_builder(train_pipeline)
        self.dev_builder = task.example_builder(FeaturePipeline(cfg.dataset, t.seed, False))
        for name, source in (("train", self.train_list), ("dev", self.dev_list)):
            if source is not None:     # precomputed by another front end: refused up front
                check_stored_features(source, train_pipeline.extractor,
                                      f"dataset.{name}_data {source.path}")
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

    def wrap_ddp(self) -> None:
        """DDP per module with trainable parameters (after any weights are loaded)."""
        if not self.info.distributed:
            return
        for name, module in self.modules.items():
            if not any(p.requires_grad for p in module.parameters()):
                continue
            self.wrapped[name] = nn.parallel.DistributedDataParallel(
                self.views[name], device_ids=[self.device.index] if self.device.type == "cuda" else None,
                find_unused_parameters=name in self.task.modules_with_unused_parameters)

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
            batch = self._stand_in_batch()
        sync = contextlib.ExitStack()
        if self.info.distributed and not boundary:
            for ddp in self.wrapped.values():
                sync.enter_context(ddp.no_sync())
        if boundary:
            self._record_phase_starts()
        frozen = frozen_norm_stats(self.modules.values()) if empty else contextlib.nullcontext()
        ctx = TrainerStepContext(self, True, boundary, 0.0 if empty else 1.0, factor)
        plain = contextlib.nullcontext() if self.lean_units else plain_pass()
        with sync, frozen, plain:
            metrics = self.task.train_step(batch, ctx)
        if boundary:
            for name in self.optimizers:
                if name not in ctx.results:
                    # Not stepped this time (inactive phase): drop stray gradients.
                    self.optimizers[name].zero_grad(set_to_none=True)
            self.last_step_results = ctx.results
        undeclared = set(metrics) - set(self.task.metrics.train)
        if undeclared:
            raise RuntimeError(f"task {self.task.name}: train_step returned "
                               f"{', '.join(sorted(undeclared))}, not in its metrics.train")
        if empty:
            return {"n": 0}
        return dict(metrics, n=len(batch))

    def _stand_in_batch(self) -> Batch:
        """Real data for a micro-step in which this rank has none (a short last group, or
        every utterance of its batch bad): its forward and backward at weight 0 let the
        other ranks' gradient all-reduce complete. The first usable batch of epoch 0's plan,
        built here by the training builder: the same in every run, so that a resumed run
        draws the random numbers an uninterrupted one does."""
        if self.stand_in is None:
            batches = iter(self.train_list.loader(self._global_plan(0), self.train_builder, 0,
                                                  0, 0, self.cfg.dataset.prefetch_factor,
                                                  self.cfg.training.seed))
            try:
                self.stand_in = next((b for b in batches if len(b)), None)
            finally:
                batches.close()
            if self.stand_in is None:
                raise TrainingError(f"{self.train_list.path}: no planned batch holds a usable "
                                    "utterance")
        return self.stand_in

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
            self.task.eval_batch(batch, TrainerStepContext(self, False), state)
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
        metric = result[self.task.metrics.select]
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
        self._log_run_end(run_start, start_step, ended_by)


def _ever_positive(ramp: Ramp) -> bool:
    return ramp.initial > 0 or ramp.final > 0


def workers_per_rank(configured: int, local_world_size: int) -> int:
    """The configured worker count is per node; share it among the local ranks."""
    if configured <= 0:
        return 0
    return max(1, configured // max(1, local_world_size))
