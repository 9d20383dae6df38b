"""Test doubles for driving the Core: a CommTask over a plain byte buffer, and a virtual-time
driver of the Scheduler. These are real implementations of the plugin interface (partitioning a
real buffer into zero-copy memoryview slices), not mocks: the tests check the bytes."""

from __future__ import annotations

import heapq
from typing import Callable

from bytesched.core import CommTask, Scheduler, SubTask, split_elements


class BufferTask(CommTask):
    """A CommTask over a bytearray: partitions are zero-copy memoryview slices of it.

    ``start`` records the sub-task and hands it to ``on_start`` (a driver decides when it finishes).
    """

    def __init__(self, name: str, priority: int, nbytes: int, itemsize: int = 4,
                 on_start: Callable[[SubTask], None] | None = None) -> None:
        super().__init__(name, priority, nbytes)
        self.buffer = bytearray(nbytes)
        self.itemsize = itemsize
        self.on_start = on_start
        self.started: list[SubTask] = []
        self.finished_callbacks = 0
        self.errors: list[BaseException] = []

    def partition(self, size: float) -> list[tuple[memoryview, int]]:
        view = memoryview(self.buffer)
        return [(view[a * self.itemsize:b * self.itemsize], (b - a) * self.itemsize)
                for a, b in split_elements(self.nbytes // self.itemsize, self.itemsize, size)]

    def start(self, subtask: SubTask) -> None:
        self.started.append(subtask)
        if self.on_start is not None:
            self.on_start(subtask)

    def on_finish(self) -> None:
        self.finished_callbacks += 1

    def on_error(self, error: BaseException) -> None:
        self.errors.append(error)


class VirtualDriver:
    """Drives a Scheduler in virtual time: each started sub-task finishes after ``duration(sub)``.

    Records the global start order, and checks the credit invariant at every start.
    """

    def __init__(self, scheduler: Scheduler, duration: Callable[[SubTask], float]) -> None:
        self.scheduler = scheduler
        self.duration = duration
        self.now = 0.0
        self.started: list[SubTask] = []
        self._heap: list[tuple[float, int, str, object]] = []
        self._n = 0

    def at(self, time: float, kind: str, obj: object) -> None:
        """Schedule an event: ("ready", task) or ("finish", sub)."""
        heapq.heappush(self._heap, (time, self._n, kind, obj))
        self._n += 1

    def run(self) -> None:
        """Process events in time order until none is left."""
        while self._heap:
            self.now, _, kind, obj = heapq.heappop(self._heap)
            if kind == "ready":
                out = self.scheduler.ready(obj, self.now)  # type: ignore[arg-type]
            else:
                out = self.scheduler.finish(obj, self.now)  # type: ignore[arg-type]
            self._started(out)

    def _started(self, subs: list[SubTask]) -> None:
        for sub in subs:
            self.started.append(sub)
            sub.task.start(sub)
            self.at(self.now + self.duration(sub), "finish", sub)
