"""The command line of ``python -m benchmarks compiled``: rounds of jobs on an emulated cluster, and
the report (see :mod:`benchmarks.compiled`)."""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
from pathlib import Path
from typing import Any

from bytesched.core.config import parse_size
from bytesched.sim.predict import simulate

from ..emulated.protocol import parse, worker_argv
from ..emulated.scaling import Scale, balanced_time_scale, scaled_profile
from ..emulation import emulated_cluster, parse_rate, unavailable_reason
from ..provenance import command_line, revision


def build_parser(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("--model", default="vgg16", help="a simulator profile (emulated compute)")
    parser.add_argument("--configs", default="ddp,bytesched",
                        help="comma-separated, the first is the baseline: ddp, allreduce, bytesched, "
                             "bytesched-barrier (bytesched ones may end in :SIZE, the pieces' bytes, or :inf)")
    parser.add_argument("--bandwidth", default="1gbit")
    parser.add_argument("--repeats", type=int, default=5, help="interleaved rounds")
    parser.add_argument("--steps", type=int, default=10, help="timed steps per run")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps before them (the first compiles)")
    parser.add_argument("--gradient-bytes", default="24MB", help="scale the profile's gradients to this many bytes")
    parser.add_argument("--balance-at", default="1gbit",
                        help="scale compute times so that compute = communication at this bandwidth")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per job")
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.set_defaults(func=main)
    return parser


def scales(model: str, gradient_bytes: str, balance_at: str) -> Scale:
    """The size and time scales that give ``model`` ``gradient_bytes`` of gradients and a compute
    time equal to the simulated communication time of 2 ranks at ``balance_at``."""
    unscaled = scaled_profile(model, Scale())
    size = parse_size(gradient_bytes, name="--gradient-bytes") / unscaled.nbytes
    sized = scaled_profile(model, Scale(size, 1.0))
    communication = simulate(sized, policies=["fifo"], workers=2, bandwidth=parse_rate(balance_at) / 8,
                             topology="full-duplex").predictions[0].communication_time
    return Scale(size, balanced_time_scale(sized, communication))


def run(args: argparse.Namespace) -> dict[str, Any]:
    configs = [name.strip() for name in args.configs.split(",") if name.strip()]
    scale = scales(args.model, args.gradient_bytes, args.balance_at)
    profile = scaled_profile(args.model, scale)
    results: dict[str, Any] = {
        "meta": {"command": command_line("compiled"), "revision": revision(), "cpus": os.cpu_count(),
                 "started": datetime.datetime.now().isoformat(timespec="seconds"),
                 "loadavg": {"start": round(os.getloadavg()[0], 1)}},
        "model": args.model, "bits_per_second": parse_rate(args.bandwidth), "ranks": 2,
        "size_scale": scale.size, "time_scale": scale.time, "gradient_bytes": profile.nbytes,
        "compute_seconds": profile.compute_time, "steps": args.steps, "warmup": args.warmup,
        "configs": configs, "runs": [],
    }
    with emulated_cluster(2, parse_rate(args.bandwidth)) as cluster:
        print(cluster.describe(), flush=True)
        for round_number in range(args.repeats):
            order = configs[round_number % len(configs):] + configs[:round_number % len(configs)]
            argv = [sys.executable, "-m", "benchmarks.compiled.worker",
                    *worker_argv("torch", args.model, scale.size, scale.time, args.steps, args.warmup,
                                 runs=[(name, round_number) for name in order])]
            job = cluster.launch_torch_distributed(argv, env={}, ranks=2)
            status = job.wait(args.timeout)
            records = parse(job.output)
            if status != 0 or len(records) != len(order):
                tail = "\n".join(job.output[-40:])
                raise RuntimeError(f"round {round_number} exited with status {status} and reported "
                                   f"{len(records)} of {len(order)} runs:\n{tail}")
            for record in records:
                print(f"round {round_number}: {record['config']}: {record['samples_per_second']:.1f} samples/s"
                      + (f" ({record['plan']})" if "plan" in record else ""), flush=True)
            results["runs"] += records
    results["meta"]["loadavg"]["end"] = round(os.getloadavg()[0], 1)
    results["summary"] = summary(results)
    return results


def summary(results: dict[str, Any]) -> dict[str, Any]:
    """Per configuration: median samples/s, its ratio to the first configuration's median, and
    the range of the per-round ratios."""
    configs = results["configs"]
    by_round: dict[int, dict[str, float]] = {}
    for run in results["runs"]:
        by_round.setdefault(run["round"], {})[run["config"]] = run["samples_per_second"]
    baseline = configs[0]
    table = {}
    for name in configs:
        rates = [rounds[name] for rounds in by_round.values()]
        ratios = [rounds[name] / rounds[baseline] for rounds in by_round.values()]
        table[name] = {"median_samples_per_second": statistics.median(rates),
                       "median_ratio": statistics.median(ratios),
                       "ratio_range": [min(ratios), max(ratios)]}
    return table


def main(args: argparse.Namespace) -> int:
    reason = unavailable_reason()
    if reason is not None:
        print(f"python -m benchmarks compiled: cannot build the emulated network: {reason}", file=sys.stderr)
        return 2
    results = run(args)
    for name, row in results["summary"].items():
        low, high = row["ratio_range"]
        print(f"{name}: {row['median_samples_per_second']:.1f} samples/s, {row['median_ratio']:.2f}x "
              f"[{low:.2f}-{high:.2f}] of {results['configs'][0]}")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
        print(f"results written to {args.json}")
    return 0
