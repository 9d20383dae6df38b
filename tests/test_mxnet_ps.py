"""ScheduledKVStore on a real MXNet parameter server: 2 workers x 2 servers via `bytesched launch`.

Each job trains the small Gluon MLP of tests/scripts/mxnet_train.py for 20 steps (SGD with
momentum and weight decay, updates on the servers); a scheduled job must end with exactly the
weights of the plain dist_sync job, bit for bit. Partitions are small enough to split every
weight matrix, and the credit small enough that only a few partitions are in flight.
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import numpy as np
import pytest

from bytesched.core.config import POLICIES
from bytesched.tuning.space import space_for
from conftest import SCRIPTS, output_after, require, require_executable, run_job, started

TRAIN = SCRIPTS / "mxnet_train.py"
# A job takes 10-20 s on an idle machine; the bounds leave room for a shared, loaded one (a job
# that deadlocks still fails, just later). A test with the `plain` fixture may run two jobs.
JOB_TIMEOUT = 240
TWO_JOBS = 2 * JOB_TIMEOUT + 30


def launch(out: Path, *train_args: str, env: dict[str, str] | None = None,
           timeout: float = JOB_TIMEOUT) -> str:
    """Run one 2-worker x 2-server job of the training script; return its output."""
    require("mxnet")
    bytesched = require_executable("bytesched")
    result = run_job([bytesched, "launch", "--servers", "2", "--workers", "2",
                      "--timeout", str(timeout - 10), "--", sys.executable, TRAIN,
                      "--out", out, *train_args],
                     timeout=timeout, env={**os.environ, **(env or {})})
    assert result.returncode == 0, result.stdout[-6000:]
    assert len(re.findall(r"^\[worker \d\] TRAINED", result.stdout, re.M)) == 2, result.stdout[-6000:]
    return result.stdout


def weights(path: Path) -> dict[str, np.ndarray]:
    with np.load(path) as data:
        return {name: data[name] for name in data.files}


def assert_same_weights(reference_file: Path, run: Path) -> None:
    """Both workers of ``run`` end with exactly the weights in ``reference_file``."""
    reference = weights(reference_file)
    for worker in (0, 1):
        got = weights(run / f"worker{worker}.npz")
        assert got.keys() == reference.keys()
        for param, value in reference.items():
            diff = float(np.abs(got[param] - value).max())
            assert np.array_equal(got[param], value), f"worker {worker} {param}: max |diff| {diff}"


def subtasks(output: str) -> list[int]:
    return [int(n) for n in re.findall(r"TRAINED steps=\d+ subtasks=(\d+)", output)]


def orders(output: str) -> list[str]:
    return re.findall(r"TRAINED .* order=(\w+)", output)


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The reference: the plain dist_sync store, weights after 5 and 20 steps."""
    out = tmp_path_factory.mktemp("plain")
    launch(out, "--store", "plain", "--snapshot-at", "5")
    return out


@pytest.mark.multiproc
@pytest.mark.timeout(TWO_JOBS)
@pytest.mark.parametrize("policy", POLICIES)
def test_scheduled_dist_sync_equals_plain(plain: Path, tmp_path: Path, policy: str) -> None:
    output = launch(tmp_path, "--store", "scheduled",
                    env={"BYTESCHED_POLICY": policy, "BYTESCHED_PARTITION_BYTES": "1000",
                         "BYTESCHED_CREDIT_BYTES": "2000"})

    assert_same_weights(plain / "worker0.npz", tmp_path)
    assert orders(output) == ["immediate" if policy == "fifo" else "rank0"] * 2  # fifo holds nothing back
    # 16 partitions per step (a 1536-element matrix alone is 7): tensors really were split;
    # fifo is the no-scheduler baseline and never partitions (6 tensors per step)
    assert subtasks(output) == [(6 if policy == "fifo" else 16) * 20] * 2


BLOCKS = 12
DEEP = [f"layer{i}_{kind}" for i in range(2, BLOCKS + 2) for kind in ("weight", "bias")]
"""The deep model's parameters in forward order; the Trainer, given the dict, numbers them by
name (layer10 ... layer13 first)."""


@pytest.fixture(scope="module")
def plain_deep(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The reference of the 12-layer model: the plain dist_sync store."""
    out = tmp_path_factory.mktemp("plain_deep")
    launch(out, "--store", "plain", "--blocks", str(BLOCKS))
    return out


@pytest.mark.multiproc
@pytest.mark.timeout(TWO_JOBS)
@pytest.mark.parametrize("policy", ["bytescheduler", "tictac"])
def test_a_trainer_given_collect_params_is_scheduled_in_the_forward_order(plain_deep: Path, tmp_path: Path,
                                                                          policy: str) -> None:
    """Twelve layers named layer2 ... layer13 and ``gluon.Trainer(net.collect_params())``: MXNet's
    priorities follow the names, the store's the first forward pass, on both workers (and in rank
    0's timeline: the order recorded, and the partitions' tracks sorted by it); tictac orders the
    chain by TIC on the traced pass, which is the forward order again. The weights are the plain
    store's, bit for bit."""
    output = launch(tmp_path, "--store", "scheduled", "--blocks", str(BLOCKS),
                    env={"BYTESCHED_POLICY": policy, "BYTESCHED_PARTITION_BYTES": "1000",
                         "BYTESCHED_CREDIT_BYTES": "2000", "BYTESCHED_LOG_LEVEL": "info",
                         "BYTESCHED_TIMELINE": str(tmp_path / "tl.json")})

    assert_same_weights(plain_deep / "worker0.npz", tmp_path)
    assert re.findall(r"TRAINED .* priority=(\S+)", output) == [",".join(DEEP)] * 2, output[-4000:]
    assert output.count("tictac orders the tasks by TIC") == (2 if policy == "tictac" else 0), output[-4000:]
    by_key = sorted(DEEP)  # the Trainer's numbering
    events = json.loads((tmp_path / "tl.0.json").read_text())
    (recorded,) = [e["args"] for e in events if e["name"] == "priority order"]
    assert recorded["source"] == "forward pass"
    assert recorded["order"] == [f"{by_key.index(name)} ({name})" for name in DEEP]
    names = {e["tid"]: e["args"]["name"] for e in events if e["name"] == "thread_name"}
    sort = {names[e["tid"]]: e["args"]["sort_index"] for e in events if e["name"] == "thread_sort_index"
            and re.fullmatch(r"pushpull:\d+ \[0\]", names.get(e["tid"], ""))}
    assert sorted(sort, key=sort.__getitem__) == [f"pushpull:{by_key.index(name)} [0]" for name in DEEP]


@pytest.mark.multiproc
@pytest.mark.timeout(TWO_JOBS)
def test_skewed_workers_and_a_partition_change_mid_training(plain: Path, tmp_path: Path) -> None:
    """Worker 1 issues every step's pushes in reverse order with pauses, under a one-partition
    credit: rank-0 order must keep the job deadlock-free. At step 10 the partition size changes
    from 1000 to 300 bytes: new server keys, momentum carried over on the servers."""
    output = launch(tmp_path, "--store", "scheduled", "--skew",
                    "--repartition-at", "10", "--repartition-bytes", "300",
                    env={"BYTESCHED_PARTITION_BYTES": "1000", "BYTESCHED_CREDIT_BYTES": "1000"})

    assert_same_weights(plain / "worker0.npz", tmp_path)
    assert "partition_bytes=300" in output
    assert subtasks(output) == [16 * 10 + 44 * 10] * 2


@pytest.mark.multiproc
@pytest.mark.timeout(TWO_JOBS)
def test_unlimited_credit_runs_skewed_workers_in_immediate_order(plain: Path, tmp_path: Path) -> None:
    """With unlimited credit no worker holds a push back, so the workers start partitions as they
    become ready, without rank 0's order: worker 1 pushing in reverse order with pauses must
    neither deadlock nor change a bit of the result."""
    output = launch(tmp_path, "--store", "scheduled", "--skew",
                    env={"BYTESCHED_PARTITION_BYTES": "1000", "BYTESCHED_CREDIT_BYTES": "inf"})

    assert_same_weights(plain / "worker0.npz", tmp_path)
    assert orders(output) == ["immediate"] * 2
    assert subtasks(output) == [16 * 20] * 2


@pytest.mark.multiproc
@pytest.mark.timeout(TWO_JOBS)
def test_str_keys_equal_the_trainers_int_keys(plain: Path, tmp_path: Path) -> None:
    """Module-style callers give parameter names as keys. A dist store numbers str keys in init
    order for its servers' optimizer, which is the Trainer's int order here, so the result is
    exactly the plain (int-keyed) run's, with split tensors."""
    output = launch(tmp_path, "--store", "scheduled", "--str-keys",
                    env={"BYTESCHED_PARTITION_BYTES": "1000", "BYTESCHED_CREDIT_BYTES": "2000"})

    assert_same_weights(plain / "worker0.npz", tmp_path)
    assert subtasks(output) == [16 * 20] * 2


@pytest.mark.multiproc
@pytest.mark.timeout(TWO_JOBS)
def test_thousands_of_tiny_partitions(plain: Path, tmp_path: Path) -> None:
    """8-byte partitions: 1505 server keys per step, 64 bytes of credit."""
    output = launch(tmp_path, "--store", "scheduled", "--steps", "5",
                    env={"BYTESCHED_PARTITION_BYTES": "8", "BYTESCHED_CREDIT_BYTES": "64"})

    assert_same_weights(plain / "worker0_step5.npz", tmp_path)
    assert subtasks(output) == [1505 * 5] * 2


@pytest.mark.multiproc
@pytest.mark.timeout(TWO_JOBS)
def test_adam_with_a_credit_below_the_partitions_across_a_repartition(tmp_path: Path) -> None:
    """The hazard that hung a local store (an optimizer step holding one of MXNet's shared
    temp-space variables behind a held partition) cannot arise on a dist store: Adam runs on the
    servers, and a worker's held partitions gate only its own transfers. Every partition here
    is bigger than the credit and the partition size changes at step 6: exactly plain Adam."""
    adam = ("--optimizer", "adam", "--steps", "12")
    launch(tmp_path / "plain", "--store", "plain", *adam)
    launch(tmp_path / "scheduled", "--store", "scheduled", *adam, "--repartition-at", "6",
           "--repartition-bytes", "400", env={"BYTESCHED_PARTITION_BYTES": "1000",
                                               "BYTESCHED_CREDIT_BYTES": "300"})

    assert_same_weights(tmp_path / "plain" / "worker0.npz", tmp_path / "scheduled")


@pytest.mark.multiproc
@pytest.mark.timeout(TWO_JOBS)
def test_tuning_switches_sizes_on_every_worker_alike(plain: Path, tmp_path: Path) -> None:
    """BYTESCHED_TUNING=1 with three 6-step trials: rank 0 picks the sizes, every worker switches
    at the same steps (each new partition size is a live re-partition of the server keys), both
    keep the same final sizes, and the weights are still exactly the plain store's. Meanwhile
    every worker times a push+pull at step 2 and rank 0 predicts the search's first points from
    the step it observed (the warm start)."""
    output = launch(tmp_path, "--store", "scheduled",
                    env={"BYTESCHED_TUNING": "1", "BYTESCHED_TUNING_MAX_TRIALS": "3",
                         "BYTESCHED_TUNING_STEPS_PER_TRIAL": "6", "BYTESCHED_TUNING_WARMUP_STEPS": "0",
                         "BYTESCHED_TUNING_SEED": "3", "BYTESCHED_LOG_LEVEL": "info"})
    assert len(re.findall(r"bytesched tuning: warm start measured 6 gradients .* and the push\+pull", output)) == 1, \
        output[-4000:]

    kept = re.findall(r"TRAINED .* tuned=(\S+) repartitions=(\d+)", output)
    assert len(kept) == 2 and kept[0] == kept[1] and kept[0][0] != "none", output[-4000:]
    assert int(kept[0][1]) >= 1, "tuning never changed the partition size"
    # The script's MLP has 3,010 float32 weights: the lattice fitted to it starts at 64 KB.
    space = space_for("ps", model_bytes=4 * 3010)
    partition, credit = (float(size) for size in kept[0][0].split(","))
    assert any(partition == pytest.approx(space.partition.value(i), rel=1e-5) for i in range(space.partition.size))
    assert any(credit == pytest.approx(space.credit.value(i), rel=1e-5) for i in range(space.credit.size))
    assert_same_weights(plain / "worker0.npz", tmp_path)


def plans(output: str) -> list[tuple[str, str, str, str]]:
    """Per worker: the plan applied, the Core's start order, repartitions and sub-tasks."""
    return re.findall(r"TRAINED steps=\d+ subtasks=(\d+) .* repartitions=(\d+) plan=(\S+) start_order=(\w+)", output)


@pytest.mark.multiproc
@pytest.mark.timeout(TWO_JOBS)
def test_with_no_sizes_set_every_worker_applies_rank0s_start_up_plan_at_step_2(plain: Path, tmp_path: Path) -> None:
    """No BYTESCHED_*_BYTES: steps 0 and 1 send every key whole as soon as it is ready, rank 0
    times the push+pull on keys of its own, simulates the MLP's step and sends its choice over the
    rank-0 channel; both workers apply it at step 2. The MLP's 12 KB are too small to gain from
    scheduling, so the plan stays out of the way: no announcements, no re-partition, and from
    step 2 every pushpull goes to the wrapped store directly (only steps 0 and 1 reach the Core)."""
    output = launch(tmp_path, "--store", "scheduled", env={"BYTESCHED_LOG_LEVEL": "info"})

    assert_same_weights(plain / "worker0.npz", tmp_path)
    assert plans(output) == [("12", "0", "inf,inf@2", "immediate")] * 2, output[-4000:]
    assert output.count("bytesched plan: measured 6 gradients") == 1, output[-4000:]
    assert "the push+pull (4 B in" in output


@pytest.mark.multiproc
@pytest.mark.timeout(TWO_JOBS)
def test_a_plan_that_stays_out_passes_striped_keys_through_exactly(plain: Path, tmp_path: Path) -> None:
    """With MXNet's big-array bound at 500 elements the two weight matrices are striped over both
    servers, each in 4 server keys: passing through, their push+pulls run on fenced avatars, all 4
    at once, after the gradient and before the next forward pass. Worker 1 pushes in reverse
    with pauses; the result is still the plain store's (default bound), bit for bit."""
    output = launch(tmp_path, "--store", "scheduled", "--skew",
                    env={"MXNET_KVSTORE_BIGARRAY_BOUND": "500", "BYTESCHED_LOG_LEVEL": "info"})

    assert_same_weights(plain / "worker0.npz", tmp_path)
    assert plans(output) == [(str(2 * (4 + 4 + 4)), "0", "inf,inf@2", "immediate")] * 2, output[-4000:]


@pytest.mark.multiproc
@pytest.mark.timeout(TWO_JOBS)
def test_with_scheduling_off_every_operation_passes_through_from_the_first(plain: Path, tmp_path: Path) -> None:
    """BYTESCHED_POLICY=off: no plan and no CommTask; every push+pull is the wrapped store's own
    from the first step, striped keys on fenced avatars as when a plan stays out, with worker 1
    pushing in reverse with pauses: the plain store's weights, bit for bit."""
    output = launch(tmp_path, "--store", "scheduled", "--skew",
                    env={"MXNET_KVSTORE_BIGARRAY_BOUND": "500", "BYTESCHED_POLICY": "off"})

    assert_same_weights(plain / "worker0.npz", tmp_path)
    assert plans(output) == [("0", "0", "none", "immediate")] * 2, output[-4000:]


@pytest.mark.multiproc
@pytest.mark.timeout(TWO_JOBS)
def test_a_sized_plan_repartitions_every_worker_at_step_2_and_restores_rank0_order(plain: Path,
                                                                                   tmp_path: Path) -> None:
    """Rank 0's simulation replaced by one that picks 1,000-byte partitions under a 2,000-byte
    credit (with no trial): worker 1 applies sizes it never computed, both re-partition the server
    keys at step 2 (6 whole keys a step before, 16 partitions after) and go back to rank 0's order,
    which keeps worker 1's reversed, paused pushes deadlock-free. The result is the plain store's,
    bit for bit."""
    output = launch(tmp_path, "--store", "scheduled", "--plan", "forced", "--skew",
                    env={"BYTESCHED_PLAN_TRIAL": "0"})

    assert_same_weights(plain / "worker0.npz", tmp_path)
    assert plans(output) == [(str(6 * 2 + 16 * 18), "1", "1000,2000@2", "rank0")] * 2, output[-4000:]


@pytest.mark.multiproc
@pytest.mark.timeout(TWO_JOBS)
@pytest.mark.parametrize("trial", ["keep", "leave"])
def test_a_sized_plans_trial_stays_out_then_keeps_the_faster_on_every_worker(plain: Path, tmp_path: Path,
                                                                            trial: str) -> None:
    """The forced sizes are tried (the default): steps 2-7 on them, steps 8-13 on the whole keys
    again, passing through, then rank 0's medians decide for both workers. Kept, the keys are
    re-partitioned once more at step 14 and the Core schedules them in rank 0's order (16
    partitions a step); left, the store passes through to the end. Both end with the plain
    store's weights, bit for bit, across three re-partitions."""
    output = launch(tmp_path, "--store", "scheduled", "--plan", "forced", "--skew", "--trial", trial,
                    env={"BYTESCHED_LOG_LEVEL": "info"})

    assert_same_weights(plain / "worker0.npz", tmp_path)
    sized_steps = 6 + (6 if trial == "keep" else 0)
    expected = ((str(6 * 2 + 16 * sized_steps), "3", "1000,2000@14", "rank0") if trial == "keep"
                else (str(6 * 2 + 16 * sized_steps), "2", "inf,inf@8", "rank0"))
    assert plans(output) == [expected] * 2, output[-4000:]
    assert re.findall(r"passes_through=(\d)", output) == ["0" if trial == "keep" else "1"] * 2
    kept = "keeping the plan's 1KB partitions, 2KB credit" if trial == "keep" else "passing through"
    assert output.count("bytesched plan trial: ") == 1 and kept in output, output[-4000:]  # rank 0 logs it


@pytest.mark.multiproc
@pytest.mark.timeout(TWO_JOBS)
def test_set_params_after_a_plan_that_stayed_out_schedules_again(plain: Path, tmp_path: Path) -> None:
    """The plan stays out and the store passes through; at step 10 the script sets 300-byte
    partitions under the default credit: the store waits for what it passed through, returns to
    rank 0's order (worker 1 pushes in reverse, with pauses) and re-partitions, exactly."""
    output = launch(tmp_path, "--store", "scheduled", "--skew", "--repartition-at", "10",
                    "--repartition-bytes", "300")

    assert_same_weights(plain / "worker0.npz", tmp_path)
    assert plans(output) == [(str(6 * 2 + 44 * 10), "1", "inf,inf@2", "rank0")] * 2, output[-4000:]


@pytest.mark.multiproc
@pytest.mark.timeout(TWO_JOBS)
def test_a_plan_that_cannot_time_the_network_stays_out_with_a_warning(plain: Path, tmp_path: Path) -> None:
    output = launch(tmp_path, "--store", "scheduled", "--plan", "failed")

    assert_same_weights(plain / "worker0.npz", tmp_path)
    assert plans(output) == [("12", "0", "inf,inf@2", "immediate")] * 2, output[-4000:]
    assert ("bytesched plan: staying out of the way (no partitioning, no credit limit): timing the "
            "backend's push+pull failed: the push+pull failed (injected by the test)") in output


@pytest.mark.multiproc
@pytest.mark.timeout(JOB_TIMEOUT + 30)
def test_dist_async_trains(tmp_path: Path) -> None:
    """dist_async: each push is applied on arrival (no cross-worker order, no exact reference)."""
    output = launch(tmp_path, "--store", "scheduled", "--kvstore", "dist_async",
                    env={"BYTESCHED_PARTITION_BYTES": "1000", "BYTESCHED_CREDIT_BYTES": "2000"})

    assert subtasks(output) == [16 * 20] * 2
    assert orders(output) == ["immediate"] * 2
    for worker in (0, 1):
        assert all(np.isfinite(v).all() for v in weights(tmp_path / f"worker{worker}.npz").values())


@pytest.mark.multiproc
@pytest.mark.timeout(90)
def test_a_crashing_worker_stops_the_whole_job(tmp_path: Path) -> None:
    """Worker 1 dies at step 3; worker 0 is then stuck in a push the servers can never answer.
    `bytesched launch` must stop everything within seconds and exit with the crash's status
    (the test's process guard fails it if anything is left running)."""
    require("mxnet")
    argv = [require_executable("bytesched"), "launch", "--servers", "2", "--workers", "2",
            "--kill-grace", "2", "--", sys.executable, TRAIN, "--out", tmp_path,
            "--store", "scheduled", "--crash-at", "3"]
    with started(argv) as job:
        output, took = output_after(job, "CRASHING", 30)

    assert job.returncode == 3, output[-4000:]
    assert "[worker 1] CRASHING at step 3" in output
    assert "[launch] worker 1 exited with code 3; stopping the job" in output
    assert "TRAINED" not in output
    assert took < 10, f"the job took {took:.1f} s to stop after the crash"
