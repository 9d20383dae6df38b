"""Would a wider grid of sizes help the plan over torch.distributed? For every all-reduce scenario
of ``python -m benchmarks scale``'s two grids, run as over torch.distributed (``bytesched
simulate --backend torch-distributed``), the plan's choice (its 24 candidate sizes, each also with
batching under its two thresholds) against the best of a wider grid: partitions of 250 KB to
64 MB, credits of 1 to 32 partitions, each without batching and under both thresholds (162
sizes), picked by the same short simulation. Writes the rows as JSON and prints each grid's median
share over the rows whose ideal gains at least 5 %.

    PYTHONPATH=. .venv/bin/python docs/experiments/plan-batching/wide.py docs/data/plan-batching_wide-grid.json
"""

from __future__ import annotations

import json
import statistics
import sys
from typing import Any

from benchmarks.scale import share
from bytesched.core.config import SchedulingParams
from bytesched.sim import run
from bytesched.sim.plan import STAY_OUT, cluster_thresholds, make_plan, search_seconds
from probe import scenarios  # this directory's probe.py (a script's own directory is on the path)

PARTITIONS = (250_000, 500_000, 1_000_000, 2_000_000, 4_000_000, 8_000_000, 16_000_000, 32_000_000, 64_000_000)
CREDIT_FACTORS = (1, 2, 4, 8, 16, 32)


def rows() -> list[dict[str, Any]]:
    out = []
    for grid_name, model, workers, bandwidth, profile, cluster, vanilla, ideal in scenarios():
        thresholds = cluster_thresholds(profile, cluster)
        plan = make_plan(profile, cluster, batch_thresholds=thresholds)
        best: tuple[float, SchedulingParams, str] = (search_seconds(profile, cluster, "fifo", STAY_OUT),
                                                     STAY_OUT, "fifo")
        for partition in PARTITIONS:
            for factor in CREDIT_FACTORS:
                for batch in (0, *thresholds):
                    params = SchedulingParams(partition, partition * factor, batch_bytes=batch)
                    seconds = search_seconds(profile, cluster, "bytescheduler", params)
                    if seconds < best[0]:
                        best = (seconds, params, "bytescheduler")
        row = {"grid": grid_name, "model": model, "workers": workers, "bandwidth": bandwidth, "ideal": ideal,
               "plan": max(1.0, vanilla / run(profile, cluster, plan.policy, plan.params).iteration_time),
               "wide": max(1.0, vanilla / run(profile, cluster, best[2], best[1]).iteration_time),
               "wide_params": [best[1].partition_bytes, best[1].credit_bytes, best[1].batch_bytes]}
        out.append(row)
        print(f"{grid_name:9}{model:12}{workers:4}{bandwidth:>8} ideal {ideal:.3f} plan {row['plan']:.3f} "
              f"wide {row['wide']:.3f}", flush=True)
    return out


if __name__ == "__main__":
    result = rows()
    with open(sys.argv[1], "w") as f:
        json.dump(result, f, indent=1)
    for grid_name in ("issue", "held-out"):
        counted = [r for r in result if r["grid"] == grid_name and r["ideal"] >= 1.05]
        for key in ("plan", "wide"):
            shares = [share(r[key], r["ideal"]) for r in counted]
            print(f"{grid_name}: {key} median share {statistics.median(shares):.2f}, lowest {min(shares):.2f} "
                  f"({len(counted)} rows)")
