"""Asynchronous SGD on a parameter server (``dist_async``) in the simulator: each worker goes on
after its own push and pull, and a server applies each push alone."""

from __future__ import annotations

import pytest

from bytesched.core.config import ConfigError, SchedulingParams
from bytesched.sim import Cluster, Layer, ModelProfile, Tensor, WorkerSpec, run, simulate

ONE_LAYER = ModelProfile("one", (Layer("l0", 1.0, 1.0, (Tensor("g0", 100),)),))


def cluster(asynchronous: bool, **options: object) -> Cluster:
    return Cluster(workers=2, arch="ps", servers=1, bandwidth=100.0, server_bandwidth=1e9, overhead=0.0,
                   latency=0.0, asynchronous=asynchronous, **options)  # type: ignore[arg-type]


def test_a_worker_pulls_its_own_push_without_waiting_for_the_others() -> None:
    # Worker 1 computes three times slower. Synchronous: worker 0 waits for worker 1's push every
    # step, so both step at worker 1's pace, 6 s + 2 s of push and pull. Asynchronous: each steps
    # at its own pace, 2 + 2 s and 6 + 2 s; the job's samples/s is the sum of theirs.
    straggler = ((1, WorkerSpec(compute=3.0)),)
    synchronous = run(ONE_LAYER, cluster(False, worker_specs=straggler), "fifo", SchedulingParams())
    asynchronous = run(ONE_LAYER, cluster(True, worker_specs=straggler), "fifo", SchedulingParams())
    assert synchronous.iteration_time == pytest.approx(8.0)
    assert asynchronous.iteration_time == pytest.approx(2 / (1 / 4.0 + 1 / 8.0))


def test_identical_workers_are_simulated_apart_and_share_the_link_when_they_meet() -> None:
    # Two identical workers on one shared 100 B/s medium: a step is 2 s of compute, a push of 48 B
    # and its pull, 0.48 s each alone. Started 1 s apart, one communicates while the other
    # computes: each steps in 2.96 s. In step, they share the medium: 2 + 2 x 0.96 s.
    def shared(asynchronous: bool) -> Cluster:
        return Cluster(workers=2, arch="ps", servers=1, bandwidth=100.0, overhead=0.0, latency=0.0,
                       topology="shared", asynchronous=asynchronous)
    profile = ModelProfile("one", (Layer("l0", 1.0, 1.0, (Tensor("g0", 48),)),))
    assert len(shared(True).worker_classes()) == 2
    assert run(profile, shared(True), "fifo", SchedulingParams()).iteration_time == pytest.approx(2.96)
    assert run(profile, shared(False), "fifo", SchedulingParams()).iteration_time == pytest.approx(3.92)


def test_asynchronous_training_needs_a_parameter_server() -> None:
    with pytest.raises(ConfigError, match="asynchronous training needs a parameter server"):
        Cluster(workers=2, arch="allreduce", asynchronous=True)


def test_simulate_names_an_asynchronous_job() -> None:
    report = simulate("resnet50", policies="bytescheduler", arch="ps", workers=2, bandwidth="1Gbps",
                      asynchronous=True)
    assert "asynchronous" in report.table()
    assert report.to_json()["predictions"][0]["cluster"]["asynchronous"] is True
