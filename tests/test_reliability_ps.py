"""A parameter server killed, or a worker frozen, mid-training (MXNet dist_sync through
ScheduledKVStore).

Under ``bytesched launch`` (1 server, 2 workers; tests/scripts/reliability_ps_worker.py):

- worker 0 SIGKILLs the server at step 3. ps-lite has no error for a lost server (the workers
  would block in C++ forever); the launcher sees the server die, says so and why the job cannot
  go on, stops every other process and exits 128+9, all within a bound counted from the fault.
- worker 1 stops itself (SIGSTOP) at step 3. Nothing exits and ps-lite waits for its push
  forever; only the rank-0 channel's heartbeats notice: worker 0 names the lost rank and exits
  70 (the fault exit code) once the fault timeout and the exit grace passed, and the launcher
  ends the job with that status.
"""

from __future__ import annotations

import os
import sys

import pytest

from bytesched.core.core import EXIT_GRACE_S, FAULT_EXIT_CODE
from conftest import SCRIPTS, output_after, require, require_executable, started

AFTER_FAULT_BOUND_S = 30.0  # measured 0.6 s (SIGTERM suffices); kill grace 2 s; the rest is slack for load
FAULT_TIMEOUT_S = 3
AFTER_FREEZE_BOUND_S = FAULT_TIMEOUT_S + EXIT_GRACE_S + 20.0  # the rest is slack for load


def launch_faulty_job(fault: list[str], marker: str, bound_s: float,
                     env: dict[str, str] | None = None) -> tuple[int, str, float]:
    """Run the worker script with ``fault`` under ``bytesched launch`` (1 server, 2 workers):
    the job's status, its output, and how long after the line with ``marker`` the output ended."""
    require("mxnet")
    argv = [require_executable("bytesched"), "launch", "--servers", "1", "--workers", "2", "--kill-grace", "2",
            "--", sys.executable, SCRIPTS / "reliability_ps_worker.py", *fault]
    with started(argv, env=env) as job:
        output, took = output_after(job, marker, bound_s)
    return job.returncode, output, took


@pytest.mark.multiproc
@pytest.mark.timeout(150)
def test_killed_server_ends_every_process_naming_the_server() -> None:
    status, output, took = launch_faulty_job(["--kill-server-at", "3"], "FAULT killing server", AFTER_FAULT_BOUND_S)
    assert status == 128 + 9, output[-4000:]
    assert ("[launch] server 0 was killed by SIGKILL; stopping the job: ps-lite cannot replace a lost server"
            in output), output[-4000:]
    assert ("how each process ended: scheduler was killed by SIGTERM, server 0 was killed by SIGKILL, "
            "worker 0 was killed by SIGTERM, worker 1 was killed by SIGTERM") in output, output[-4000:]
    assert took < AFTER_FAULT_BOUND_S
    print(f"job ended {took:.1f} s after the server was killed")


@pytest.mark.multiproc
@pytest.mark.timeout(150)
def test_a_frozen_worker_is_named_by_the_heartbeats_and_ends_the_job() -> None:
    status, output, took = launch_faulty_job(["--freeze-worker-at", "3"], "FAULT freezing worker 1",
                                             AFTER_FREEZE_BOUND_S,
                                             dict(os.environ, BYTESCHED_FAULT_TIMEOUT_S=str(FAULT_TIMEOUT_S)))
    assert status == FAULT_EXIT_CODE, output[-4000:]
    assert "rank 1 was lost" in output, output[-4000:]
    assert f"[launch] worker 0 exited with code {FAULT_EXIT_CODE}; stopping the job" in output, output[-4000:]
    assert took < AFTER_FREEZE_BOUND_S
    print(f"job ended {took:.1f} s after worker 1 froze")
