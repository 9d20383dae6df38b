"""The scheduling decision, as a pure state machine (no threads, no clock, no I/O).

Events go in (a task was enqueued, became ready, a sub-task finished, parameters changed, rank 0
announced its order); the answer is the list of sub-tasks to start now. Time is an argument of
every event, supplied by the driver: the runtime :class:`~bytesched.core.core.Core` passes the
monotonic clock, the simulator its virtual clock, tests whatever they like. Because this is the
only place a scheduling decision is made, the simulator predicts exactly what the runtime does.

Batching while busy (Caramel's small-parameter batcher, with its threshold as
``SchedulingParams.batch_bytes``). Every backend operation pays a fixed cost; where it dominates,
several small pieces sent as one operation cost little more than one. So of what the policy
releases, in order, consecutive sub-tasks smaller than the threshold whose tasks share a
:class:`~bytesched.core.task.Batcher` gather in an *open batch* of at most the threshold's
bytes; a larger sub-task, or one that does not fit, closes it. The open batch starts at once
where nothing else is in flight; otherwise it waits (its sub-tasks already count in the credit
window) for more to join it, until it is full or the last other sub-task in flight finishes:
small pieces are held only while the backend is busy anyway. Started together, the sub-tasks of
a batch share one ``batch`` tuple. Followers do not batch by themselves: they start rank 0's
announced batches (:class:`~bytesched.core.policies.follow.FollowOrderPolicy`).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from math import isnan
from typing import Callable, Iterable

from .config import SchedulingParams
from .policies import Policy, Window
from .policies.follow import FollowOrderPolicy, SubTaskKey
from .task import CommTask, SubTask


class SchedulingError(RuntimeError):
    """An event that contradicts the protocol (ready twice, finish of a sub-task not started...)."""


@dataclass
class Stats:
    """Counters since the last :meth:`Scheduler.take_stats` (the plugins take them per step)."""

    tasks: int = 0
    subtasks_started: int = 0
    subtasks_finished: int = 0
    bytes_started: int = 0
    queue_delay_total: float = 0.0
    queue_delay_max: float = 0.0
    max_inflight_bytes: int = 0

    @property
    def queue_delay_mean(self) -> float:
        """Mean time a sub-task waited between ready and start."""
        return self.queue_delay_total / self.subtasks_started if self.subtasks_started else 0.0


class Scheduler:
    """Algorithm 1's state: partitioned tasks, the policy's ready queue and the credit window."""

    def __init__(self, policy: Policy) -> None:
        self.window = Window()
        self.stats = Stats()
        self._instances: defaultdict[str, int] = defaultdict(int)
        self._seq = 0
        self._unfinished: dict[int, CommTask] = {}  # by seq, so in enqueue order
        self.waiting = 0
        """Ready sub-tasks in the policy's queue (its ``len``, counted without calling it)."""
        self._open: list[SubTask] = []
        """The open batch (module doc): admitted sub-tasks waiting to start with the next ones."""
        self._open_bytes = 0
        self.set_policy(policy)

    # -- events -------------------------------------------------------------------------------
    def enqueue(self, task: CommTask, now: float) -> None:
        """Partition ``task`` at the current partition size; its sub-tasks wait to be ready."""
        if not isnan(task.t_enqueue):
            raise SchedulingError(f"{task!r} was enqueued twice; create a new CommTask per iteration")
        instance = task.instance = self._instances[task.name]
        self._instances[task.name] = instance + 1
        task.seq = self._seq
        self._seq += 1
        task.t_enqueue = now
        pieces = task.partition(self.policy.partition_bytes())
        if not pieces:
            raise SchedulingError(f"{task!r}.partition() returned no pieces")
        task.subtasks = SubTask.of(task, pieces)
        task.remaining = len(pieces)
        self._unfinished[task.seq] = task
        self.stats.tasks += 1
        if self._on_enqueue is not None:
            self._on_enqueue(task, now)

    def ready(self, task: CommTask, now: float) -> list[SubTask]:
        """``task``'s tensor is computed: queue its sub-tasks and start what may start."""
        if isnan(task.t_enqueue):
            raise SchedulingError(f"{task!r} became ready before it was enqueued")
        if not isnan(task.t_ready):
            raise SchedulingError(f"{task!r} was notified ready twice")
        task.t_ready = now
        if task.released_on_ready:  # the backend has started them already (see CommTask)
            started = list(task.subtasks)
            nbytes = sum(sub.nbytes for sub in started)
            self.window.inflight_bytes += nbytes
            self.window.inflight_count += len(started)
            self._count_starts(started, nbytes, now)
            return started
        self.waiting += len(task.subtasks)
        self.policy.push(task, now)
        if self._on_ready is not None:
            self._on_ready(task, now)
        return self.schedule(now)

    def finish(self, sub: SubTask, now: float) -> list[SubTask]:
        """``sub``'s communication completed: return its credit and start what may start."""
        return self.finish_many((sub,), now)[0]

    def finish_many(self, subs: Iterable[SubTask], now: float) -> tuple[list[SubTask], list[CommTask]]:
        """:meth:`finish` for each of ``subs`` in turn, all at ``now``: the sub-tasks those calls
        would start, in order, and the tasks whose last sub-task this finished.

        One call for a run of finishes (the runtime Core drains them from its queue together)
        saves a Python call per sub-task. The policy is still asked after every finish while a
        ready sub-task waits, exactly as the calls one by one would ask it; with nothing
        waiting, no policy can start anything, so it is not asked.
        """
        started: list[SubTask] = []
        completed: list[CommTask] = []
        window = self.window
        stats = self.stats
        on_finish = self._on_finish
        # The credit returned and the finishes counted are summed in locals and stored before
        # anything reads them (the policy, at the end, or on a protocol error).
        freed = count = 0
        try:
            for sub in subs:
                # NaN is the only value unequal to itself: a start time, but no finish time yet.
                if sub.t_start != sub.t_start or sub.t_finish == sub.t_finish:
                    raise _finish_error(sub)
                sub.t_finish = now
                freed += sub.nbytes
                count += 1
                task = sub.task
                task.remaining -= 1
                if not task.remaining:
                    del self._unfinished[task.seq]
                    completed.append(task)
                if on_finish is not None or self.waiting:
                    window.inflight_bytes -= freed
                    window.inflight_count -= count
                    stats.subtasks_finished += count
                    freed = count = 0
                    if on_finish is not None:
                        on_finish(sub, now)
                    if self.waiting:
                        started += self.schedule(now)
        finally:
            window.inflight_bytes -= freed
            window.inflight_count -= count
            stats.subtasks_finished += count
        if self._open and window.inflight_count == len(self._open):  # nothing else in flight
            flushed = self._batched([])
            self._count_starts(flushed, sum(sub.nbytes for sub in flushed), now)
            started += flushed
        return started, completed

    def set_params(self, params: SchedulingParams, now: float) -> list[SubTask]:
        """New partition/credit sizes: the credit applies now, the partition size to tasks
        enqueued from now on (a task is never re-partitioned while in the queue)."""
        self.policy.set_params(params)
        return self.schedule(now)

    def set_policy(self, policy: Policy) -> None:
        """Hand the ready queue to ``policy`` from now on (only while no sub-task waits in it)."""
        if self.waiting or self._open:
            raise SchedulingError(f"cannot change the policy while {self.waiting + len(self._open)} ready "
                                  "sub-task(s) wait")
        self.policy = policy
        self._batching = policy.batches
        # The policy's observation hooks, or None where it keeps the default no-op: the finish
        # hook would otherwise be an empty call per sub-task.
        self._on_enqueue = _hook(policy, "on_enqueue")
        self._on_ready = _hook(policy, "on_ready")
        self._on_finish = _hook(policy, "on_finish")

    def announce(self, keys: Iterable[SubTaskKey], now: float) -> list[SubTask]:
        """Rank 0 started these sub-tasks in this order (followers in rank0 mode only)."""
        if not isinstance(self.policy, FollowOrderPolicy):
            raise SchedulingError("announce() is for followers in rank0 order mode")
        self.policy.announce(keys)
        return self.schedule(now)

    def tick(self, now: float) -> list[SubTask]:
        """No event, but time passed (a policy's :meth:`~Policy.wake_at` was reached)."""
        return self.schedule(now)

    # -- the decision -------------------------------------------------------------------------
    def schedule(self, now: float) -> list[SubTask]:
        """Start ready sub-tasks in the policy's order while it admits them (in batches where
        batching while busy is on: module doc)."""
        window = self.window
        inflight_before = window.inflight_bytes
        started = self.policy.release(window, now)
        if started:
            self.waiting -= len(started)
        if self._open or (started and self._batching and self.policy.params.batch_bytes):
            started = self._batched(started)
            nbytes = sum(sub.nbytes for sub in started)
        else:
            nbytes = window.inflight_bytes - inflight_before
        if started:
            self._count_starts(started, nbytes, now)
        return started

    def _batched(self, released: list[SubTask]) -> list[SubTask]:
        """Batching while busy (module doc): of the open batch and of ``released`` (just admitted,
        in order), what starts now, each batch of two or more with its ``batch`` tuple set; the
        rest stays in the open batch."""
        limit = self.policy.params.batch_bytes if self._batching else 0
        started: list[SubTask] = []
        batch, nbytes = self._open, self._open_bytes
        for sub in released:
            batcher = sub.task.batcher
            if batcher is not None and sub.nbytes < limit:
                if batch and (batch[0].task.batcher is not batcher or nbytes + sub.nbytes > limit):
                    started += _started_together(batch)
                    batch, nbytes = [], 0
                batch.append(sub)
                nbytes += sub.nbytes
                continue
            if batch:
                started += _started_together(batch)
                batch, nbytes = [], 0
            started.append(sub)
        if batch and (not limit or self.window.inflight_count == len(batch)):  # nothing else in flight
            started += _started_together(batch)
            batch, nbytes = [], 0
        self._open, self._open_bytes = batch, nbytes
        return started

    def _count_starts(self, started: list[SubTask], nbytes: int, now: float) -> None:
        """Stamp ``started`` (already counted into the window, ``nbytes`` together) and add them
        to the statistics."""
        window = self.window
        for sub in started:
            sub.t_start = now
        # Statistics without a Python step per sub-task beyond the list below: release() counted
        # every started sub-task into the window, which only fills up here (so its peak is its
        # state at the end), and sum() adds the delays in the same order as a loop would.
        delays = [now - sub.task.t_ready for sub in started]
        stats = self.stats
        stats.subtasks_started += len(started)
        stats.bytes_started += nbytes
        stats.queue_delay_total += sum(delays, 0.0)
        longest = max(delays)
        if longest > stats.queue_delay_max:
            stats.queue_delay_max = longest
        if window.inflight_bytes > stats.max_inflight_bytes:
            stats.max_inflight_bytes = window.inflight_bytes

    # -- queries ------------------------------------------------------------------------------
    def take_stats(self) -> Stats:
        """Counters since the previous call (and reset them)."""
        stats, self.stats = self.stats, Stats()
        return stats

    def instances(self, name: str) -> int:
        """How many tasks called ``name`` were enqueued (the next one's ``instance``)."""
        return self._instances.get(name, 0)

    def unfinished(self) -> list[CommTask]:
        """Tasks enqueued but not completely finished, oldest first."""
        return list(self._unfinished.values())

    def wake_at(self) -> float | None:
        """When the driver should call :meth:`tick` if no event comes first."""
        return self.policy.wake_at()

    @property
    def idle(self) -> bool:
        """Nothing waiting and nothing in flight."""
        return not self._unfinished


def _started_together(batch: list[SubTask]) -> list[SubTask]:
    """``batch``, each of its sub-tasks told the others if there are several (``SubTask.batch``)."""
    if len(batch) > 1:
        together = tuple(batch)
        for sub in batch:
            sub.batch = together
    return batch


def _finish_error(sub: SubTask) -> SchedulingError:
    """Why finishing ``sub`` contradicts the protocol."""
    if isnan(sub.t_start):
        return SchedulingError(f"{sub!r} finished but was never started")
    return SchedulingError(f"{sub!r} finished twice")


def _hook(policy: Policy, name: str) -> Callable[..., None] | None:
    """``policy``'s bound hook ``name``, or None if it is :class:`Policy`'s no-op."""
    return None if getattr(type(policy), name) is getattr(Policy, name) else getattr(policy, name)
