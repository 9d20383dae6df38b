"""A Gluon training script written the way published ones are (Trainer given collect_params(), a
CNN with batch norm, Adam, an evaluation pass after every epoch) on a real dist_sync parameter
server, 2 workers x 2 servers: every path bytesched can take ends with exactly the plain store's
trained weights.

The evaluation passes matter: outside autograd.record(), MXNet's MKLDNN convolutions rewrite
their weight arrays in place into a blocked memory layout, which the next step's pull then writes
into. MXNet's own store copies into the whole array and copes; a pull into a view of it fails
MXNet's `!is_view` check, and one into an avatar wrote the default layout into memory the weight
still read as blocked (csrc/proxies.cc, "MKLDNN layouts").
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import SCRIPTS, require, require_executable, run_job

pytestmark = pytest.mark.multiproc

SCRIPT = SCRIPTS / "gluon_eval.py"
JOB_TIMEOUT = 240
_references: dict[tuple[int, int], Path] = {}


def launch(out: Path, store: str, seed: int, contexts: int, env: dict[str, str] | None = None) -> None:
    """One 2-worker x 2-server job of the script; both workers must finish."""
    require("mxnet")
    result = run_job([require_executable("bytesched"), "launch", "--servers", "2", "--workers", "2",
                      "--timeout", str(JOB_TIMEOUT - 10), "--", sys.executable, SCRIPT, "--store", store,
                      "--out", out, "--seed", str(seed), "--contexts", str(contexts)],
                     timeout=JOB_TIMEOUT, env={**os.environ, **(env or {})})
    assert result.returncode == 0, result.stdout[-6000:]
    assert len(re.findall(r"^\[worker \d\] EVALUATED", result.stdout, re.M)) == 2, result.stdout[-6000:]


def reference(tmp_path_factory: pytest.TempPathFactory, seed: int, contexts: int) -> Path:
    """The plain store's run of (seed, contexts), made once per test session."""
    if (seed, contexts) not in _references:
        out = tmp_path_factory.mktemp(f"plain-{seed}-{contexts}")
        launch(out, "plain", seed, contexts)
        _references[seed, contexts] = out
    return _references[seed, contexts]


@pytest.mark.parametrize("seed, contexts, env", [
    pytest.param(0, 1, {}, id="no-settings"),
    pytest.param(1, 1, {}, id="no-settings-seed1"),
    pytest.param(0, 2, {"BYTESCHED_POLICY": "off"}, id="off-2-contexts"),
    pytest.param(0, 1, {"BYTESCHED_PARTITION_BYTES": "1KB", "BYTESCHED_CREDIT_BYTES": "4KB"}, id="core-1kb")])
def test_training_with_evaluation_passes_ends_with_the_plain_stores_weights(
        tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, seed: int, contexts: int,
        env: dict[str, str]) -> None:
    """No settings (the start-up plan, which stays out on this small model and passes through),
    scheduling off with two contexts per worker (MXNet reduces them on the worker), and the Core
    with 1 KB partitions (every convolution's weight split): after three epochs of three steps,
    each followed by an evaluation pass, the trained parameters equal the plain store's, bit for
    bit."""
    plain = reference(tmp_path_factory, seed, contexts)
    launch(tmp_path, "scheduled", seed, contexts, env)
    for worker in (0, 1):
        with np.load(plain / f"worker{worker}.npz") as want, np.load(tmp_path / f"worker{worker}.npz") as got:
            assert want.files == got.files
            for name in want.files:
                diff = float(np.abs(got[name] - want[name]).max())
                assert np.array_equal(got[name], want[name]), f"worker {worker} {name}: max |diff| {diff}"
