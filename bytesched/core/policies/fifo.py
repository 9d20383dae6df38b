"""``fifo``: what every framework does without a scheduler - whole tensors in readiness order."""

from __future__ import annotations

import math
from collections import deque

from ..config import SchedulingParams
from ..task import CommTask, SubTask
from .base import Policy, Window


class FifoPolicy(Policy):
    """Readiness order, no partitioning, no credit limit: the vanilla baseline as a policy."""

    name = "fifo"
    default_partition_bytes = math.inf

    def __init__(self, params: SchedulingParams) -> None:
        super().__init__(params)
        self._queue: deque[SubTask] = deque()

    def partition_bytes(self) -> float:
        return math.inf

    def push(self, task: CommTask, now: float) -> None:
        self._queue.extend(task.subtasks)

    def peek(self, now: float) -> SubTask | None:
        return self._queue[0] if self._queue else None

    def pop(self) -> SubTask:
        return self._queue.popleft()

    def admits(self, sub: SubTask, window: Window, now: float) -> bool:
        return True

    def holds_back(self) -> bool:
        return False

    def __len__(self) -> int:
        return len(self._queue)
