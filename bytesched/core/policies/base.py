"""The policy interface: the only question a policy answers is "which ready sub-task next, and may
it start now?". Everything else (partitioning, credit accounting, statistics) is the Scheduler's.
"""

from __future__ import annotations

from heapq import heappop, heappush
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

from ..config import SchedulingParams
from ..task import CommTask, SubTask


@dataclass
class Window:
    """What is in flight right now (the state of the credit window)."""

    inflight_bytes: int = 0
    inflight_count: int = 0

    def fits(self, nbytes: int, credit: float) -> bool:
        """Algorithm 1's credit test, with the two gaps of its line 16 settled: a sub-task that
        exactly uses up the credit may start, and one larger than the whole credit starts when
        nothing else is in flight (so it can never wait forever)."""
        return self.inflight_count == 0 or self.inflight_bytes + nbytes <= credit


class Policy(ABC):
    """A scheduling policy: owns the ready queue's order and the admission rule."""

    name: ClassVar[str]
    default_partition_bytes: ClassVar[float]

    def __init__(self, params: SchedulingParams) -> None:
        self.params = params

    def partition_bytes(self) -> float:
        """Partition size used for tasks enqueued from now on."""
        p = self.params.partition_bytes
        return self.default_partition_bytes if p is None else p

    def set_params(self, params: SchedulingParams) -> None:
        """New partition/credit: credit applies at once, partition to tasks enqueued later."""
        self.params = params

    @abstractmethod
    def push(self, sub: SubTask, now: float) -> None:
        """A sub-task became ready."""

    @abstractmethod
    def peek(self, now: float) -> SubTask | None:
        """The sub-task this policy would start next, or None if it would start none now."""

    @abstractmethod
    def pop(self) -> SubTask:
        """Remove the sub-task :meth:`peek` returned (the Scheduler starts it)."""

    @abstractmethod
    def admits(self, sub: SubTask, window: Window, now: float) -> bool:
        """May ``sub`` start now, given what is in flight?"""

    @abstractmethod
    def __len__(self) -> int:
        """Number of ready sub-tasks waiting."""

    # Observations, for policies that learn from timing (Prophet). Default: ignore.
    def on_enqueue(self, task: CommTask, now: float) -> None:
        """A task was enqueued (before it is ready)."""

    def on_ready(self, task: CommTask, now: float) -> None:
        """All sub-tasks of ``task`` were pushed."""

    def on_finish(self, sub: SubTask, now: float) -> None:
        """A sub-task finished."""

    def wake_at(self) -> float | None:
        """When this policy may want to start something without any new event (a time window
        closing), so that drivers can wake the scheduler then; None if never."""
        return None


class PriorityPolicy(Policy):
    """Ready queue ordered by (task priority, enqueue order, partition index): lower first.

    The enqueue order breaks ties between equal priorities deterministically, and the partition
    index keeps the pieces of one tensor in tensor order.
    """

    def __init__(self, params: SchedulingParams) -> None:
        super().__init__(params)
        self._heap: list[tuple[int, int, int, SubTask]] = []

    def push(self, sub: SubTask, now: float) -> None:
        task = sub.task
        heappush(self._heap, (self.rank_of(task), task.seq, sub.index, sub))

    def rank_of(self, task: CommTask) -> int:
        """The priority number the queue orders by (the task's own, unless a policy derives one)."""
        return task.priority

    def peek(self, now: float) -> SubTask | None:
        return self._heap[0][3] if self._heap else None

    def pop(self) -> SubTask:
        return heappop(self._heap)[3]

    def __len__(self) -> int:
        return len(self._heap)


class CreditPolicy(PriorityPolicy):
    """Priority order under a credit window (shared by bytescheduler and tictac)."""

    def admits(self, sub: SubTask, window: Window, now: float) -> bool:
        return window.fits(sub.nbytes, self.params.credit_bytes)
