"""What any scheduler could reach, and where a simulated schedule loses the rest.

Three lower bounds on the iteration time of a job, each tighter than the one before:

- the *ideal*, ``max(compute, communication)``: compute on the slowest worker, every gradient
  moved at full bandwidth with no per-message cost, perfectly balanced servers, and perfect
  overlap of the two;
- the *achievable bound* (:func:`achievable_time`): the same job with zero per-message cost,
  arbitrarily fine partitions and perfect preemption, sent in the optimal order of Theorem 1 of
  the ByteScheduler paper (the layer nearest the input first). Communication is a fluid served at
  full bandwidth; a gradient joins it when its layer's backward pass ends; a layer's next forward
  pass starts once its gradients are through (and, for all-reduce, its update applied). What it
  adds to the ideal is the *order constraint*: the first layer's gradient is ready last and
  needed first, so whatever the first layers hold cannot overlap anything;
- the :class:`Breakdown` of one job: the best sizes of a wide grid, simulated first with free
  messages (what finite partitions and the servers' placement cost), then with the cluster's
  hop latency, then with its per-message overhead θ and Horovod's cycle, and finally the plan's
  choice. The differences say where the gap between the achievable bound and the plan goes.

See docs/simulator.md, "How far from the limit".
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from ..core.config import SchedulingParams
from .cluster import Cluster
from .engine import EventLoop
from .plan import STAY_OUT, candidate_sizes, search_seconds
from .profile import ModelProfile
from .simulator import make_fabric


def compute_time(profile: ModelProfile, cluster: Cluster) -> float:
    """One iteration of compute on the slowest worker (the PS applies updates on servers)."""
    per_layer = (layer.forward + layer.backward + (layer.update if cluster.arch == "allreduce" else 0.0)
                 for layer in profile.layers)
    return _slowest(cluster) * sum(per_layer)


def communication_time(profile: ModelProfile, cluster: Cluster) -> float:
    """Moving every gradient at full bandwidth, with no per-message cost and perfect balance."""
    fabric = make_fabric(cluster, EventLoop(), cluster.worker_classes())
    if cluster.arch == "allreduce":
        return fabric.allreduce_seconds(profile.nbytes, cluster.workers)
    return fabric.ps_lower_bound(profile.nbytes, cluster.workers)


def achievable_time(profile: ModelProfile, cluster: Cluster) -> float:
    """The achievable bound (module docstring): the steady-state iteration time of Theorem 1's
    schedule in the fluid limit, on the slowest worker.

    Every iteration is the same: the forward pass of the last layer waits for the last
    gradient, which Theorem 1's order sends last, so communication is idle when backward
    begins. Gradients ready at ``r_j`` (layer ``j``'s backward ends) are served layer-first at
    rate ``R`` (the ideal's bandwidth); under preemptive priority only layers ``<= i`` delay
    layer ``i``, and the layers ``<= j`` are ready from ``r_j`` on (backward runs from the last
    layer to the first), so layer ``i`` is through at ``max over j <= i of r_j + bytes(0..j)/R``.
    """
    communication = communication_time(profile, cluster)
    scale = _slowest(cluster)
    layers = profile.layers
    seconds_per_byte = communication / profile.nbytes if profile.nbytes else 0.0
    ready = [0.0] * len(layers)
    clock = 0.0
    for index in range(len(layers) - 1, -1, -1):
        clock += layers[index].backward * scale
        ready[index] = clock
    on_device = cluster.arch == "allreduce"
    sent = through = 0.0
    forward_end = clock  # the forward pass starts when the backward pass has ended
    for index, layer in enumerate(layers):
        sent += layer.nbytes * seconds_per_byte
        through = max(through, ready[index] + sent)
        update = layer.update * scale
        start = max(forward_end, through + (0.0 if on_device else update))
        forward_end = start + (update if on_device else 0.0) + layer.forward * scale
    return forward_end


BREAKDOWN_PARTITIONS = (125_000, 500_000, 2_000_000, 8_000_000, 32_000_000)
"""Partitions of the breakdown's grid: factors of 4 from 125 KB (finer than any plan's) to 32 MB."""
BREAKDOWN_CREDIT_FACTORS = (1, 4, 16, 64)
"""Its credits, in partitions: one (preemption at every partition) to 64 (a parameter server's
many servers busy at once)."""
BREAKDOWN_PIECES_MAX = 4096
"""A partition is left out of the grid where it cuts the model into more pieces than this (each
piece is a simulated event per worker class)."""


def breakdown_grid(profile: ModelProfile, cluster: Cluster) -> list[SchedulingParams]:
    """The sizes the breakdown tries for ``profile`` on ``cluster`` (besides staying out): its own
    grid and the plan's candidates."""
    grid = [SchedulingParams(partition_bytes=p, credit_bytes=p * k) for p in BREAKDOWN_PARTITIONS
            if profile.nbytes <= p * BREAKDOWN_PIECES_MAX for k in BREAKDOWN_CREDIT_FACTORS]
    return grid + [p for p in candidate_sizes(profile, cluster) if p not in grid]


@dataclass(frozen=True)
class Stage:
    """One step of the breakdown: the iteration time reached with what is named, and the sizes."""

    name: str
    iteration_time: float
    params: SchedulingParams | None = None
    """The best sizes of the grid (None: a bound, or staying out)."""

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "iteration_time": self.iteration_time}
        if self.params is not None:
            out["partition_bytes"] = self.params.partition_bytes
            out["credit_bytes"] = self.params.credit_bytes
        return out


STAGES = ("ideal", "achievable", "free messages", "hop latency", "per-message cost", "plan")
GAPS = {"achievable": "order constraint", "free messages": "partitions and placement",
        "hop latency": "hop latency", "per-message cost": "per-message cost", "plan": "plan's choice"}
"""What the step from the stage before to each stage is charged to."""


@dataclass(frozen=True)
class Breakdown:
    """The iteration time after each of :data:`STAGES`; :meth:`gaps` charges each difference."""

    stages: tuple[Stage, ...]

    def gaps(self) -> list[tuple[str, float]]:
        """``(cause, seconds)`` from each stage to the next (the plan's may be negative where
        it runs a schedule the grid does not hold)."""
        return [(GAPS[after.name], after.iteration_time - before.iteration_time)
                for before, after in zip(self.stages, self.stages[1:])]

    def to_json(self) -> dict[str, Any]:
        return {"stages": [s.to_json() for s in self.stages],
                "gaps": [{"cause": cause, "seconds": seconds} for cause, seconds in self.gaps()]}


def breakdown(profile: ModelProfile, cluster: Cluster, plan_seconds: float) -> Breakdown:
    """Where the time between the ideal and the plan's ``plan_seconds`` goes on ``cluster`` (each
    candidate simulated as the plan simulates it)."""
    free = dataclasses.replace(cluster, overhead=0.0, latency=0.0)
    hops = dataclasses.replace(cluster, overhead=0.0)
    grid = breakdown_grid(profile, cluster)
    stages = [Stage("ideal", max(compute_time(profile, cluster), communication_time(profile, cluster))),
              Stage("achievable", achievable_time(profile, cluster))]
    for name, costs in (("free messages", free), ("hop latency", hops), ("per-message cost", cluster)):
        stay_out = search_seconds(profile, costs, "fifo", STAY_OUT)
        best = min(((search_seconds(profile, costs, "bytescheduler", p), p) for p in grid), key=lambda c: c[0])
        stages.append(Stage(name, *best) if best[0] < stay_out else Stage(name, stay_out))
    stages.append(Stage("plan", plan_seconds))
    return Breakdown(tuple(stages))


def _slowest(cluster: Cluster) -> float:
    return max(spec.compute for spec, _ in cluster.worker_classes())
