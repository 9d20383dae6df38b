"""Every script in examples/ runs, in a tiny configuration, so none of them rots.

The trainings must also learn: each prints its test accuracy, which must beat chance (10%)
clearly. The synthetic benchmark records a BYTESCHED_TIMELINE, which `bytesched timeline`
must then read: a real two-rank trace end to end.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

import pytest

from bytesched.launch.ports import free_port
from conftest import REPO_ROOT, require, require_executable, run_job

EXAMPLES = REPO_ROOT / "examples"
pytestmark = [pytest.mark.multiproc, pytest.mark.timeout(420)]  # generous: the machine may be shared


def accuracies(output: str) -> list[float]:
    return [float(a) for a in re.findall(r"test accuracy ([\d.]+)%", output)]


def test_pytorch_synthetic_benchmark_with_a_timeline_read_by_bytesched_timeline(tmp_path: Path) -> None:
    horovodrun = require_executable("horovodrun")
    require("horovod.torch", "Horovod with PyTorch")
    result = run_job([horovodrun, "-np", "2", "-H", "localhost:2", "--gloo", sys.executable,
                      EXAMPLES / "pytorch_synthetic_benchmark.py", "--bytesched", "--num-warmup", "1",
                      "--num-batches-per-iter", "2", "--num-iters", "2", "--batch-size", "8"],
                     timeout=300, env={**os.environ, "BYTESCHED_TIMELINE": str(tmp_path / "tl.json"),
                                           "BYTESCHED_PARTITION_BYTES": "4MB"})
    assert result.returncode == 0, result.stdout[-3000:]
    assert "Total img/sec on 2 CPU rank(s)" in result.stdout
    proc = subprocess.run([sys.executable, "-m", "bytesched.cli", "timeline", str(tmp_path / "tl.json"), "--json"],
                          capture_output=True, text=True, timeout=120, cwd=REPO_ROOT)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["ranks"] == [0, 1]
    steps = [s for s in report["steps"] if s["rank"] == 0]
    assert len(steps) == 1 + 2 * 2  # warm-up and timed steps, one task instance each
    # The CNN's 10 tensors in the default 1 MB fusion buckets: the convolutions' 6 in one, fc1.weight
    # (4 MiB) alone and split at the 4 MB partition size set here into 2 (the start-up plan, which
    # would choose its own from the third step, is off when a size is set), fc1.bias with fc2: 4 partitions.
    assert all(s["subtasks"] == 4 for s in steps)
    assert all(s["iteration_s"] > 0 and s["comm_s"] > 0 for s in steps[:-1])


def test_pytorch_cnn_learns_under_torchrun() -> None:
    torchrun = require_executable("torchrun")
    result = run_job([torchrun, "--nproc-per-node", "2", "--master-port", str(free_port()),
                      EXAMPLES / "pytorch_train_cnn.py", "--epochs", "2", "--train-size", "256"], timeout=300)
    assert result.returncode == 0, result.stdout[-3000:]
    assert accuracies(result.stdout)[-1] > 25, result.stdout


def test_mxnet_gluon_with_scheduled_kvstore_via_bytesched_launch() -> None:
    bytesched = require_executable("bytesched")
    require("mxnet", "MXNet")
    result = run_job([bytesched, "launch", "--servers", "1", "--workers", "2", "--", sys.executable,
                      EXAMPLES / "mxnet_gluon_ps.py", "--epochs", "2", "--train-size", "256"], timeout=300)
    assert result.returncode == 0, result.stdout[-3000:]
    final = accuracies(result.stdout)[-2:]
    assert len(final) == 2 and min(final) > 50, result.stdout


def test_mxnet_over_horovod() -> None:
    horovodrun = require_executable("horovodrun")
    result = run_job([horovodrun, "-np", "2", "-H", "localhost:2", "--gloo", sys.executable,
                      EXAMPLES / "mxnet_horovod.py", "--epochs", "2", "--train-size", "256"], timeout=300)
    assert result.returncode == 0, result.stdout[-3000:]
    assert accuracies(result.stdout)[-1] > 50, result.stdout



def epoch_lines(output: str) -> list[str]:
    return re.findall(r"epoch \d+: loss [\d.]+, test accuracy [\d.]+%", output)


def trains_alike(command: Callable[[str], list[Any]]) -> None:
    """``command(mode)`` run with ``--bytesched`` and ``--no-bytesched`` prints the same losses and
    accuracies, and learns."""
    runs = [run_job(command(mode), timeout=300) for mode in ("--bytesched", "--no-bytesched")]
    for result in runs:
        assert result.returncode == 0, result.stdout[-3000:]
    scheduled, plain = (epoch_lines(result.stdout) for result in runs)
    assert len(scheduled) == 2 and scheduled == plain, (scheduled, plain)
    assert accuracies(runs[0].stdout)[-1] > 25, runs[0].stdout


def test_pytorch_compiled_model_under_torchrun_trains_as_with_ddp() -> None:
    """torch.compile(model), DistributedSampler, accumulation, evaluation every epoch: the same
    losses and accuracies with bytesched as with DistributedDataParallel."""
    torchrun = require_executable("torchrun")
    trains_alike(lambda mode: [torchrun, "--nproc-per-node", "2", "--master-port", str(free_port()),
                               EXAMPLES / "pytorch_compile_torchrun.py", "--epochs", "2", "--steps-per-epoch", "8",
                               mode])


def test_pytorch_compiled_training_step_under_horovod_trains_as_plain_horovod() -> None:
    """A compiled forward-and-loss function, backward_passes_per_step, evaluation every epoch: the
    same losses and accuracies with bytesched's two lines as without them."""
    horovodrun = require_executable("horovodrun")
    require("horovod.torch", "Horovod with PyTorch")
    trains_alike(lambda mode: [horovodrun, "-np", "2", "-H", "localhost:2", "--gloo", sys.executable,
                               EXAMPLES / "pytorch_compile_horovod.py", "--epochs", "2", "--steps-per-epoch", "8",
                               mode])
