"""Start whole tasks in one fixed cycle of task names on every rank: a common collective order
with no announcements.

A backend that matches collectives by the order each rank issues them (torch.distributed) needs
every rank to issue the same sequence. Under a policy that may hold sub-tasks back, rank 0
decides and announces its order over the channel (``rank0`` mode), which costs a round trip per
batch of starts on the followers' critical path. A job that stays out of the way (no partitions,
no credit limit) has nothing to decide: every rank can follow one order agreed in advance, the
rule DistributedDataParallel uses for its buckets. Each step every task name occurs once, so the
cycle of names is the sequence: the next task in the cycle starts once it is ready here (its
sub-tasks in index order), and a task ready early waits for the ones before it.
"""

from __future__ import annotations

from collections import deque
from typing import Sequence

from ..config import SchedulingParams
from ..task import CommTask, SubTask
from .base import Policy, Window


class SequenceError(RuntimeError):
    """A task outside the agreed cycle of names was made ready."""


class SequencePolicy(Policy):
    """Start tasks in the cycle ``names`` (each name once per step), whole and in order."""

    name = "sequence"
    batches = False  # every rank starts the agreed sequence by itself

    def __init__(self, leader: Policy, names: Sequence[str]) -> None:
        super().__init__(leader.params)
        if not names or len(set(names)) != len(names):
            raise ValueError(f"a sequence needs distinct task names, got {list(names)!r}")
        self.leader = leader
        self.names = tuple(names)
        self._next = 0
        self._ready: dict[str, deque[SubTask]] = {name: deque() for name in self.names}
        self._count = 0

    def partition_bytes(self) -> float:
        return self.leader.partition_bytes()

    def set_params(self, params: SchedulingParams) -> None:
        super().set_params(params)
        self.leader.set_params(params)

    def push(self, task: CommTask, now: float) -> None:
        queue = self._ready.get(task.name)
        if queue is None:
            raise SequenceError(f"task {task.name!r} is not in the sequence every rank agreed on "
                                f"({len(self.names)} names, e.g. {self.names[0]!r}): its collectives would be "
                                f"issued in different orders on different ranks")
        queue.extend(task.subtasks)
        self._count += len(task.subtasks)

    def peek(self, now: float) -> SubTask | None:
        queue = self._ready[self.names[self._next]]
        return queue[0] if queue else None

    def pop(self) -> SubTask:
        sub = self._ready[self.names[self._next]].popleft()
        self._count -= 1
        if sub.index == len(sub.task.subtasks) - 1:  # the task's last piece: the next name's turn
            self._next = (self._next + 1) % len(self.names)
        return sub

    def admits(self, sub: SubTask, window: Window, now: float) -> bool:
        return True  # no credit: the sequence is used where nothing is held back for credit

    def __len__(self) -> int:
        return self._count

    def waiting_for(self) -> str:
        """The task whose turn it is (for stall reports)."""
        return self.names[self._next]
