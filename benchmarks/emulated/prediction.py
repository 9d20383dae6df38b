"""The simulator's side of a group of cells: the same scaled profile, rank count, bandwidth,
architecture and topology as the measured job, every configuration as the policy (and sizes) it
runs, the sizes of ``bytescheduler-sim`` (and of ``bytescheduler-tuned``, from its tuning job), and
the ideal speedup the targets are measured against."""

from __future__ import annotations

import dataclasses
import math
import statistics
from typing import Any, Sequence

from bytesched.core.config import SchedulingParams, from_env
from bytesched.sim.predict import simulate
from bytesched.sim.simulator import VANILLA
from bytesched.sim.profile import ModelProfile
from .calibration import Calibration
from .cells import Group, groups
from .configs import BASELINE, CONFIGURATIONS, PROBES, PS_PROBES, Configuration, with_sizes
from .results import summarize
from .scaling import Scale, scaled_profile

SIZE_GRID = tuple(SchedulingParams(partition_bytes=p << 10, credit_bytes=(p << 10) * k)
                  for p in (256, 512, 1024, 2048, 4096, 8192) for k in (1, 2, 4))
"""What ``bytescheduler-sim`` chooses from: partitions of 256 KB to 8 MB (the scaled models
carry tens of MB per iteration), credits of 1, 2 or 4 partitions."""

IDEAL_PARTITION = 64 << 10
"""The "fine partitions" of the ideal: 64 KB, a few hundred sub-tasks per scaled model."""


def ideal_credits(nbytes: int) -> tuple[int, ...]:
    """Credits of the ideal, in partitions: 1, 2, 4... up to the whole model's gradients. A PS
    with several workers needs many sub-tasks in flight to keep every link busy: a grid that
    stopped at 16 partitions (1 MB) put the 4-worker PS ResNet50's ideal below
    1x (0.97x; 1.52x with this grid) while the auto-tuner's sizes measured 1.49x."""
    return tuple(2 ** k for k in range(math.ceil(math.log2(max(nbytes / IDEAL_PARTITION, 1))) + 1))


def as_measured(profile: ModelProfile, calibration: Calibration | None) -> ModelProfile:
    """``profile`` with every layer's times stretched so that one step's compute takes what the
    calibration measured (unchanged when it measured none)."""
    if calibration is None or calibration.compute_seconds is None:
        return profile
    factor = calibration.compute_seconds / profile.compute_time
    layers = tuple(dataclasses.replace(layer, forward=layer.forward * factor, backward=layer.backward * factor,
                                       update=layer.update * factor) for layer in profile.layers)
    return dataclasses.replace(profile, layers=layers)


def cluster_options(group: Group, topology: str, calibration: Calibration | None,
                    scheduled: bool = False) -> dict[str, Any]:
    """The simulator's cluster for ``group``: its ranks, architecture and topology (with one
    server per worker for PS), and the calibrated costs when there are any (of bytesched's path
    with ``scheduled``)."""
    options: dict[str, Any] = {"workers": group.ranks, "arch": group.framework.arch,
                               "bandwidth": group.bits_per_second / 8, "topology": topology,
                               "collective": "ring"}  # Gloo (Horovod and torch on the CPU), modelled as a ring
    if group.framework.arch == "ps":
        options["servers"] = group.ranks
    if group.framework.fuses:
        options["bucket_bytes"] = from_env().fusion_bytes
    if group.framework.asynchronous:
        options["asynchronous"] = True
    if calibration is not None:
        options.update(calibration.simulator_options(group.framework.arch, group.ranks, scheduled))
    return options


MAX_OVERHEAD = 0.05
"""The largest per-message cost :func:`fit_scheduled_overhead` considers (50 ms)."""
OVERHEAD_GRID = (0.0, *(1e-4 * 1.1 ** i for i in range(math.ceil(math.log(MAX_OVERHEAD / 1e-4, 1.1)) + 1)))
"""The costs it tries: 0, then 0.1 ms to :data:`MAX_OVERHEAD` in steps of 10 %, from the plain
path's own cost up (see :func:`fit_scheduled_overhead`)."""


def _step_seconds(profile: ModelProfile, options: dict[str, Any], params: SchedulingParams) -> float:
    prediction = simulate(profile, policies=["bytescheduler"], partition=params.partition_bytes,
                          credit=params.credit_bytes, **options).predictions[0]
    return prediction.result("bytescheduler").iteration_time


MAX_LATENCY = 0.02
"""The largest pipelined per-message latency :func:`fit_scheduled_latency` considers (20 ms)."""
LATENCY_GRID = (0.0, *(1e-4 * 1.15 ** i for i in range(math.ceil(math.log(MAX_LATENCY / 1e-4, 1.15)) + 1)))
"""The latencies it tries: 0, then 0.1 ms to :data:`MAX_LATENCY` in steps of 15 %."""


def _probe_error(profile: ModelProfile, options: dict[str, Any], names: Sequence[str],
                 seconds: Sequence[float], baseline: tuple[float, float]) -> float:
    """Least squares of the simulator's relative errors on the probes ``names`` measured at
    ``seconds`` per step, each taken relative to the plain path: ``baseline`` is its (simulated,
    measured) seconds per step."""
    simulated_base, measured_base = baseline
    return sum((_step_seconds(profile, options, CONFIGURATIONS[name].params) / simulated_base
                / (measured / measured_base) - 1) ** 2
               for name, measured in zip(names, seconds, strict=True))


def fit_scheduled_overhead(profile: ModelProfile, options: dict[str, Any], coarse_seconds: float,
                           fine_seconds: float, baseline: tuple[float, float]) -> float:
    """The per-message cost θ of :data:`OVERHEAD_GRID` with which the simulator's step times
    under ``probe-coarse`` and ``probe-fine``, relative to its plain step time, come closest to
    the measured ones relative to the measured plain step (``baseline``: simulated and measured
    plain seconds; least squares of the relative errors; ``options``: the calibrated cluster).

    Relative to the plain path, because θ should be bytesched's cost per message and nothing
    else. Fitted to absolute times it also absorbed the simulator's error on the whole job: on
    MXNet over Horovod's Transformer the simulator put the plain step 17 % too fast, the fit
    answered 25 ms per message (Horovod's own is about 1 ms), and the sizes chosen with it held
    one collective in flight, predicted 0.54x and measured 0.95x (docs/benchmarks.md). Each
    probe against the plain step, not the probes against each other: on a PS (and for some
    models on all-reduce) one probe's ratio to the other is not monotonic in θ (a small θ slows
    the coarse probe more than the fine one), while each probe's level tells the answers apart.
    The price is sensitivity to load: a load spike during one of the calibration's runs skews θ,
    which the report shows (the measured probe times are printed next to it).

    θ is at least the plain path's per-operation cost (``options["overhead"]``): bytesched's
    partitions are the framework's own collectives, which the simulator already fuses per cycle
    as Horovod does, so none costs less. A fit below it explains a probe's gain by cheap messages
    where something else gave it, and the sizes chosen with that θ can be the grid's finest with
    one partition in flight, which ran slower than predicted (docs/simulator.md, "Accuracy").
    """
    floor = options["overhead"]
    grid = (floor, *(theta for theta in OVERHEAD_GRID if theta > floor))
    return min(grid, key=lambda theta: _probe_error(profile, {**options, "overhead": theta}, PROBES,
                                                    (coarse_seconds, fine_seconds), baseline))


def fit_scheduled_latency(profile: ModelProfile, options: dict[str, Any], probe_seconds: Sequence[float],
                          baseline: tuple[float, float]) -> float:
    """The pipelined per-message latency of :data:`LATENCY_GRID` with which the simulator's step
    times under a PS's three probes (:data:`.configs.PS_PROBES`), relative to the plain step
    (``baseline``, as for :func:`fit_scheduled_overhead`), come closest to the measured ones, the
    overhead staying the framework's calibrated one.

    Why a latency and three probes: with a credit of a few partitions a PS's throughput is the
    credit over a partition's round trip, so a delay that does not occupy the connection (the
    follower waiting for rank 0's order, ps-lite's hand-offs) starves small credits and hardly
    touches large ones. The emulated VGG16 ran 256 KB / 1 MB at 1.33x where the simulator without
    it predicted 1.70x, while 4 MB / 16 MB and 512 KB / 2 MB were predicted within 5 %: those two
    probes alone cannot see the delay, the smallest grid point can.
    """
    return min(LATENCY_GRID, key=lambda latency: _probe_error(profile, {**options, "latency": latency}, PS_PROBES,
                                                              probe_seconds, baseline))


def fit_probes(arch: str, profile: ModelProfile, options: dict[str, Any], calibration: Calibration) -> Calibration:
    """``calibration`` with the cost of bytesched's path fitted from its probes: the overhead for
    all-reduce, the latency for a PS (``options``: the calibrated cluster, whose plain step the
    simulator compares with the measured plain step)."""
    seconds = calibration.probe_seconds
    if seconds is None:
        return calibration
    if calibration.probe_baseline_seconds is None:
        raise ValueError("the calibration's probes were run without the plain path to compare them with")
    simulated = simulate(profile, policies=[VANILLA], **options).predictions[0].vanilla.iteration_time
    baseline = (simulated, calibration.probe_baseline_seconds)
    if arch == "ps":
        return dataclasses.replace(calibration, scheduled_latency=fit_scheduled_latency(profile, options, seconds,
                                                                                        baseline))
    return dataclasses.replace(calibration, scheduled_overhead=fit_scheduled_overhead(profile, options, *seconds,
                                                                                      baseline=baseline))


def choose_sizes(profile: ModelProfile, options: dict[str, Any]) -> SchedulingParams:
    """The partition and credit of :data:`SIZE_GRID` the simulator predicts fastest."""
    best = simulate(profile, policies=["bytescheduler"], tune=list(SIZE_GRID), **options).predictions[0]
    chosen = best.result("bytescheduler")
    return SchedulingParams(partition_bytes=int(chosen.partition_bytes), credit_bytes=int(chosen.credit_bytes))


def resolve(group: Group, profile: ModelProfile, options: dict[str, Any],
            tuned: tuple[int, int] | None = None) -> tuple[Configuration, ...]:
    """``group``'s configurations with the run-time-sized ones given their sizes: the simulator's
    choice (``options``: the cluster as bytesched's path sees it) or the pair the tuning job kept
    (``tuned``). A tuner-sized configuration without a pair (its tuning job failed) is left out."""
    simulated = None
    if any(c.sized_by == "simulator" for c in group.configurations):
        params = choose_sizes(profile, options)
        simulated = (int(params.partition_bytes), int(params.credit_bytes))
    sizes = {"simulator": simulated, "tuner": tuned}
    return tuple(c if not c.sized_at_run_time else with_sizes(c, *sizes[c.sized_by])
                 for c in group.configurations if not c.sized_at_run_time or sizes[c.sized_by] is not None)


def ideal_speedup(profile: ModelProfile, options: dict[str, Any]) -> float:
    """The issue's yardstick: bytescheduler with free messages (no per-message cost, latency or
    Horovod cycle wait) and fine partitions, at its best credit of :func:`ideal_credits`, over
    vanilla with free messages, on the group's (calibrated) bandwidth: what priority scheduling can
    give this model."""
    free = {**options, "overhead": 0.0, "latency": 0.0, "cycle_time": 0.0}
    grid = [SchedulingParams(partition_bytes=IDEAL_PARTITION, credit_bytes=IDEAL_PARTITION * k)
            for k in ideal_credits(profile.nbytes)]
    prediction = simulate(profile, policies=["bytescheduler"], tune=grid, **free).predictions[0]
    return prediction.vanilla.iteration_time / prediction.result("bytescheduler").iteration_time


def refresh_ideals(results: dict[str, Any]) -> None:
    """Recompute in place, with this version of the simulator, the ideal speedup of every group of
    ``results`` (as :func:`~.results.merge` makes it) that recorded a calibration, keeping the
    value of its run as ``ideal_speedup_at_run``: the targets' yardstick is then the same for
    cells measured in different sessions, and a fix to it reaches the cells measured before."""
    for group in results["groups"]:
        prediction, record = group.get("prediction"), group.get("calibration")
        workload = results["workloads"][group["model"]]
        if not prediction or not record or workload.get("real"):
            continue
        [cell], _ = groups([group["framework"]], [group["model"]], [group["bits_per_second"]], [group["ranks"]],
                           [BASELINE])
        calibration = Calibration.from_record(record)
        profile = as_measured(scaled_profile(group["model"], Scale(workload["size_scale"], workload["time_scale"])),
                              calibration)
        options = cluster_options(cell, prediction["cluster"]["topology"], calibration)
        prediction.setdefault("ideal_speedup_at_run", prediction["ideal_speedup"])
        prediction["ideal_speedup"] = ideal_speedup(profile, options)


def predict_group(group: Group, profile: ModelProfile, topology: str,
                  calibration: Calibration | None = None) -> dict[str, Any]:
    """Predicted samples/s and speedup per configuration of ``group`` (whose run-time-sized
    configurations must already carry their sizes), the ideal speedup, the bound of perfect
    overlap, and the cluster the simulator modelled.

    ``topology`` is the simulator's (``full-duplex`` or ``shared``). The baseline is simulated
    with the framework's calibrated cost, bytesched's configurations with their own (when it
    was fitted). Configurations the simulator cannot tell apart (Horovod autotune) are predicted
    as the policy they run.
    """
    plain = cluster_options(group, topology, calibration)
    scheduled = cluster_options(group, topology, calibration, scheduled=True)
    vanilla = simulate(profile, policies=[VANILLA], **plain).predictions[0]
    defaults = sorted({c.simulated_as for c in group.configurations
                       if c.params.partition_bytes is None and c.simulated_as != VANILLA})
    base = simulate(profile, policies=defaults, **scheduled).predictions[0] if defaults else vanilla
    explicit = {c.params: simulate(profile, policies=[c.simulated_as], partition=c.params.partition_bytes,
                                   credit=c.params.credit_bytes, **scheduled).predictions[0]
                for c in group.configurations if c.params.partition_bytes is not None}
    baseline = vanilla.vanilla.iteration_time
    out: dict[str, Any] = {"cluster": vanilla.cluster.describe(), "compute_time": vanilla.compute_time,
                           "communication_time": vanilla.communication_time,
                           "ideal_speedup": ideal_speedup(profile, plain),
                           "overlap_bound_speedup": baseline / vanilla.ideal_time,
                           "calibrated": calibration is not None,
                           "scheduled_overhead": scheduled["overhead"] if "overhead" in scheduled else None,
                           "scheduled_latency": scheduled.get("latency"),
                           "configs": {}}
    for config in group.configurations:
        source = vanilla if config.simulated_as == VANILLA else explicit.get(config.params, base)
        result = source.result(config.simulated_as)
        cell = {"policy": config.simulated_as, "samples_per_second": result.throughput,
                "speedup": baseline / result.iteration_time}
        if config.sized_at_run_time:
            cell["partition_bytes"] = config.params.partition_bytes
            cell["credit_bytes"] = config.params.credit_bytes
        out["configs"][config.name] = cell
    return out


def repredict(results: dict[str, Any]) -> None:
    """Predict again in place, with this version of the simulator, every emulated group of
    ``results`` (as :func:`~.results.merge` makes it), keeping the prediction of its run as
    ``prediction_at_run``: each configuration with the sizes it ran (the ones chosen at run time
    included) on the group's recorded calibration (the simulator's defaults where it recorded
    none). Configurations this version no longer knows are left out of the new prediction."""
    for group in results["groups"]:
        prediction = group.get("prediction")
        workload = results["workloads"][group["model"]]
        if not prediction or workload.get("real"):
            continue
        known = [name for name in group["configs"] if name in CONFIGURATIONS]
        [cell], _ = groups([group["framework"]], [group["model"]], [group["bits_per_second"]], [group["ranks"]],
                           [BASELINE, *known])
        ran = prediction["configs"]
        configurations = tuple(
            c if not c.sized_at_run_time else with_sizes(c, ran[c.name]["partition_bytes"], ran[c.name]["credit_bytes"])
            for c in cell.configurations if not c.sized_at_run_time or "partition_bytes" in ran.get(c.name, {}))
        record = group.get("calibration")
        calibration = None if not record else Calibration(**{
            **record, **{name: tuple(record[name]) for name in ("probe_seconds", "tuned_sizes", "tuning_trials")
                         if record.get(name) is not None}})
        profile = as_measured(scaled_profile(group["model"], Scale(workload["size_scale"], workload["time_scale"])),
                              calibration)
        group.setdefault("prediction_at_run", prediction)
        group["prediction"] = predict_group(dataclasses.replace(cell, configurations=configurations), profile,
                                            prediction["cluster"]["topology"], calibration)


def prediction_errors(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Every measured configuration of ``results`` with a prediction, the baseline included (as
    the report's median counts it): its cell, measured and predicted samples/s, and the error."""
    out = []
    for group in results["groups"]:
        for cell in summarize(group):
            if cell.error is not None:
                out.append({"framework": group["framework"], "model": group["model"],
                            "bits_per_second": group["bits_per_second"], "ranks": group["ranks"],
                            "config": cell.config, "measured": cell.throughput.median,  # type: ignore[union-attr]
                            "predicted": cell.predicted_throughput, "error": cell.error})
    return out


def accuracy_markdown(errors: Sequence[dict[str, Any]]) -> str:
    """The accuracy table of docs/simulator.md: per stack and rank count, how many measured
    configurations, the median and 90th percentile of the absolute error and the median signed
    error (positive: the simulator predicted too few samples/s), then all of them together."""
    def row(label: str, rows: Sequence[dict[str, Any]]) -> str:
        absolute = sorted(abs(r["error"]) for r in rows)
        p90 = absolute[min(len(absolute) - 1, math.ceil(0.9 * len(absolute)) - 1)]
        signed = statistics.median(r["error"] for r in rows)
        return (f"| {label} | {len(rows)} | {statistics.median(absolute) * 100:.1f} % | {p90 * 100:.0f} % | "
                f"{signed * 100:+.1f} % |")

    keys = sorted({(r["framework"], r["ranks"]) for r in errors})
    lines = ["| stack, ranks | configurations | median error | 90th percentile | median signed error |",
             "|---|---|---|---|---|"]
    lines += [row(f"{framework}, {ranks}", [r for r in errors if (r["framework"], r["ranks"]) == (framework, ranks)])
              for framework, ranks in keys]
    lines.append(row("all", errors))
    return "\n".join(lines)
