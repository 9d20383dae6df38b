"""MXNet over Horovod: ScheduledOptimizer on 2 ranks equals plain horovod.mxnet, bit for bit."""

from __future__ import annotations

import os
import re
import sys

import pytest

from conftest import SCRIPTS, require, require_executable, run_job


@pytest.mark.multiproc
@pytest.mark.timeout(150)
def test_scheduled_optimizer_equals_plain_horovod() -> None:
    """Each rank trains the same Gluon MLP twice, through hvd.DistributedOptimizer and through
    ScheduledOptimizer(hvd.DistributedOptimizer(...)) with partitions that split the weight
    matrices and a credit of three partitions; the weights must be identical."""
    require("horovod.mxnet", "Horovod built with MXNet")
    horovodrun = require_executable("horovodrun")

    result = run_job([horovodrun, "-np", "2", "-H", "localhost:2", "--gloo",
                      sys.executable, SCRIPTS / "mxnet_hvd.py"],
                     timeout=120, env={**os.environ, "BYTESCHED_PARTITION_BYTES": "1000",
                                       "BYTESCHED_CREDIT_BYTES": "3000"})

    assert result.returncode == 0, result.stdout[-4000:]
    verdicts = re.findall(r"HVD MXNET (\w+) rank=(\d) subtasks=(\d+)", result.stdout)
    assert sorted(rank for _, rank, _ in verdicts) == ["0", "1"], result.stdout[-4000:]
    assert {verdict for verdict, _, _ in verdicts} == {"EQUAL"}, result.stdout[-4000:]
    # 11 partitions per step (the 48x32 matrix alone is 7) over 12 steps
    assert {int(n) for _, _, n in verdicts} == {11 * 12}
