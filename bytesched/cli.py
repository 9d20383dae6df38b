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
)


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with every registered subcommand."""
    parser = argparse.ArgumentParser(prog="bytesched", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=_version())
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    subparsers.required = True
    for name in SUBCOMMAND_MODULES:
        importlib.import_module(name).register(subparsers)
    return parser


def _version() -> str:
    from . import __version__
    return f"bytesched {__version__}"


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``bytesched`` console script."""
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
