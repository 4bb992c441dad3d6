"""torchrun is the source of truth: world size, ranks and device come from its
environment (WORLD_SIZE, RANK, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR/PORT)."""
import datetime
import logging
import os
from dataclasses import dataclass
from typing import Any, List, Optional

import torch
import torch.distributed as dist

from toolkit.errors import DeviceError

logger = logging.getLogger(__name__)


@dataclass
class DistInfo:
    world_size: int
    rank: int
    local_rank: int
    local_world_size: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def from_env(num_gpus: Optional[int] = None, use_cuda: Optional[bool] = None) -> DistInfo:
    """Reads torchrun's variables. `num_gpus` (the recipe's expectation) must agree with
    WORLD_SIZE on one node: a mismatch is an error before any work starts."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
    if num_gpus is not None and num_gpus > 0 and num_gpus != local_world:
        raise DeviceError(
            f"--num-gpus {num_gpus} disagrees with torchrun's LOCAL_WORLD_SIZE={local_world} "
            f"(WORLD_SIZE={world}); launch torchrun with --nproc-per-node={num_gpus} or fix "
            "gpus= in run.sh")
    if use_cuda is None:
        use_cuda = num_gpus is not None and num_gpus > 0
    if use_cuda:
        if not torch.cuda.is_available():
            raise DeviceError("GPUs were requested but CUDA is not available; set gpus=-1 "
                              "in run.sh to train on CPU")
        if local_rank >= torch.cuda.device_count():
            raise DeviceError(f"LOCAL_RANK {local_rank} but only {torch.cuda.device_count()} "
                              "visible GPUs (check CUDA_VISIBLE_DEVICES / gpus=)")
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    return DistInfo(world, rank, local_rank, local_world, device)


def _restart_safe_store(info: DistInfo, timeout: datetime.timedelta) -> Optional[dist.Store]:
    """The store for init_process_group, isolated per torchrun restart.

    torchrun's agent hosts one TCPStore that outlives its workers and is shared by every
    restart round. The process group's keys (each rank's gloo/NCCL address) carry no round
    number, so after `--max-restarts` kicks in, a restarted rank can read the dead round's
    address and fail with "connection refused" (pytorch issues 135712 and 167288). On one
    node all workers share the agent's TORCHELASTIC_RESTART_COUNT, so it makes a safe key
    prefix. Across nodes the agents count restarts separately; utils/torchrun.sh therefore
    sets TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1, which gives every round a fresh store."""
    restarts_allowed = int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0")) > 0
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True" or not restarts_allowed:
        return None     # no restart round can meet stale keys: torch's default store
    if info.local_world_size != info.world_size:
        if info.is_main:
            logger.warning("torchrun --max-restarts across nodes with a shared rendezvous store: "
                           "a restart may reuse stale addresses; export "
                           "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 before torchrun "
                           "(utils/torchrun.sh does)")
        return None
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    agent_store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                                info.world_size, is_master=False, timeout=timeout)
    return dist.PrefixStore(f"toolkit/restart_{attempt}", agent_store)


# How long the other ranks wait for rank 0's one-off setup work (data fingerprint over every
# referenced file, checkpoint verification) before training: on network storage a large
# corpus takes minutes, far beyond training.rank_failure_timeout_s. A rank that dies
# meanwhile still stops the others at once (torchrun ends the group).
SETUP_TIMEOUT_S = 3 * 3600.0
_SETUP_GROUP = None


def init(info: DistInfo, timeout_s: float) -> None:
    global _SETUP_GROUP
    if not info.distributed:
        return
    backend = "nccl" if info.device.type == "cuda" else "gloo"
    kwargs = {"device_id": info.device} if backend == "nccl" else {}
    timeout = datetime.timedelta(seconds=timeout_s)
    store = _restart_safe_store(info, timeout)
    if store is not None:
        kwargs.update(store=store, rank=info.rank, world_size=info.world_size)
    dist.init_process_group(backend, timeout=timeout, **kwargs)
    _SETUP_GROUP = dist.new_group(backend="gloo", timeout=datetime.timedelta(
        seconds=max(timeout_s, SETUP_TIMEOUT_S)))
    logger.info("process group: backend=%s world=%d rank=%d local_rank=%d", backend,
                info.world_size, info.rank, info.local_rank)


def all_reduce_sum(values: List[float], info: DistInfo) -> List[float]:
    if not info.distributed:
        return list(values)
    t = torch.tensor(values, dtype=torch.float64,
                     device=info.device if info.device.type == "cuda" else "cpu")
    dist.all_reduce(t)
    return t.cpu().tolist()


def all_gather_object(obj: Any, info: DistInfo) -> List[Any]:
    if not info.distributed:
        return [obj]
    out: List[Any] = [None] * info.world_size
    dist.all_gather_object(out, obj)
    return out


def broadcast_object(obj: Any, info: DistInfo, setup: bool = False) -> Any:
    """Rank 0's `obj` on every rank. `setup`: the others may wait up to SETUP_TIMEOUT_S
    (rank 0 is doing one-off work), not training's collective timeout."""
    if not info.distributed:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0, group=_SETUP_GROUP if setup else None)
    return box[0]


def barrier(info: DistInfo) -> None:
    if info.distributed:
        dist.barrier()


def cleanup(info: DistInfo) -> None:
    global _SETUP_GROUP
    _SETUP_GROUP = None
    if info.distributed and dist.is_initialized():
        dist.destroy_process_group()
