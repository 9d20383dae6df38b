"""``python -m benchmarks scale``: at GPU speed and at scale, how much of the available gain the
plan captures, in the simulator.

Per scenario (a GPU-class profile, ``*-h100-bf16``, on all-reduce with 16, 64 and 256 workers or
a parameter server with 8 and 32, at 25 and 100 Gbit/s) it runs what ``bytesched simulate
--policy fifo,bytescheduler,plan --tune`` runs and reports each speedup over vanilla, the ideal
(``max(compute, communication)``), the achievable bound and the *share* of the available gain
the plan captures, ``(speedup - 1) / (ideal - 1)``. ``--held-out`` runs other clusters (8, 32
and 128 workers on all-reduce, 4 and 16 on a parameter server, at 10 and 40 Gbit/s), which no
constant of the plan was chosen on. ``--breakdown`` adds where each scenario's gap goes
(``bytesched simulate --breakdown``). The simulator is deterministic: one run is the result.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Any, Sequence

from bytesched.sim import simulate
from bytesched.sim.backends import BACKENDS

from . import REPO
from .docs_section import replace_section
from .provenance import revision

MODELS = ("resnet50", "vgg16", "transformer")
PROFILE = "{model}-h100-bf16"
GAIN_FLOOR = 1.05
"""Scenarios whose ideal speedup is below this have too little to gain to count a share."""


@dataclass(frozen=True)
class Grid:
    """Worker counts per architecture and bandwidths."""

    workers: dict[str, tuple[int, ...]]
    bandwidths: tuple[str, ...]

    def scenarios(self, models: Sequence[str] = MODELS) -> list[tuple[str, str, int, str]]:
        """(model, architecture, workers, bandwidth), all-reduce first, as the issue's table."""
        return [(model, arch, workers, bandwidth) for model, arch in itertools.product(models, self.workers)
                for bandwidth in self.bandwidths for workers in self.workers[arch]]


GRID = Grid({"allreduce": (16, 64, 256), "ps": (8, 32)}, ("25Gbps", "100Gbps"))
HELD_OUT = Grid({"allreduce": (8, 32, 128), "ps": (4, 16)}, ("10Gbps", "40Gbps"))
QUICK = Grid({"allreduce": (64,), "ps": (8,)}, ("100Gbps",))


def scenario(model: str, arch: str, workers: int, bandwidth: str, breakdown: bool = False,
             overhead: str | None = None) -> dict[str, Any]:
    """Every figure of one scenario (``overhead``: θ instead of the simulator's default)."""
    started = time.perf_counter()
    prediction = simulate(PROFILE.format(model=model), policies="fifo,bytescheduler,plan", tune=True,
                          breakdown=breakdown, arch=arch, workers=workers, bandwidth=bandwidth,
                          overhead=overhead).predictions[0]
    data = prediction.to_json()
    speedups = {r["policy"]: r["speedup"] for r in data["results"]}
    torch: dict[str, float] = {}
    if arch == "allreduce":
        decoupled = simulate(PROFILE.format(model=model), policies="plan", decoupled=True, arch=arch,
                             workers=workers, bandwidth=bandwidth, overhead=overhead).predictions[0].result("plan")
        speedups["plan, decoupled"] = decoupled.speedup
        backend = BACKENDS["torch-distributed"]
        over_torch = simulate(PROFILE.format(model=model), policies="plan", batching=backend.batches, arch=arch,
                              workers=workers, bandwidth=bandwidth, overhead=overhead,
                              **backend.cluster_options()).predictions[0]
        torch = {"speedup": over_torch.result("plan").speedup,
                 "ideal": over_torch.vanilla.iteration_time / over_torch.ideal_time,
                 "batch_bytes": over_torch.result("plan").batch_bytes}
    plan = prediction.result("plan")
    ideal = data["ideal"]["speedup"]
    best = max(speedups[p] for p in ("fifo", "bytescheduler", "plan"))
    return {"model": model, "arch": arch, "workers": workers, "bandwidth": bandwidth,
            "speedups": speedups, "ideal": ideal, "achievable": data["achievable"]["speedup"],
            "plan_partition_bytes": plan.partition_bytes, "plan_credit_bytes": plan.credit_bytes,
            "plan_share": share(speedups["plan"], ideal), "best_share": share(best, ideal),
            "decoupled_share": share(speedups.get("plan, decoupled", speedups["plan"]), ideal),
            "achievable_share": share(data["achievable"]["speedup"], ideal),
            "torch_distributed": torch or None,
            "breakdown": data["breakdown"], "seconds": time.perf_counter() - started}


def share(speedup: float, ideal: float) -> float | None:
    """The part of the available gain a speedup captures (None where nothing is available)."""
    return (speedup - 1) / (ideal - 1) if ideal > 1 else None


def summary(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The targets' figures over ``rows``: shares where the ideal gains at least 5 %."""
    counted = [r for r in rows if r["ideal"] >= GAIN_FLOOR]
    shares = [r["plan_share"] for r in counted]
    return {"scenarios": len(rows), "counted": len(counted),
            "median_share": statistics.median(shares) if shares else None,
            "min_share": min(shares) if shares else None,
            "median_achievable_share": statistics.median(r["achievable_share"] for r in counted) if counted else None,
            "median_share_with_decoupled":
                statistics.median(r["decoupled_share"] for r in counted) if counted else None,
            "min_share_with_decoupled": min(r["decoupled_share"] for r in counted) if counted else None,
            "below_0.3": sum(s < 0.3 for s in shares),
            **torch_distributed_summary(rows),
            "min_plan_speedup": min(r["speedups"]["plan"] for r in rows),
            "below_vanilla": sum(r["speedups"]["plan"] < 1.0 for r in rows),
            "median_share_by_stage": stage_shares(counted)}


def torch_distributed_summary(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The plan's share on the all-reduce rows run as over torch.distributed (against DDP, each
    with its own ideal), where that ideal gains at least 5 %."""
    over_torch = [r["torch_distributed"] for r in rows if r.get("torch_distributed")]
    shares = [share(t["speedup"], t["ideal"]) for t in over_torch if t["ideal"] >= GAIN_FLOOR]
    return {"torch_distributed_counted": len(shares),
            "median_share_over_torch_distributed": statistics.median(shares) if shares else None,
            "min_share_over_torch_distributed": min(shares) if shares else None,
            "torch_distributed_below_ddp": sum(t["speedup"] < 1.0 for t in over_torch)}


def stage_shares(rows: Sequence[dict[str, Any]]) -> dict[str, float]:
    """The median share over ``rows`` (scenarios with something to gain, those with a breakdown)
    that each stage of the breakdown after the ideal reaches (``bytesched.sim.bound.STAGES``): the
    achievable bound, then the best sizes of the wide grid with free messages, with the hop
    latency, with θ too, and the plan's choice, each in the short simulation the plan searches
    with. It says how much of the available gain each message cost leaves to any choice of sizes."""
    broken_down = [r for r in rows if r["breakdown"]]
    if not broken_down:
        return {}
    names = [stage["name"] for stage in broken_down[0]["breakdown"]["stages"]]
    shares: dict[str, list[float]] = {name: [] for name in names[1:]}
    for r in broken_down:
        stages = r["breakdown"]["stages"]
        vanilla = r["ideal"] * stages[0]["iteration_time"]  # the ideal speedup is vanilla over the ideal's time
        for stage in stages[1:]:
            shares[stage["name"]].append((vanilla / stage["iteration_time"] - 1) / (r["ideal"] - 1))
    return {name: statistics.median(values) for name, values in shares.items()}


def markdown(result: dict[str, Any]) -> str:
    """The table of docs/simulator.md: one row per scenario, then the summary."""
    lines = ["| model | architecture | workers | bandwidth | plan | best tuned | plan with DeAR | achievable | ideal | "
             "share | plan's sizes | over torch.distributed: plan of ideal |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        sizes = ("stays out" if r["plan_credit_bytes"] is None
                 else f"{r['plan_partition_bytes'] / 1e6:g} / {r['plan_credit_bytes'] / 1e6:g} MB")
        cell = "-" if r["plan_share"] is None or r["ideal"] < GAIN_FLOOR else f"{r['plan_share']:.2f}"
        tuned = max(r["speedups"][p] for p in ("fifo", "bytescheduler", "plan"))
        dear = f"{r['speedups']['plan, decoupled']:.2f}x" if "plan, decoupled" in r["speedups"] else "-"
        lines.append(f"| {r['model']} | {'all-reduce' if r['arch'] == 'allreduce' else 'PS'} | {r['workers']} | "
                     f"{r['bandwidth'].replace('Gbps', ' Gbit/s')} | {r['speedups']['plan']:.2f}x | {tuned:.2f}x | "
                     f"{dear} | {r['achievable']:.2f}x | {r['ideal']:.2f}x | {cell} | {sizes} | {_over_torch(r)} |")
    s = result["summary"]
    lines += ["", f"Over the {s['counted']} of {s['scenarios']} scenarios whose ideal gains at least 5 %: median share "
              f"{s['median_share']:.2f}, lowest {s['min_share']:.2f} ({s['below_0.3']} below 0.3; the achievable "
              f"bound's median {s['median_achievable_share']:.2f}; weighing DeAR too, median "
              f"{s['median_share_with_decoupled']:.2f}, lowest {s['min_share_with_decoupled']:.2f}); "
              "the plan's lowest speedup "
              f"{s['min_plan_speedup']:.2f}x ({s['below_vanilla']} below vanilla)."]
    if s.get("torch_distributed_counted"):
        lines.append(f"Over torch.distributed (all-reduce rows against DDP, each with its own ideal; "
                     f"`bytesched simulate --backend torch-distributed`), over the "
                     f"{s['torch_distributed_counted']} whose ideal gains at least 5 %: median share "
                     f"{s['median_share_over_torch_distributed']:.2f}, lowest "
                     f"{s['min_share_over_torch_distributed']:.2f}; {s['torch_distributed_below_ddp']} below DDP.")
    return "\n".join(lines)


def _over_torch(row: dict[str, Any]) -> str:
    """``{speedup}x of {ideal}x`` (with ``, batching`` where the plan batched) for an all-reduce row's
    run over torch.distributed, ``-`` for a PS row."""
    torch = row.get("torch_distributed")
    if not torch:
        return "-"
    return f"{torch['speedup']:.2f}x of {torch['ideal']:.2f}x" + (", batching" if torch["batch_bytes"] else "")


def breakdown_markdown(result: dict[str, Any]) -> str:
    """Where each scenario's time from the ideal to the plan goes, in ms."""
    rows = [r for r in result["rows"] if r["breakdown"]]
    if not rows:
        return ""
    causes = [gap["cause"] for gap in rows[0]["breakdown"]["gaps"]]
    lines = ["| scenario | ideal ms | " + " | ".join(causes) + " | plan ms |",
             "|---|---|" + "---|" * len(causes) + "---|"]
    for r in rows:
        stages = r["breakdown"]["stages"]
        gaps = " | ".join(f"{gap['seconds'] * 1e3:+.1f}" for gap in r["breakdown"]["gaps"])
        lines.append(f"| {r['model']} {'all-reduce' if r['arch'] == 'allreduce' else 'PS'} {r['workers']}, "
                     f"{r['bandwidth'].replace('Gbps', ' Gbit/s')} | {stages[0]['iteration_time'] * 1e3:.1f} | "
                     f"{gaps} | "
                     f"{stages[-1]['iteration_time'] * 1e3:.1f} |")
    return "\n".join(lines)


def stages_markdown(result_summary: dict[str, Any]) -> str:
    """One line: the median share the counted scenarios reach at each stage of the breakdown."""
    shares = result_summary.get("median_share_by_stage") or {}
    return ("The median share of the same scenarios at each stage (the best sizes of the wide grid, in the plan's "
            "short simulation): " + ", ".join(f"{name} {value:.2f}" for name, value in shares.items()) + "."
            if shares else "")


BEGIN = "<!-- scale:begin -->"
END = "<!-- scale:end -->"


def run_grid(grid: Grid, label: str, breakdown: bool, say: bool, overhead: str | None = None) -> dict[str, Any]:
    """Every scenario of ``grid``, the summary, and how it was made."""
    started = time.perf_counter()
    rows = []
    for model, arch, workers, bandwidth in grid.scenarios():
        rows.append(scenario(model, arch, workers, bandwidth, breakdown=breakdown, overhead=overhead))
        if say:
            r = rows[-1]
            print(f"{model:<12}{arch:<10}{workers:>5}{bandwidth:>9}  plan {r['speedups']['plan']:.2f}x of "
                  f"{r['ideal']:.2f}x (achievable {r['achievable']:.2f}x)", file=sys.stderr, flush=True)
    return {"grid": label, "command": "python -m benchmarks scale" + ("" if label == "issue" else f" --{label}")
            + (" --breakdown" if breakdown else "") + (f" --overhead {overhead}" if overhead else ""),
            "revision": revision(), "overhead": overhead,
            "rows": rows, "summary": summary(rows), "wall_seconds": time.perf_counter() - started}


def docs_section(issue: dict[str, Any], held_out: dict[str, Any]) -> str:
    """docs/simulator.md's section: the grid's table and breakdown, the held-out clusters' table."""
    return "\n".join([
        BEGIN, f"Generated by `python -m benchmarks scale --docs` (revision {issue['revision']}; every figure in "
        "[docs/data/scale_issue.json](data/scale_issue.json) and "
        "[docs/data/scale_held_out.json](data/scale_held_out.json)). Speedups over vanilla; \"best tuned\" is the "
        "fastest of `fifo`, `bytescheduler` at its best candidate size and the plan (`bytesched simulate --policy "
        "fifo,bytescheduler,plan --tune`); \"plan with DeAR\" the plan weighing a decoupled all-reduce too "
        "(`--decoupled`); the share is the plan's, `(speedup - 1) / (ideal - 1)`, where the ideal gains at "
        "least 5 %.", "", markdown(issue), "",
        "Where the time from the ideal to the plan goes, in ms per iteration (`--breakdown`): the order "
        "constraint is the achievable bound's excess over the ideal; *partitions and placement* what the best "
        "sizes of a wide grid (125 KB to 32 MB partitions, 1 to 64 partitions of credit, and the plan's "
        "candidates) lose with free messages (and Horovod's cycle); *hop latency* and *per-message cost* what "
        "the cluster's latency and θ add to the best sizes; *plan's choice* what the plan's own choice adds to "
        "that.", "", breakdown_markdown(issue), "", stages_markdown(issue["summary"]), "",
        "The same on clusters no choice of the plan was made on (`--held-out`: 8, 32 and 128 workers on "
        "all-reduce, 4 and 16 on a parameter server, 10 and 40 Gbit/s):", "", markdown(held_out), END])


def write_docs(issue: dict[str, Any], held_out: dict[str, Any]) -> None:
    """Both grids' JSON under docs/data and the section of docs/simulator.md."""
    for result, name in ((issue, "scale_issue.json"), (held_out, "scale_held_out.json")):
        (REPO / "docs" / "data" / name).write_text(json.dumps(result, indent=1) + "\n")
    replace_section(REPO / "docs" / "simulator.md", BEGIN, END, docs_section(issue, held_out))


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``scale`` benchmark to ``python -m benchmarks``."""
    parser = subparsers.add_parser("scale", help="the plan's share of the available gain at GPU speed and at scale "
                                                 "(simulator)", description=__doc__.splitlines()[0])
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--held-out", action="store_true", help="the held-out clusters instead of the issue's grid")
    which.add_argument("--quick", action="store_true", help="one all-reduce and one PS cluster")
    parser.add_argument("--breakdown", action="store_true", help="also where each scenario's gap goes")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument("--overhead", help="the per-message overhead θ, e.g. 50us (default: the simulator's, 300us)")
    parser.add_argument("--docs", action="store_true",
                        help="run the grid (with --breakdown) and the held-out clusters, and write "
                             "docs/data/scale_*.json and docs/simulator.md's section")
    parser.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    if args.docs:
        issue = run_grid(GRID, "issue", True, True)
        held_out = run_grid(HELD_OUT, "held-out", False, True)
        write_docs(issue, held_out)
        print(docs_section(issue, held_out))
        return 0
    grid, label = (HELD_OUT, "held-out") if args.held_out else (QUICK, "quick") if args.quick else (GRID, "issue")
    result = run_grid(grid, label, args.breakdown, not args.json, args.overhead)
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        print(markdown(result))
        if args.breakdown:
            print("\n" + breakdown_markdown(result) + "\n\n" + stages_markdown(result["summary"]))
    return 0
