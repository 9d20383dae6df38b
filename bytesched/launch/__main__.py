"""``python -m bytesched.launch --servers 2 --workers 2 -- python train.py``."""

from __future__ import annotations

import sys
from typing import Sequence

from bytesched.launch.ps import build_parser, run


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` (default: the command line) and run the parameter-server job."""
    return run(build_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
