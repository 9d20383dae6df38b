"""All-reduce as Horovod runs it over NCCL (or Gloo): one collective at a time, each once every
rank has submitted it, optionally fused per background-loop cycle (the vanilla baseline), each
run with the ring or the tree algorithm.

A collective of ``b`` bytes among ``n`` workers costs the per-message overhead θ plus its
algorithm's latency and bandwidth terms:

    ring:  θ + 2(n-1)·latency          + 2(n-1)/n · b / bandwidth
    tree:  θ + 2⌈log2 n⌉·2·latency    + b / (0.92 · bandwidth / 2)

(the bandwidth terms come from the fabric, so a shared medium costs n times more). A ring is
bandwidth-optimal and pays a hop per step, 2(n-1) of them; a tree (NCCL's double binary tree)
reduces up and broadcasts down ``log2 n`` levels, each costing about two ring steps, at 92 % of
the ring's bus bandwidth: the constants of NCCL's own cost model (``src/graph/tuning.cc``: a
network tree level 28 us against a ring step's 14 us with the Simple protocol, tree bus
bandwidth ``0.92 x``). ``nccl`` takes whichever is faster for each collective's size, as NCCL
chooses per call; ``ring`` is Gloo's and Horovod-over-MPI's large-message algorithm. See
docs/simulator.md, "All-reduce".

Collectives never overlap: Horovod's background thread executes them one after another, and
NCCL runs the collectives of one communicator in order on one stream, which is why a credit
window larger than one partition delays a newly ready urgent gradient.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Callable, Hashable

from ..core.task import SubTask
from .engine import Event, EventLoop
from .network import Fabric

Done = Callable[[], None]

ALGORITHMS = ("nccl", "ring", "tree")
"""``Cluster.collective``: NCCL's per-size choice of ring or tree, or one of them always."""
TREE_LEVEL_HOPS = 2.0
"""A tree level's latency in ring steps (NCCL's network model, Simple protocol: 28 us a tree
level against 14 us a ring step)."""
TREE_BANDWIDTH = 0.92
"""The tree's bus bandwidth as a fraction of the ring's (NCCL's model: ``busBw * .92``)."""


def tree_levels(workers: int) -> int:
    """Levels of a binary tree over ``workers`` ranks: ``ceil(log2 n)``."""
    return math.ceil(math.log2(workers)) if workers > 1 else 0


class CollectiveCost:
    """What one all-reduce of ``nbytes`` costs on ``fabric`` among ``workers`` with ``algorithm``
    (see the module docstring), and which algorithm it ran with."""

    def __init__(self, fabric: Fabric, workers: int, *, overhead: float, latency: float,
                 algorithm: str = "nccl") -> None:
        if algorithm not in ALGORITHMS:
            raise ValueError(f"collective algorithm {algorithm!r} is unknown: expected one of {', '.join(ALGORITHMS)}")
        self.fabric = fabric
        self.workers = workers
        self.algorithm = algorithm
        self.ring_fixed = overhead + 2 * (workers - 1) * latency
        self.half_fixed = overhead + (workers - 1) * latency
        self.tree_fixed = overhead + 2 * tree_levels(workers) * TREE_LEVEL_HOPS * latency

    def ring(self, nbytes: float) -> float:
        return self.ring_fixed + self.fabric.allreduce_seconds(nbytes, self.workers)

    def tree(self, nbytes: float) -> float:
        return self.tree_fixed + self.fabric.tree_allreduce_seconds(nbytes, self.workers) / TREE_BANDWIDTH

    def seconds(self, nbytes: float) -> float:
        """Duration of one all-reduce of ``nbytes``."""
        if self.algorithm == "ring" or self.workers < 2:
            return self.ring(nbytes)
        if self.algorithm == "tree":
            return self.tree(nbytes)
        return min(self.ring(nbytes), self.tree(nbytes))

    def half(self, nbytes: float) -> float:
        """Duration of a reduce-scatter (or an all-gather) of ``nbytes``: half a ring all-reduce,
        with its own overhead: ``θ + (n-1)·latency + (n-1)/n · b / bandwidth``. NCCL runs both
        with the ring algorithm only (its tuning model weighs no tree for them)."""
        return self.half_fixed + self.fabric.allreduce_seconds(nbytes, self.workers) / 2


ALLREDUCE = "allreduce"
HALF = "half"
"""The kinds of collective :class:`Allreduce` runs: an all-reduce, or a reduce-scatter or
all-gather (:meth:`CollectiveCost.half`). Only collectives of one kind fuse."""


class _Pending:
    """A collective waiting for its submissions: its kind, how many classes submitted, and their
    callbacks."""

    __slots__ = ("nbytes", "kind", "count", "callbacks")

    def __init__(self, nbytes: float, kind: str) -> None:
        self.nbytes = nbytes
        self.kind = kind
        self.count = 0
        self.callbacks: list[Done] = []


class Allreduce:
    """The collective backend shared by every worker class of one simulation."""

    def __init__(self, loop: EventLoop, cost: CollectiveCost, num_classes: int, *,
                 fusion_threshold: float = 0.0, cycle_time: float = 0.0) -> None:
        self.loop = loop
        self.cost = cost
        self.num_classes = num_classes
        self.fusion_threshold = fusion_threshold
        self.cycle_time = cycle_time
        self._pending: dict[Hashable, _Pending] = {}
        self._queue: deque[_Pending] = deque()
        self._busy = False
        self._next_tick = 0.0
        self._tick_event: Event | None = None
        self.collectives = 0

    @property
    def fusing(self) -> bool:
        return self.fusion_threshold > 0 and self.cycle_time > 0

    def submit(self, sub: SubTask, done: Done) -> None:
        """One worker class submitted ``sub``'s all-reduce; it runs once every class did."""
        self.submit_collective(sub.key, sub.nbytes, ALLREDUCE, done)

    def submit_collective(self, key: Hashable, nbytes: float, kind: str, done: Done) -> None:
        """One worker class submitted the collective ``key`` of ``nbytes`` and ``kind`` (a
        sub-task's, a batch of them under its first one's key, or a decoupled all-reduce's half);
        it runs once every class did, after the collectives every class submitted before."""
        pending = self._pending.get(key)
        if pending is None:
            pending = self._pending[key] = _Pending(nbytes, kind)
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
            if not groups or size + item.nbytes > self.fusion_threshold or item.kind != groups[-1][0].kind:
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
        nbytes = sum(item.nbytes for item in group)
        duration = self.cost.seconds(nbytes) if group[0].kind == ALLREDUCE else self.cost.half(nbytes)
        self.loop.call_later(duration, self._group_done, group, groups)

    def _group_done(self, group: list[_Pending], rest: list[list[_Pending]]) -> None:
        for item in group:
            for done in item.callbacks:
                done()
        self._run_groups(rest)
