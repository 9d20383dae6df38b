"""Decoupled all-reduce (DeAR, Zhang et al., 2023): each gradient's all-reduce split into a
reduce-scatter during backward and an all-gather during the next forward pass.

The Scheduler decides the reduce-scatters exactly as it decides all-reduces: each sub-task it
starts is a reduce-scatter of the piece, and the credit returns when it is done. The all-gathers
are not the Scheduler's: they go in the order the next forward pass reads the layers, in fixed
buckets of consecutive tasks holding at most the partition size together (a larger task alone),
each once the forward pass has begun and every reduce-scatter of its tasks and every bucket
before it is through. A layer's forward pass waits for the all-gathers of its tasks (its update
is applied just before it, as for all-reduce). Every collective runs on the one communicator,
in submission order; reduce-scatters and all-gathers each cost half an all-reduce of their bytes
plus a whole per-message overhead (:meth:`~bytesched.sim.allreduce.CollectiveCost.half`).

Where it can pay: an urgent gradient waits behind at most one reduce-scatter, the reduce-scatters
of the backward pass may be large and few (nothing waits for them until the forward pass), and
the all-gathers fill the forward pass. What it costs: twice the per-message overhead, and the
ring's latency (NCCL has no tree for either half). See docs/simulator.md, "Decoupled all-reduce".
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Sequence

from ..core.task import SubTask
from .allreduce import HALF, Allreduce

if TYPE_CHECKING:
    from .worker import SimCommTask, WorkerClass


@dataclass
class _Gathers:
    """One worker class's all-gathers of one iteration."""

    buckets: list[list["SimCommTask"]]
    reduced: set[int] = field(default_factory=set)
    """``id`` of the tasks whose reduce-scatters are all through."""
    open: bool = False
    """The next forward pass has begun."""
    next: int = 0
    """The first bucket not submitted yet."""


class DecoupledAllreduce:
    """The DeAR backend shared by every worker class of one simulation (module docstring)."""

    def __init__(self, ring: Allreduce, bucket_bytes: float) -> None:
        self.ring = ring
        self.bucket_bytes = bucket_bytes
        self._gathers: dict[tuple[int, int], _Gathers] = {}

    # -- the Scheduler's sub-tasks: reduce-scatters ---------------------------------------------
    def start(self, klass: int, sub: SubTask, task: "SimCommTask", done: Callable[[], None]) -> None:
        self.ring.submit_collective(("reduce-scatter", *sub.key), sub.nbytes, HALF, done)

    # -- the worker's events --------------------------------------------------------------------
    def enqueued(self, worker: "WorkerClass", iteration: int, tasks: Sequence["SimCommTask"]) -> None:
        """``tasks`` are ``iteration``'s communication on ``worker``: fix their all-gather buckets."""
        buckets: list[list[SimCommTask]] = []
        size = 0.0
        for task in sorted(tasks, key=lambda t: t.priority):
            if not buckets or size + task.nbytes > self.bucket_bytes:
                buckets.append([])
                size = 0
            buckets[-1].append(task)
            size += task.nbytes
        self._gathers[worker.index, iteration] = _Gathers(buckets)

    def reduced(self, worker: "WorkerClass", task: "SimCommTask") -> None:
        """Every reduce-scatter of ``task`` is through."""
        gathers = self._gathers[worker.index, task.iteration]
        gathers.reduced.add(id(task))
        self._release(worker, task.iteration, gathers)

    def forward_begins(self, worker: "WorkerClass", iteration: int) -> None:
        """``worker`` begins the forward pass after ``iteration``: its all-gathers may go."""
        gathers = self._gathers.get((worker.index, iteration))
        if gathers is not None:
            gathers.open = True
            self._release(worker, iteration, gathers)

    def _release(self, worker: "WorkerClass", iteration: int, gathers: _Gathers) -> None:
        while gathers.open and gathers.next < len(gathers.buckets):
            bucket = gathers.buckets[gathers.next]
            if not all(id(task) in gathers.reduced for task in bucket):
                return
            key = ("all-gather", iteration, gathers.next)
            gathers.next += 1
            self.ring.submit_collective(key, sum(task.nbytes for task in bucket), HALF,
                                        functools.partial(self._gathered, worker, bucket))
        if gathers.next == len(gathers.buckets):
            del self._gathers[worker.index, iteration]

    @staticmethod
    def _gathered(worker: "WorkerClass", bucket: list["SimCommTask"]) -> None:
        for task in bucket:
            worker.gathered(task)
