"""The policy interface: the only question a policy answers is "which ready sub-task next, and may
it start now?". Everything else (partitioning, credit accounting, statistics) is the Scheduler's.
"""

from __future__ import annotations

import math
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
    batches: ClassVar[bool] = True
    """The Scheduler may batch what this policy releases (batching while busy, see
    :mod:`~bytesched.core.scheduler`); not a follower's, which starts rank 0's batches."""

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
    def push(self, task: CommTask, now: float) -> None:
        """Every sub-task of ``task`` became ready (a tensor is computed at once, so the Scheduler
        queues whole tasks; :meth:`peek` and :meth:`pop` hand out their sub-tasks one by one)."""

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

    def release(self, window: Window, now: float) -> list[SubTask]:
        """Pop, in order, every ready sub-task that may start now, counting each into ``window``.

        The Scheduler calls this after every event. This generic loop is defined by
        peek/admits/pop; a policy may replace it with an equivalent one that makes no Python call
        per sub-task (calls are most of what the Core costs per sub-task).
        """
        started: list[SubTask] = []
        sub = self.peek(now)
        while sub is not None and self.admits(sub, window, now):
            self.pop()
            window.inflight_bytes += sub.nbytes
            window.inflight_count += 1
            started.append(sub)
            sub = self.peek(now)
        return started

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

    def holds_back(self) -> bool:
        """May this policy keep a ready sub-task waiting (a credit, a time window, one message in
        flight)? One that never does starts every sub-task the moment it is ready, so its start
        order is readiness order and followers have no decision of rank 0's to wait for."""
        return True


class PriorityPolicy(Policy):
    """Ready queue ordered by (task priority, enqueue order, partition index): lower first.

    The enqueue order breaks ties between equal priorities deterministically, and the partition
    index keeps the pieces of one tensor in tensor order. Since the first two are the same for
    every piece of a task and the enqueue order is unique, a task's pieces are consecutive in
    this order: the heap holds one entry per ready task, ``[rank, seq, next piece, pieces]``,
    and a pop only advances its cursor until the last piece (one heap operation per task).
    """

    def __init__(self, params: SchedulingParams) -> None:
        super().__init__(params)
        self._heap: list[list] = []  # [rank_of(task), task.seq, index of the next piece, task.subtasks]
        self._waiting = 0
        # release() reads the heap directly; a subclass that changes how it is read keeps the
        # generic loop (which goes through its overrides).
        self._plain_heap = not _overrides(type(self), PriorityPolicy, "peek", "pop")
        self._derives_rank = _overrides(type(self), PriorityPolicy, "rank_of")  # else no call per task

    def push(self, task: CommTask, now: float) -> None:
        rank = self.rank_of(task) if self._derives_rank else task.priority
        heappush(self._heap, [rank, task.seq, 0, task.subtasks])
        self._waiting += len(task.subtasks)

    def rank_of(self, task: CommTask) -> int:
        """The priority number the queue orders by (the task's own, unless a policy derives one)."""
        return task.priority

    def peek(self, now: float) -> SubTask | None:
        if not self._heap:
            return None
        _, _, piece, pieces = self._heap[0]
        return pieces[piece]

    def pop(self) -> SubTask:
        entry = self._heap[0]
        pieces = entry[3]
        sub = pieces[entry[2]]
        entry[2] += 1
        if entry[2] == len(pieces):
            heappop(self._heap)
        self._waiting -= 1
        return sub

    def release(self, window: Window, now: float) -> list[SubTask]:
        heap = self._heap
        if not heap:  # the common case, after a finish
            return []
        if not self._plain_heap:
            return super().release(window, now)
        admits = self.admits
        started: list[SubTask] = []
        while heap:
            entry = heap[0]
            _, _, piece, pieces = entry
            end = len(pieces)
            while piece < end:
                sub = pieces[piece]
                if not admits(sub, window, now):
                    break
                window.inflight_bytes += sub.nbytes
                window.inflight_count += 1
                started.append(sub)
                piece += 1
            if piece < end:  # the head may not start now
                entry[2] = piece
                break
            heappop(heap)
        self._waiting -= len(started)
        return started

    def __len__(self) -> int:
        return self._waiting


class CreditPolicy(PriorityPolicy):
    """Priority order under a credit window (shared by bytescheduler and tictac)."""

    def __init__(self, params: SchedulingParams) -> None:
        super().__init__(params)
        self._credit_admits = not _overrides(type(self), CreditPolicy, "admits")  # admission is the credit test
        self._plain_credit = self._plain_heap and self._credit_admits

    def admits(self, sub: SubTask, window: Window, now: float) -> bool:
        return window.fits(sub.nbytes, self.params.credit_bytes)

    def holds_back(self) -> bool:
        """Only under a finite credit, unless a subclass admits by another rule (Prophet)."""
        return self.params.credit_bytes < math.inf or not self._credit_admits

    def release(self, window: Window, now: float) -> list[SubTask]:
        heap = self._heap
        if not heap:  # the common case, after a finish
            return []
        if not self._plain_credit:
            return super().release(window, now)
        # PriorityPolicy.release with Window.fits inlined (this loop runs for every sub-task).
        credit = self.params.credit_bytes
        inflight_bytes, inflight_count = window.inflight_bytes, window.inflight_count
        started: list[SubTask] = []
        while heap:
            entry = heap[0]
            _, _, first, pieces = entry
            count_before = inflight_count
            for sub in pieces[first:] if first else pieces:
                nbytes = sub.nbytes
                if inflight_count and inflight_bytes + nbytes > credit:
                    break
                inflight_bytes += nbytes
                inflight_count += 1
            piece = first + inflight_count - count_before
            started += pieces[first:piece]
            if piece < len(pieces):  # the head does not fit
                entry[2] = piece
                break
            heappop(heap)
        window.inflight_bytes, window.inflight_count = inflight_bytes, inflight_count
        self._waiting -= len(started)
        return started


def _overrides(cls: type, base: type, *names: str) -> bool:
    """Does ``cls`` replace any of ``base``'s methods ``names``?"""
    return any(getattr(cls, name) is not getattr(base, name) for name in names)
