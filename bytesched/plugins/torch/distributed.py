"""The torch.distributed backend: each partition is an asynchronous ``dist.all_reduce``.

c10d matches collectives by the order in which each rank issues them, so every rank must issue
the same sequence: followers start partitions exactly in the order rank 0's Core released them,
announced over the rank-0 channel (the Core's ``rank0`` order mode). Completion comes from the
collective's future (``Work.get_future().then``), a real callback, so nothing waits or polls; on
CUDA the callback runs on streams that wait for the collective's kernels, which is where the
task's completion mark is recorded (:mod:`.streams`).
Gradients are summed and then divided by the number of ranks, i.e. averaged as DDP does.

Without ``process_group=``, the gradients travel in a process group of bytesched's own over the
same ranks (:func:`own_group`), not in the default group the script uses: since ``step()`` returns
while gradients are still in flight, a collective the script issues right after it (an epoch's
loss averaged over the ranks) would otherwise be matched with a gradient's on another rank
(docs/plugins/torch.md, "Your own collectives").
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any, Callable

import torch
import torch.distributed as dist

from bytesched.core import Config, Core, SubTask

from .backend import Backend, operation_buffer
from .fusion import unpack
from .passthrough import BucketPassThrough, PassThrough
from .task import GradientBatcher

if TYPE_CHECKING:
    from bytesched.runtime import StallWatch

    from .fusion import Bucket
    from .slots import ParamSlot
    from .task import GradientTask


CPU = torch.device("cpu")
"""Where gradients live unless the backend is told otherwise."""

_own_groups: "weakref.WeakKeyDictionary[Any, Any]" = weakref.WeakKeyDictionary()
"""bytesched's group for each default group (a new one after the job re-initialises torch.distributed)."""


def own_group() -> Any:
    """bytesched's process group over every rank, created once per default group: every rank
    makes its first ScheduledOptimizer at the same point of the same script, so every rank calls
    ``new_group`` in the same order, as c10d requires."""
    world = dist.group.WORLD
    group = _own_groups.get(world)
    if group is None:
        group = _own_groups[world] = dist.new_group()
    return group


class DistributedBackend(Backend):
    """All-reduce over a torch.distributed process group: ``group``, or bytesched's own over every
    rank (:func:`own_group`)."""

    name = "torch.distributed"
    order = "rank0"
    fuses_by_itself = False
    batches = True

    def __init__(self, group: Any = None, device: torch.device = CPU) -> None:
        self._group = group if group is not None else own_group()
        self.rank = dist.get_rank(self._group)
        self.size = dist.get_world_size(self._group)
        self.device = device
        """Where the gradients live (the native Core runs on CPU tensors)."""
        self._batchers: dict[tuple[torch.dtype, torch.device], GradientBatcher] = {}

    def batcher_for(self, wire: torch.Tensor) -> GradientBatcher:
        """One batcher per type and device: followers start rank 0's batches (``rank0`` order)."""
        key = (wire.dtype, wire.device)
        batcher = self._batchers.get(key)
        if batcher is None:
            batcher = self._batchers[key] = GradientBatcher(self.all_reduce_async)
        return batcher

    def make_core(self, config: Config, **kwargs: Any) -> Core:
        """The job's Core: native where it can be (:func:`.native.make_core`), unless a subclass
        starts the pieces its own way (:meth:`start`), which only the Python Core calls."""
        from .native import make_core
        return make_core(config, self._group, self.device,
                         self.broadcast_int, own_start=type(self).start is not DistributedBackend.start, **kwargs)

    def barrier(self) -> None:
        dist.barrier(group=self._group)

    def all_gather(self, local: torch.Tensor) -> torch.Tensor:
        parts = [torch.empty_like(local) for _ in range(self.size)]
        dist.all_gather(parts, local, group=self._group)
        return torch.stack(parts)

    def operation(self, nbytes: int, device: torch.device) -> Callable[[], None]:
        buffer = operation_buffer(nbytes, device)

        def all_reduce() -> None:
            dist.all_reduce(buffer, group=self._group)
            if buffer.is_cuda:  # NCCL returns once the kernel is queued
                torch.cuda.synchronize(buffer.device)
        return all_reduce

    def wire(self, flat: torch.Tensor) -> tuple[torch.Tensor, Any]:
        return flat, None

    def all_reduce_async(self, tensor: torch.Tensor) -> Any:
        """Start summing ``tensor`` over the group, in place; the collective's ``Work``."""
        return dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=self._group, async_op=True)

    def average(self, summed: torch.Tensor, grads: list[torch.Tensor]) -> None:
        """Write the mean of the flat ``summed`` gradients into ``grads`` (DDP's average)."""
        summed.div_(self.size)
        unpack(summed, grads)

    def pass_through(self, optimizer: torch.optim.Optimizer, slots: list["ParamSlot"], buckets: list["Bucket"],
                     plain_step: Callable[..., Any], passes_per_step: int, barrier: bool,
                     watch: "StallWatch", first_step: int) -> "PassThrough":
        return BucketPassThrough(self, slots, buckets, plain_step, optimizer, passes_per_step, barrier, watch,
                                 first_step)

    def start(self, task: "GradientTask", sub: SubTask) -> None:
        work = self.all_reduce_async(sub.payload)

        def done(future: torch.futures.Future) -> None:
            try:
                future.value()  # raises the collective's error, if any
            except BaseException as error:
                task.fail(sub, error)
            else:
                task.finish(sub)

        work.get_future().then(done)

    def finalize(self, task: "GradientTask") -> None:
        self.average(task.wire, task.grads)
