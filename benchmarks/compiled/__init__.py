"""``python -m benchmarks compiled``: a compiled model (``torch.compile``) under bytesched against
compiled DDP, on an emulated network.

    python -m benchmarks compiled --json out.json
    python -m benchmarks compiled --configs ddp,bytesched,bytesched:inf --bandwidth 1gbit --repeats 5

Two emulated hosts (one rank each, torch.distributed over Gloo) joined by links shaped to
``--bandwidth``; the model is a simulator profile with emulated compute whose sleeps are custom
operators that ``torch.compile`` captures in one graph (:mod:`.model`), scaled as the emulated
benchmark scales it (gradients to ``--gradient-bytes``, compute to about the communication time at
``--balance-at``). Every round runs one job with every configuration, in an order rotated from round
to round; the report gives each configuration's median samples/s and its ratio to the first's.
Modules: :mod:`.model` (the compilable emulated model), :mod:`.worker` (a rank), :mod:`.command`.
"""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``python -m benchmarks compiled`` (the command module is imported when it runs, so the
    worker starts lean)."""
    from .command import build_parser
    build_parser(subparsers.add_parser(
        "compiled", help="a compiled model under bytesched against compiled DDP, on an emulated network",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter))
