"""Glue behind `toolkit.bin.train`: config resolution, exp-dir locking, process group,
resume or init, and failure reporting that names the failed rank and its log."""
import logging
import os
import sys
import traceback

from toolkit.config import (ConfigError, apply_overrides, config_secrets, load_yaml,
                            register_secrets, task_class)
from toolkit.config import resolve_config as resolve_task_config
from toolkit.errors import MissingInputError, UserError
from toolkit.logging_utils import setup_logging
from toolkit.memory import allocator_in_use
from toolkit.trainer import checkpoint as ckpt
from toolkit.trainer import distributed as dist_util
from toolkit.trainer.experiment import data_fingerprint, prepare_exp_dir
from toolkit.trainer.lock import ExpDirLock

logger = logging.getLogger("toolkit.train")


def resolve_config(args):
    """File config (with its defaults list) + CLI paths + overrides + the values the task
    derives from the inventory and its declared inputs (`args.task_inputs`, name -> path)
    -> (validated Config, task class, inventory). The task must be registered (the binary
    imports toolkit.tasks)."""
    cli = []
    if args.train_data:
        cli.append(f"dataset.train_data={args.train_data}")
    if args.dev_data:
        cli.append(f"dataset.dev_data={args.dev_data}")
    if getattr(args, "init_checkpoint", None):
        cli.append(f"training.init_checkpoint={args.init_checkpoint}")
    raw = load_yaml(args.config)
    try:
        raw = apply_overrides(raw, cli + list(args.overrides))
    except ConfigError as err:
        raise ConfigError(f"{args.config}: {err}") from None
    inputs = dict(getattr(args, "task_inputs", None) or {}, inventory=args.inventory)
    cfg, inventory = resolve_task_config(raw, inputs, source=args.config)
    return cfg, task_class(raw), inventory


def _agree(problem, info):
    """Every rank learns whether any rank failed (and rank 0's or the first message)."""
    problems = dist_util.all_gather_object(problem, info)
    return next((p for p in problems if p), None)


def run_training(args) -> int:
    num_gpus = args.num_gpus
    use_cuda = num_gpus is not None and num_gpus > 0
    if use_cuda:
        # cuBLAS needs this before CUDA starts for deterministic GEMMs.
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    rank = int(os.environ.get("RANK", "0"))
    log_file = os.path.join(args.exp_dir, "log", f"train.rank{rank}.log")
    setup_logging(log_file, console=rank == 0, rank=rank)
    # Host memory depends on it (toolkit/memory.py): recorded with every run.
    logger.info("allocator: %s", allocator_in_use(), extra={"console": False})
    info = None
    lock = ExpDirLock(args.exp_dir, rank)
    try:
        info = dist_util.from_env(num_gpus if use_cuda else None, use_cuda)
        cfg, task_cls, inventory = resolve_config(args)
        register_secrets(config_secrets(cfg))
        dist_util.init(info, cfg.training.rank_failure_timeout_s)
        # Rank 0 checks the exp dir is free before anyone else touches it.
        problem = None
        if info.is_main:
            try:
                lock.acquire_exclusive_check()
            except UserError as err:
                problem = str(err)
        problem = dist_util.broadcast_object(problem, info)
        if problem:
            raise ConfigError(problem)
        if not info.is_main:
            try:
                lock.acquire_shared()
            except UserError as err:
                problem = str(err)
        problem = _agree(problem, info)
        if problem:
            raise ConfigError(problem)

        from toolkit.trainer.trainer import Trainer
        task = task_cls(cfg, inventory)
        trainer = Trainer(cfg, task, args.exp_dir, info)
        resume_path = None
        if info.is_main:
            try:
                referenced = {"train_data": trainer.train_list.referenced_files()}
                if trainer.dev_list is not None:
                    referenced["dev_data"] = trainer.dev_list.referenced_files()
                prepare_exp_dir(args.exp_dir, cfg, inventory,
                                data_fingerprint(cfg, referenced, task.fingerprinted_files()),
                                task_cls.optimizers, write=True)
                latest = ckpt.latest_valid(args.exp_dir)
                resume_path = latest.path if latest else None
                if latest is None and ckpt.has_checkpoint_files(args.exp_dir):
                    logger.warning("%s has checkpoint files but none is usable: not resuming",
                                   args.exp_dir)
            except UserError as err:
                problem = str(err)
        # The others wait for rank 0's fingerprint of every referenced file: no collective
        # timeout for that.
        problem, resume_path = dist_util.broadcast_object((problem, resume_path), info,
                                                          setup=True)
        if problem:
            raise ConfigError(problem)
        what = trainer.restore(resume_path)
        if info.is_main:
            logger.info("%s", what)
        trainer.wrap_ddp()
        trainer.train()
        dist_util.barrier(info)
        return 0
    except (UserError, FileNotFoundError) as err:
        # The user's input is wrong: say what, in one line, without a traceback (the log
        # file keeps it too). Rank 0 speaks for all: every rank meets the same input.
        logger.error("error: %s", err, extra={"console": rank != 0})
        if rank == 0:
            from toolkit.config.secrets import scrub_text
            print(f"error: {scrub_text(str(err))}", file=sys.stderr, flush=True)
        return 2
    except Exception as err:
        logger.error("rank %d failed: %s\n%s(full log: %s)", rank, err,
                     traceback.format_exc(), log_file)
        if info is not None and info.distributed:
            logger.error("other ranks stop when they next communicate (within "
                         "training.rank_failure_timeout_s) or when torchrun ends them; "
                         "see %s/log/train.rank*.log", args.exp_dir)
        raise
    finally:
        lock.release()
        if info is not None:
            dist_util.cleanup(info)


__all__ = ["run_training", "resolve_config", "MissingInputError"]
