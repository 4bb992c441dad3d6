"""Glue behind `toolkit.bin.train`: config resolution, exp-dir locking, process group,
resume, and failure reporting that names the failed rank and its log."""
import logging
import os
import traceback

from toolkit.config import ConfigError, apply_overrides, load_yaml, validate
from toolkit.data.datalist import read_inventory
from toolkit.data.tokens import read_units
from toolkit.logging_utils import setup_logging
from toolkit.trainer import distributed as dist_util
from toolkit.trainer.experiment import prepare_exp_dir
from toolkit.trainer.lock import ExpDirBusy, ExpDirLock

logger = logging.getLogger("toolkit.train")


def resolve_config(args, inventory):
    """File config + CLI paths + overrides -> validated Config with derived sizes filled."""
    raw = load_yaml(args.config)
    cli = []
    if args.train_data:
        cli.append(f"dataset.train_data={args.train_data}")
    if args.dev_data:
        cli.append(f"dataset.dev_data={args.dev_data}")
    if args.cmvn:
        cli.append(f"model.cmvn_file={args.cmvn}")
    if getattr(args, "init_checkpoint", None):
        cli.append(f"training.init_checkpoint={args.init_checkpoint}")
    try:
        cfg = validate(apply_overrides(raw, cli + list(args.overrides)))
    except ConfigError as err:
        raise ConfigError(f"{args.config}: {err}") from None
    if cfg.model.input_dim <= 0:
        cfg.model.input_dim = cfg.dataset.feature.num_mel_bins
    if cfg.model.num_outputs <= 0:
        cfg.model.num_outputs = len(inventory)
    if cfg.model.num_outputs != len(inventory):
        raise ConfigError(f"model.num_outputs={cfg.model.num_outputs} but the inventory "
                          f"{args.inventory} has {len(inventory)} entries")
    units_path = getattr(args, "units", None)
    if units_path and loss_has_ctc(cfg.loss):
        try:
            units = read_units(units_path)
        except (OSError, ValueError) as err:
            raise ConfigError(f"--units: {err}") from None
        if cfg.model.ctc_outputs <= 0:
            cfg.model.ctc_outputs = len(units)
        if cfg.model.ctc_outputs != len(units):
            raise ConfigError(f"model.ctc_outputs={cfg.model.ctc_outputs} but the unit list "
                              f"{units_path} has {len(units)} entries")
    return cfg


def loss_has_ctc(loss_cfg) -> bool:
    from toolkit.losses import build_loss, uses_ctc_head
    return uses_ctc_head(build_loss(loss_cfg))


def run_training(args) -> int:
    num_gpus = args.num_gpus
    use_cuda = num_gpus is not None and num_gpus > 0
    info = dist_util.from_env(num_gpus if use_cuda else None, use_cuda)
    log_file = os.path.join(args.exp_dir, "log", f"train.rank{info.rank}.log")
    setup_logging(log_file, console=info.is_main, rank=info.rank)
    lock = ExpDirLock(args.exp_dir, info.rank)
    try:
        inventory = read_inventory(args.inventory)
        cfg = resolve_config(args, inventory)
        dist_util.init(info, cfg.training.rank_failure_timeout_s)
        # Rank 0 checks the exp dir is free before anyone else touches it.
        problem = None
        if info.is_main:
            try:
                lock.acquire_exclusive_check()
                prepare_exp_dir(args.exp_dir, cfg, inventory, write=True)
            except (ExpDirBusy, ConfigError) as err:
                problem = str(err)
        problem = dist_util.broadcast_object(problem, info)
        if problem:
            if info.is_main:
                logger.error("%s", problem)
            return 2
        if not info.is_main:
            lock.acquire_shared()
        from toolkit.trainer.trainer import Trainer
        trainer = Trainer(cfg, args.exp_dir, info, resuming=_has_checkpoint(args.exp_dir))
        trainer.resume()
        trainer.train()
        dist_util.barrier(info)
        return 0
    except (ConfigError, FileNotFoundError) as err:
        # The user's input is wrong: say what, without a traceback.
        logger.error("%s", err)
        return 2
    except Exception as err:
        logger.error("rank %d failed: %s\n%s(full log: %s)", info.rank, err,
                     traceback.format_exc(), log_file)
        if info.distributed:
            logger.error("other ranks stop when they next communicate (within "
                         "training.rank_failure_timeout_s) or when torchrun ends them; "
                         "see %s/log/train.rank*.log", args.exp_dir)
        raise
    finally:
        lock.release()
        dist_util.cleanup(info)


def _has_checkpoint(exp_dir: str) -> bool:
    return any(name.startswith("ckpt-") for name in os.listdir(exp_dir))
