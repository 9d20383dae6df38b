"""The start-up plan over torch.distributed in the simulator: batching weighed with every size
against batching weighed after the sizes.

For every all-reduce scenario of ``python -m benchmarks scale``'s issue grid and held-out grid,
the job runs as over torch.distributed (``bytesched simulate --backend torch-distributed``: every
collective alone, the PyTorch plugin's 1 MB buckets, vanilla DDP's 25 MiB buckets). Two plans
are made, each with a margin of 5 % (sizes tried against staying out, the CPU's) and of 25 %
(untried, a GPU's):

- ``after``: sizes chosen alone, then the calibration's batching threshold added where it is
  predicted 1 % faster (the rule before batching joined the search);
- ``with``: :func:`bytesched.sim.plan.make_plan` weighing every size also with batching under the
  calibration's threshold and under the model's bytes (:func:`~bytesched.sim.plan.batch_thresholds`).

Each plan's choice is then simulated in full against DDP; staying out counts as passing through,
DDP's speed. Writes the rows as JSON and prints each grid's median share of the available gain,
``(speedup - 1) / (ideal - 1)`` over the rows where the ideal gains at least 5 %, beside the
Horovod plan's from the docs' data.

    PYTHONPATH=. .venv/bin/python docs/experiments/plan-batching/probe.py docs/data/plan-batching_scale.json
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import sys
from typing import Any, Iterator

from benchmarks.scale import GRID, HELD_OUT, PROFILE, share
from bytesched.core.config import SchedulingParams
from bytesched.runtime.calibration import FIXED_BYTES, NetworkCost, large_bytes_for
from bytesched.sim import Cluster, ModelProfile, make_cluster, run
from bytesched.sim.backends import BACKENDS
from bytesched.sim.bound import communication_time, compute_time
from bytesched.sim.engine import EventLoop
from bytesched.sim.plan import STAY_OUT, batch_thresholds, make_plan, search_seconds
from bytesched.sim.profile import load_profile
from bytesched.sim.simulator import VANILLA, collective_cost, make_fabric

MARGINS = (0.05, 0.25)


def calibrated(profile: ModelProfile, cluster: Cluster) -> NetworkCost:
    """What the runtime's calibration would measure on ``cluster``: a 4-byte and a large all-reduce."""
    cost = collective_cost(cluster, make_fabric(cluster, EventLoop(), cluster.worker_classes()))
    large = large_bytes_for(profile.nbytes)
    return NetworkCost(cost.seconds(FIXED_BYTES), cost.seconds(large), large)


def after(profile: ModelProfile, alone: Cluster, margin: float, threshold: int) -> SchedulingParams | None:
    plan = make_plan(profile, alone, margin)
    if plan.policy == "fifo":
        return None
    batched = dataclasses.replace(plan.params, batch_bytes=threshold)
    ratio = search_seconds(profile, alone, plan.policy, batched) / search_seconds(profile, alone, plan.policy,
                                                                                  plan.params)
    return batched if ratio <= 0.99 else plan.params


def weighed_with(profile: ModelProfile, alone: Cluster, margin: float, threshold: int) -> SchedulingParams | None:
    plan = make_plan(profile, alone, margin, batch_thresholds=batch_thresholds(threshold, profile))
    return None if plan.policy == "fifo" else plan.params


def speedup(profile: ModelProfile, cluster: Cluster, vanilla: float, params: SchedulingParams | None) -> float:
    if params is None:
        return max(1.0, vanilla / run(profile, cluster, "fifo", STAY_OUT).iteration_time)
    return vanilla / run(profile, cluster, "bytescheduler", params).iteration_time


def scenarios() -> Iterator[tuple[str, str, int, str, ModelProfile, Cluster, float, float]]:
    """Every all-reduce scenario of both scale grids over torch.distributed: the grid's name,
    model, workers, bandwidth, the profile, the cluster, DDP's iteration time and the ideal
    speedup over it."""
    backend = BACKENDS["torch-distributed"]
    for grid_name, grid in (("issue", GRID), ("held-out", HELD_OUT)):
        for model, arch, workers, bandwidth in grid.scenarios():
            if arch != "allreduce":
                continue
            profile = load_profile(PROFILE.format(model=model))
            cluster = make_cluster(arch=arch, workers=workers, bandwidth=bandwidth, **backend.cluster_options())
            vanilla = run(profile, cluster, VANILLA).iteration_time
            ideal = vanilla / max(compute_time(profile, cluster), communication_time(profile, cluster))
            yield grid_name, model, workers, bandwidth, profile, cluster, vanilla, ideal


def rows() -> list[dict[str, Any]]:
    out = []
    for grid_name, model, workers, bandwidth, profile, alone, vanilla, ideal in scenarios():
        threshold = calibrated(profile, alone).batch_threshold()
        row: dict[str, Any] = {"grid": grid_name, "model": model, "workers": workers, "bandwidth": bandwidth,
                               "ideal": ideal, "calibrated_threshold": threshold}
        for rule_name, rule in (("after", after), ("with", weighed_with)):
            for margin in MARGINS:
                params = rule(profile, alone, margin, threshold)
                row[f"{rule_name}_margin{margin:g}"] = {
                    "speedup": speedup(profile, alone, vanilla, params),
                    "params": None if params is None else dataclasses.asdict(params)}
        out.append(row)
        print(f"{grid_name:9}{model:12}{workers:4}{bandwidth:>8} ideal {ideal:.3f} " + " ".join(
            f"{k}={v['speedup']:.3f}" for k, v in row.items() if isinstance(v, dict)), flush=True)
    return out


def summary(data: list[dict[str, Any]]) -> None:
    for grid_name, docs_file in (("issue", "scale_issue.json"), ("held-out", "scale_held_out.json")):
        docs = json.load(open(f"docs/data/{docs_file}"))["rows"]
        horovod = [share(r["speedups"]["plan"], r["ideal"]) for r in docs
                   if r["arch"] == "allreduce" and r["ideal"] >= 1.05]
        print(f"{grid_name}: Horovod plan (docs/data/{docs_file}) median share {statistics.median(horovod):.2f}")
        mine = [r for r in data if r["grid"] == grid_name and r["ideal"] >= 1.05]
        for key in [k for k in mine[0] if k.startswith(("after", "with"))]:
            shares = [share(r[key]["speedup"], r["ideal"]) for r in mine]
            below = sum(r[key]["speedup"] < 1 for r in data if r["grid"] == grid_name)
            print(f"  over torch.distributed, {key:16} median share {statistics.median(shares):.2f}, "
                  f"lowest {min(shares):.2f}, {below} rows below vanilla ({len(mine)} rows)")


if __name__ == "__main__":
    result = rows()
    with open(sys.argv[1], "w") as f:
        json.dump(result, f, indent=1)
    summary(result)
