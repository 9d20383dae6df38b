"""The parameter server's share at GPU speed in the simulator, with small keys fused.

On a parameter server every key (and every partition of one) is a message of its own to each
server it lives on, and the per-message cost is where most of the gap between the plan and the
achievable bound goes (``bytesched simulate --arch ps --breakdown``). MXNet's KVStore does not
fuse keys, and neither does ``ScheduledKVStore``. This probe asks what fusing would be worth: for
every parameter-server scenario of ``python -m benchmarks scale``'s issue grid and held-out grid,
each model's layers are merged into keys of at least ``F`` bytes as the PyTorch plugin merges its
buckets (:func:`bytesched.sim.plan.fused_profile`: the first layer alone, then runs of consecutive
layers; a merged key is ready when its last gradient is, and the forward pass waits for it before
its first layer), and the start-up plan (:func:`bytesched.sim.plan.make_plan`) picks partition and
credit on the fused model. Vanilla stays MXNet's own unfused job; a plan that stays out passes through, and sizes
are tried against passing through and kept only if faster (both at vanilla's speed, as in
``bytesched simulate``'s plan row). ``best`` is the fastest of the bounds, as a plan weighing them
would choose.

    PYTHONPATH=. .venv/bin/python docs/experiments/ps-key-fusion/probe.py docs/data/ps-key-fusion_scale.json
    PYTHONPATH=. .venv/bin/python docs/experiments/ps-key-fusion/probe.py --summary docs/data/ps-key-fusion_scale.json
"""

from __future__ import annotations

import json
import statistics
import sys
from typing import Any

from benchmarks.scale import GRID, HELD_OUT, PROFILE, share
from bytesched.sim import make_cluster, run
from bytesched.sim.bound import communication_time, compute_time
from bytesched.sim.plan import fused_profile, keeps_the_faster_path, make_plan
from bytesched.sim.profile import load_profile
from bytesched.sim.simulator import VANILLA

BOUNDS = (0, 1_000_000, 4_000_000, 16_000_000, 64_000_000)
"""Fused keys of at least this many bytes (0: the model's own keys)."""


def rows() -> list[dict[str, Any]]:
    out = []
    for grid_name, grid in (("issue", GRID), ("held-out", HELD_OUT)):
        for model, arch, workers, bandwidth in grid.scenarios():
            if arch != "ps":
                continue
            profile = load_profile(PROFILE.format(model=model))
            cluster = make_cluster(arch=arch, workers=workers, bandwidth=bandwidth)
            vanilla = run(profile, cluster, VANILLA).iteration_time
            ideal = vanilla / max(compute_time(profile, cluster), communication_time(profile, cluster))
            row: dict[str, Any] = {"grid": grid_name, "model": model, "workers": workers, "bandwidth": bandwidth,
                                   "ideal": ideal, "keys": {}, "speedup": {}, "params": {}}
            for bound in BOUNDS:
                keyed = fused_profile(profile, bound) if bound else profile
                plan = make_plan(keyed, cluster)
                speedup = vanilla / run(keyed, cluster, plan.policy, plan.params).iteration_time
                stays_out = plan.policy == "fifo"
                row["keys"][str(bound)] = sum(len(layer.tensors) for layer in keyed.layers)
                tried = stays_out or keeps_the_faster_path(plan, cluster)  # the plan trial keeps vanilla if faster
                row["speedup"][str(bound)] = max(1.0, speedup) if tried else speedup
                row["params"][str(bound)] = "no partitioning, no credit limit" if stays_out else (
                    f"{plan.params.partition_bytes / 1e6:g} / {plan.params.credit_bytes / 1e6:g} MB")
            out.append(row)
            print(f"{grid_name:9}{model:12}{workers:4}{bandwidth:>8} ideal {ideal:.2f}  " + "  ".join(
                f"F{bound / 1e6:g}MB {row['speedup'][str(bound)]:.2f}" for bound in BOUNDS), flush=True)
    return out


def summary(data: list[dict[str, Any]]) -> None:
    for grid_name in ("issue", "held-out"):
        mine = [r for r in data if r["grid"] == grid_name and r["ideal"] >= 1.05]
        columns = {f"{bound / 1e6:g} MB": [share(r["speedup"][str(bound)], r["ideal"]) for r in mine]
                   for bound in BOUNDS}
        columns["best"] = [share(max(r["speedup"].values()), r["ideal"]) for r in mine]
        for name, shares in columns.items():
            print(f"{grid_name}: keys fused to {name:>6}: median share {statistics.median(shares):.2f}, "
                  f"lowest {min(shares):.2f} ({len(shares)} scenarios)")
        docs_file = {"issue": "scale_issue.json", "held-out": "scale_held_out.json"}[grid_name]
        allreduce = [share(r["speedups"]["plan"], r["ideal"]) for r in json.load(open(f"docs/data/{docs_file}"))["rows"]
                     if r["arch"] == "allreduce" and r["ideal"] >= 1.05]
        for name in ("0 MB", "best"):
            every = allreduce + columns[name]
            print(f"{grid_name}: with the all-reduce rows over Horovod (docs/data/{docs_file}), keys fused to "
                  f"{name:>4}: median share {statistics.median(every):.2f}, lowest {min(every):.2f} "
                  f"({len(every)} scenarios)")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--summary"]:
        summary(json.load(open(sys.argv[2])))
        sys.exit()
    result = rows()
    with open(sys.argv[1], "w") as f:
        json.dump(result, f, indent=1)
    summary(result)
