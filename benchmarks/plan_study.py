"""``python -m benchmarks plan``: the plan (what a job gets with no settings) across the simulator's
scenarios, against doing nothing, against fifo and against the best configuration a grid search
finds.

Per scenario (model, architecture, workers, bandwidth) it simulates vanilla, fifo, the fixed
defaults (bytescheduler at 4 MB / 16 MB), the plan, and bytescheduler at every candidate size of
:func:`bytesched.sim.plan.candidate_sizes`; the grid's best is the fastest of fifo and those. It
reports the plan's speedup over the better of vanilla and fifo (target: never below 0.99x) and its
share of the grid's best (target: within 5 %). The simulator is deterministic, so one run is
enough; the figures do not depend on the machine's load.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from typing import Any

from bytesched.core.config import SchedulingParams
from bytesched.sim import load_profile
from bytesched.sim.options import make_cluster
from bytesched.sim.plan import candidate_sizes, make_plan
from bytesched.sim.simulator import VANILLA, run

MODELS = ("vgg16", "resnet50", "transformer")
WORKERS = {"ps": (2, 8, 16, 64), "allreduce": (2, 16, 64, 1024)}
BANDWIDTHS = ("1Gbps", "10Gbps", "25Gbps", "100Gbps")
QUICK = {"models": ("vgg16",), "workers": {"ps": (2,), "allreduce": (16,)}, "bandwidths": ("10Gbps",)}


def scenario(model: str, arch: str, workers: int, bandwidth: str) -> dict[str, Any]:
    """Every figure of one scenario (iteration times in seconds)."""
    profile = load_profile(model)
    cluster = make_cluster(None, arch=arch, workers=workers, bandwidth=bandwidth)

    def seconds(policy: str, params: SchedulingParams) -> float:
        return run(profile, cluster, policy, params).iteration_time

    plan = make_plan(profile, cluster)
    times = {"vanilla": seconds(VANILLA, SchedulingParams()), "fifo": seconds("fifo", SchedulingParams()),
             "defaults": seconds("bytescheduler", SchedulingParams()), "plan": seconds(plan.policy, plan.params)}
    grid = min([times["fifo"], *(seconds("bytescheduler", p) for p in candidate_sizes(profile, cluster))])
    return {"model": model, "arch": arch, "workers": workers, "bandwidth": bandwidth, "chosen": plan.describe(),
            **{f"{name}_s": value for name, value in times.items()}, "grid_best_s": grid,
            "plan_vs_best_of_vanilla_fifo": min(times["vanilla"], times["fifo"]) / times["plan"],
            "plan_share_of_grid_best": grid / times["plan"],
            "defaults_vs_vanilla": times["vanilla"] / times["defaults"]}


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``plan`` benchmark to ``python -m benchmarks``."""
    parser = subparsers.add_parser("plan", help="the no-settings plan against vanilla, fifo and a grid search "
                                                "in the simulator", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one PS and one all-reduce scenario")
    parser.add_argument("--json", action="store_true", help="print every scenario as JSON")
    parser.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    models, workers, bandwidths = ((QUICK["models"], QUICK["workers"], QUICK["bandwidths"]) if args.quick
                                   else (MODELS, WORKERS, BANDWIDTHS))
    rows = []
    for model, arch, bandwidth in itertools.product(models, ("ps", "allreduce"), bandwidths):
        for count in workers[arch]:
            rows.append(scenario(model, arch, count, bandwidth))
            if not args.json:
                r = rows[-1]
                print(f"{model:<12}{arch:<10}{count:>5}{bandwidth:>9}  plan {r['plan_vs_best_of_vanilla_fifo']:.2f}x "
                      f"of max(vanilla, fifo), {r['plan_share_of_grid_best'] * 100:.1f}% of the grid's best; "
                      f"defaults {r['defaults_vs_vanilla']:.2f}x vanilla; {r['chosen']}", flush=True)
    worst_floor = min(r["plan_vs_best_of_vanilla_fifo"] for r in rows)
    worst_share = min(r["plan_share_of_grid_best"] for r in rows)
    summary = {"scenarios": len(rows),
               "below_0.99x_of_vanilla_or_fifo": sum(r["plan_vs_best_of_vanilla_fifo"] < 0.99 for r in rows),
               "worst_vs_vanilla_or_fifo": worst_floor,
               "more_than_5pct_from_grid_best": sum(r["plan_share_of_grid_best"] < 0.95 for r in rows),
               "worst_share_of_grid_best": worst_share}
    if args.json:
        print(json.dumps({"summary": summary, "scenarios": rows}, indent=1))
    else:
        print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    from .cli import main as cli_main
    sys.exit(cli_main(["plan", *sys.argv[1:]]))
