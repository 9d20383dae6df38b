"""The plan: the scheduling a job gets with no settings, chosen by simulating its own profile.

Fixed sizes cannot suit every job: 4 MB partitions under a 16 MB credit lose to doing nothing on a
16-worker parameter server at 10 Gbps (the simulator predicts 0.31x) and win on a slow network.
So the plan simulates the job (its layers' compute times and gradient sizes on its cluster) under
every candidate and keeps the fastest:

- ``fifo``: no partitions and no credit limit, each gradient sent whole as soon as it is ready,
  the cheapest path through bytesched (it stays out of the way);
- ``bytescheduler`` at each (partition, credit) of :func:`candidate_sizes`.

A sized candidate must beat ``fifo`` by :data:`STAY_OUT_MARGIN` to be kept: each partition costs
real CPU that the simulator only approximates, so a predicted gain smaller than that is not worth
the risk of a real loss. The search runs short simulations (one warm-up and one measured
iteration); the chosen configuration is what the caller then reports.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..core.config import UNLIMITED, SchedulingParams
from .cluster import Cluster
from .profile import ModelProfile
from .simulator import run

PLAN = "plan"
"""The name of the plan's row in ``bytesched simulate``."""
STAY_OUT_MARGIN = 0.01
"""The predicted gain (fraction of fifo's iteration time) a sized candidate needs to be chosen."""
CANDIDATE_PARTITIONS = (1_000_000, 2_000_000, 4_000_000, 8_000_000, 16_000_000, 32_000_000)
CANDIDATE_CREDIT_FACTORS = (1, 2, 4, 8)
STAY_OUT = SchedulingParams(partition_bytes=UNLIMITED, credit_bytes=UNLIMITED)
"""No partitions and no credit limit: every gradient goes whole the moment it is ready."""
SEARCH_ITERATIONS = 1
SEARCH_WARMUP = 1


def candidate_sizes() -> list[SchedulingParams]:
    """Partitions of 1 to 32 MB, credits of 1 to 8 partitions (24 candidates)."""
    return [SchedulingParams(partition_bytes=p, credit_bytes=p * k)
            for p in CANDIDATE_PARTITIONS for k in CANDIDATE_CREDIT_FACTORS]


@dataclass(frozen=True)
class Plan:
    """What the plan chose, and the short simulation's iteration times that chose it."""

    policy: str
    """``fifo`` (stay out of the way) or ``bytescheduler``."""
    params: SchedulingParams
    search_iteration_time: float
    stay_out_iteration_time: float
    """The same short simulation's iteration time under ``fifo``: what the choice is weighed against."""

    @property
    def predicted_speedup(self) -> float:
        """How much faster the short simulation runs the choice than staying out of the way."""
        return self.stay_out_iteration_time / self.search_iteration_time

    def describe(self) -> str:
        """One line for a log: what was chosen."""
        if self.policy == "fifo":
            return "fifo: no partitioning, no credit limit (no predicted gain from scheduling)"
        return (f"bytescheduler: {self.params.partition_bytes / 1e6:g} MB partitions, "
                f"{self.params.credit_bytes / 1e6:g} MB credit")


def make_plan(profile: ModelProfile, cluster: Cluster, margin: float = STAY_OUT_MARGIN) -> Plan:
    """The fastest candidate for ``profile`` on ``cluster``: fifo unless a sized one is predicted
    faster by ``margin`` (a fraction of fifo's iteration time)."""
    def seconds(policy: str, params: SchedulingParams) -> float:
        return run(profile, cluster, policy, params, iterations=SEARCH_ITERATIONS,
                   warmup=SEARCH_WARMUP).iteration_time

    stay_out = seconds("fifo", STAY_OUT)
    fifo = Plan("fifo", STAY_OUT, stay_out, stay_out)
    sized = min((Plan("bytescheduler", params, seconds("bytescheduler", params), stay_out)
                 for params in candidate_sizes()), key=lambda plan: plan.search_iteration_time)
    if sized.search_iteration_time < (1 - margin) * fifo.search_iteration_time:
        return sized
    return fifo
