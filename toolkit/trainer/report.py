"""What a training run tells: the periodic log line and scalars of the training metrics
(reduced over ranks, named by the task's `metrics.train`), each optimizer step's learning
rate, gradient norm and skipped updates, and the end of the run (each rank's parameter
checksum, time, memory, CPU)."""
import hashlib
import logging
import resource
import time
from typing import Dict

import torch

from toolkit.progress import format_duration
from toolkit.task import Batch
from toolkit.trainer import distributed as dist_util

logger = logging.getLogger(__name__)


class Reporting:
    """Logging of toolkit.trainer.trainer.Trainer (mixed into it): reads the run's state
    (step, epoch, schedules, writer, the task's metric names) and writes nothing to it."""

    def _log_run_end(self, run_start: float, start_step: int, ended_by: str) -> None:
        # Every rank logs it: ranks that drifted apart (a sync bug) are visible at a glance.
        logger.info("rank %d final parameter checksum %s", self.info.rank, self.checksum())
        if self.info.is_main:
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
        names = list(self.task.metrics.train)
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
