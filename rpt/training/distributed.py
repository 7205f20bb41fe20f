"""Distributed helpers: one code path for a single process (CPU or one GPU) and for torchrun (DDP, optionally FSDP).

torchrun sets RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR / MASTER_PORT; with WORLD_SIZE > 1 we join the process
group (nccl on GPU, gloo on CPU). Everything else in the loop asks `DistInfo` instead of calling torch.distributed.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn


@dataclass(frozen=True)
class DistInfo:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    owns_group: bool = False  # True when `setup` created the process group (and `teardown` must destroy it)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def setup(device: str | None = None) -> DistInfo:
    """Read the torchrun environment, join the process group if needed, and pick this rank's device.

    device: "cpu", "cuda", "cuda:N" or None (= cuda when available). Under torchrun each rank gets cuda:LOCAL_RANK;
    one process takes cuda:N when named, else the current CUDA device.
    """
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local = int(os.environ.get("LOCAL_RANK", str(rank)))
    use_cuda = torch.cuda.is_available() if device is None else device.startswith("cuda")
    if not use_cuda:
        dev = torch.device("cpu")
    elif world > 1:
        dev = torch.device("cuda", local)
    else:
        dev = torch.device(device) if device and ":" in device else torch.device("cuda", torch.cuda.current_device())
    if use_cuda:
        torch.cuda.set_device(dev)
    owns = False
    if world > 1 and not dist.is_initialized():
        dist.init_process_group(backend="nccl" if use_cuda else "gloo", rank=rank, world_size=world)
        owns = True
    if dist.is_initialized():
        rank, world = dist.get_rank(), dist.get_world_size()
    return DistInfo(rank=rank, world_size=world, local_rank=local, device=dev, owns_group=owns)


def teardown(info: DistInfo) -> None:
    if info.owns_group and dist.is_initialized():
        dist.destroy_process_group()


def all_reduce_sum(t: torch.Tensor, info: DistInfo) -> torch.Tensor:
    """Sum a tensor over ranks in place (identity on one process); returns it."""
    if info.enabled:
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


def all_gather_object(obj: Any, info: DistInfo) -> list[Any]:
    if not info.enabled:
        return [obj]
    out: list[Any] = [None] * info.world_size
    dist.all_gather_object(out, obj)
    return out


def broadcast_object(obj: Any, info: DistInfo) -> Any:
    """Rank 0's `obj` on every rank."""
    if not info.enabled:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def barrier(info: DistInfo) -> None:
    if info.enabled:
        dist.barrier()


def wrap(model: nn.Module, info: DistInfo, fsdp: bool = False) -> nn.Module:
    """DDP (or FSDP when `fsdp`) around `model` when running on several ranks; the model itself otherwise.

    FSDP (torch's fully_shard, "FSDP2") shards every block of every nn.ModuleList (the decoder layers) as its own unit
    and the rest (tied embedding, retriever, final norm) in the root unit; the model keeps its class and parameter
    names, so checkpoints are interchangeable with DDP / single-process runs. Meant for the 1b preset on GPUs; it also
    runs on CPU with gloo (that is how it is tested).
    """
    if fsdp:
        if not dist.is_initialized():
            raise ValueError("fsdp needs a process group: launch with torchrun")
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh(info.device.type, (info.world_size,))
        for ml in [m for m in model.modules() if isinstance(m, nn.ModuleList)]:
            for block in ml:
                fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
        return model
    if not info.enabled:
        return model
    from torch.nn.parallel import DistributedDataParallel

    return DistributedDataParallel(model, device_ids=[info.device.index] if info.device.type == "cuda" else None)


def unwrap(model: nn.Module) -> nn.Module:
    """The user's module inside a DDP wrapper (an FSDP model is the user's module, sharded in place)."""
    return model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model


def is_fsdp(model: nn.Module) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


@contextlib.contextmanager
def maybe_no_sync(model: nn.Module, skip_sync: bool) -> Iterator[None]:
    """Skip the gradient reduction on all but the last micro-batch of an accumulated step (DDP and FSDP)."""
    if skip_sync and is_fsdp(model):
        model.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            model.set_requires_gradient_sync(True)
    elif skip_sync and hasattr(model, "no_sync"):
        with model.no_sync():
            yield
    else:
        yield
