"""`bytesched doctor` on the real stack, and on a bare interpreter where everything is missing."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

from conftest import REPO_ROOT


def test_doctor_passes_on_the_installed_stack() -> None:
    proc = subprocess.run([sys.executable, "-m", "bytesched.cli", "doctor", "--json"],
                          capture_output=True, text=True, timeout=600)
    findings = {f["name"]: f for f in json.loads(proc.stdout)}
    failed = [f for f in findings.values() if f["required"] and not f["ok"]]
    assert proc.returncode == 0 and not failed, failed
    assert findings["horovod"]["detail"] == "built with PyTorch, MXNet and Gloo"
    assert findings["csrc Dependency Proxies (MXNet plugin)"]["detail"].endswith("libbytesched_mxnet.so")


def test_doctor_names_missing_components_and_exits_non_zero() -> None:
    bare = shutil.which("python3.11", path="/usr/bin") or "/usr/bin/python3"
    env = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"}
    env["PYTHONPATH"] = str(REPO_ROOT)
    env["PATH"] = "/usr/bin:/bin"
    proc = subprocess.run([bare, "-S", "-m", "bytesched.cli", "doctor"], capture_output=True, text=True,
                          timeout=300, env=env, cwd="/")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "[FAIL] torch" in proc.stdout and "fix: run `make setup`" in proc.stdout
    assert "[FAIL] horovod: horovodrun not found" in proc.stdout
    assert "[FAIL] csrc Dependency Proxies (MXNet plugin)" in proc.stdout
