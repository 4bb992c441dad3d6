"""What a checkpoint holds of a training run and how a run continues from one: the payload
every rank contributes to (modules, optimizers, schedules, scalers, task state, position,
optimizer phases, ramp totals, per-rank random state and bad-input counts), and the exact
resume, including onto another world size or another total of steps."""
import logging
import os
import time
from typing import List, Optional

from toolkit.config import ConfigError, redact, to_dict
from toolkit.data.datalist import BadCounter
from toolkit.trainer import checkpoint as ckpt
from toolkit.trainer import distributed as dist_util
from toolkit.trainer.experiment import load_init_weights

logger = logging.getLogger(__name__)
PAYLOAD_FORMAT = 2


class Resumable:
    """Checkpointing and resume of toolkit.trainer.trainer.Trainer (mixed into it): reads
    and sets the run's state it holds (modules, optimizers, schedules, step, epoch,
    global_pos, phase_starts, ramp_totals, the epoch's bad-input counts)."""

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
                    "dev_metric": dev_metric, "dev_metric_name": self.task.metrics.select,
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
