"""``bytesched bench <name>``: one sub-subcommand per benchmark module.

Adding a benchmark is one line in :data:`BENCHMARKS`: the module path of something exposing
``register(subparsers)``, which adds its parser and sets ``func=<callable(args) -> int>``.
Benchmark modules are imported only when the console script builds its parser.
"""

from __future__ import annotations

import argparse
import importlib

BENCHMARKS: tuple[str, ...] = (
    "bytesched.bench.core",
    "bytesched.tuning.study",
    "bytesched.sim.benchmark",
    "bytesched.bench.emulated",
    "bytesched.bench.soak",
    "bytesched.bench.overhead",
)


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``bench`` and every benchmark in :data:`BENCHMARKS` under it."""
    parser = subparsers.add_parser("bench", help="run a benchmark (Core throughput, ...)",
                                   description="Run one of the benchmarks; each has --help and --json.")
    benchmarks = parser.add_subparsers(dest="benchmark", metavar="BENCHMARK")
    benchmarks.required = True
    for name in BENCHMARKS:
        importlib.import_module(name).register(benchmarks)
