"""Starting and ending local Horovod jobs for the benchmarks that drive ``horovodrun`` themselves
(the ``soak`` and ``overhead`` benchmarks)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

KILL_GRACE_S = 20.0
"""Seconds horovodrun gets to end its ranks after SIGINT before the survivors are killed."""


def horovodrun_argv(ranks: int, module: str, worker_args: list[str]) -> list[str]:
    """The command that runs ``python -m module worker_args`` on ``ranks`` local Gloo ranks, with
    the horovodrun next to this interpreter (a venv's) or on PATH."""
    horovodrun = shutil.which("horovodrun", path=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    if horovodrun is None:
        raise SystemExit("horovodrun not found (pip install horovod with PyTorch and Gloo)")
    return [horovodrun, "-np", str(ranks), "-H", f"localhost:{ranks}", "--gloo", sys.executable, "-m", module,
            *worker_args]


def end_job(proc: subprocess.Popen[str]) -> None:
    """End horovodrun and its ranks. The ranks run in process groups of their own, so killing
    horovodrun's group would orphan them: SIGINT lets horovodrun end them, SIGKILL the rest."""
    import psutil
    try:
        family = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return
    proc.send_signal(signal.SIGINT)
    _, alive = psutil.wait_procs(family, timeout=KILL_GRACE_S)
    for survivor in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            survivor.kill()
