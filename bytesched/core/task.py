"""CommTask and SubTask: the unified abstraction of one tensor's communication (paper §3.2).

A plugin subclasses :class:`CommTask` and implements the two framework-specific callbacks,
:meth:`CommTask.partition` and :meth:`CommTask.start`. The framework signals back with
:meth:`CommTask.notify_ready` and :meth:`CommTask.notify_finish`, from any thread; those only
post events to the Core, which owns all scheduling state.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, Callable, Hashable, Protocol, Sequence

if TYPE_CHECKING:  # the runtime Core imports this module, not the other way round
    from .core import Core


class SubTask:
    """One partition of a CommTask: the unit the Core schedules, starts and gets credit back for.

    ``key`` identifies the sub-task identically on every rank (task name, the task's instance
    number, partition index), which is what rank 0's start order is expressed in.
    """

    __slots__ = ("task", "index", "nbytes", "payload", "t_start", "t_finish", "batch")
    task: "CommTask"
    index: int
    nbytes: int
    payload: Any
    t_start: float
    t_finish: float
    batch: "tuple[SubTask, ...] | None"
    """The sub-tasks started with this one as one backend operation (this one among them, in
    order), or None: started alone (see :class:`~bytesched.core.scheduler.Scheduler`)."""

    @classmethod
    def of(cls, task: "CommTask", pieces: Sequence[tuple[Any, int]]) -> list["SubTask"]:
        """The sub-tasks of ``task``, one per ``(payload, nbytes)`` piece, index by index, not
        started (NaN times). The only constructor, and filled in place on purpose: a Python
        ``__init__`` costs a nested interpreter call per piece (Python 3.11 does not inline it),
        and the Core makes one sub-task per piece. What all pieces share (the ready time, the
        key's name and instance) is read from the task instead of being stored per piece."""
        nan, new = math.nan, cls.__new__
        subtasks = []
        for index, (payload, nbytes) in enumerate(pieces):
            sub = new(cls)
            sub.task = task
            sub.index = index
            sub.nbytes = nbytes
            sub.payload = payload
            sub.t_start = sub.t_finish = nan
            sub.batch = None
            subtasks.append(sub)
        return subtasks

    @property
    def key(self) -> tuple[str, int, int]:
        """``(task name, instance, partition index)``: the same sub-task on every rank."""
        task = self.task
        return (task.name, task.instance, self.index)

    @property
    def t_ready(self) -> float:
        """When the task's tensor was computed (all its pieces become ready together)."""
        return self.task.t_ready

    @property
    def priority(self) -> int:
        """Inherited from the task; the partition index breaks ties so pieces keep their order."""
        return self.task.priority

    def __repr__(self) -> str:
        return f"SubTask({self.task.name!r}#{self.task.instance}[{self.index}], {self.nbytes}B)"


class Batcher(Protocol):
    """What a plugin's backend offers where it can start several sub-tasks, of one or several
    tasks, as one operation (one collective on a buffer holding them all): batching while busy."""

    def start_batch(self, batch: Sequence[SubTask]) -> None:
        """Issue the communication of every sub-task of ``batch`` as one operation; like
        :meth:`CommTask.start`, must not block, and reports each one's finish to its task."""


class CommTask(ABC):
    """One tensor's communication (an all-reduce, or a push+pull) handed to the Core.

    Attributes:
        name: identical on every rank (it is how ranks agree on which tensor is meant).
        priority: lower runs first; plugins use the order in which the forward pass uses the
            tensor, so the first layer's gradient is the most urgent.
        nbytes: size of the tensor in bytes.
        instance: how many times a task of this name was enqueued before (set by the Core); it
            tells apart the same tensor's communication in successive iterations.
        subtasks: the partitions (set by the Scheduler at enqueue; the empty tuple before). The
            runtime Core sets it back to the empty tuple once the task completed and its hooks
            ran: a task and its sub-tasks point at each other, and without that cut every step's
            tasks would be freed only by Python's cyclic garbage collector, whose passes stall
            the training process (the Core benchmark ran about a fifth slower). The tuple, unlike
            a new empty list, is no object of the task's own for the collector to count while
            the task waits for its update. The timeline keeps what the sub-tasks recorded.
        t_enqueue, t_ready: when the task was enqueued and when its tensor was computed (set by
            the Scheduler; NaN until then).
        released_on_ready: the plugin let its backend start every sub-task the moment the tensor
            was computed, without waiting for :meth:`start` (set before the task can become
            ready, and only where :meth:`Core.releases_on_ready` allowed it): the Scheduler then
            records them all as started on the ready event, whatever its policy says by then.
        batcher: where the task's sub-tasks may be started in batches with others of the same
            batcher (:class:`Batcher`), or None (each alone). A plugin sets it only where every
            rank starts the same batches: rank 0 decides them and the others follow its order.
    """

    batcher: Batcher | None = None

    def __init__(self, name: str, priority: int, nbytes: int) -> None:
        if not name:
            raise ValueError("a CommTask needs a non-empty name that is identical on every rank")
        if nbytes < 0:
            raise ValueError(f"CommTask {name!r}: nbytes must be >= 0, got {nbytes}")
        self.name = name
        self.priority = priority
        self.nbytes = nbytes
        self.instance = 0
        self.subtasks: Sequence[SubTask] = ()
        self.remaining = 0
        self.seq = 0
        self.t_enqueue = math.nan
        self.t_ready = math.nan
        self.released_on_ready = False
        self.core: "Core | None" = None

    # -- implemented by plugins ---------------------------------------------------------------
    @abstractmethod
    def partition(self, size: float) -> Sequence[tuple[Any, int]]:
        """Split the tensor into zero-copy pieces of at most ``size`` bytes.

        Returns ``(payload, nbytes)`` pairs in tensor order; ``size`` may be ``math.inf``
        (one piece). :func:`split_elements` computes the element ranges.
        """

    @abstractmethod
    def start(self, subtask: SubTask) -> None:
        """Issue the real communication of one sub-task; must not block until it completes.

        Called on the Core's scheduler thread. When the communication is done, call
        :meth:`notify_finish` (from any thread).
        """

    def on_finish(self) -> None:
        """Hook: every sub-task has finished (called on the Core thread). Plugins override."""

    def on_error(self, error: BaseException) -> None:
        """Hook: starting a sub-task raised ``error`` (called on the Core thread)."""

    # -- signals from the framework -----------------------------------------------------------
    def notify_ready(self) -> None:
        """The tensor has been computed: its sub-tasks may now be scheduled."""
        if self.core is None:
            raise self._not_enqueued()
        self.core.post_ready(self)

    def notify_finish(self, subtask: SubTask) -> None:
        """The communication of ``subtask`` is complete: return its credit.

        :meth:`Core.enqueue` replaces this method on the task with the Core's ``post_finish``
        (its event queue's own ``put``), so this signal, sent once per sub-task, costs no Python
        call; this body runs only for a task that was never enqueued.
        """
        raise self._not_enqueued()

    def _not_enqueued(self) -> RuntimeError:
        return RuntimeError(f"CommTask {self.name!r} was not enqueued to a Core: call Core.enqueue(task) first")

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, priority={self.priority}, {self.nbytes}B)"


def start_operation(sub: SubTask) -> None:
    """Start ``sub``'s communication, as a driver of the Scheduler does for each sub-task it
    answers with, in order: alone, or at the first sub-task of its batch, the whole batch as one
    operation (the batch's other sub-tasks then need nothing more)."""
    batch = sub.batch
    if batch is None:
        sub.task.start(sub)
    elif sub is batch[0]:
        sub.task.batcher.start_batch(batch)  # type: ignore[union-attr]  # a batch's tasks have a batcher


def split_elements(numel: int, itemsize: int, size: float) -> list[tuple[int, int]]:
    """Element ranges ``[(start, stop), ...]`` covering ``numel`` elements exactly once, each at
    most ``size`` bytes (at least one element each, so a tiny ``size`` still makes progress).

    Pieces are as equal as possible, so the last one is not a small remainder that would cost a
    full per-message overhead for little data.
    """
    if numel <= 0:
        return [(0, 0)]
    per_piece = max(1, int(size // itemsize)) if size != math.inf else numel
    pieces = -(-numel // per_piece)
    base, extra = divmod(numel, pieces)
    ranges = []
    start = 0
    for i in range(pieces):
        stop = start + base + (1 if i < extra else 0)
        ranges.append((start, stop))
        start = stop
    return ranges


def fusion_runs(sizes: Sequence[int], bound: float, kinds: Sequence[Hashable] | None = None) -> list[list[int]]:
    """Indices of runs of consecutive items (of one kind, if ``kinds`` is given) holding at most
    ``bound`` bytes together; an item larger than ``bound`` is a run alone.

    The one rule of tensor fusion: the buckets of the PyTorch plugin and of MXNet over Horovod
    are these runs of their parameters, and the simulator models them with the same function.
    """
    return _runs(sizes, kinds, lambda total, nbytes: total + nbytes <= bound)


def filled_runs(sizes: Sequence[int], bound: float, kinds: Sequence[Hashable] | None = None) -> list[list[int]]:
    """Indices of runs of consecutive items (of one kind, if ``kinds`` is given), each closed once
    it holds at least ``bound`` bytes (the last, or one cut by a change of kind, may hold less).

    DistributedDataParallel's rule for its buckets (``bucket_cap_mb``): where the PyTorch plugin
    stays out of the way it merges its buckets so, and gets as many as DDP under the same bound.
    Runs of at most the bound (:func:`fusion_runs`) came out twice as many where the buckets being
    merged are a good share of it: the emulated Transformer's 18 buckets of up to 1 MB did not
    merge at all under DDP's scaled 1.6 MB, where DDP makes 10 (and :func:`filled_runs` 11).
    """
    return _runs(sizes, kinds, lambda total, nbytes: total < bound)


def _runs(sizes: Sequence[int], kinds: Sequence[Hashable] | None, joins: Callable[[int, int], bool]) -> list[list[int]]:
    """Runs of consecutive items of one kind, an item joining the open run where ``joins(the
    run's bytes, the item's bytes)``."""
    runs: list[list[int]] = []
    total = 0
    for index, nbytes in enumerate(sizes):
        same_kind = kinds is None or (bool(runs) and kinds[runs[-1][-1]] == kinds[index])
        if runs and same_kind and joins(total, nbytes):
            runs[-1].append(index)
            total += nbytes
        else:
            runs.append([index])
            total = nbytes
    return runs
