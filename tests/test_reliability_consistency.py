"""BYTESCHED_CHECK on real 2-rank Horovod jobs: silent on a normal run (which also ends promptly,
every rank exiting 0), loud on a rank whose weights were changed behind the scheduler's back."""

from __future__ import annotations

import os
import re
import socket
import sys
import time

import pytest

from conftest import SCRIPTS, require, require_executable, run_job


def horovod_job(*args: str, **env: str) -> tuple[str, int, float]:
    require("horovod.torch", "Horovod built with PyTorch")
    horovodrun = require_executable("horovodrun")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    job_env = dict(os.environ, BYTESCHED_CHANNEL_PORT=str(port), **env)
    start = time.monotonic()
    result = run_job([horovodrun, "-np", "2", "-H", "localhost:2", "--gloo", sys.executable,
                      SCRIPTS / "reliability_train.py", *args], timeout=150, env=job_env)
    return result.stdout, result.returncode, time.monotonic() - start


@pytest.mark.multiproc
@pytest.mark.timeout(200)
def test_check_passes_on_a_normal_run_and_every_rank_exits_promptly() -> None:
    out, code, _ = horovod_job("--steps", "20", BYTESCHED_CHECK="5")
    assert code == 0, out[-4000:]
    sums = re.findall(r"DONE rank=\d checksum=(\S+)", out)
    assert len(sums) == 2 and sums[0] == sums[1], out[-4000:]
    assert "ParameterDivergence" not in out


@pytest.mark.multiproc
@pytest.mark.timeout(200)
def test_check_names_the_perturbed_parameter_and_rank() -> None:
    out, code, _ = horovod_job("--steps", "20", "--perturb-rank", "1", "--perturb-step", "6", BYTESCHED_CHECK="5")
    assert code != 0
    assert re.search(r"ParameterDivergence: BYTESCHED_CHECK: after step 10, parameter 'layers\.3\.bias' "
                     r"differs between rank 0 and rank\(s\) 1", out), out[-4000:]
