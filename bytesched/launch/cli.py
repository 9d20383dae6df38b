"""``bytesched launch``: run a command as the workers of a local MXNet parameter-server job.

    bytesched launch --servers 2 --workers 2 -- python train.py

The same options as ``python -m bytesched.launch`` (:mod:`bytesched.launch.ps` does the work).
Multi-host jobs are described in docs/plugins/mxnet.md ("Launcher").
"""

from __future__ import annotations

import argparse

from bytesched.launch.ps import build_parser, run


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``launch`` subcommand."""
    parser = subparsers.add_parser(
        "launch",
        help="start a local parameter-server job (scheduler, servers, workers)",
        description="Run a command as the workers of a local MXNet parameter-server job: one "
                    "ps-lite scheduler, --servers servers and --workers workers on the local host, "
                    "with the DMLC_* and BYTESCHED_RANK/WORLD_SIZE variables set. Output lines "
                    "are prefixed with role and rank; if any process fails, all are stopped and "
                    "the exit status is non-zero.",
        epilog="example: bytesched launch --servers 2 --workers 2 -- python train.py",
    )
    build_parser(parser)
    parser.set_defaults(func=run)
