"""A short ``python -m benchmarks soak`` (the full one is 2,000 steps, docs/reliability.md): the real
command, scheduled and plain Horovod runs on 2 ranks with random per-layer backward delays, must
finish, keep RSS within 5 % after warm-up and end with bit-identical parameters."""

from __future__ import annotations

import json
import os
import sys

import pytest

from conftest import require, require_executable, run_job


@pytest.mark.multiproc
@pytest.mark.timeout(300)
def test_short_soak_has_no_deadlock_stable_memory_and_identical_parameters() -> None:
    require("horovod.torch", "Horovod built with PyTorch")
    require_executable("horovodrun")
    env = {k: v for k, v in os.environ.items() if k not in ("BYTESCHED_CHANNEL_PORT", "BYTESCHED_ORDER")}
    result = run_job([sys.executable, "-m", "benchmarks", "soak", "--steps", "100", "--report-every", "20",
                      "--warmup", "40", "--delay-ms", "1", "--timeout", "240", "--json"], timeout=280, env=env)
    assert result.stdout.strip(), "no output"
    report = json.loads(result.stdout[result.stdout.index("{"):])
    assert report["passed"], "\n".join(report["problems"])
    assert result.returncode == 0
    assert report["parameters_identical"] is True
    for run in report["runs"].values():
        assert len(run["digests"]) == 2 and all(len(samples) == 5 for samples in run["rss_mib"].values()), run
        assert all(drift is not None and drift <= 0.05 for drift in run["rss_drift"].values()), run
