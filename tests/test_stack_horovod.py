"""The Horovod part of the stack: a real 2-rank ``horovodrun --gloo`` job with torch and MXNet."""

from __future__ import annotations

import re
import sys

import pytest

from conftest import SCRIPTS, require, require_executable, run_job


@pytest.mark.multiproc
@pytest.mark.timeout(150)
def test_horovodrun_gloo_allreduce_torch_and_mxnet() -> None:
    """Both framework bindings of the source-built Horovod sum exactly across 2 ranks."""
    require("torch")
    require("mxnet")
    require("horovod.torch", "Horovod built with PyTorch")
    require("horovod.mxnet", "Horovod built with MXNet")
    horovodrun = require_executable("horovodrun")

    result = run_job(
        [horovodrun, "-np", "2", "-H", "localhost:2", "--gloo",
         sys.executable, SCRIPTS / "hvd_allreduce.py"],
        timeout=120,
    )

    assert result.returncode == 0, result.stdout[-4000:]
    assert "FAIL" not in result.stdout, result.stdout[-4000:]
    for framework in ("torch", "mxnet"):
        ranks = set(re.findall(rf"HVD OK {framework} rank=(\d) size=2", result.stdout))
        assert ranks == {"0", "1"}, f"{framework}: ranks reporting OK: {ranks}\n{result.stdout}"
