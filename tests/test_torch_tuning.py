"""Tuning in the PyTorch plugin, end to end: real 2-rank jobs (horovodrun over Gloo, torchrun).

Each launch runs several cases of tests/scripts/torch_tuning.py and is shared by the tests below
(module-scoped fixtures; start-up costs most of a launch). Trials are 6 steps (3 measured, 3 of
announcement lead), 2 of them: every rank switches at steps 0 and 6 and to the kept sizes at 12.
The protocol's corner cases with made-up clocks and real channels are in test_tuning_session.py;
here the plugin's step boundaries drive it and real all-reduces depend on it.
"""

from __future__ import annotations

import csv
import dataclasses
import sys
from pathlib import Path
from typing import Any

import pytest

from bytesched.core import Config, SchedulingParams
from bytesched.runtime import needs_channel
from bytesched.tuning.log import load_best
from bytesched.tuning.space import space_for
from conftest import SCRIPTS, require, require_executable, run_job
from test_torch_plugin import Launch, free_port, job_env

SWITCH_STEPS = [0, 6, 12]
WIDE_MODEL_BYTES = 4 * (32 * 256 + 256 + 256 * 8192 + 8192 + 8192 * 10 + 10)
"""The gradient bytes of the script's WideMLP, to which the tuner fits its lattice."""
OPENING_BATCH = 250_000
"""The torch.distributed job's configured batching threshold: trial 0 batches under it (a point of
the batching axis, so the opening keeps it exactly)."""
TRIAL_ENV = {"BYTESCHED_TUNING_MAX_TRIALS": "2", "BYTESCHED_TUNING_STEPS_PER_TRIAL": "6",
             "BYTESCHED_TUNING_WARMUP_STEPS": "0", "BYTESCHED_LOG_LEVEL": "INFO"}


class TuningLaunch(Launch):
    """A launch of torch_tuning.py: its CASE lines, plus each rank's TUNED report per case."""

    def tuned(self, case: str) -> dict[int, dict[str, Any]]:
        return self.json_lines("TUNED", case)

    def agreed(self, case: str) -> dict[str, Any]:
        """Every rank applied the same switches at the same steps and kept the same sizes."""
        reports = self.tuned(case)
        first = reports[0]
        for rank, report in reports.items():
            assert (report["applied"], report["tuned"]) == (first["applied"], first["tuned"]), \
                f"{case}: rank {rank} switched {report['applied']} and kept {report['tuned']}, rank 0 " \
                f"switched {first['applied']} and kept {first['tuned']}"
        return first


def torch_tuning(launcher: list[Any], backend: str, cases: str, log_dir: Path, timeout: float,
                 *options: Any) -> TuningLaunch:
    result = run_job([*launcher, SCRIPTS / "torch_tuning.py", "--backend", backend, "--cases", cases,
                      "--log-dir", log_dir, *options], timeout=timeout, env={**job_env(), **TRIAL_ENV})
    return TuningLaunch(2, result.stdout, result.returncode)


@pytest.fixture(scope="module")
def log_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("tuning")


@pytest.fixture(scope="module")
def horovod_job(log_dir: Path) -> TuningLaunch:
    """Tune (crossing the barrier), a late switch (barrier mode), a slow rank 0, then load the
    first log."""
    require("horovod.torch", "Horovod built with PyTorch")
    launcher = [require_executable("horovodrun"), "-np", "2", "-H", "localhost:2", "--gloo", sys.executable]
    return torch_tuning(launcher, "horovod", "tune,late,slow,load", log_dir, 240)


@pytest.fixture(scope="module")
def dist_job(tmp_path_factory: pytest.TempPathFactory) -> TuningLaunch:
    """torch.distributed in rank-0 order: tune, opening with batching while busy under
    :data:`OPENING_BATCH` bytes, then a lost switch (which ends the job)."""
    launcher = [require_executable("torchrun"), "--nproc-per-node", "2", "--master-port", str(free_port())]
    return torch_tuning(launcher, "dist", "tune,lost", tmp_path_factory.mktemp("dist"), 200,
                        "--opening-batch", OPENING_BATCH)


def kept_sizes(log: Path) -> list[int]:
    best = load_best(str(log))
    return [int(best.partition_bytes), int(best.credit_bytes), int(best.batch_bytes)]  # type: ignore[arg-type]


def test_tuning_opens_the_channel_in_immediate_order_too() -> None:
    """Horovod's followers need no order from rank 0, but tuning needs its switches (the fault
    watch, off here, opens the channel by itself: docs/reliability.md)."""
    unwatched = Config(fault_timeout_s=0.0)
    assert not needs_channel(unwatched, "immediate", 2)
    assert needs_channel(dataclasses.replace(unwatched, tuning=True), "immediate", 2)
    assert needs_channel(dataclasses.replace(unwatched, tuning_load="best.csv"), "immediate", 2)
    assert not needs_channel(dataclasses.replace(unwatched, tuning=True), "rank0", 1)


@pytest.mark.parametrize("samples", [0, -32, float("nan"), float("inf")])
def test_samples_per_step_must_be_a_positive_number(samples: float) -> None:
    torch = require("torch")
    from bytesched.plugins.torch import ScheduledOptimizer

    model = torch.nn.Linear(2, 2)
    with pytest.raises(ValueError, match="samples_per_step must be a positive number"):
        ScheduledOptimizer(model, torch.optim.SGD(model.parameters(), lr=0.1), samples_per_step=samples)


@pytest.mark.multiproc
@pytest.mark.timeout(300)
def test_horovod_tuning_finishes_its_trials_ranks_agree_and_results_are_unchanged(horovod_job: TuningLaunch,
                                                                                  log_dir: Path) -> None:
    """Crossing the barrier: both trials, the same switches on both ranks at the agreed steps, the
    same bits as plain hvd.DistributedOptimizer, and the log's best is what both ranks kept."""
    horovod_job.check(["tune/same_as_unscheduled", "tune/finished"])
    assert "bytesched tuning: warm start measured" in horovod_job.output  # rank 0: the search's first points
    agreed = horovod_job.agreed("tune")
    assert [step for step, *_ in agreed["applied"]] == SWITCH_STEPS
    assert agreed["applied"][-1][1:] == agreed["tuned"]
    assert [round(size, -3) for size in agreed["tuned"]] == kept_sizes(log_dir / "tune.csv")  # MB to the kB
    space = space_for("allreduce", model_bytes=WIDE_MODEL_BYTES)  # 137 KB to 8.8 MB partitions
    lattice = {space.params(point) for point in space.points()}
    assert all(SchedulingParams(partition, credit, batch_bytes=batch) in lattice
               for _, partition, credit, batch in agreed["applied"])  # Horovod does not batch: always 0
    with (log_dir / "tune.csv").open() as file:
        rows = list(csv.DictReader(file))
    assert [row["trial"] for row in rows] == ["0", "1", "best"]
    assert rows[0]["source"] == "configured" and rows[-1]["source"] == "final"
    assert all(float(row["samples_per_s"]) > 0 for row in rows)
    for row, (_, partition, credit, _) in zip(rows, agreed["applied"]):
        assert [round(float(row["partition_mb"]) * 1e6), round(float(row["credit_mb"]) * 1e6)] == \
            [round(partition, -3), round(credit, -3)], row


@pytest.mark.multiproc
@pytest.mark.timeout(300)
def test_horovod_late_switch_is_waited_for_at_the_agreed_step_in_barrier_mode(horovod_job: TuningLaunch) -> None:
    """Rank 0's switch of trial 1 leaves 4 s late: the follower waits for it at step 6 and both
    ranks still switch at steps 0, 6 and 12, with unchanged results."""
    horovod_job.check(["late/same_as_unscheduled", "late/finished"])
    agreed = horovod_job.agreed("late")
    assert [step for step, *_ in agreed["applied"]] == SWITCH_STEPS
    follower_wait = horovod_job.tuned("late")[1]["longest_wait_s"]
    assert follower_wait >= 1.0, f"the follower never waited for the late switch ({follower_wait} s)"


@pytest.mark.multiproc
@pytest.mark.timeout(300)
def test_horovod_slow_rank0_never_makes_a_switch_late(horovod_job: TuningLaunch) -> None:
    """Rank 0 sleeps 4 s after backward of steps 2 and 3, around its decision (at the boundary of
    step 3) of the switch of step 6: the follower is held by the all-reduces, not in on_step, and
    both ranks switch at steps 0, 6 and 12 with unchanged results."""
    horovod_job.check(["slow/same_as_unscheduled", "slow/finished"])
    agreed = horovod_job.agreed("slow")
    assert [step for step, *_ in agreed["applied"]] == SWITCH_STEPS
    follower_wait = horovod_job.tuned("slow")[1]["longest_wait_s"]
    assert follower_wait < 1.0, f"the follower waited {follower_wait} s for a switch although rank 0 was only slow"


@pytest.mark.multiproc
@pytest.mark.timeout(300)
def test_horovod_tuning_load_starts_from_the_logged_best(horovod_job: TuningLaunch, log_dir: Path) -> None:
    """BYTESCHED_TUNING_LOAD alone: rank 0 reads the log and both ranks run its best from step 3."""
    horovod_job.check(["load/same_as_unscheduled", "load/finished"])
    agreed = horovod_job.agreed("load")
    assert agreed["applied"] == [[3, *kept_sizes(log_dir / "tune.csv")]]
    assert horovod_job.returncode == 0, horovod_job.output[-3000:]


@pytest.mark.multiproc
@pytest.mark.timeout(300)
def test_distributed_rank0_order_tuning_keeps_results(dist_job: TuningLaunch) -> None:
    """torch.distributed: followers obey rank 0's order, so a rank partitioning (or batching) a step
    differently would deadlock; tuning switches both ranks alike, searches the batching threshold
    too, opening with the configured one, and results stay bit-identical."""
    dist_job.check(["tune/same_as_unscheduled", "tune/finished"])
    agreed = dist_job.agreed("tune")
    assert [step for step, *_ in agreed["applied"]] == SWITCH_STEPS
    assert agreed["applied"][0][3] == OPENING_BATCH
    space = space_for("allreduce", model_bytes=WIDE_MODEL_BYTES, batches=True)
    lattice = {space.params(point) for point in space.points()}
    assert all(SchedulingParams(partition, credit, batch_bytes=batch) in lattice
               for _, partition, credit, batch in agreed["applied"])


@pytest.mark.multiproc
@pytest.mark.timeout(300)
def test_distributed_lost_switch_fails_the_follower_within_the_timeout(dist_job: TuningLaunch) -> None:
    """Rank 0 never sends trial 1's switch: the follower fails at step 6 after the channel timeout
    (8 s) naming the step, the job exits non-zero, and no rank reports a finished run."""
    lost = dist_job.cases.get("lost/follower_fails_clearly", {})
    assert set(lost) == {1} and lost[1][0], f"{lost}\n{dist_job.output[-3000:]}"
    assert "step 6" in lost[1][1], lost[1][1]
    assert dist_job.returncode != 0
    assert "TuningProtocolError" in dist_job.output
