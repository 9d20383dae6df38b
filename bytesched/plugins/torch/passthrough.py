"""Passing through: the library's own gradient path, once the start-up plan stayed out of the way.

When the plan predicts no gain from partitions and a credit window, the Core's path still costs
its work per gradient: a ready hook, the Core thread, the completion hand-off, the update thread
and the forward proxies. So from the plan's step on, a ScheduledOptimizer hands its gradients to
what the job runs without bytesched, and ``step()`` waits for them and updates, as the plain
optimizer does (the barrier is no longer crossed):

* Horovod: ``hvd.DistributedOptimizer``'s own gradient hooks (called from removable hooks of
  bytesched's) and its ``synchronize()``;
* torch.distributed: bytesched's buckets, each all-reduced from the backward hook of its last
  gradient, in the buckets' backward order on every rank (c10d pairs collectives by the order each
  rank issues them; DDP keeps one bucket order for the same reason), and averaged as DDP does.

ScheduledOptimizer's rules stay what they were, so a training loop behaves the same before and
after the switch: ``synchronize()`` after backward reduces and leaves the gradients free to modify
(no ``skip_synchronize()`` needed), ``zero_grad()`` between backward and step is refused while
gradients are in flight, barrier mode's backward() returns with reduced gradients, and
``step(closure)`` reduces what each evaluation of the closure computed. The arithmetic is that of a
plan that stays out through the Core: the same buckets, unpartitioned, summed, then divided.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, Callable

import torch

from bytesched.runtime import StallWatch

from .fusion import backward_order, pack
from .slots import ZERO_GRAD_IN_FLIGHT, ParamSlot, clear_grad, computed_again, dense_grad, modified_while_reducing

if TYPE_CHECKING:
    from .distributed import DistributedBackend
    from .fusion import Bucket


class PassThrough(ABC):
    """One optimizer's gradients on the library's own path, kept to ScheduledOptimizer's rules.

    Args:
        slots: the optimizer's trainable parameters.
        plain_step: the unbound ``step`` that updates without communicating.
        optimizer: the wrapped optimizer.
        passes_per_step: backward passes accumulated per step.
        barrier: barrier mode: each step's last backward() returns with reduced gradients.
        watch: holds each wait for the library's collectives to the stall warning and timeout
            (the Core, which watches its own sub-tasks, sees none of these).
        first_step: the optimizer's step at which passing through begins (for messages).
    """

    #: Whether the subclass needs to hear of each gradient (else hooks are registered only where
    #: barrier mode needs the end of backward).
    hears_gradients = False
    #: The library whose path the gradients take, for messages.
    library = ""

    def __init__(self, slots: list[ParamSlot], plain_step: Callable[..., Any], optimizer: torch.optim.Optimizer,
                 passes_per_step: int, barrier: bool, watch: StallWatch, first_step: int) -> None:
        self._slots = slots
        self._watch = watch
        self._step = first_step  # the optimizer's step, for messages
        self._plain_step = plain_step
        self._optimizer = optimizer
        self._passes_per_step = passes_per_step
        self._barrier = barrier
        self._synchronized = False  # this step's gradients were reduced before step()
        self._backward_passes = 0  # barrier mode: backward passes ended since the last step
        self._end_queued = False
        hooked = self.hears_gradients or barrier
        self._hooks = [slot.param.register_post_accumulate_grad_hook(self._hook(position))
                       for position, slot in enumerate(slots)] if hooked else []

    @property
    @abstractmethod
    def round_open(self) -> bool:
        """Gradients of a backward pass since the last step wait to be reduced."""

    @abstractmethod
    def _reduce(self) -> None:
        """All-reduce this step's gradients (those not computed as zeros, as Horovod does) and
        wait until the averages are in ``param.grad``."""

    def _gradient_ready(self, position: int) -> None:
        """Backward finished accumulating ``self._slots[position]``'s gradient."""

    @property
    def in_flight(self) -> bool:
        """Gradients are being all-reduced: they must not be read or modified yet."""
        return self.round_open and not self._synchronized

    def synchronize(self) -> None:
        """After a backward pass: reduce its gradients and wait (then they may be modified, and
        step() applies them as they are). At any other time: nothing is pending."""
        if self.round_open and not self._synchronized:
            self._reduce_watched()
            self._synchronized = True

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """Reduce what is not reduced yet, then update."""
        if closure is None:
            if not self._synchronized:
                self._reduce_watched()
            result = self._plain_step(self._optimizer)
        else:
            def reduced_closure() -> Any:
                loss = closure()
                if not self._synchronized:
                    self._reduce_watched()
                self._end_round()
                return loss
            result = self._plain_step(self._optimizer, reduced_closure)
        self._end_round()
        self._step += 1
        return result

    def zero_grad(self, set_to_none: bool) -> None:
        """Clear the gradients; refused while they are in flight (as Horovod refuses)."""
        if self.in_flight:
            raise RuntimeError(ZERO_GRAD_IN_FLIGHT)
        self._end_round()
        for slot in self._slots:
            clear_grad(slot.param, set_to_none)

    def close(self) -> None:
        """Remove bytesched's hooks and stop watching."""
        for hook in self._hooks:
            hook.remove()
        self._hooks = []
        self._watch.close()

    def _reduce_watched(self) -> None:
        with self._watch.waiting(f"step {self._step}'s gradients, passing through to {self.library}'s "
                                 f"all-reduce"):
            self._reduce()

    def _end_round(self) -> None:
        self._synchronized = False
        self._backward_passes = 0

    def _hook(self, position: int) -> Callable[[torch.Tensor], None]:
        def ready(param: torch.Tensor) -> None:
            self._gradient_ready(position)
            if self._barrier and not self._end_queued:
                self._end_queued = True
                torch.autograd.Variable._execution_engine.queue_callback(self._end_of_backward)
        return ready

    def _end_of_backward(self) -> None:
        """Barrier mode: the step's last backward pass returns with its gradients reduced."""
        self._end_queued = False
        self._backward_passes += 1
        if self._backward_passes >= self._passes_per_step:
            self.synchronize()


class HorovodPassThrough(PassThrough):
    """hvd.DistributedOptimizer's own gradient hooks all-reduce each gradient (Horovod fuses them
    by its own threshold); its ``synchronize()`` waits for them and reduces those never computed.

    Horovod registers its hooks on autograd nodes, where they cannot be removed, and a graph still
    alive (the previous iteration's loss) hands the next forward pass the same nodes. So Horovod's
    hook functions are called from bytesched's removable gradient hooks instead, and a path trial
    that goes back to the Core leaves none of them behind."""

    hears_gradients = True
    library = "Horovod"
    _optimizer: Any  # hvd.DistributedOptimizer: Horovod's class, untyped

    def __init__(self, optimizer: Any, slots: list[ParamSlot], plain_step: Callable[..., Any],
                 barrier: bool, watch: StallWatch, first_step: int) -> None:
        # The hooks Horovod's constructor made for every parameter it reduces (HorovodBackend
        # dropped the nodes it had hung them on).
        hooks = {param: optimizer._make_hook(param) for param in optimizer._requires_update}
        self._horovod_hooks = [hooks.get(slot.param) for slot in slots]
        super().__init__(slots, plain_step, optimizer, optimizer.backward_passes_per_step, barrier, watch, first_step)

    @property
    def round_open(self) -> bool:
        # A backward pass leaves an entry per gradient (a handle, or None while accumulating).
        return bool(self._optimizer._handles)

    def _gradient_ready(self, position: int) -> None:
        hook = self._horovod_hooks[position]
        if hook is not None:
            hook()

    def _reduce(self) -> None:
        self._optimizer.synchronize()


class BucketPassThrough(PassThrough):
    """Each bucket all-reduced over torch.distributed once its last gradient is ready, the buckets
    started in one order on every rank: backward's (the reverse of the first forward's reads)."""

    hears_gradients = True
    library = "torch.distributed"

    def __init__(self, backend: "DistributedBackend", slots: list[ParamSlot], buckets: list["Bucket"],
                 plain_step: Callable[..., Any], optimizer: torch.optim.Optimizer, passes_per_step: int,
                 barrier: bool, watch: StallWatch, first_step: int) -> None:
        self._backend = backend
        self._buckets = backward_order(buckets)
        order = {id(slot): index for index, bucket in enumerate(self._buckets) for slot in bucket.slots}
        self._bucket_of = [order[id(slot)] for slot in slots]
        self._passes = [0] * len(slots)
        self._waiting = [len(bucket.slots) for bucket in self._buckets]
        self._next = 0  # the first bucket not started this step
        # Started buckets: the bucket, its collective, flat buffer, gradients and their versions then.
        self._started: list[tuple["Bucket", Any, torch.Tensor, list[torch.Tensor], list[int]]] = []
        self._counted = False
        super().__init__(slots, plain_step, optimizer, passes_per_step, barrier, watch, first_step)

    @property
    def round_open(self) -> bool:
        return self._counted

    def _gradient_ready(self, position: int) -> None:
        self._counted = True
        passes = self._passes[position] = self._passes[position] + 1
        if passes < self._passes_per_step:
            return
        if passes > self._passes_per_step:
            raise computed_again(self._slots[position], self._passes_per_step)
        index = self._bucket_of[position]
        self._waiting[index] -= 1
        while self._next < len(self._buckets) and not self._waiting[self._next]:
            self._start(self._next)

    def _start(self, index: int) -> None:
        bucket = self._buckets[index]
        grads = [dense_grad(slot) for slot in bucket.slots]
        flat = pack(grads)
        self._started.append((bucket, self._backend.all_reduce_async(flat), flat, grads, [g._version for g in grads]))
        self._next = index + 1

    def _reduce(self) -> None:
        while self._next < len(self._buckets):  # gradients backward did not reach: zeros
            self._start(self._next)
        started, self._started = self._started, []
        self._next = 0
        self._counted = False
        self._passes = [0] * len(self._slots)
        self._waiting = [len(bucket.slots) for bucket in self._buckets]
        for bucket, work, flat, grads, versions in started:
            work.wait()
            for slot, grad, version in zip(bucket.slots, grads, versions):
                if grad._version != version:
                    raise modified_while_reducing(slot.name)
            self._backend.average(flat, grads)

    def close(self) -> None:
        super().close()
        for _bucket, work, *_ in self._started:
            work.wait()
        self._started = []
