"""The scheduling decision, as a pure state machine (no threads, no clock, no I/O).

Events go in (a task was enqueued, became ready, a sub-task finished, parameters changed, rank 0
announced its order); the answer is the list of sub-tasks to start now. Time is an argument of
every event, supplied by the driver: the runtime :class:`~bytesched.core.core.Core` passes the
monotonic clock, the simulator its virtual clock, tests whatever they like. Because this is the
only place a scheduling decision is made, the simulator predicts exactly what the runtime does.
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
        self.policy = policy
        self.window = Window()
        self.stats = Stats()
        self._instances: defaultdict[str, int] = defaultdict(int)
        self._seq = 0
        self._unfinished: dict[tuple[str, int], CommTask] = {}
        # The policy's observation hooks, or None where it keeps the default no-op: the finish
        # hook would otherwise be an empty call per sub-task.
        self._on_enqueue = _hook(policy, "on_enqueue")
        self._on_ready = _hook(policy, "on_ready")
        self._on_finish = _hook(policy, "on_finish")

    # -- events -------------------------------------------------------------------------------
    def enqueue(self, task: CommTask, now: float) -> None:
        """Partition ``task`` at the current partition size; its sub-tasks wait to be ready."""
        if task.subtasks:
            raise SchedulingError(f"{task!r} was enqueued twice; create a new CommTask per iteration")
        instance = task.instance = self._instances[task.name]
        self._instances[task.name] = instance + 1
        task.seq = self._seq
        self._seq += 1
        task.t_enqueue = now
        pieces = task.partition(self.policy.partition_bytes())
        if not pieces:
            raise SchedulingError(f"{task!r}.partition() returned no pieces")
        task.subtasks = [SubTask(task, i, nbytes, payload) for i, (payload, nbytes) in enumerate(pieces)]
        task.remaining = len(task.subtasks)
        self._unfinished[(task.name, task.instance)] = task
        self.stats.tasks += 1
        if self._on_enqueue is not None:
            self._on_enqueue(task, now)

    def ready(self, task: CommTask, now: float) -> list[SubTask]:
        """``task``'s tensor is computed: queue its sub-tasks and start what may start."""
        if not task.subtasks:
            raise SchedulingError(f"{task!r} became ready before it was enqueued")
        if not isnan(task.subtasks[0].t_ready):
            raise SchedulingError(f"{task!r} was notified ready twice")
        for sub in task.subtasks:
            sub.t_ready = now
        self.policy.push(task, now)
        if self._on_ready is not None:
            self._on_ready(task, now)
        return self.schedule(now)

    def finish(self, sub: SubTask, now: float) -> list[SubTask]:
        """``sub``'s communication completed: return its credit and start what may start."""
        if isnan(sub.t_start):
            raise SchedulingError(f"{sub!r} finished but was never started")
        if not isnan(sub.t_finish):
            raise SchedulingError(f"{sub!r} finished twice")
        sub.t_finish = now
        window = self.window
        window.inflight_bytes -= sub.nbytes
        window.inflight_count -= 1
        self.stats.subtasks_finished += 1
        task = sub.task
        task.remaining -= 1
        if not task.remaining:
            del self._unfinished[(task.name, task.instance)]
        if self._on_finish is not None:
            self._on_finish(sub, now)
        return self.schedule(now)

    def set_params(self, params: SchedulingParams, now: float) -> list[SubTask]:
        """New partition/credit sizes: the credit applies now, the partition size to tasks
        enqueued from now on (a task is never re-partitioned while in the queue)."""
        self.policy.set_params(params)
        return self.schedule(now)

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
        """Start ready sub-tasks in the policy's order while it admits them."""
        window = self.window
        started = self.policy.release(window, now)
        if not started:  # the common case after a finish: nothing waits
            return started
        # Statistics are summed in locals and stored once (this loop runs for every sub-task).
        # The window only fills up here, so its peak is its state at the end.
        stats = self.stats
        delay_total = 0.0
        delay_max = stats.queue_delay_max
        bytes_started = 0
        for sub in started:
            sub.t_start = now
            bytes_started += sub.nbytes
            delay = now - sub.t_ready
            delay_total += delay
            if delay > delay_max:
                delay_max = delay
        stats.subtasks_started += len(started)
        stats.bytes_started += bytes_started
        stats.queue_delay_total += delay_total
        stats.queue_delay_max = delay_max
        if window.inflight_bytes > stats.max_inflight_bytes:
            stats.max_inflight_bytes = window.inflight_bytes
        return started

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
        return sorted(self._unfinished.values(), key=lambda t: t.seq)

    def wake_at(self) -> float | None:
        """When the driver should call :meth:`tick` if no event comes first."""
        return self.policy.wake_at()

    @property
    def idle(self) -> bool:
        """Nothing waiting and nothing in flight."""
        return not self._unfinished


def _hook(policy: Policy, name: str) -> Callable[..., None] | None:
    """``policy``'s bound hook ``name``, or None if it is :class:`Policy`'s no-op."""
    return None if getattr(type(policy), name) is getattr(Policy, name) else getattr(policy, name)
