"""Follower policies: how a rank other than 0 starts sub-tasks so that every rank agrees.

Rank 0 runs the configured policy and decides. A follower either obeys rank 0's announced start
order exactly (``rank0`` mode, for backends that need the same collective order everywhere, such
as torch.distributed or a dist_sync parameter server), or starts as soon as ready
(``immediate`` mode, for backends that negotiate order themselves, such as Horovod, where a
collective runs only once every rank submitted it, so rank 0's release order becomes global).
Either way a follower partitions exactly as rank 0 does, so sub-task names match across ranks.
"""

from __future__ import annotations

from collections import deque
from typing import Iterable

from ..config import SchedulingParams
from ..task import CommTask, SubTask
from .base import Policy, Window
from .fifo import FifoPolicy

SubTaskKey = tuple[str, int, int]


class ImmediatePolicy(FifoPolicy):
    """Start every sub-task as soon as it is ready, partitioned like the leader's policy."""

    name = "immediate"

    def __init__(self, leader: Policy) -> None:
        super().__init__(leader.params)
        self.leader = leader

    def partition_bytes(self) -> float:
        return self.leader.partition_bytes()

    def set_params(self, params: SchedulingParams) -> None:
        super().set_params(params)
        self.leader.set_params(params)


class FollowOrderPolicy(Policy):
    """Start sub-tasks exactly in the order rank 0 announced, each once it is ready here."""

    name = "rank0-follower"

    def __init__(self, leader: Policy) -> None:
        super().__init__(leader.params)
        self.leader = leader
        self._order: deque[SubTaskKey] = deque()
        self._ready: dict[SubTaskKey, SubTask] = {}

    def partition_bytes(self) -> float:
        return self.leader.partition_bytes()

    def set_params(self, params: SchedulingParams) -> None:
        super().set_params(params)
        self.leader.set_params(params)

    def announce(self, keys: Iterable[SubTaskKey]) -> None:
        """Rank 0 started these sub-tasks, in this order."""
        self._order.extend(keys)

    def push(self, task: CommTask, now: float) -> None:
        for sub in task.subtasks:
            self._ready[sub.key] = sub

    def peek(self, now: float) -> SubTask | None:
        if not self._order:
            return None
        return self._ready.get(self._order[0])

    def pop(self) -> SubTask:
        return self._ready.pop(self._order.popleft())

    def admits(self, sub: SubTask, window: Window, now: float) -> bool:
        return True  # rank 0 already applied the credit window

    def __len__(self) -> int:
        return len(self._ready)

    def waiting_for(self) -> SubTaskKey | None:
        """The announced key this rank has not made ready yet (for stall reports)."""
        if self._order and self._order[0] not in self._ready:
            return self._order[0]
        return None


ORDER_NEEDS = ("rank0", "immediate", "ps")
"""What a backend needs from the cross-rank order: ``rank0`` (every rank must issue its collectives
in one order: torch.distributed), ``immediate`` (the backend orders them itself: Horovod; or there
is nothing to agree on: one process, an asynchronous or local store), ``ps`` (a synchronous
parameter server: :func:`ps_order` decides)."""


def order_mode(leader: Policy, *, need: str, setting: str = "auto", world_size: int = 2,
               tuning: bool = False) -> str:
    """The order mode of a job's Cores, decided once for the runtime plugins and the simulator:
    ``setting`` (``BYTESCHED_ORDER``) unless it is ``auto``, else what the backend ``need``s; for
    a synchronous parameter server of several workers, :func:`ps_order` under ``leader``."""
    if need not in ORDER_NEEDS:
        raise ValueError(f"need={need!r}: expected one of {', '.join(ORDER_NEEDS)}")
    if setting != "auto":
        return setting
    if need == "ps":
        return ps_order(leader, tuning=tuning) if world_size > 1 else "immediate"
    return need


def ps_order(leader: Policy, *, tuning: bool = False) -> str:
    """The follower mode of a synchronous parameter server's workers under ``leader``.

    Followers never hold a push back (a ``dist_sync`` server answers a key once every worker
    pushed it, so workers holding pushes back in their own orders could wait on each other
    forever); ``rank0`` order makes them start rank 0's schedule, so that every worker's uplink
    carries the urgent partitions first. A policy that never holds a ready sub-task back (``fifo``,
    or a credit policy with unlimited credit) has no schedule to share: ``immediate`` order starts
    the same sub-tasks at once, without a channel round trip per start. Tuning may set a finite
    credit later, so it keeps ``rank0``.
    """
    return "rank0" if tuning or leader.holds_back() else "immediate"
