"""The plan: the scheduling a job gets with no settings, chosen by simulating its own profile.

Fixed sizes cannot suit every job: 4 MB partitions under a 16 MB credit lose to doing nothing on a
fast network with many servers and win on a slow one (docs/plan.md).
So the plan simulates the job (its layers' compute times and gradient sizes on its cluster) under
every candidate and keeps the fastest:

- ``fifo``: no partitions and no credit limit, each gradient sent whole as soon as it is ready,
  the cheapest path through bytesched (it stays out of the way);
- ``bytescheduler`` at each (partition, credit) of :func:`candidate_sizes` (on a parameter
  server, sub-megabyte partitions too, where the model holds few of them).

A sized candidate must beat ``fifo`` by :data:`STAY_OUT_MARGIN` to be kept: each partition costs
real CPU that the simulator only approximates, so a predicted gain smaller than that is not worth
the risk of a real loss. The search runs short simulations (one warm-up and one measured
iteration); the chosen configuration is what the caller then reports.

Staying out through bytesched still crosses the global barrier (each update lands as soon as its
gradient is reduced, and the next forward pass waits only for the parameters it reads), which the
simulator credits nothing for under ``fifo``: there the first layer's gradient, ready last, is
sent last. Where even the best sized candidate is predicted to gain less than
:data:`PASS_THROUGH_MARGIN`, communication hides behind compute, nothing bytesched does pays for
its own work per gradient, and :attr:`Plan.passes_through` tells the caller to hand the gradients
to the framework's own path.
"""

from __future__ import annotations

import dataclasses

from dataclasses import dataclass
from typing import Sequence

from ..core.config import UNLIMITED, SchedulingParams
from ..core.task import filled_runs
from .cluster import Cluster
from .profile import Layer, ModelProfile, Tensor
from .engine import EventLoop
from .simulator import collective_cost, make_fabric, run

PLAN = "plan"
"""The name of the plan's row in ``bytesched simulate``."""
STAY_OUT_MARGIN = 0.01
"""The predicted gain (fraction of fifo's iteration time) a sized candidate needs to be chosen."""
CANDIDATE_PARTITIONS = (1_000_000, 2_000_000, 4_000_000, 8_000_000, 16_000_000, 32_000_000)
CANDIDATE_CREDIT_FACTORS = (1, 2, 4, 8)
STAY_OUT = SchedulingParams(partition_bytes=UNLIMITED, credit_bytes=UNLIMITED)
"""No partitions and no credit limit: every gradient goes whole the moment it is ready."""
PASS_THROUGH_MARGIN = 0.02
"""The predicted gain of the best sized candidate over staying out below which a plan that stays
out passes through: below it, staying on the Core's path did not win back its cost per gradient
(docs/plan.md, "Figures behind the plan's margins")."""
FUSION_MARGIN = 0.01
"""How much slower (a fraction of staying out's iteration time) a plan that stays out may be
predicted to run in fused tasks than in the observed ones and still fuse (:func:`fusion_pays`).
Fewer tasks save each collective's CPU, which the simulator does not model; larger ones start
communicating later, which it does (docs/experiments/torch-distributed.md)."""
FINE_PARTITIONS = (250_000, 500_000)
"""The partitions below a megabyte a parameter server's plan also weighs, each at every credit of
:data:`FINE_CREDITS`. A server holds each partition's key, so finer partitions spread a worker's
pushes over more servers' links, and a push preempts sooner; on slow networks they ran faster
than megabyte plans (docs/experiments/finer-partitions.md). Not weighed on all-reduce, where every
piece is a collective whose CPU the simulator models only in part, and where it predicted little
from them."""
FINE_CREDITS = (4_000_000, 8_000_000)
"""The credits of :data:`FINE_PARTITIONS`, in bytes: a sub-megabyte partition's best credit was a
few megabytes, where credits of 1-8 partitions stop at 2-4 MB. Credits of 1 and 2 MB are left out:
they made no clear difference and lengthened the search (docs/experiments/finer-partitions.md)."""
FINE_PIECES_MAX = 256
"""A partition of :data:`FINE_PARTITIONS` is weighed only where it cuts the model's gradients into
at most this many pieces: each piece is a simulated event per worker, so the search stays well under
a second, and a model of hundreds of megabytes keeps the megabyte partitions."""
SERVER_CREDITS = (2, 4)
"""Credits in partitions per server that a parameter server's plan also weighs, for each partition
it weighs, where the smallest exceeds the largest of :data:`CANDIDATE_CREDIT_FACTORS` (more than
four servers), below the model's bytes. Every worker pushes the same partition at the same time
to the one server that holds it, whose link the workers share: to keep every worker's link busy,
as many partitions as servers must be in flight, and twice that for pulls to overlap pushes. In
the simulator, ResNet50 on 32 workers at 25 Gbit/s ran best at 64 partitions in flight, where the
plan's largest credit of 8 had it stay out (docs/simulator.md, "How far from the limit")."""
SEARCH_ITERATIONS = 1
SEARCH_WARMUP = 1


def candidate_sizes(profile: ModelProfile | None = None, cluster: Cluster | None = None) -> list[SchedulingParams]:
    """Partitions of 1 to 32 MB, credits of 1 to 8 partitions (24 candidates); for ``profile`` on
    a parameter-server ``cluster``, also each of :data:`FINE_PARTITIONS` that cuts the model into at
    most :data:`FINE_PIECES_MAX` pieces, at each of :data:`FINE_CREDITS`, and with more than four
    servers every partition at the credits of :data:`SERVER_CREDITS` per server."""
    sizes = [SchedulingParams(partition_bytes=p, credit_bytes=p * k)
             for p in CANDIDATE_PARTITIONS for k in CANDIDATE_CREDIT_FACTORS]
    if profile is not None and cluster is not None and cluster.arch == "ps":
        fine = [p for p in FINE_PARTITIONS if profile.nbytes <= p * FINE_PIECES_MAX]
        sizes += [SchedulingParams(partition_bytes=p, credit_bytes=c) for p in fine for c in FINE_CREDITS]
        if min(SERVER_CREDITS) * cluster.num_servers > max(CANDIDATE_CREDIT_FACTORS):
            sizes += [SchedulingParams(partition_bytes=p, credit_bytes=p * k * cluster.num_servers)
                      for p in (*fine, *CANDIDATE_PARTITIONS) for k in SERVER_CREDITS
                      if p * k * cluster.num_servers < profile.nbytes]
    return sizes


@dataclass(frozen=True)
class Plan:
    """What the plan chose, and the short simulation's iteration times that chose it."""

    policy: str
    """``fifo`` (stay out of the way) or ``bytescheduler``."""
    params: SchedulingParams
    search_iteration_time: float
    stay_out_iteration_time: float
    """The same short simulation's iteration time under ``fifo``: what the choice is weighed against."""
    best_sized_iteration_time: float
    """The same under the fastest sized candidate, chosen or not."""
    pass_through_margin: float = PASS_THROUGH_MARGIN
    """The predicted gain of the fastest sized candidate below which staying out passes through."""
    decoupled: bool = False
    """Each all-reduce runs as a reduce-scatter and an all-gather (:mod:`.decoupled`)."""

    @property
    def predicted_speedup(self) -> float:
        """How much faster the short simulation runs the choice than staying out of the way."""
        return self.stay_out_iteration_time / self.search_iteration_time

    @property
    def sized_gain(self) -> float:
        """How much faster the short simulation runs the fastest sized candidate than staying out."""
        return self.stay_out_iteration_time / self.best_sized_iteration_time

    @property
    def passes_through(self) -> bool:
        """It stays out, and no size was predicted to gain :attr:`pass_through_margin` either."""
        return self.policy == "fifo" and self.sized_gain < 1 + self.pass_through_margin

    def describe(self) -> str:
        """One line for a log: what was chosen."""
        if self.policy == "fifo":
            return "fifo: no partitioning, no credit limit (no predicted gain from scheduling)"
        partition = self.params.partition_bytes / 1e6  # type: ignore[operator]  # a sized plan's is set
        batching = f", batching pieces under {self.params.batch_bytes / 1e6:g} MB while busy" \
            if self.params.batch_bytes else ""
        return (f"bytescheduler: {partition:g} MB partitions, "
                f"{self.params.credit_bytes / 1e6:g} MB credit" + (", decoupled all-reduce" if self.decoupled else "")
                + batching)


def make_plan(profile: ModelProfile, cluster: Cluster, margin: float = STAY_OUT_MARGIN,
              pass_through_margin: float = PASS_THROUGH_MARGIN, decoupled: bool = False,
              batch_thresholds: Sequence[float] = ()) -> Plan:
    """The fastest candidate for ``profile`` on ``cluster``: fifo unless a sized one is predicted
    faster by ``margin`` (a fraction of fifo's iteration time); staying out passes through unless
    a sized one is predicted faster by ``pass_through_margin``. On all-reduce, every size is also
    weighed as a decoupled all-reduce (:mod:`.decoupled`) with ``decoupled``, and batching while
    busy under each of ``batch_thresholds`` (:func:`batch_thresholds`; for a backend that runs
    every collective alone, as ``cluster`` must then model), each kept on the same terms."""
    stay_out = search_seconds(profile, cluster, "fifo", STAY_OUT)
    schedules: list[tuple[SchedulingParams, bool]] = []
    for params in candidate_sizes(profile, cluster):
        schedules.append((params, False))
        if cluster.arch == "allreduce":
            schedules += [(params, True)] if decoupled else []
            schedules += [(dataclasses.replace(params, batch_bytes=t), False) for t in batch_thresholds]
    (params, split), best = min((((params, split), search_seconds(profile, cluster, "bytescheduler", params, split))
                                 for params, split in schedules),
                                key=lambda candidate: candidate[1])
    if best < (1 - margin) * stay_out:
        return Plan("bytescheduler", params, best, stay_out, best, pass_through_margin, split)
    return Plan("fifo", STAY_OUT, stay_out, stay_out, best, pass_through_margin)


BATCHING_RULE = 1.5
"""Caramel's rule for the batching threshold, ``x = BATCHING_RULE * a / b`` for an operation
costing ``a + b * bytes``: two pieces of ``x`` sent as one cost over 0.8 of sending them apart,
``f(2x) / 2f(x) > 0.8``; below it the fixed cost dominates."""


def rule_threshold(fixed_seconds: float, seconds_per_byte: float) -> int:
    """Caramel's batching threshold (:data:`BATCHING_RULE`) for an operation costing
    ``fixed_seconds + seconds_per_byte * bytes``; 0 where it has no cost per byte."""
    return int(BATCHING_RULE * fixed_seconds / seconds_per_byte) if seconds_per_byte > 0 else 0


def cluster_thresholds(profile: ModelProfile, cluster: Cluster) -> tuple[float, ...]:
    """:func:`batch_thresholds` for ``profile`` on ``cluster``, the rule's threshold from the
    cluster's own cost of a 4-byte and a whole-model all-reduce (what the runtime's calibration
    measures on a real network)."""
    cost = collective_cost(cluster, make_fabric(cluster, EventLoop(), cluster.worker_classes()))
    fixed = cost.seconds(4)
    per_byte = (cost.seconds(profile.nbytes) - fixed) / profile.nbytes
    return batch_thresholds(rule_threshold(fixed, per_byte), profile)


def batch_thresholds(rule_bytes: float, profile: ModelProfile) -> tuple[float, ...]:
    """The batching thresholds a plan weighs: Caramel's rule (``rule_bytes``, where it found a
    fixed cost), and every piece ready while the window is busy, up to the model's bytes. In the
    simulator the gain over torch.distributed grew with the threshold up to the credit's bytes,
    beyond where the rule puts it, and the plan batched under the model's bytes wherever it
    batched (docs/experiments/plan-batching.md)."""
    whole = float(profile.nbytes)
    return tuple(dict.fromkeys(t for t in (rule_bytes, whole) if t >= 1))


def keeps_the_faster_path(plan: Plan, cluster: Cluster) -> bool:
    """Whether a job with ``plan`` on ``cluster`` ends up on the faster of the plan's choice and the
    framework's own path, as the runtime times them by default: a plan that stays out passes
    through or times both paths (the path trial), and a parameter server's sized plan is tried
    against passing through (the plan trial, :func:`bytesched.runtime.plan_trial.wants_trial`). The
    simulated ``plan`` row then runs the faster of the two, the framework's path simulated as
    :data:`~.simulator.VANILLA` (whose global barrier makes it the slower bound of passing
    through)."""
    return plan.policy == "fifo" or cluster.arch == "ps"


def fused_profile(profile: ModelProfile, fusion_bytes: float) -> ModelProfile:
    """``profile`` with its layers merged as a plugin merges its tasks' buckets
    (:func:`bytesched.plugins.torch.fusion.merge_buckets`): the first layer alone, then runs of
    consecutive layers each closed once it holds ``fusion_bytes`` (:func:`~bytesched.core.filled_runs`). A merged
    layer computes its members' time and sends one tensor, ready when the last of theirs is
    (its first member's, in backward order)."""
    first, rest = profile.layers[0], profile.layers[1:]
    merged = [first]
    for indices in filled_runs([layer.nbytes for layer in rest], fusion_bytes):
        members = [rest[index] for index in indices]
        name = members[0].name if len(members) == 1 else f"{members[0].name}+{len(members) - 1}"
        merged.append(Layer(name, forward=sum(layer.forward for layer in members),
                            backward=sum(layer.backward for layer in members),
                            tensors=(Tensor(name, sum(layer.nbytes for layer in members)),),
                            update=sum(layer.update for layer in members)))
    return ModelProfile(f"{profile.name}, fused", tuple(merged), profile.batch_size, profile.description)


def fusion_pays(plan: Plan, profile: ModelProfile, cluster: Cluster, fusion_bytes: float) -> tuple[bool, float]:
    """Whether a plan that stays out may fuse ``profile``'s tasks up to ``fusion_bytes``: the
    fused layout must be predicted no slower than the observed one, whose time ``plan`` (made for
    ``profile`` on ``cluster``) already simulated, by :data:`FUSION_MARGIN`. Returns that and the
    predicted ratio of their iteration times (fused over observed)."""
    fused = search_seconds(fused_profile(profile, fusion_bytes), cluster, "fifo", STAY_OUT)
    ratio = fused / plan.stay_out_iteration_time
    return ratio <= 1 + FUSION_MARGIN, ratio


def search_seconds(profile: ModelProfile, cluster: Cluster, policy: str, params: SchedulingParams,
                   decoupled: bool = False) -> float:
    """The short simulation's iteration time of ``profile`` on ``cluster`` under ``policy``."""
    return run(profile, cluster, policy, params, iterations=SEARCH_ITERATIONS, warmup=SEARCH_WARMUP,
               decoupled=decoupled).iteration_time
