"""Where a benchmark result came from: the command, with the settings its jobs inherit from the
environment, and the code revision, so a result can be told apart from one taken before or after
a change, or under other settings."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys

from . import REPO


def revision() -> str | None:
    """The git commit bytesched ran from (``+changes`` if tracked files were modified); None
    outside a checkout."""
    root = REPO
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, timeout=10)
        changes = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                                 capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if head.returncode != 0:
        return None
    return head.stdout.strip() + ("+changes" if changes.stdout.strip() else "")


INHERITED_PREFIXES = ("BYTESCHED_", "HOROVOD_", "MXNET_")
"""Environment variables that every job of a benchmark inherits and that change what it measures
(a ``BYTESCHED_FUSION_BYTES`` set for the whole run changes every bytesched configuration)."""


def command_line(benchmark: str) -> str:
    """How this run of ``python -m benchmarks <benchmark>`` was started, as one shell line: the
    inherited settings of :data:`INHERITED_PREFIXES` set in the environment, then the command."""
    argv = sys.argv[sys.argv.index(benchmark) + 1:] if benchmark in sys.argv else sys.argv[1:]
    settings = [f"{name}={value}" for name, value in sorted(os.environ.items())
                if name.startswith(INHERITED_PREFIXES)]
    return shlex.join([*settings, "python", "-m", "benchmarks", benchmark, *argv])
