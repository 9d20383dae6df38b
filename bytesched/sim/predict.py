"""Predictions: every policy on one cluster (or a sweep of clusters), relative to vanilla.

This is the Python face of ``bytesched simulate``: :func:`simulate` takes the same options as
the command line (as strings like ``"10Gbps"`` or as numbers in bytes, seconds and bytes/s)
and returns a :class:`Report`, which renders as the table, the JSON or the plot.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, fields, replace
from typing import Any, Iterable, Sequence

from ..core.config import ConfigError, SchedulingParams, format_size
from ..core.policies import CreditPolicy, make_policy
from .cluster import Cluster, format_bandwidth
from .options import format_value, make_cluster, make_params, parse_sweep, policy_names
from . import bound
from .bound import Breakdown, achievable_time, communication_time, compute_time
from .plan import (PLAN, STAY_OUT, candidate_sizes, cluster_thresholds, keeps_the_faster_path, make_plan,
                   search_seconds)
from .profile import ModelProfile, load_profile
from .simulator import DEFAULT_ITERATIONS, DEFAULT_WARMUP, VANILLA, run


@dataclass
class PolicyPrediction:
    """One policy's predicted iteration time, throughput and speedup over vanilla."""

    policy: str
    iteration_time: float
    throughput: float
    speedup: float
    partition_bytes: float
    credit_bytes: float | None
    """None for a policy without a credit window (vanilla, fifo, p3)."""
    wall_seconds: float
    """How long the simulation itself took (all tuning runs included)."""
    decoupled: bool = False
    """It ran as a decoupled all-reduce (the plan's choice, :mod:`.decoupled`)."""
    batch_bytes: float = 0.0
    """It batched pieces under this many bytes while busy (the plan's choice; 0: no batching)."""


@dataclass
class Prediction:
    """All policies on one cluster, plus the ideal lower bound max(compute, communication), the
    achievable bound of :mod:`.bound` and, if asked for, where the gap to the plan goes."""

    profile: ModelProfile
    cluster: Cluster
    compute_time: float
    communication_time: float
    results: list[PolicyPrediction]
    sweep_value: Any = None
    achievable_time: float = 0.0
    """:func:`.bound.achievable_time`: Theorem 1's order with free messages and fine partitions."""
    breakdown: Breakdown | None = None

    @property
    def ideal_time(self) -> float:
        return max(self.compute_time, self.communication_time)

    @property
    def vanilla(self) -> PolicyPrediction:
        return self.result(VANILLA)

    def result(self, policy: str) -> PolicyPrediction:
        for r in self.results:
            if r.policy == policy:
                return r
        raise KeyError(f"no prediction for policy {policy!r}; have {', '.join(r.policy for r in self.results)}")

    def samples_per_second(self, iteration_time: float) -> float:
        return self.cluster.workers * self.profile.batch_size / iteration_time

    def to_json(self) -> dict[str, Any]:
        vanilla = self.vanilla.iteration_time
        return {
            "cluster": self.cluster.describe(),
            "sweep_value": self.sweep_value,
            "compute_time": self.compute_time,
            "communication_time": self.communication_time,
            "ideal": {"iteration_time": self.ideal_time,
                      "throughput": self.samples_per_second(self.ideal_time),
                      "speedup": vanilla / self.ideal_time},
            "achievable": {"iteration_time": self.achievable_time,
                           "throughput": self.samples_per_second(self.achievable_time),
                           "speedup": vanilla / self.achievable_time},
            "breakdown": None if self.breakdown is None else self.breakdown.to_json(),
            "results": [{f.name: _json_number(getattr(r, f.name)) for f in fields(r)} for r in self.results],
        }


@dataclass
class Report:
    """The predictions of one :func:`simulate` call (one per sweep value)."""

    predictions: list[Prediction]
    sweep_variable: str | None = None
    policies: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        profile = self.predictions[0].profile
        return {"profile": {"name": profile.name, "batch_size": profile.batch_size, "layers": len(profile.layers),
                            "tensors": profile.num_tensors, "bytes": profile.nbytes, "source": profile.source},
                "units": {"time": "s", "throughput": "samples/s", "bandwidth": "bytes/s", "size": "bytes"},
                "sweep": self.sweep_variable,
                "predictions": [p.to_json() for p in self.predictions]}

    def table(self) -> str:
        """The human-readable table, one block per sweep value."""
        return "\n\n".join(_block(p, self.sweep_variable) for p in self.predictions)

    def plot(self, path: str) -> None:
        """Draw throughput and speedup per policy (against the sweep variable, if any)."""
        from .plot import plot_report  # matplotlib is imported only when a plot is asked for
        plot_report(self, path)


def simulate(profile: str | ModelProfile = "vgg16", *, policies: Iterable[str] | str | None = None,
             partition: str | float | None = None, credit: str | float | None = None,
             sweep: tuple[str, Sequence[Any]] | str | None = None, iterations: int = DEFAULT_ITERATIONS,
             warmup: int = DEFAULT_WARMUP, tune: bool | Sequence[SchedulingParams] = False,
             breakdown: bool = False, decoupled: bool = False, batching: bool = False,
             cluster: Cluster | None = None, **cluster_options: Any) -> Report:
    """Predict iteration time, throughput and speedup over vanilla for every policy.

    Args:
        profile: a shipped profile name (``vgg16``, ``resnet50``, ``transformer``), a JSON
            path, or a :class:`ModelProfile`.
        policies: names or a comma-separated string; default: every policy of
            :data:`~bytesched.core.config.SIMULATED_POLICIES`. Vanilla always runs (it is the baseline).
        partition, credit: scheduling parameters (``"4MB"`` or bytes); partition ``None``
            means each policy's own default.
        sweep: ``("bandwidth", ["1Gbps", "10Gbps"])`` or the command line's
            ``"bandwidth=1,10,25Gbps"``; one prediction per value.
        tune: run each credit-window policy at its best partition and credit size of
            :func:`tuning_grid` (24 simulations each, up to 28 on a parameter server), or of the given list of
            :class:`SchedulingParams`, instead of ``partition``/``credit``.
        decoupled: the plan also weighs a decoupled all-reduce (DeAR, :mod:`.decoupled`), which
            no plugin runs yet.
        batching: the plan also weighs batching while busy with every size, as over
            torch.distributed (:func:`~.plan.cluster_thresholds`; the cluster should run every
            collective alone, ``fusion_threshold=0``).
        breakdown: also say where the gap between the ideal and the plan goes
            (:func:`.bound.breakdown`: up to 63 more short simulations).
        cluster: a :class:`Cluster`; ``cluster_options`` (``arch="ps"``, ``workers=16``,
            ``bandwidth="10Gbps"``, ``worker_specs=["3:compute=1.5"]`` ...) change its fields.
    """
    model = profile if isinstance(profile, ModelProfile) else load_profile(profile)
    base = make_cluster(cluster, **cluster_options)
    names = policy_names(policies)
    variable, values = parse_sweep(sweep) if sweep is not None else (None, [None])
    if tune and (partition is not None or credit is not None or variable in ("partition", "credit")):
        raise ConfigError("tune searches the partition and credit sizes itself: do not also give or sweep them")
    predictions = []
    for value in values:
        point, part, cred = base, partition, credit
        if variable == "partition":
            part = value
        elif variable == "credit":
            cred = value
        elif variable is not None:
            changes: dict[str, Any] = {variable: value}
            point = replace(base, **changes)
        params = make_params(part, cred)
        prediction = predict(model, point, names, params, iterations=iterations, warmup=warmup, tune=tune,
                             breakdown=breakdown, decoupled=decoupled, batching=batching)
        prediction.sweep_value = value
        predictions.append(prediction)
    return Report(predictions, variable, names)


def predict(profile: ModelProfile, cluster: Cluster, policies: Sequence[str], params: SchedulingParams, *,
            iterations: int = DEFAULT_ITERATIONS, warmup: int = DEFAULT_WARMUP,
            tune: bool | Sequence[SchedulingParams] = False, breakdown: bool = False,
            decoupled: bool = False, batching: bool = False) -> Prediction:
    """Run vanilla and every policy in ``policies`` on ``cluster``; with ``tune``, each policy
    that has a credit window runs at the best (partition, credit) of :func:`tuning_grid` (or of
    the given candidates) instead of ``params``. :data:`~.plan.PLAN` runs what
    :func:`~.plan.make_plan` chooses, weighing a decoupled all-reduce too with ``decoupled`` and
    batching while busy with ``batching``. With
    ``breakdown``, the prediction says where the gap from the ideal to the plan goes
    (:func:`.bound.breakdown`)."""
    grid = tuning_grid(profile, cluster) if tune is True else list(tune or [])
    thresholds = cluster_thresholds(profile, cluster) if batching and cluster.arch == "allreduce" else ()
    runs = []
    for name in [VANILLA, *[p for p in policies if p != VANILLA]]:
        started = time.perf_counter()
        if name == PLAN:
            chosen = make_plan(profile, cluster, decoupled=decoupled, batch_thresholds=thresholds)
            outcome = run(profile, cluster, chosen.policy, chosen.params, iterations=iterations, warmup=warmup,
                          decoupled=chosen.decoupled)
            if keeps_the_faster_path(chosen, cluster):
                outcome = min(outcome, run(profile, cluster, VANILLA, iterations=iterations, warmup=warmup),
                              key=lambda r: r.iteration_time)
            outcome = replace(outcome, policy=PLAN)
        else:
            candidates = grid if grid and _has_credit(name) else [params]
            outcome = min((run(profile, cluster, name, p, iterations=iterations, warmup=warmup) for p in candidates),
                          key=lambda r: r.iteration_time)
        runs.append((outcome, time.perf_counter() - started))
    prediction = Prediction(profile, cluster, compute_time(profile, cluster), communication_time(profile, cluster), [],
                            achievable_time=achievable_time(profile, cluster))
    if breakdown:
        chosen = make_plan(profile, cluster, decoupled=decoupled, batch_thresholds=thresholds)
        seconds = search_seconds(profile, cluster, chosen.policy, chosen.params, chosen.decoupled)
        if keeps_the_faster_path(chosen, cluster):
            seconds = min(seconds, search_seconds(profile, cluster, VANILLA, STAY_OUT))
        prediction.breakdown = bound.breakdown(profile, cluster, seconds)
    vanilla = runs[0][0].iteration_time
    prediction.results = [
        PolicyPrediction(r.policy, r.iteration_time, prediction.samples_per_second(r.iteration_time),
                         vanilla / r.iteration_time, r.partition_bytes, r.credit_bytes, wall, r.decoupled,
                         r.batch_bytes)
        for r, wall in runs]
    return prediction


def tuning_grid(profile: ModelProfile | None = None, cluster: Cluster | None = None) -> list[SchedulingParams]:
    """What ``--tune`` tries: the plan's candidates for ``profile`` on ``cluster`` (partitions of 1
    to 32 MB and credits of 1 to 8 partitions, and a parameter server's finer ones). The paper's
    speedups are with auto-tuned parameters, and so are the predictions with ``--tune`` (an
    exhaustive grid, where the runtime tuner uses Bayesian optimisation)."""
    return candidate_sizes(profile, cluster)


def _has_credit(policy: str) -> bool:
    return policy != VANILLA and isinstance(make_policy(policy, SchedulingParams()), CreditPolicy)


# -- the table --------------------------------------------------------------------------------
def _block(p: Prediction, sweep_variable: str | None) -> str:
    c = p.cluster
    where = f"{c.workers} workers, {c.arch}"
    if c.arch == "ps":
        where += (f" ({c.num_servers} servers, {c.assignment} placement"
                  f"{', asynchronous' if c.asynchronous else ''})")
    elif c.vanilla_bucket_bytes:
        where += f" (vanilla in {format_size(c.vanilla_bucket_bytes)} buckets)"
    where += (f", {format_bandwidth(c.bandwidth)} {c.topology}, overhead {c.overhead * 1e6:g}us, "
              f"latency {c.latency * 1e6:g}us")
    if c.worker_specs:
        where += ", " + "; ".join(f"rank {r}: compute x{s.compute:g}" +
                                  (f" {format_bandwidth(s.bandwidth)}" if s.bandwidth else "")
                                  for r, s in c.worker_specs)
    title = f"{p.profile.name} on {where}"
    if sweep_variable is not None:
        title = f"[{sweep_variable} = {format_value(sweep_variable, p.sweep_value)}] " + title
    header = f"{'policy':<15}{'partition':>10}{'credit':>9}{'iteration':>13}{'samples/s':>12}{'speedup':>9}"
    lines = [title, header, "-" * len(header)]
    for r in p.results:
        part = "-" if r.policy == VANILLA else format_size(r.partition_bytes)
        cred = "-" if r.credit_bytes is None else format_size(r.credit_bytes)
        lines.append(f"{r.policy:<15}{part:>10}{cred:>9}{r.iteration_time * 1e3:>10.2f} ms"
                     f"{r.throughput:>12.1f}{r.speedup:>8.2f}x" + ("  (decoupled all-reduce)" if r.decoupled else "")
                     + (f"  (batching under {format_size(r.batch_bytes)} while busy)" if r.batch_bytes else ""))
    ideal = p.ideal_time
    lines.append(f"{'ideal':<15}{'':>10}{'':>9}{ideal * 1e3:>10.2f} ms{p.samples_per_second(ideal):>12.1f}"
                 f"{p.vanilla.iteration_time / ideal:>8.2f}x")
    achievable = p.achievable_time
    lines.append(f"{'achievable':<15}{'':>10}{'':>9}{achievable * 1e3:>10.2f} ms"
                 f"{p.samples_per_second(achievable):>12.1f}{p.vanilla.iteration_time / achievable:>8.2f}x")
    lines.append(f"(ideal = max(compute {p.compute_time * 1e3:.2f} ms, "
                 f"communication {p.communication_time * 1e3:.2f} ms); "
                 f"achievable = Theorem 1's order, free messages, fine partitions)")
    if p.breakdown is not None:
        lines.append("where the time from the ideal to the plan goes:")
        for (cause, seconds), stage in zip(p.breakdown.gaps(), p.breakdown.stages[1:]):
            sizes = ""
            if stage.params is not None:
                partition = format_size(stage.params.partition_bytes)  # type: ignore[arg-type]  # a grid's are set
                sizes = f" (best of the grid: {partition} / {format_size(stage.params.credit_bytes)})"
            lines.append(f"  {cause:<26}{seconds * 1e3:>+9.2f} ms -> {stage.name} "
                         f"{stage.iteration_time * 1e3:.2f} ms{sizes}")
    return "\n".join(lines)


def _json_number(value: Any) -> Any:
    if isinstance(value, float) and math.isinf(value):
        return None
    return value
