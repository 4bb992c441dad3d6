"""The training executor: torchrun DDP, exact resume, AMP, clipping, validation, logging."""
import contextlib
import logging
import math
import os
import time
from typing import Dict, List, Optional

import numpy as np
import torch
from torch import nn

from toolkit.cmvn import read_cmvn
from toolkit.config import Config, redact, to_dict
from toolkit.data.datalist import BAD_REASONS, BadCounter, DataList
from toolkit.data.dataset import (DataSource, UtteranceProcessor, open_source, rank_batches,
                                  workers_per_rank)
from toolkit.losses import build_loss, uses_ctc_head
from toolkit.models import build_model, count_parameters
from toolkit.trainer import checkpoint as ckpt
from toolkit.trainer import distributed as dist_util
from toolkit.trainer.clip import clip_and_step
from toolkit.trainer.distributed import DistInfo
from toolkit.trainer.experiment import load_init_weights
from toolkit.trainer.optim import build_optimizer, build_schedule

logger = logging.getLogger(__name__)


class TrainingError(RuntimeError):
    pass


class WithCTCHead(nn.Module):
    """Keyword logits and CTC logits from one encoder pass. DDP wraps this instead of
    the model when the loss has a CTC component: DDP synchronises only parameters used
    through the forward it wraps, and the model's own forward skips the CTC head."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, feats: torch.Tensor):
        hidden, _ = self.model.encode(feats, None)
        return self.model.classifier(hidden), self.model.ctc_head(hidden)


_LIBC = None


def release_free_memory() -> None:
    """Returns freed heap pages to the OS (glibc malloc_trim). Batches of varying shape
    fragment glibc's arenas: without this, a 22K-parameter model's process grows past
    3 GB; with it, it stays under 1 GB. A no-op where libc has no malloc_trim."""
    global _LIBC
    if _LIBC is None:
        import ctypes
        import ctypes.util
        try:
            _LIBC = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            _LIBC.malloc_trim.argtypes = [ctypes.c_size_t]
        except (OSError, AttributeError):
            _LIBC = False
    if _LIBC:
        _LIBC.malloc_trim(0)


@contextlib.contextmanager
def frozen_norm_stats(model: nn.Module):
    """Keeps BatchNorm running statistics unchanged (momentum 0) for zero-weight steps."""
    saved = []
    for m in model.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            saved.append((m, m.momentum))
            m.momentum = 0.0
    try:
        yield
    finally:
        for m, momentum in saved:
            m.momentum = momentum


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


class Trainer:
    def __init__(self, cfg: Config, exp_dir: str, info: DistInfo, resuming: bool):
        self.cfg = cfg
        self.exp_dir = exp_dir
        self.info = info
        self.device = info.device
        t = cfg.training
        torch.manual_seed(t.seed)
        np.random.seed(t.seed % (2 ** 32))
        if t.deterministic:
            torch.use_deterministic_algorithms(True, warn_only=True)
            if torch.backends.cudnn.is_available():
                torch.backends.cudnn.benchmark = False
                torch.backends.cudnn.deterministic = True

        self.loss_fn = build_loss(cfg.loss)
        self.use_ctc = uses_ctc_head(self.loss_fn)
        # Each component of a weighted-sum loss is logged on its own: (metric key, tag).
        self.loss_parts = [(f"loss_{i}", f"loss_{i}_{sub.type}") for i, (sub, _, _) in
                           enumerate(getattr(cfg.loss, "parsed", []))]
        if self.use_ctc and cfg.model.ctc_outputs <= 0:
            raise TrainingError("the loss has a ctc component but model.ctc_outputs is 0: "
                                "pass --units (toolkit.bin.make_lexicon) or set it")
        if self.use_ctc and cfg.loss.type == "ctc":
            raise TrainingError("loss.type ctc alone trains no keyword output: use weighted_sum "
                                "with a keyword loss and a ctc component")
        self.train_list = self._load_list(cfg.dataset.train_data, "train")
        self.dev_list = (self._load_list(cfg.dataset.dev_data, "dev")
                         if cfg.dataset.dev_data else None)

        cmvn = read_cmvn(cfg.model.cmvn_file) if cfg.model.cmvn_file else None
        self.model = build_model(cfg.model, cmvn).to(self.device)
        if t.init_checkpoint and not resuming:
            load_init_weights(self.model, t.init_checkpoint, t.init_allow_missing)
        self.optimizer = build_optimizer(self.model.parameters(), cfg.optim)
        self.amp_dtype = amp_dtype(cfg, self.device)
        self.scaler = (torch.amp.GradScaler(self.device.type)
                       if self.amp_dtype == torch.float16 else None)

        self.steps_per_epoch = self._optimizer_steps_per_epoch()
        total = cfg.optim.scheduler.total_steps or self.steps_per_epoch * t.max_epoch
        self.total_steps = total
        self.schedule = build_schedule(self.optimizer, cfg.optim.scheduler, total)
        # Each rank has its own dropout randomness; restored per rank on resume.
        torch.manual_seed(t.seed + 1000003 * info.rank)

        self.trained = WithCTCHead(self.model) if self.use_ctc else self.model
        self.ddp = self.trained
        if info.distributed:
            self.ddp = nn.parallel.DistributedDataParallel(
                self.trained,
                device_ids=[self.device.index] if self.device.type == "cuda" else None)

        self.step = 0
        self.epoch = 0
        self.batch_pos = 0          # micro-batches of the current epoch already trained
        self.nonfinite_run = 0
        self.nonfinite_total = 0
        self.epoch_bad = BadCounter()
        self.epoch_seen = 0
        self.writer = None
        self.save_seconds = 0.0
        self.trim_interval = t.malloc_trim_interval if self.device.type == "cpu" else 0
        processor_args = dict(seed=t.seed, from_features=self.train_list.has_features())
        noise = DataList.load(cfg.dataset.noise.noise_list, require_label=False) \
            if cfg.dataset.noise.noise_list and cfg.dataset.noise.prob > 0 else None
        rirs = DataList.load(cfg.dataset.reverb.rir_list, require_label=False) \
            if cfg.dataset.reverb.rir_list and cfg.dataset.reverb.prob > 0 else None
        self.train_proc = UtteranceProcessor(cfg.dataset, train=True, noise=noise, rirs=rirs,
                                             **processor_args)
        self.dev_proc = UtteranceProcessor(cfg.dataset, train=False, seed=t.seed,
                                           from_features=bool(self.dev_list and
                                                              self.dev_list.has_features()))
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
            logger.info("model %s: %d parameters; %d train utterances (%.2f h), %d optimizer "
                        "steps/epoch, %d loader workers per rank", cfg.model.type,
                        count_parameters(self.model), len(self.train_list),
                        self.train_list.total_hours(), self.steps_per_epoch, self.workers)

    # ------------------------------------------------------------------ setup helpers

    def _load_list(self, path: str, name: str) -> DataSource:
        if not path or not os.path.exists(path):
            raise FileNotFoundError(f"dataset.{name}_data: data list '{path}' not found")
        try:
            datalist = open_source(self.cfg.dataset.data_type, path, self.cfg.model.num_outputs,
                                   self.cfg.model.ctc_outputs if self.use_ctc else None)
        except ValueError as err:
            raise TrainingError(str(err)) from None
        total = len(datalist) + datalist.bad.total()
        if total == 0 or len(datalist) == 0:
            raise TrainingError(f"{path}: no usable entries ({datalist.bad.summary()})")
        if datalist.bad.total() / total > self.cfg.dataset.max_bad_fraction:
            raise TrainingError(
                f"{path}: {datalist.bad.total()} of {total} entries are bad, above "
                f"dataset.max_bad_fraction={self.cfg.dataset.max_bad_fraction}: "
                f"{datalist.bad.summary()}")
        return datalist

    def _rank_plan(self, epoch: int) -> List[np.ndarray]:
        batches = self.train_list.plan(self.cfg.dataset, self.cfg.training.seed, epoch, True)
        return rank_batches(batches, self.info.rank, self.info.world_size)

    def _optimizer_steps_per_epoch(self) -> int:
        micro = len(self._rank_plan(0))
        return max(1, math.ceil(micro / self.cfg.training.accum_grad))

    # ------------------------------------------------------------------ checkpoints

    def _payload(self) -> dict:
        rngs = dist_util.all_gather_object(ckpt.rng_state(), self.info)
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "schedule": self.schedule.state_dict(),
            "scaler": self.scaler.state_dict() if self.scaler is not None else {},
            "step": self.step, "epoch": self.epoch, "batch_pos": self.batch_pos,
            "nonfinite_run": self.nonfinite_run, "nonfinite_total": self.nonfinite_total,
            "epoch_bad": dict(self.epoch_bad.counts), "epoch_seen": self.epoch_seen,
            "rng": rngs, "world_size": self.info.world_size,
            "model_config": redact(to_dict(self.cfg)["model"]),
        }

    def save(self, dev_loss: Optional[float] = None) -> None:
        started = time.time()
        try:
            self._save(dev_loss)
        finally:
            self.save_seconds += time.time() - started

    def _save(self, dev_loss: Optional[float]) -> None:
        payload = self._payload()          # collective: every rank takes part
        if not self.info.is_main:
            return
        meta = {"epoch": self.epoch, "batch_pos": self.batch_pos, "dev_loss": dev_loss,
                "time": time.strftime("%Y-%m-%d %H:%M:%S")}
        t0 = time.time()
        path = ckpt.save_checkpoint(self.exp_dir, self.step, payload, meta)
        ckpt.prune(self.exp_dir, self.cfg.training.keep_last, self.cfg.training.keep_best)
        logger.info("saved %s (%.2f s)", os.path.basename(path), time.time() - t0)

    def resume(self) -> bool:
        info = ckpt.latest_valid(self.exp_dir) if self.info.is_main else None
        path = dist_util.broadcast_object(info.path if info else None, self.info)
        if path is None:
            return False
        state = ckpt.load_payload(path)
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.schedule.load_state_dict(state["schedule"])
        if self.scaler is not None and state["scaler"]:
            self.scaler.load_state_dict(state["scaler"])
        # A changed learning rate is allowed on resume: the schedule follows the config.
        self.schedule.set_base_lr(self.cfg.optim.lr)
        self.step, self.epoch, self.batch_pos = state["step"], state["epoch"], state["batch_pos"]
        self.nonfinite_run, self.nonfinite_total = state["nonfinite_run"], state["nonfinite_total"]
        self.epoch_bad.counts.update(state["epoch_bad"])
        self.epoch_seen = state["epoch_seen"]
        if state["world_size"] == self.info.world_size:
            ckpt.set_rng_state(state["rng"][self.info.rank])
        else:
            logger.warning("world size changed (%d -> %d): per-rank RNG states not restored, "
                           "the run continues but is no longer bitwise reproducible",
                           state["world_size"], self.info.world_size)
        logger.info("resumed from %s: epoch %d, batch %d, step %d", path, self.epoch,
                    self.batch_pos, self.step)
        return True

    # ------------------------------------------------------------------ steps

    def _forward_loss(self, batch):
        if hasattr(self.loss_fn, "progress"):     # loss schedules switch on by progress
            self.loss_fn.progress = self.step / max(1, self.total_steps)
        feats = batch.feats.to(self.device, non_blocking=True)
        lengths = batch.lengths.to(self.device)
        labels = batch.labels.to(self.device)
        with torch.autocast(self.device.type, dtype=self.amp_dtype or torch.float32,
                            enabled=self.amp_dtype is not None):
            out = self.ddp(feats)
        return self._loss(out, lengths, labels, batch)   # loss in fp32

    def _loss(self, out, lengths, labels, batch):
        end = None if batch.keyword_end is None else batch.keyword_end.to(self.device)
        if not self.use_ctc:
            return self.loss_fn(out[0], lengths, labels, keyword_end=end)
        logits, ctc_logits = out
        return self.loss_fn(logits, lengths, labels, ctc_logits,
                            batch.tokens.to(self.device), batch.token_lengths.to(self.device),
                            keyword_end=end)

    def _dummy_batch(self):
        from toolkit.data.dataset import collate
        dim = self.cfg.model.input_dim
        # Two frames: BatchNorm in training mode needs more than one value per channel.
        return collate(["<empty>"], [np.zeros((2, dim), np.float32)], [-1], 0.0, BadCounter(), dim,
                       [[]] if self.use_ctc else None)

    def _micro_step(self, batch, boundary: bool) -> Dict[str, float]:
        empty = len(batch) == 0
        if empty:
            batch = self._dummy_batch()
        sync = contextlib.nullcontext()
        if self.info.distributed and not boundary:
            sync = self.ddp.no_sync()
        frozen = frozen_norm_stats(self.model) if empty else contextlib.nullcontext()
        with sync, frozen:
            loss, metrics = self._forward_loss(batch)
            # An empty batch still runs forward/backward (weight 0) so that the gradient
            # all-reduce of the other ranks finds this one: no hang on uneven data.
            weight = 0.0 if empty else 1.0 / self.cfg.training.accum_grad
            scaled = loss * weight
            if self.scaler is not None:
                scaled = self.scaler.scale(scaled)
            scaled.backward()
        if empty:
            return {"loss": 0.0, "acc": 0.0, "n": 0}
        stats = {"loss": float(loss.detach()), "acc": float(metrics["acc"]), "n": len(batch)}
        for name, _ in self.loss_parts:     # components of a weighted sum, when switched on
            if name in metrics:
                stats[name] = float(metrics[name])
        return stats

    def _optimizer_step(self) -> Dict[str, float]:
        norm, applied = clip_and_step(self.model.parameters(), self.optimizer,
                                      self.cfg.training.grad_clip, self.scaler)
        self.optimizer.zero_grad(set_to_none=True)
        if applied:
            self.nonfinite_run = 0
        else:
            self.nonfinite_run += 1
            self.nonfinite_total += 1
            logger.warning("step %d: non-finite gradient norm (%s); update skipped "
                           "(%d in a row, %d in total)", self.step, norm, self.nonfinite_run,
                           self.nonfinite_total)
            if self.nonfinite_run >= self.cfg.training.max_nonfinite_steps:
                raise TrainingError(f"{self.nonfinite_run} consecutive non-finite gradient norms "
                                    "(training.max_nonfinite_steps); lower the learning rate or "
                                    "check the data")
        self.step += 1
        self.schedule.step()
        if self.trim_interval and self.step % self.trim_interval == 0:
            release_free_memory()
        return {"grad_norm": norm, "skipped": 0.0 if applied else 1.0}

    # ------------------------------------------------------------------ validation

    @torch.no_grad()
    def validate(self) -> Optional[Dict[str, float]]:
        if self.dev_list is None:
            return None
        self.model.eval()
        batches = self.dev_list.plan(self.cfg.dataset, self.cfg.training.seed, 0, False)
        mine = rank_batches(batches, self.info.rank, self.info.world_size)
        loader = self.dev_list.loader(mine, self.dev_proc, 0, 0, self.workers,
                                      self.cfg.dataset.prefetch_factor, self.cfg.training.seed)
        loss_sum = acc_sum = count = 0.0
        for batch in loader:
            if len(batch) == 0:
                continue
            loss, metrics = self._forward_loss_eval(batch)
            loss_sum += float(loss) * len(batch)
            acc_sum += float(metrics["acc"]) * len(batch)
            count += len(batch)
        loss_sum, acc_sum, count = dist_util.all_reduce_sum([loss_sum, acc_sum, count], self.info)
        self.model.train()
        if count == 0:
            raise TrainingError(f"{self.cfg.dataset.dev_data}: no usable dev utterances")
        return {"loss": loss_sum / count, "acc": acc_sum / count, "count": count}

    def _forward_loss_eval(self, batch):
        feats = batch.feats.to(self.device)
        with torch.autocast(self.device.type, dtype=self.amp_dtype or torch.float32,
                            enabled=self.amp_dtype is not None):
            out = self.trained(feats)   # the bare module: no DDP sync in eval
        return self._loss(out, batch.lengths.to(self.device), batch.labels.to(self.device), batch)

    def _after_validation(self, result: Optional[Dict[str, float]], tag: str) -> Optional[float]:
        if result is None:
            return None
        self.schedule.on_validation(result["loss"])
        if self.info.is_main:
            logger.info("%s dev: loss %.5f acc %.4f over %d utterances (step %d)", tag,
                        result["loss"], result["acc"], int(result["count"]), self.step)
            if self.writer:
                self.writer.add_scalar("dev/loss", result["loss"], self.step)
                self.writer.add_scalar("dev/acc", result["acc"], self.step)
        return result["loss"]

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
            logger.info("epoch %d input: %d utterances used, %d skipped%s", self.epoch,
                        int(seen), int(bad_total),
                        f" ({self.epoch_bad.summary()} on rank 0)" if bad_total else "")
        if denominator and bad_total / denominator > self.cfg.dataset.max_bad_fraction \
                and (final or denominator >= 1000):
            raise TrainingError(
                f"{int(bad_total)} of {int(denominator)} utterances were bad this epoch, above "
                f"dataset.max_bad_fraction={self.cfg.dataset.max_bad_fraction}. Top reasons "
                f"(this rank): {self.epoch_bad.summary()}")

    # ------------------------------------------------------------------ main loop

    def train(self) -> None:
        t = self.cfg.training
        if self.info.is_main and t.tensorboard:
            from tensorboardX import SummaryWriter
            self.writer = SummaryWriter(os.path.join(self.exp_dir, "tensorboard"),
                                        purge_step=self.step if self.step else None)
        total_steps = self.steps_per_epoch * t.max_epoch
        run_start = time.time()
        start_step = self.step
        self.model.train()
        while self.epoch < t.max_epoch:
            plan = self._rank_plan(self.epoch)
            loader = self.train_list.loader(plan, self.train_proc, self.epoch, self.batch_pos,
                                            self.workers, self.cfg.dataset.prefetch_factor,
                                            t.seed + self.epoch)
            window = self._new_window()
            waited = time.time()
            for index, batch in zip(range(self.batch_pos, len(plan)), loader):
                window["wait"] += time.time() - waited
                self.epoch_bad.merge(batch.bad)
                self.epoch_seen += len(batch)
                boundary = (index + 1) % t.accum_grad == 0 or index + 1 == len(plan)
                stats = self._micro_step(batch, boundary)
                window["loss"] += stats["loss"] * stats["n"]
                window["acc"] += stats["acc"] * stats["n"]
                for name, _ in self.loss_parts:
                    if name in stats:
                        total, count = window["parts"].get(name, (0.0, 0))
                        window["parts"][name] = (total + stats[name] * stats["n"],
                                                 count + stats["n"])
                window["n"] += stats["n"]
                window["audio"] += batch.audio_seconds
                if not boundary:
                    waited = time.time()
                    continue
                step_stats = self._optimizer_step()
                self.batch_pos = index + 1
                if self.writer:
                    self.writer.add_scalar("train/lr", self.schedule.lr(), self.step)
                    self.writer.add_scalar("train/grad_norm", step_stats["grad_norm"], self.step)
                    self.writer.add_scalar("train/skipped_steps", self.nonfinite_total, self.step)
                if self.step % t.log_interval == 0:
                    self._log(window, run_start, start_step, total_steps)
                    self._check_bad(final=False)
                    window = self._new_window()
                dev_loss = None
                if t.val_interval_steps and self.step % t.val_interval_steps == 0 \
                        and self.batch_pos < len(plan):
                    dev_loss = self._after_validation(self.validate(), f"step {self.step}")
                if (t.save_interval_steps and self.step % t.save_interval_steps == 0
                        and self.batch_pos < len(plan)) or dev_loss is not None:
                    self.save(dev_loss)
                waited = time.time()
            self._check_bad(final=True)
            dev_loss = self._after_validation(self.validate(), f"epoch {self.epoch}")
            self.epoch += 1
            self.batch_pos = 0
            self.epoch_bad = BadCounter()
            self.epoch_seen = 0
            self.save(dev_loss)
        if self.writer:
            self.writer.close()
        if self.info.is_main:
            wall = time.time() - run_start
            logger.info("training finished: %d steps, %.1f s this run (%.2f steps/s); "
                        "checkpointing %.2f s = %.2f%% of wall time", self.step, wall,
                        (self.step - start_step) / max(wall, 1e-9), self.save_seconds,
                        100.0 * self.save_seconds / max(wall, 1e-9))

    @staticmethod
    def _new_window() -> dict:
        """Sums over the steps between two log lines ("parts": loss components)."""
        return {"loss": 0.0, "acc": 0.0, "n": 0, "audio": 0.0, "wait": 0.0, "parts": {},
                "t0": time.time()}

    def _log(self, window, run_start, start_step, total_steps) -> None:
        parts = [window["parts"].get(name, (0.0, 0)) for name, _ in self.loss_parts]
        values = dist_util.all_reduce_sum(
            [window["loss"], window["acc"], window["n"], window["audio"]]
            + [v for total_count in parts for v in total_count], self.info)
        if not self.info.is_main:
            return
        loss_sum, acc_sum, n, audio = values[:4]
        part_means = {label: values[4 + 2 * i] / values[5 + 2 * i]
                      for i, (_, label) in enumerate(self.loss_parts) if values[5 + 2 * i] > 0}
        elapsed = max(1e-6, time.time() - window["t0"])
        done = self.step - start_step
        rate = done / max(1e-6, time.time() - run_start)
        eta = (total_steps - self.step) / rate if rate > 0 else float("nan")
        loss = loss_sum / max(n, 1)
        logger.info("epoch %d step %d/%d loss %.5f acc %.4f lr %.3g | %.0f utt/s %.0f audio-s/s "
                    "loader wait %.0f%% | ETA %.0f s", self.epoch, self.step, total_steps, loss,
                    acc_sum / max(n, 1), self.schedule.lr(), n / elapsed, audio / elapsed,
                    100.0 * window["wait"] / elapsed, eta)
        if part_means:
            logger.info("epoch %d step %d loss components: %s", self.epoch, self.step,
                        " ".join(f"{k} {v:.5f}" for k, v in part_means.items()))
        if self.writer:
            for label, value in part_means.items():
                self.writer.add_scalar(f"train/{label}", value, self.step)
            self.writer.add_scalar("train/loss", loss, self.step)
            self.writer.add_scalar("train/acc", acc_sum / max(n, 1), self.step)
            self.writer.add_scalar("train/utts_per_s", n / elapsed, self.step)
            self.writer.add_scalar("train/audio_s_per_s", audio / elapsed, self.step)
            self.writer.add_scalar("train/loader_wait_s", window["wait"], self.step)

