"""``bytesched doctor``: check the installed stack and say what is wrong and how to fix it.

Each check runs in a fresh interpreter, because the failures it looks for are import-time
crashes (MXNet with numpy >= 1.24, a Horovod extension built without a framework) that would
otherwise take the doctor down with them.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass
from typing import Callable

FIX_SETUP = "run `make setup` (scripts/setup.sh) to install the tested stack into .venv"


@dataclass
class Finding:
    """The outcome of one check."""

    name: str
    ok: bool
    detail: str
    fix: str = ""
    required: bool = True


def _probe(code: str, timeout: float = 120.0) -> tuple[bool, str]:
    """Run ``code`` in a new interpreter; (succeeded, last line of output or error)."""
    try:
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return False, f"timed out after {timeout:.0f} s"
    text = (proc.stdout if proc.returncode == 0 else proc.stderr or proc.stdout).strip()
    last = text.splitlines()[-1] if text else f"exit code {proc.returncode}"
    return proc.returncode == 0, last


def check_torch() -> Finding:
    ok, out = _probe("import torch; print(torch.__version__)")
    return Finding("torch", ok, out, "" if ok else FIX_SETUP)


def check_mxnet_numpy() -> Finding:
    ok, out = _probe("import numpy, mxnet; print(f'mxnet {mxnet.__version__} with numpy {numpy.__version__}')")
    if ok:
        return Finding("mxnet", True, out)
    numpy_ok, numpy_version = _probe("import numpy; print(numpy.__version__)")
    hint = FIX_SETUP
    if numpy_ok and tuple(int(x) for x in numpy_version.split(".")[:2]) >= (1, 24):
        hint = f"numpy {numpy_version} breaks mxnet 1.9.1 (np.bool was removed): pip install numpy==1.23.5"
    return Finding("mxnet", False, out, hint)


def check_horovod() -> Finding:
    horovodrun = shutil.which("horovodrun", path=os.path.dirname(sys.executable)) or shutil.which("horovodrun")
    if horovodrun is None:
        return Finding("horovod", False, "horovodrun not found", FIX_SETUP)
    try:
        out = subprocess.run([horovodrun, "--check-build"], capture_output=True, text=True, timeout=120).stdout
    except subprocess.TimeoutExpired:
        return Finding("horovod", False, "horovodrun --check-build timed out", FIX_SETUP)
    missing = [what for what in ("PyTorch", "MXNet", "Gloo") if f"[X] {what}" not in out]
    if missing:
        return Finding("horovod", False, f"built without {', '.join(missing)}",
                       "rebuild Horovod with HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_MXNET=1 HOROVOD_WITH_GLOO=1 "
                       "(scripts/setup.sh does; delete the cached wheel under ~/.cache/bytesched/wheels first)")
    return Finding("horovod", True, "built with PyTorch, MXNet and Gloo")


def check_proxies() -> Finding:
    ok, out = _probe("from bytesched.plugins.mxnet.proxies import ProxyLibrary; print(ProxyLibrary().path)")
    return Finding("csrc Dependency Proxies (MXNet plugin)", ok, out,
                   "" if ok else "build them with `.venv/bin/python csrc/build.py` (needs g++ and mxnet)")


def check_channel() -> Finding:
    ok, out = _probe("import zmq; print('pyzmq', zmq.__version__)")
    return Finding("pyzmq (rank-0 channel)", ok, out, "" if ok else "pip install pyzmq")


def check_tuning() -> Finding:
    ok, out = _probe("import skopt; print('scikit-optimize', skopt.__version__)")
    return Finding("scikit-optimize (tuning)", ok, out, "" if ok else "pip install scikit-optimize==0.10.2",
                   required=False)


def check_docs() -> Finding:
    ok, out = _probe("import mkdocs, material; print('mkdocs', mkdocs.__version__, 'with the Material theme')")
    return Finding("mkdocs (documentation site)", ok, out,
                   "" if ok else "pip install -c requirements/constraints.txt mkdocs mkdocs-material", required=False)



CHECKS: tuple[Callable[[], Finding], ...] = (
    check_torch, check_mxnet_numpy, check_horovod, check_proxies, check_channel, check_tuning, check_docs,
)


def run(args: argparse.Namespace) -> int:
    """Run every check, print a report; exit 1 when a required component is missing."""
    findings = [check() for check in CHECKS]
    if args.json:
        print(json.dumps([asdict(f) for f in findings], indent=2))
    else:
        for f in findings:
            mark = "ok " if f.ok else ("FAIL" if f.required else "warn")
            print(f"[{mark}] {f.name}: {f.detail}")
            if f.fix:
                print(f"       fix: {f.fix}")
    return 0 if all(f.ok or not f.required for f in findings) else 1


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``bytesched doctor``."""
    parser = subparsers.add_parser("doctor", help="check the installed stack",
                                   description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.set_defaults(func=run)
