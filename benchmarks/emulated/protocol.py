"""How a worker reports a measured run to the harness: one ``BENCH-RESULT {json}`` line on rank 0.

The launchers prefix every output line with the rank (``[0]<stdout>:``, ``[worker 0] ``...), so
the harness looks for the marker anywhere in a line.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, Iterable

from .usage import Usage

MARKER = "BENCH-RESULT "


def emit(record: dict[str, Any]) -> None:
    """Print one result line (flushed at once: the harness shows progress as lines arrive)."""
    sys.stdout.write(MARKER + json.dumps(record, sort_keys=True) + "\n")
    sys.stdout.flush()


def emit_run(config: str, round_number: int, usage: Usage, steps: int, samples_per_step: int,
             plan: str | None = None) -> None:
    """Report one measured run of ``steps`` steps, each training on ``samples_per_step`` samples
    across all ranks (rank 0 calls it), with the start-up plan's summary if it ran one."""
    record = {"config": config, "round": round_number, "seconds": usage.seconds, "steps": steps,
              "samples_per_second": samples_per_step * steps / usage.seconds, "pid": os.getpid(),
              "cpu_seconds": usage.cpu_seconds, "machine_busy": usage.machine_busy}
    if plan is not None:
        record["plan"] = plan
    emit(record)


def parse(lines: Iterable[str]) -> list[dict[str, Any]]:
    """Every result record found in ``lines``."""
    records = []
    for line in lines:
        at = line.find(MARKER)
        if at >= 0:
            records.append(json.loads(line[at + len(MARKER):]))
    return records


def worker_parser(description: str) -> argparse.ArgumentParser:
    """The options every worker entry script takes (the harness builds them in :func:`worker_argv`)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--backend", required=True, help="horovod, torch or ps (framework-specific)")
    parser.add_argument("--model", required=True, help="a simulator profile name (emulated compute) or a real model")
    parser.add_argument("--size-scale", type=float, default=1.0)
    parser.add_argument("--time-scale", type=float, default=1.0)
    parser.add_argument("--steps", type=int, required=True, help="timed steps per run")
    parser.add_argument("--warmup", type=int, required=True, help="untimed steps before them")
    parser.add_argument("--runs", type=parse_runs, default=[],
                        help="CONFIG@ROUND,... in the order to run them")
    parser.add_argument("--sizes", type=parse_sizes, default={},
                        help="CONFIG=PARTITION:CREDIT,... (bytes) for configurations sized at run time")
    parser.add_argument("--calibrate", type=int, metavar="BYTES",
                        help="instead of runs: time a 4-byte and a BYTES operation and report them")
    return parser


def parse_worker_args(description: str, argv: list[str] | None = None) -> argparse.Namespace:
    """A worker's options, with exactly one of ``--runs`` and ``--calibrate``."""
    parser = worker_parser(description)
    args = parser.parse_args(argv)
    if bool(args.runs) == (args.calibrate is not None):
        parser.error("give either --runs or --calibrate")
    return args


def parse_runs(text: str) -> list[tuple[str, int]]:
    """``vanilla@0,p3@0`` -> [("vanilla", 0), ("p3", 0)]."""
    runs = []
    for item in text.split(","):
        name, at, number = item.partition("@")
        if not at or not number.isdigit():
            raise argparse.ArgumentTypeError(f"run {item!r}: expected CONFIG@ROUND")
        runs.append((name, int(number)))
    return runs


def parse_sizes(text: str) -> dict[str, tuple[int, int]]:
    """``bytescheduler-sim=1048576:2097152`` -> {"bytescheduler-sim": (1048576, 2097152)}."""
    sizes = {}
    for item in text.split(","):
        name, _, value = item.partition("=")
        partition, _, credit = value.partition(":")
        if not (name and partition.isdigit() and credit.isdigit()):
            raise argparse.ArgumentTypeError(f"sizes {item!r}: expected CONFIG=PARTITION:CREDIT in bytes")
        sizes[name] = (int(partition), int(credit))
    return sizes


def worker_argv(backend: str, model: str, size_scale: float, time_scale: float, steps: int, warmup: int,
                runs: Iterable[tuple[str, int]] = (), sizes: dict[str, tuple[int, int]] | None = None,
                calibrate: int | None = None) -> list[str]:
    """The worker options for one job (the inverse of :func:`worker_parser`)."""
    argv = ["--backend", backend, "--model", model, "--size-scale", repr(size_scale),
            "--time-scale", repr(time_scale), "--steps", str(steps), "--warmup", str(warmup)]
    if calibrate is not None:
        return argv + ["--calibrate", str(calibrate)]
    argv += ["--runs", ",".join(f"{name}@{number}" for name, number in runs)]
    if sizes:
        argv += ["--sizes", ",".join(f"{name}={p}:{c}" for name, (p, c) in sizes.items())]
    return argv
