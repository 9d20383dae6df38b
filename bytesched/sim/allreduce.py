"""Ring all-reduce as Horovod runs it: one collective at a time, each once every rank has
submitted it, optionally fused per background-loop cycle (the vanilla baseline).

A collective of ``b`` bytes among ``n`` workers costs

    θ + 2(n-1)·latency + 2(n-1)/n · b / bandwidth

(the bandwidth term comes from the fabric, so a shared medium costs n times more). Collectives
never overlap: Horovod's background thread executes them one after another, which is why a
credit window larger than one partition delays a newly ready urgent gradient.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Callable

from ..core.task import SubTask
from .engine import Event, EventLoop
from .network import Fabric

Done = Callable[[], None]


class _Pending:
    """A collective waiting for its submissions: how many classes submitted, and their callbacks."""

    __slots__ = ("nbytes", "count", "callbacks")

    def __init__(self, nbytes: int) -> None:
        self.nbytes = nbytes
        self.count = 0
        self.callbacks: list[Done] = []


class RingAllreduce:
    """The collective backend shared by every worker class of one simulation."""

    def __init__(self, loop: EventLoop, fabric: Fabric, workers: int, num_classes: int, *,
                 overhead: float, latency: float, fusion_threshold: float = 0.0,
                 cycle_time: float = 0.0) -> None:
        self.loop = loop
        self.fabric = fabric
        self.workers = workers
        self.num_classes = num_classes
        self.fixed = overhead + 2 * (workers - 1) * latency
        self.fusion_threshold = fusion_threshold
        self.cycle_time = cycle_time
        self._pending: dict[tuple[str, int, int], _Pending] = {}
        self._queue: deque[_Pending] = deque()
        self._busy = False
        self._next_tick = 0.0
        self._tick_event: Event | None = None
        self.collectives = 0

    @property
    def fusing(self) -> bool:
        return self.fusion_threshold > 0 and self.cycle_time > 0

    def seconds(self, nbytes: float) -> float:
        """Duration of one collective of ``nbytes``."""
        return self.fixed + self.fabric.allreduce_seconds(nbytes, self.workers)

    def submit(self, sub: SubTask, done: Done) -> None:
        """One worker class submitted ``sub``; it runs once every class did."""
        self.submit_operation(sub.key, sub.nbytes, done)

    def submit_operation(self, key: tuple[str, int, int], nbytes: int, done: Done) -> None:
        """One worker class submitted the collective ``key`` of ``nbytes`` (a sub-task, or a batch
        of them under its first one's key); it runs once every class did."""
        pending = self._pending.get(key)
        if pending is None:
            pending = self._pending[key] = _Pending(nbytes)
        pending.count += 1
        pending.callbacks.append(done)
        if pending.count == self.num_classes:
            del self._pending[key]
            self._queue.append(pending)
            self._kick()

    # -- execution ----------------------------------------------------------------------------
    def _kick(self) -> None:
        if self._busy or not self._queue:
            return
        if not self.fusing:
            self._run_groups([[self._queue.popleft()]])
        elif self._tick_event is None:
            # The background loop wakes every cycle; work submitted between wakes waits.
            now = self.loop.now
            cycles = max(0, math.ceil((now - self._next_tick) / self.cycle_time - 1e-9))
            when = max(now, self._next_tick + cycles * self.cycle_time)
            self._tick_event = self.loop.call_at(when, self._tick)

    def _tick(self) -> None:
        self._tick_event = None
        self._next_tick = self.loop.now + self.cycle_time
        groups: list[list[_Pending]] = []
        size = math.inf
        while self._queue:
            item = self._queue.popleft()
            if size + item.nbytes > self.fusion_threshold or not groups:
                groups.append([])
                size = 0
            groups[-1].append(item)
            size += item.nbytes
        self._run_groups(groups)

    def _run_groups(self, groups: list[list[_Pending]]) -> None:
        if not groups:
            self._busy = False
            self._next_tick = max(self._next_tick, self.loop.now)
            self._kick()
            return
        self._busy = True
        group = groups.pop(0)
        self.collectives += 1
        duration = self.seconds(sum(item.nbytes for item in group))
        self.loop.call_later(duration, self._group_done, group, groups)

    def _group_done(self, group: list[_Pending], rest: list[list[_Pending]]) -> None:
        for item in group:
            for done in item.callbacks:
                done()
        self._run_groups(rest)
