"""``python -m benchmarks <name>``: one subcommand per benchmark module.

Adding a benchmark is one line in :data:`BENCHMARKS`: the module path of something exposing
``register(subparsers)``, which adds its parser and sets ``func=<callable(args) -> int>``.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from . import REPO

BENCHMARKS: tuple[str, ...] = (
    "benchmarks.core",
    "benchmarks.tuning_study",
    "benchmarks.sim",
    "benchmarks.emulated",
    "benchmarks.soak",
    "benchmarks.overhead",
    "benchmarks.plan_study",
    "benchmarks.compiled",
    "benchmarks.scale",
    "benchmarks.gpu_shaped",
)


def build_parser() -> argparse.ArgumentParser:
    """The parser with every benchmark in :data:`BENCHMARKS`."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks",
                                     description="Run one of bytesched's benchmarks; each has --help and --json.")
    benchmarks = parser.add_subparsers(dest="benchmark", metavar="BENCHMARK")
    benchmarks.required = True
    for name in BENCHMARKS:
        importlib.import_module(name).register(benchmarks)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark ``argv`` names; the processes it starts can import this package."""
    path = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = str(REPO) if not path else f"{REPO}{os.pathsep}{path}"
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
