"""Two real 2-rank Horovod jobs at once on this host, neither with BYTESCHED_CHANNEL_PORT set:

- both open their rank-0 channel (rank 0 binds a free port and broadcasts it) without colliding;
- job "normal" runs with BYTESCHED_CHECK=5 and a timeline: the check stays silent, and every rank
  exits promptly after its last step, with its timeline flushed and no non-daemon thread left;
- job "perturbed" has rank 1's weights changed behind the scheduler's back: the check names the
  parameter and the rank.

One concurrent launch serves every assertion here (the launches dominate the cost).
"""

from __future__ import annotations

import json
import os
import re
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import SCRIPTS, require, require_executable, run_job

EXIT_AFTER_LAST_STEP_S = 10.0
"""Bound on a rank's exit (bytesched's and Horovod's exit handlers) after its last step; measured
1-3 s on the loaded 2-core test machine."""


@dataclass
class Job:
    output: str
    returncode: int
    timeline: Path | None = None


def horovod_job(args: list[str], env: dict[str, str]) -> Job:
    horovodrun = require_executable("horovodrun")
    result = run_job([horovodrun, "-np", "2", "-H", "localhost:2", "--gloo", sys.executable,
                      SCRIPTS / "reliability_train.py", *args], timeout=150, env=env)
    return Job(result.stdout, result.returncode)


@pytest.fixture(scope="module")
def jobs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Job]:
    require("horovod.torch", "Horovod built with PyTorch")
    timeline = tmp_path_factory.mktemp("timeline") / "tl.json"
    env = {k: v for k, v in os.environ.items() if k not in ("BYTESCHED_CHANNEL_PORT", "BYTESCHED_ORDER")}
    env["BYTESCHED_CHECK"] = "5"
    # Fusion off in the normal job: one task per parameter, so that its timeline has many events to
    # flush; no plan, which could pass the gradients through to Horovod, off the Core and its trace.
    runs = {"normal": (["--steps", "20"], dict(env, BYTESCHED_TIMELINE=str(timeline), BYTESCHED_FUSION_BYTES="1",
                                               BYTESCHED_PLAN="0")),
            "perturbed": (["--steps", "20", "--perturb-rank", "1", "--perturb-step", "6"], env)}
    with ThreadPoolExecutor(len(runs)) as pool:
        futures = {name: pool.submit(horovod_job, *run) for name, run in runs.items()}
        done = {name: future.result() for name, future in futures.items()}
    done["normal"].timeline = timeline
    return done


@pytest.mark.multiproc
@pytest.mark.timeout(200)
def test_two_jobs_without_a_channel_port_share_the_host(jobs: dict[str, Job]) -> None:
    for name, job in jobs.items():
        assert "cannot listen" not in job.output and "did not say hello" not in job.output, (name, job.output[-4000:])
    assert jobs["normal"].returncode == 0, jobs["normal"].output[-4000:]
    # The perturbed job's check ran at step 10, over its own channel, after both jobs had opened theirs.
    assert "ParameterDivergence" in jobs["perturbed"].output, jobs["perturbed"].output[-4000:]


@pytest.mark.multiproc
@pytest.mark.timeout(200)
def test_check_passes_on_a_normal_run(jobs: dict[str, Job]) -> None:
    out = jobs["normal"].output
    digests = re.findall(r"DONE rank=\d digest=(\w+)", out)
    assert len(digests) == 2 and digests[0] == digests[1], out[-4000:]
    assert "ParameterDivergence" not in out


@pytest.mark.multiproc
@pytest.mark.timeout(200)
def test_normal_end_is_prompt_flushed_and_leaves_no_thread(jobs: dict[str, Job]) -> None:
    """Every process exits promptly, the timeline is flushed, no thread blocks exit."""
    job = jobs["normal"]
    done = {int(r): float(t) for r, t in re.findall(r"DONE rank=(\d) .* at=([\d.]+)", job.output)}
    exited = {int(r): float(t) for r, t in re.findall(r"EXITED rank=(\d) at=([\d.]+)", job.output)}
    assert done.keys() == exited.keys() == {0, 1}, job.output[-4000:]
    for rank in (0, 1):
        took = exited[rank] - done[rank]
        assert took < EXIT_AFTER_LAST_STEP_S, f"rank {rank} took {took:.1f} s to exit after its last step"
    assert re.findall(r"THREADS rank=\d non_daemon=(\S+)", job.output) == ["-", "-"], job.output[-4000:]
    assert job.timeline is not None
    for rank in (0, 1):
        path = job.timeline.with_name(f"tl.{rank}.json")
        events = json.loads(path.read_text())  # a truncated (unflushed) file fails here
        events = events["traceEvents"] if isinstance(events, dict) else events
        flights = [e for e in events if e.get("name") == "in flight"]
        # 20 steps x 10 parameters, one partition each: every one recorded, none lost at exit
        assert len(flights) == 200, f"{path}: {len(flights)} 'in flight' events, expected 200"


@pytest.mark.multiproc
@pytest.mark.timeout(200)
def test_check_names_the_perturbed_parameter_and_rank(jobs: dict[str, Job]) -> None:
    out = jobs["perturbed"].output
    assert jobs["perturbed"].returncode != 0
    assert re.search(r"ParameterDivergence: BYTESCHED_CHECK: after step 10, parameter 'layers\.3\.bias' "
                     r"differs between rank 0 and rank\(s\) 1", out), out[-4000:]
