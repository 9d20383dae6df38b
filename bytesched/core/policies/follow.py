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
from typing import Iterable, Sequence

from ..config import SchedulingParams
from ..task import CommTask, SubTask
from .base import Policy, Window
from .fifo import FifoPolicy

SubTaskKey = tuple[str, int, int]
JOINS = 1 << 31
"""Set in an announced key's partition index: the sub-task was started in one operation with the
key announced before it (a batch, see :mod:`~bytesched.core.scheduler`)."""


def announcement(started: Sequence[SubTask]) -> list[SubTaskKey]:
    """The keys rank 0 announces for ``started`` (in order), each key of a batch after its first
    marked with :data:`JOINS`."""
    keys = []
    for sub in started:
        task, batch = sub.task, sub.batch
        index = sub.index if batch is None or sub is batch[0] else sub.index | JOINS
        keys.append((task.name, task.instance, index))
    return keys


class ImmediatePolicy(FifoPolicy):
    """Start every sub-task as soon as it is ready, partitioned like the leader's policy."""

    name = "immediate"
    batches = False  # each rank starts on its own readiness: no common batches

    def __init__(self, leader: Policy) -> None:
        super().__init__(leader.params)
        self.leader = leader

    def partition_bytes(self) -> float:
        return self.leader.partition_bytes()

    def set_params(self, params: SchedulingParams) -> None:
        super().set_params(params)
        self.leader.set_params(params)


class FollowOrderPolicy(Policy):
    """Start sub-tasks exactly in the order rank 0 announced, each once it is ready here, and rank
    0's batches together, once every sub-task of the batch is ready here."""

    name = "rank0-follower"
    batches = False  # it starts rank 0's batches

    def __init__(self, leader: Policy) -> None:
        super().__init__(leader.params)
        self.leader = leader
        self._order: deque[SubTaskKey] = deque()
        self._sizes: deque[int] = deque()  # the announced operations' sub-task counts, in order
        self._ready: dict[SubTaskKey, SubTask] = {}

    def partition_bytes(self) -> float:
        return self.leader.partition_bytes()

    def set_params(self, params: SchedulingParams) -> None:
        super().set_params(params)
        self.leader.set_params(params)

    def announce(self, keys: Iterable[SubTaskKey]) -> None:
        """Rank 0 started these sub-tasks, in this order (:func:`announcement`)."""
        order, sizes = self._order, self._sizes
        for name, instance, index in keys:
            if index & JOINS and sizes:
                sizes[-1] += 1
                index ^= JOINS
            else:
                sizes.append(1)
            order.append((name, instance, index))

    def push(self, task: CommTask, now: float) -> None:
        for sub in task.subtasks:
            self._ready[sub.key] = sub

    def peek(self, now: float) -> SubTask | None:
        if not self._order or not all(key in self._ready for key in self._head()):
            return None
        return self._ready[self._order[0]]

    def pop(self) -> SubTask:
        self._sizes[0] -= 1
        if not self._sizes[0]:
            self._sizes.popleft()
        return self._ready.pop(self._order.popleft())

    def admits(self, sub: SubTask, window: Window, now: float) -> bool:
        return True  # rank 0 already applied the credit window

    def release(self, window: Window, now: float) -> list[SubTask]:
        """Every announced operation whose sub-tasks are all ready here, in order; a batch's
        sub-tasks share their ``batch`` tuple, as on rank 0."""
        started: list[SubTask] = []
        order, sizes, ready = self._order, self._sizes, self._ready
        while sizes and all(key in ready for key in self._head()):
            subs = [ready.pop(order.popleft()) for _ in range(sizes.popleft())]
            if len(subs) > 1:
                together = tuple(subs)
                for sub in subs:
                    sub.batch = together
            window.inflight_bytes += sum(sub.nbytes for sub in subs)
            window.inflight_count += len(subs)
            started += subs
        return started

    def _head(self) -> list[SubTaskKey]:
        """The keys of the next announced operation."""
        order = self._order
        return [order[i] for i in range(self._sizes[0])]

    def __len__(self) -> int:
        return len(self._ready)

    def waiting_for(self) -> SubTaskKey | None:
        """The announced key this rank has not made ready yet (for stall reports)."""
        if self._order:
            for key in self._head():
                if key not in self._ready:
                    return key
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
