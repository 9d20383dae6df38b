"""``python -m benchmarks emulated``: run the matrix (or part of it) and write JSON, markdown and plots.

    python -m benchmarks emulated --json out.json --docs           # the full matrix (hours)
    python -m benchmarks emulated --quick --json quick.json        # one small cell per framework
    python -m benchmarks emulated --report out.json                # regenerate docs from a JSON

Ctrl-C stops the running job and deletes the emulated network (the cluster context does it);
what was measured so far is still written to ``--json``.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import os
import sys
from pathlib import Path
from typing import Any, Sequence

from bytesched.core.config import ConfigError, parse_size
from ..emulation import parse_rate, unavailable_reason
from bytesched.sim.predict import simulate
from .. import REPO
from ..docs_section import replace_section
from ..provenance import command_line, revision
from .cells import FRAMEWORKS, REAL_MODELS, Group, groups, quick
from .configs import CONFIGURATIONS
from .calibration import Calibration
from .prediction import (accuracy_markdown, as_measured, cluster_options, fit_probes, predict_group, prediction_errors,
                         refresh_ideals, repredict, resolve)
from .report import details_page, plot, summary, write_section
from .results import FORMAT, families, load, merge, save
from .runner import Workload, run_groups
from .scaling import Scale, balanced_time_scale, scaled_profile

SIM_TOPOLOGY = {"veth": "full-duplex", "loopback": "shared"}
QUICK = {"models": "vgg16", "bandwidths": "1gbit", "ranks": "2", "configs": "vanilla,bytescheduler-sim", "repeats": 1,
         "steps": 3, "warmup": 1, "gradient_bytes": "4MB"}
"""What --quick sets (the frameworks stay selectable); each framework then runs one job
(:func:`~.cells.quick`)."""


def _names(text: str) -> list[str]:
    return [item.strip() for item in text.split(",") if item.strip()]


def build_parser(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("--frameworks", default=",".join(FRAMEWORKS),
                        help="comma-separated, of: " + ", ".join(FRAMEWORKS))
    parser.add_argument("--models", default="vgg16,resnet50,transformer",
                        help="simulator profiles (emulated compute) or " + ", ".join(REAL_MODELS) + " (real compute)")
    parser.add_argument("--bandwidths", default="0.5gbit,1gbit,2.5gbit,5gbit,10gbit")
    parser.add_argument("--ranks", default="2,4", help="rank counts (one emulated host per rank)")
    parser.add_argument("--configs", default=",".join(CONFIGURATIONS), help="of: " + ", ".join(CONFIGURATIONS))
    parser.add_argument("--repeats", type=int, default=3, help="interleaved rounds per group")
    parser.add_argument("--steps", type=int, default=10, help="timed steps per run")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps before them")
    parser.add_argument("--gradient-bytes", default="24MB",
                        help="scale each profile's gradients to this many bytes per iteration")
    parser.add_argument("--balance-at", default="1gbit",
                        help="scale compute times so compute = communication at this bandwidth")
    parser.add_argument("--size-scale", type=float, help="explicit size scale (overrides --gradient-bytes)")
    parser.add_argument("--time-scale", type=float, help="explicit time scale (overrides --balance-at)")
    parser.add_argument("--topology", choices=tuple(SIM_TOPOLOGY), default="veth",
                        help="veth: a namespace per host, links shaped per direction; loopback: one shared medium")
    parser.add_argument("--timeout", type=float, default=600, help="seconds per job before it is stopped")
    parser.add_argument("--quick", action="store_true",
                        help="one small job per framework: vgg16 scaled to 4 MB, 1 Gbit/s, 2 ranks, 3 steps; "
                             "vanilla and bytescheduler, or bytescheduler alone where a job runs one configuration")
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--docs", action="store_true", help="also write docs/benchmarks.md's section and plots")
    parser.add_argument("--report", type=Path, nargs="+", metavar="JSON",
                        help="do not run: regenerate docs/benchmarks.md's section and plots from these results files")
    parser.add_argument("--accuracy", action="store_true",
                        help="with --report: instead, the simulator's prediction error on every measured "
                             "configuration, each group predicted again with this version, into docs/simulator.md")
    parser.add_argument("--docs-file", type=Path, default=REPO / "docs" / "benchmarks.md")
    parser.add_argument("--details-file", type=Path, default=REPO / "docs" / "benchmarks-emulated.md",
                        help="the generated page with every run (default docs/benchmarks-emulated.md)")
    parser.add_argument("--img-dir", type=Path, default=REPO / "docs" / "img")
    parser.set_defaults(func=main)
    return parser


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``emulated`` under ``python -m benchmarks``."""
    build_parser(subparsers.add_parser(
        "emulated", help="training throughput on an emulated network, against vanilla and the simulator",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter))


def workload(model: str, args: argparse.Namespace, ranks: int) -> tuple[Workload, dict[str, Any]]:
    """The scaled workload of ``model`` and its description for the results."""
    if model in REAL_MODELS:
        return (Workload(model, 1.0, 1.0, args.steps, args.warmup),
                {"size_scale": 1.0, "time_scale": 1.0, "gradient_bytes": 0, "compute_seconds": 0.0, "real": True})
    unscaled = scaled_profile(model, Scale())
    size = args.size_scale or parse_size(args.gradient_bytes, name="--gradient-bytes") / unscaled.nbytes
    sized = scaled_profile(model, Scale(size, 1.0))
    if args.time_scale:
        time_scale = args.time_scale
    else:
        balance = parse_rate(args.balance_at)
        communication = simulate(sized, policies=["fifo"], workers=ranks, bandwidth=balance / 8,
                                     topology=SIM_TOPOLOGY[args.topology]).predictions[0].communication_time
        time_scale = balanced_time_scale(sized, communication)
    profile = scaled_profile(model, Scale(size, time_scale))
    return (Workload(model, size, time_scale, args.steps, args.warmup, profile.nbytes),
            {"size_scale": size, "time_scale": time_scale, "gradient_bytes": profile.nbytes,
             "compute_seconds": profile.compute_time, "balance_at": args.balance_at, "real": False})


def _loadavg() -> float:
    return round(os.getloadavg()[0], 1)


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Run the selected matrix; the results (also when interrupted: what was measured so far)."""
    bandwidths = [parse_rate(b) for b in _names(args.bandwidths)]
    ranks = [int(r) for r in _names(args.ranks)]
    matrix, skipped = groups(_names(args.frameworks), _names(args.models), bandwidths, ranks, _names(args.configs))
    if args.quick:
        matrix = [quick(group) for group in matrix]
    described = {m: workload(m, args, min(ranks)) for m in _names(args.models)}
    workloads = {m: w for m, (w, _) in described.items()}
    command = command_line("emulated")
    results: dict[str, Any] = {
        "format": FORMAT,
        "meta": {"command": command, "started": datetime.datetime.now().isoformat(timespec="seconds"),
                 "revision": revision(), "cpus": os.cpu_count(), "pid": os.getpid(),
                 "loadavg": {"start": _loadavg()},
                 "repeats": args.repeats,
                 "steps": args.steps, "warmup": args.warmup, "topology": args.topology,
                 "sim_topology": SIM_TOPOLOGY[args.topology], "networks": []},
        "workloads": {m: d for m, (_, d) in described.items()},
        "groups": [],
        "not_run": [{"framework": f, "config": c, "reason": "does not exist on this framework"} for f, c in skipped],
    }
    entries: dict[tuple, dict[str, Any]] = {}
    for group in matrix:
        entry = {"framework": group.framework.name, "model": group.model, "bits_per_second": group.bits_per_second,
                 "ranks": group.ranks, "configs": [c.name for c in group.configurations], "runs": [],
                 "failures": [], "retried": []}
        entries[group.key] = entry
        results["groups"].append(entry)

    def prepare(group: Group, calibration: Calibration | None) -> Group:
        if group.model in REAL_MODELS:
            return group
        workload = workloads[group.model]
        profile = as_measured(scaled_profile(group.model, Scale(workload.size_scale, workload.time_scale)), calibration)
        topology = SIM_TOPOLOGY[args.topology]
        if calibration is not None:
            calibration = fit_probes(group.framework.arch, profile, cluster_options(group, topology, calibration),
                                     calibration)
        options = cluster_options(group, topology, calibration, scheduled=True)
        tuned = None if calibration is None else calibration.tuned_sizes
        group = dataclasses.replace(group, configurations=resolve(group, profile, options, tuned))
        entry = entries[group.key]
        if calibration is not None:
            entry["calibration"] = calibration.as_record()
        entry["prediction"] = predict_group(group, profile, topology, calibration)
        return group

    def record(group: Group, run: dict[str, Any]) -> None:
        entries[group.key]["runs"].append(run)

    def failed(group: Group, configs: list[str], reason: str, final: bool) -> None:
        entries[group.key]["failures" if final else "retried"].append({"configs": configs, "reason": reason})

    def say(message: str) -> None:
        print(message, flush=True)
        if message.startswith("network: "):
            results["meta"]["networks"].append(message[len("network: "):])

    say(f"{len(matrix)} groups, {sum(len(g.configurations) for g in matrix) * args.repeats} runs; "
        f"workloads: " + "; ".join(f"{m} sizes x{d['size_scale']:.4g} times x{d['time_scale']:.4g}"
                                   for m, d in results["workloads"].items()))
    try:
        run_groups(matrix, workloads, args.repeats, args.topology, args.timeout, prepare, record, failed, say)
    finally:
        results["meta"]["loadavg"]["end"] = _loadavg()
        results["meta"]["finished"] = datetime.datetime.now().isoformat(timespec="seconds")
        if args.json is not None:
            save(results, args.json)
            print(f"results written to {args.json}", flush=True)
    return results


ACCURACY_BEGIN = "<!-- accuracy:begin -->"
ACCURACY_END = "<!-- accuracy:end -->"


def accuracy(parts: Sequence[Sequence[dict[str, Any]]], files: int) -> str:
    """docs/simulator.md's accuracy section: the table of every family of results files (each
    merged as the report merges it, every cell from its latest run), predicted again with this
    version of the simulator."""
    errors = []
    for family in parts:
        merged = merge(list(family))
        repredict(merged)
        errors += prediction_errors(merged)
    return "\n".join([ACCURACY_BEGIN, f"Generated by `python -m benchmarks emulated --report docs/data/emulated_*.json "
                      f"--accuracy` from {files} result files (revision {revision()}):", "",
                      accuracy_markdown(errors), ACCURACY_END])


def write_docs(results: dict[str, Any], args: argparse.Namespace, others: Sequence[dict[str, Any]] = ()) -> None:
    """The generated section of the benchmarks page, the page of every run and the plots; runs whose
    models were scaled otherwise (``others``) get tables of their own, without plots."""
    for each in (results, *others):
        refresh_ideals(each)
    images = plot(results, args.img_dir)
    write_section(args.docs_file, summary(results, args.details_file, args.docs_file, others))
    args.details_file.write_text(details_page(results, images, args.details_file, others) + "\n")
    print(f"wrote {args.docs_file}, {args.details_file} and {len(images)} plot(s) in {args.img_dir}", flush=True)


def main(args: argparse.Namespace) -> int:
    try:
        if args.report is not None and args.accuracy:
            section = accuracy(families([load(path) for path in args.report]), len(args.report))
            replace_section(REPO / "docs" / "simulator.md", ACCURACY_BEGIN, ACCURACY_END, section)
            print(section)
            return 0
        if args.report is not None:
            main_family, *others = families([load(path) for path in args.report])
            write_docs(merge(main_family), args, [merge(other) for other in others])
            return 0
        if args.quick:
            for name, value in QUICK.items():
                setattr(args, name, value)
        reason = unavailable_reason()
        if reason is not None:
            print(f"python -m benchmarks emulated: cannot build the emulated network: {reason}", file=sys.stderr)
            return 2
        results = run(args)
    except (ValueError, ConfigError) as error:
        print(f"python -m benchmarks emulated: {error}", file=sys.stderr)
        return 2
    if args.docs:
        write_docs(merge([results]), args)
    failures = sum(len(g["failures"]) for g in results["groups"])
    if failures:
        print(f"{failures} job(s) failed twice; their runs are missing from the results", file=sys.stderr)
    return 1 if failures else 0
