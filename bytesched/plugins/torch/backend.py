"""What the PyTorch plugin needs from a gradient all-reduce library (:class:`Backend`); the two
backends and the choice of one are in :mod:`.backends`.

A backend knows four things the plugin does not: how to lay a gradient out for the wire, how to
start one partition's all-reduce without blocking (and report its completion to the Core), how
to turn the reduced wire buffer back into the gradient (averaging, decompression), and the
library's own gradient path, which a plan that stays out of the way hands the gradients to.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, Callable

import torch

from bytesched.core import SubTask
from bytesched.core.core import Completions
from bytesched.core.task import Batcher

if TYPE_CHECKING:
    from bytesched.runtime import StallWatch

    from .fusion import Bucket
    from .passthrough import PassThrough
    from .slots import ParamSlot
    from .task import GradientTask


class Backend(ABC):
    """What the plugin needs from an all-reduce library.

    Attributes:
        name: for messages ("horovod", "torch.distributed").
        rank, size: this process's rank and the number of ranks taking part.
        order: the Core's cross-rank order mode this backend needs: ``"immediate"`` when the
            library negotiates the order of collectives itself (Horovod), ``"rank0"`` when every
            rank must issue collectives in the same order (torch.distributed).
        fuses_by_itself: the library's own path fuses gradients by itself (Horovod's tensor
            fusion), so bytesched's buckets shape only the Core's path; False where passing
            through all-reduces bytesched's buckets (torch.distributed).
        passes_per_step: backward passes per step if the wrapped optimizer says (Horovod's
            ``backward_passes_per_step``), else None.
        completions: where the library reports finished operations only when polled (Horovod),
            the operations :meth:`start` started, for the Core to poll; else None (the library
            calls back).
    """

    name: str
    rank: int
    size: int
    order: str
    fuses_by_itself: bool
    passes_per_step: int | None = None
    completions: Completions | None = None
    batches: bool = False
    """:meth:`batcher_for` gives batchers (batching while busy)."""

    @abstractmethod
    def wire(self, flat: torch.Tensor) -> tuple[torch.Tensor, Any]:
        """The buffer to all-reduce in place for the packed gradients ``flat`` (contiguous: 1-D,
        or a lone gradient's shape, see :func:`~.fusion.pack`), and the context ``finalize`` needs."""

    @abstractmethod
    def start(self, task: "GradientTask", sub: SubTask) -> None:
        """Start ``sub``'s all-reduce; arrange ``task.notify_finish(sub)`` (or ``task.fail(sub,
        error)``) on completion, by a callback or from :attr:`completions`. Runs on the Core
        thread: must not wait for the communication."""

    @abstractmethod
    def finalize(self, task: "GradientTask") -> None:
        """All partitions are reduced: leave the averaged gradients in ``task.grads``."""

    @abstractmethod
    def barrier(self) -> None:
        """Block until every rank got here (used between two Cores' rank-0 channels)."""

    @abstractmethod
    def all_gather(self, local: torch.Tensor) -> torch.Tensor:
        """``[size, n]``: every rank's 1-D int64 ``local``, row r from rank r (a blocking collective
        every rank must call, with the same ``n``)."""

    @abstractmethod
    def operation(self, nbytes: int, device: torch.device) -> Callable[[], None]:
        """A blocking all-reduce of ``nbytes`` on ``device``, as the library runs a gradient's
        (the start-up plan times it; every rank calls it together); its buffer is
        :func:`operation_buffer`'s."""

    @abstractmethod
    def pass_through(self, optimizer: torch.optim.Optimizer, slots: list["ParamSlot"], buckets: list["Bucket"],
                     plain_step: Callable[..., Any], passes_per_step: int, barrier: bool,
                     watch: "StallWatch", first_step: int) -> "PassThrough":
        """The library's own gradient path for ``slots`` (fused into ``buckets`` where the library
        does not fuse by itself), which a ScheduledOptimizer hands its gradients to from step
        ``first_step`` on, once its start-up plan stayed out of the way; ``barrier``: backward()
        waits for it (barrier mode); ``watch`` holds its waits to the stall warning and timeout."""

    def broadcast_int(self, value: int) -> int:
        """Rank 0's ``value`` on every rank: how rank 0 tells the others its channel's free port."""
        return int(self.all_gather(torch.tensor([value], dtype=torch.int64))[0, 0])

    def step_function(self, optimizer: torch.optim.Optimizer) -> Callable[..., Any]:
        """The unbound ``step`` that updates parameters without communicating."""
        return type(optimizer).step

    def check_idle(self) -> None:
        """Fail if the library started communication of its own behind bytesched's back."""

    def batcher_for(self, wire: torch.Tensor) -> Batcher | None:
        """Where partitions of ``wire`` may start in batches with others' (batching while busy):
        None unless the library runs one collective over several tasks' pieces and every rank
        starts the same batches."""
        return None


def operation_buffer(nbytes: int, device: torch.device) -> torch.Tensor:
    """The float32 buffer of :meth:`Backend.operation`: ``nbytes`` rounded down to whole elements,
    at least one."""
    return torch.zeros(max(nbytes // 4, 1), dtype=torch.float32, device=device)
