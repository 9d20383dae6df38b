"""The Horovod backend: each partition is a ``hvd.allreduce_async_`` with a deterministic name.

Horovod runs a collective once every rank has submitted it, so the order in which rank 0's Core
releases partitions becomes the global order while the other ranks submit as soon as a gradient is
ready (the Core's ``immediate`` order mode): no control channel is needed.

The user's ``hvd.DistributedOptimizer`` supplies the settings (op, compression, gradient
pre/post-divide, process set); its own gradient hooks are switched off, because bytesched starts
the all-reduces itself.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, Callable, Iterable

import torch

from bytesched.core import SubTask

from .backend import Backend, operation_buffer
from .fusion import unpack
from .passthrough import HorovodPassThrough, PassThrough

if TYPE_CHECKING:
    from bytesched.runtime import StallWatch

    from .fusion import Bucket
    from .slots import ParamSlot
    from .task import GradientTask


def _horovod_classes() -> tuple[type, type] | None:
    """Horovod's two optimizer templates, if Horovod's PyTorch binding was imported at all."""
    module = sys.modules.get("horovod.torch.optimizer")
    if module is None:
        return None
    return module._DistributedOptimizer, module._DistributedAdasumOptimizer


def _built_from(optimizer: torch.optim.Optimizer, template: type) -> bool:
    # hvd.DistributedOptimizer builds a new class from the template's __dict__, so the template's
    # functions are the very objects found in the new class.
    return type(optimizer).__dict__.get("_make_hook") is template.__dict__["_make_hook"]


def is_distributed_optimizer(optimizer: torch.optim.Optimizer) -> bool:
    """``optimizer`` came from ``hvd.DistributedOptimizer`` (Adasum is rejected with a reason)."""
    classes = _horovod_classes()
    if classes is None:
        return False
    allreduce, adasum = classes
    if _built_from(optimizer, adasum):
        raise ValueError("hvd.DistributedOptimizer(op=hvd.Adasum) reduces parameter deltas inside "
                         "step(), not gradients, so there is no gradient communication to schedule; "
                         "use op=hvd.Average or hvd.Sum with ScheduledOptimizer")
    return _built_from(optimizer, allreduce)


class HandlePoller:
    """Reports finished Horovod handles to callbacks, in whatever order they finish, when the Core
    polls it (:class:`bytesched.core.core.Completions`).

    Horovod's PyTorch binding has no completion callback, and ``hvd.synchronize()`` waits by
    spinning (a ``sched_yield`` loop that keeps a core busy). So the Core, which starts the
    all-reduces, also polls their handles with ``hvd.poll()`` between its events: the delay it
    asks for starts at ``min_interval`` after a completion and doubles up to ``max_interval``
    while none comes. Polling from a thread of its own cost a wake-up of that thread per round
    and a hand-off to the Core thread per finish.

    Horovod's background thread runs collectives one after another, in the order its coordinator
    fused them, which is mostly the order they were started in. So a round polls the handles in
    start order and stops at the first one still running; every ``full_scan_every``-th round polls
    them all, so a handle that finished behind a slower, earlier one is reported at most that many
    rounds late. Polling every handle every round made 10 polls per handle (188 unfused tensors
    over 2 ranks on the development VM); this makes 3 times fewer.

    Every handle is reported to one callback, ``report(token, error)``, with the token it was
    watched with (the backend's sub-task): a callback made per handle (a closure over the task and
    its sub-task) left three objects per partition alive until it finished, which Python's cyclic
    garbage collector counts towards its next pass.

    Not thread-safe: :meth:`watch` and :meth:`poll` run on the Core thread.
    """

    def __init__(self, poll: Callable[[int], bool], release: Callable[[int], Any],
                 report: Callable[[Any, BaseException | None], None],
                 min_interval: float = 0.0001, max_interval: float = 0.002, full_scan_every: int = 4) -> None:
        self._poll = poll
        self._release = release
        self._report = report
        self._min = min_interval
        self._max = max_interval
        self._full_scan_every = full_scan_every
        self._pending: dict[int, Any] = {}  # each handle's token, in start order
        self._interval = min_interval
        self._rounds = 0

    def watch(self, handle: int, token: Any) -> None:
        """Call ``report(token, None)`` when ``handle`` finished, or ``report(token, error)`` if it
        failed."""
        self._pending[handle] = token

    def poll(self) -> float | None:
        """Report the handles that finished; the delay before the next round (None: none in flight)."""
        if not self._pending:
            self._interval = self._min
            return None
        self._rounds += 1
        finished = self._finished(self._pending.items(), full=self._rounds % self._full_scan_every == 0)
        for handle, token in finished:
            del self._pending[handle]
            try:
                self._release(handle)  # returns at once for a finished handle; raises its error
            except BaseException as error:  # HorovodInternalError: report it to the task
                self._report(token, error)
            else:
                self._report(token, None)
        self._interval = self._min if finished else min(2 * self._interval, self._max)
        return self._interval

    def _finished(self, in_flight: Iterable[tuple[int, Any]], full: bool) -> list[tuple[int, Any]]:
        """The finished ones of ``in_flight`` (handles and their tokens): all of them (``full``),
        or those before the first one still running."""
        if full:
            return [(handle, token) for handle, token in in_flight if self._poll(handle)]
        finished = []
        for handle, token in in_flight:
            if not self._poll(handle):
                break
            finished.append((handle, token))
        return finished


class HorovodBackend(Backend):
    """All-reduce with Horovod, honouring the wrapped ``hvd.DistributedOptimizer``'s settings."""

    name = "horovod"
    order = "immediate"
    fuses_by_itself = True
    completions: HandlePoller

    def __init__(self, optimizer: Any) -> None:  # hvd.DistributedOptimizer: Horovod's class, untyped
        import horovod.torch as hvd
        if getattr(optimizer, "_groups", None) is not None:
            raise ValueError("hvd.DistributedOptimizer(groups=...) fuses tensors by hand, while "
                             "bytesched partitions and orders them: drop groups= to use ScheduledOptimizer")
        self._hvd = hvd
        self._optimizer = optimizer
        self._process_set = optimizer.process_set
        self.rank = self._process_set.rank()
        self.size = self._process_set.size()
        self.passes_per_step = optimizer.backward_passes_per_step
        self._op = optimizer.op
        self._compression = optimizer._compression
        if self._op == hvd.Average:  # as Horovod splits averaging around the sum
            self._prescale = 1.0 / optimizer.gradient_predivide_factor
            self._postscale = optimizer.gradient_predivide_factor
            if not hvd.rocm_built():
                # Horovod's CPU and NCCL operations run Average as a Sum whose postscale factor
                # they divide by the process set's size; asking for exactly that Sum gives the same
                # numbers and skips the ctypes query (rocm_built) Horovod's Python makes for every
                # Average, which releases the GIL on the Core thread once per partition.
                self._op = hvd.Sum
                self._postscale = optimizer.gradient_predivide_factor / self.size
        else:
            self._prescale = self._postscale = 1.0
        self._silence_horovod_hooks()
        self.completions = HandlePoller(hvd.poll, hvd.synchronize, _report)

    def _silence_horovod_hooks(self) -> None:
        # Horovod registered its hooks on the parameters' gradient accumulators and keeps the only
        # references to those autograd nodes in _grad_accs. Dropping them frees the nodes with the
        # hooks; the next forward pass creates fresh accumulators, so only bytesched's hooks fire.
        # check_idle() verifies that no Horovod hook fired.
        self._optimizer._grad_accs.clear()

    def pass_through(self, optimizer: torch.optim.Optimizer, slots: list["ParamSlot"], buckets: list["Bucket"],
                     plain_step: Callable[..., Any], passes_per_step: int, barrier: bool,
                     watch: "StallWatch", first_step: int) -> "PassThrough":
        return HorovodPassThrough(self._optimizer, slots, plain_step, barrier, watch, first_step)

    def step_function(self, optimizer: torch.optim.Optimizer) -> Callable[..., Any]:
        # hvd.DistributedOptimizer's class derives from the user's optimizer class; that class's
        # step updates without Horovod's synchronize().
        users_class: Any = type(optimizer).__mro__[1]
        return users_class.step

    def check_idle(self) -> None:
        """Fail if Horovod's own gradient hooks started an all-reduce (they must stay silent)."""
        if self._optimizer._handles:
            raise RuntimeError("hvd.DistributedOptimizer's own gradient hooks are still active (an "
                               "autograd graph built before ScheduledOptimizer was created is still "
                               "alive?): create ScheduledOptimizer right after hvd.DistributedOptimizer, "
                               "before the first forward pass")

    def barrier(self) -> None:
        self._hvd.barrier(process_set=self._process_set)

    def all_gather(self, local: torch.Tensor) -> torch.Tensor:
        return self._hvd.allgather(local.unsqueeze(0), name="bytesched.all_gather", process_set=self._process_set)

    def operation(self, nbytes: int, device: torch.device) -> Callable[[], None]:
        buffer = operation_buffer(nbytes, device)
        return lambda: self._hvd.allreduce_(buffer, name=f"bytesched.calibrate.{nbytes}", op=self._hvd.Sum,
                                            process_set=self._process_set)

    def wire(self, flat: torch.Tensor) -> tuple[torch.Tensor, Any]:
        return self._compression.compress(flat)

    def start(self, task: "GradientTask", sub: SubTask) -> None:
        handle = self._hvd.allreduce_async_(
            sub.payload, name=f"bytesched.{task.name}.{sub.index}", op=self._op,
            prescale_factor=self._prescale, postscale_factor=self._postscale,
            process_set=self._process_set)
        self.completions.watch(handle, sub)

    def finalize(self, task: "GradientTask") -> None:
        unpack(self._compression.decompress(task.wire, task.context), task.grads)


def _report(sub: SubTask, error: BaseException | None) -> None:
    """A partition's Horovod handle finished (or failed): tell its task."""
    task: "GradientTask" = sub.task  # type: ignore[assignment]  # the plugin's tasks
    if error is None:
        task.finish(sub)
    else:
        task.fail(sub, error)
