"""Where a benchmark result came from: the code revision, so a result can be told apart from one
taken before or after a change."""

from __future__ import annotations

import subprocess

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
