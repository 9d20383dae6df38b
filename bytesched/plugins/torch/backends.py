"""Which backend a ScheduledOptimizer runs on: Horovod's when the user wrapped the optimizer in
``hvd.DistributedOptimizer``, else torch.distributed's (:mod:`.backend` says what a backend does).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from . import horovod
from .backend import Backend
from .distributed import DistributedBackend


def make_backend(optimizer: torch.optim.Optimizer, process_group: Any = None) -> Backend:
    """Horovod when ``optimizer`` is a ``hvd.DistributedOptimizer``, else torch.distributed when a
    process group is initialised; a clear error otherwise."""
    if horovod.is_distributed_optimizer(optimizer):
        if process_group is not None:
            raise ValueError("process_group= is for the torch.distributed backend; Horovod's "
                             "DistributedOptimizer brings its own process_set")
        return horovod.HorovodBackend(optimizer)
    if dist.is_available() and dist.is_initialized():
        return DistributedBackend(process_group, _device_of(optimizer))
    raise RuntimeError(
        f"ScheduledOptimizer needs an all-reduce backend for {type(optimizer).__name__}: either wrap it "
        "in hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters()) first "
        "(Horovod), or call torch.distributed.init_process_group() before creating it "
        "(torch.distributed)")


def _device_of(optimizer: torch.optim.Optimizer) -> torch.device:
    """Where ``optimizer``'s first parameter lives (the CPU if it has none)."""
    for group in optimizer.param_groups:
        for param in group["params"]:
            return param.device
    return torch.device("cpu")
