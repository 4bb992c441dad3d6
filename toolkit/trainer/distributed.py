"""torchrun is the source of truth: world size, ranks and device come from its
environment (WORLD_SIZE, RANK, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR/PORT)."""
import datetime
import logging
import os
from dataclasses import dataclass
from typing import Any, List, Optional

import torch
import torch.distributed as dist

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
        raise RuntimeError(
            f"--num-gpus {num_gpus} disagrees with torchrun's LOCAL_WORLD_SIZE={local_world} "
            f"(WORLD_SIZE={world}); launch torchrun with --nproc-per-node={num_gpus} or fix "
            "gpus= in run.sh")
    if use_cuda is None:
        use_cuda = num_gpus is not None and num_gpus > 0
    if use_cuda:
        if not torch.cuda.is_available():
            raise RuntimeError("GPUs were requested but CUDA is not available; set gpus=-1 "
                               "in run.sh to train on CPU")
        if local_rank >= torch.cuda.device_count():
            raise RuntimeError(f"LOCAL_RANK {local_rank} but only {torch.cuda.device_count()} "
                               "visible GPUs (check CUDA_VISIBLE_DEVICES / gpus=)")
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    return DistInfo(world, rank, local_rank, local_world, device)


def init(info: DistInfo, timeout_s: float) -> None:
    if not info.distributed:
        return
    backend = "nccl" if info.device.type == "cuda" else "gloo"
    kwargs = {"device_id": info.device} if backend == "nccl" else {}
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s), **kwargs)
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


def broadcast_object(obj: Any, info: DistInfo) -> Any:
    if not info.distributed:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def barrier(info: DistInfo) -> None:
    if info.distributed:
        dist.barrier()


def cleanup(info: DistInfo) -> None:
    if info.distributed and dist.is_initialized():
        dist.destroy_process_group()
