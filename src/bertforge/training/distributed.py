"""Minimal DDP plumbing: read the torchrun environment, pick this rank's device, init/destroy the process group,
small collectives."""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.distributed as dist


def distributed_context() -> tuple[int, int, int]:
    """(rank, world_size, local_rank) from the torchrun environment; (0, 1, 0) when not launched by torchrun."""
    return (
        int(os.environ.get("RANK", 0)),
        int(os.environ.get("WORLD_SIZE", 1)),
        int(os.environ.get("LOCAL_RANK", 0)),
    )


def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def init_distributed(device: torch.device) -> bool:
    """Init the default process group when torchrun asked for >1 process. True if this call created it."""
    _rank, world_size, _local = distributed_context()
    if world_size <= 1 or is_distributed():
        return False
    backend = "nccl" if device.type == "cuda" else "gloo"
    kwargs = {"device_id": device} if device.type == "cuda" else {}
    dist.init_process_group(backend=backend, **kwargs)
    return True


def barrier() -> None:
    if is_distributed():
        dist.barrier()


def all_reduce_sum(t: torch.Tensor) -> torch.Tensor:
    if is_distributed():
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


def broadcast_tensor(t: torch.Tensor, src: int = 0) -> torch.Tensor:
    if is_distributed():
        dist.broadcast(t, src=src)
    return t


def broadcast_object(obj: Any, src: int = 0) -> Any:
    if not is_distributed():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def all_gather_object(obj: Any) -> list[Any]:
    if not is_distributed():
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out
