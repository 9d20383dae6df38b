"""Each trainable parameter as the PyTorch plugin tracks it (:class:`ParamSlot`), and the errors a
training loop meets when it does what cannot cross the step() barrier, with the ways out they name.

Both the Core's path (:mod:`.pipeline`) and passing through (:mod:`.passthrough`) keep the same
rules, so both take them from here (and the backends, which pass the slots through).
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

import torch
from torch import nn

from . import streams

if TYPE_CHECKING:
    from .fusion import Bucket

BARRIER_MODE = ("create the optimizer with ScheduledOptimizer(model, optimizer, cross_barrier=False) "
                "(barrier mode: communication is still ordered and partitioned, but backward() and step() "
                "wait for it)")
ESCAPE_HATCH = ("call optimizer.synchronize() after backward() and before reading or modifying gradients "
                "(that iteration then waits for its communication, as Horovod requires), or " + BARRIER_MODE)


ZERO_GRAD_IN_FLIGHT = ("optimizer.zero_grad() was called after loss.backward() but before optimizer.step() or "
                       "optimizer.synchronize(), while gradients are being all-reduced; this is prohibited "
                       "(as with Horovod)")


class BarrierCrossingError(RuntimeError):
    """The training loop does something that cannot cross the step() barrier (see the message)."""


class ParamSlot:
    """One trainable parameter, as the pipeline tracks it across iterations.

    Attributes:
        name: the parameter's name in the model (identical on every rank; names the CommTask).
        param: the parameter.
        group: index of its group in the optimizer's ``param_groups``.
        priority: rank of its first read in the forward pass (lower is more urgent).
        fresh: set while no update of this parameter is pending; forward proxies wait on it.
        passes: backward passes accumulated into its gradient since the last step().
        bucket: the bucket its gradient is all-reduced in (set once the ranks agreed on buckets).
        applied: where the update thread's stream stood after its last update of this parameter
            (None on CPU, or before the first update): readers wait for it.
    """

    __slots__ = ("name", "param", "group", "priority", "fresh", "passes", "bucket", "applied")

    def __init__(self, name: str, param: nn.Parameter, group: int, priority: int) -> None:
        self.name = name
        self.param = param
        self.group = group
        self.priority = priority
        self.fresh = threading.Event()
        self.fresh.set()
        self.passes = 0
        self.bucket: Bucket
        self.applied: streams.Mark = None

    def __repr__(self) -> str:
        return f"ParamSlot({self.name!r}, priority={self.priority})"


def clear_grad(param: torch.Tensor, set_to_none: bool) -> None:
    """What ``Optimizer.zero_grad`` does to one parameter."""
    if param.grad is None:
        return
    if set_to_none:
        param.grad = None
    else:
        if param.grad.grad_fn is not None:
            param.grad.detach_()
        else:
            param.grad.requires_grad_(False)
        param.grad.zero_()


def dense_grad(slot: ParamSlot) -> torch.Tensor:
    """``slot``'s gradient to all-reduce: zeros where this rank did not use the parameter (peers
    may have, as Horovod assumes); a sparse one is refused, as it cannot be partitioned."""
    param = slot.param
    if param.grad is None:
        param.grad = torch.zeros_like(param)
    if param.grad.is_sparse:
        raise BarrierCrossingError(f"{slot.name!r} has a sparse gradient, which bytesched cannot "
                                   "partition: use a dense layer (e.g. nn.Embedding(sparse=False))")
    return param.grad


def computed_again(slot: ParamSlot, passes_per_step: int) -> BarrierCrossingError:
    """The error for a gradient accumulated more often than a step allows."""
    return BarrierCrossingError(
        f"the gradient of {slot.name!r} was computed again before its previous all-reduce and update "
        f"finished: call step() after every {passes_per_step} backward pass(es) (backward_passes_per_step "
        f"of hvd.DistributedOptimizer), and read {slot.name!r} only inside the model's forward pass, or "
        + ESCAPE_HATCH)


def modified_while_reducing(name: str) -> BarrierCrossingError:
    """The error for a gradient the user changed in place while its all-reduce was in flight."""
    return BarrierCrossingError(f"the gradient of {name!r} was modified in place while bytesched was all-reducing "
                                f"it (gradient clipping or AMP unscaling between backward() and step()?); to clip "
                                f"or unscale, " + ESCAPE_HATCH)
