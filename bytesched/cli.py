"""The single ``bytesched`` console script; each subcommand lives in the module that owns it.

A subcommand module exposes ``register(subparsers)``, which adds its parser and sets
``func=<callable(args) -> int>`` as the default. Modules are imported only when the console
script starts, so ``import bytesched`` stays free of torch, mxnet and matplotlib.
"""

from __future__ import annotations

import argparse
import importlib
import sys

SUBCOMMAND_MODULES: tuple[str, ...] = (
    "bytesched.sim.simulate_command",
    "bytesched.tools.profile_command",
    "bytesched.doctor",
    "bytesched.tools.check_gpu",
    "bytesched.launch.cli",
    "bytesched.analysis.timeline_command",
)


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with every registered subcommand."""
    parser = argparse.ArgumentParser(prog="bytesched", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=_version())
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    subparsers.required = True
    for name in SUBCOMMAND_MODULES:
        try:
            importlib.import_module(name).register(subparsers)
        except ImportError as error:  # a broken stack must not take `bytesched doctor` down with it
            _register_broken(subparsers, name, error)
    return parser


def _register_broken(subparsers: argparse._SubParsersAction, module: str, error: ImportError) -> None:
    """Register a subcommand whose module cannot be imported: running it explains why."""
    command = module.rsplit(".", 1)[-1].removesuffix("_command")
    if command == "cli":
        command = module.split(".")[-2]
    if command in subparsers.choices:  # it registered itself before a nested import failed
        del subparsers.choices[command]
    parser = subparsers.add_parser(command, help=f"(unavailable: {error})", add_help=False)
    parser.add_argument("rest", nargs=argparse.REMAINDER)

    def explain(args: argparse.Namespace) -> int:
        print(f"bytesched {command}: cannot load {module}: {error}. "
              "Run `bytesched doctor` to see what is missing.", file=sys.stderr)
        return 2

    parser.set_defaults(func=explain)


def _version() -> str:
    from . import __version__
    return f"bytesched {__version__}"


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``bytesched`` console script."""
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
