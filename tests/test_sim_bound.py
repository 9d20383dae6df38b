"""The achievable bound (Theorem 1's order with free messages and fine partitions) and the
breakdown of the gap between the ideal and the plan (bytesched.sim.bound)."""

from __future__ import annotations

import random

import pytest

from bytesched.core.config import SchedulingParams
from bytesched.sim import Cluster, Layer, ModelProfile, Tensor, load_profile, run, simulate
from bytesched.sim.bound import GAPS, STAGES, achievable_time, breakdown, compute_time, communication_time

from test_sim_theory import credit_for, ideal_cluster, random_chain, transfer_seconds


def test_achievable_bound_of_a_two_layer_chain_by_hand() -> None:
    # 2 workers at 100 B/s: a ring all-reduce of b bytes takes b/100 s. Backward: layer 1 ends at
    # 1 s (300 B ready), layer 0 at 2 s (100 B). Layer 0 first: through at 3 s; layer 1's 300 B,
    # sent from 1 s but preempted by layer 0 from 2 to 3 s, through at 5 s. Forward: layer 0 from
    # 3 to 4 s, layer 1 from 5 to 6 s. Ideal: max(compute 4 s, communication 4 s).
    profile = ModelProfile("two", (Layer("l0", 1.0, 1.0, (Tensor("g0", 100),)),
                                   Layer("l1", 1.0, 1.0, (Tensor("g1", 300),))))
    cluster = Cluster(workers=2, bandwidth=100.0)
    assert achievable_time(profile, cluster) == pytest.approx(6.0)
    assert max(compute_time(profile, cluster), communication_time(profile, cluster)) == pytest.approx(4.0)
    # a parameter server applies the update on its server, after the layer's pull
    ps = Cluster(workers=2, arch="ps", bandwidth=100.0, servers=2)
    updated = ModelProfile("two", tuple(Layer(layer.name, layer.forward, layer.backward, layer.tensors, update=0.5)
                                        for layer in profile.layers))
    # push rate: 200 B/s per worker link, servers carry 2 x 1/2 of it: 400 B at 100 B/s each way
    assert achievable_time(updated, ps) == pytest.approx(achievable_time(profile, ps) + 0.5)


@pytest.mark.parametrize("arch", ["allreduce", "ps"])
def test_fine_partitions_with_free_messages_reach_the_bound_and_nothing_beats_it(arch: str) -> None:
    rng = random.Random(f"achievable-{arch}")
    cluster = ideal_cluster(arch)
    for layers in (2, 4, 6):
        unit = 4 * rng.randint(20_000, 60_000)
        profile = random_chain(rng, layers, unit, arch, cluster.workers)
        bound = achievable_time(profile, cluster)
        fine = 4 * (min(layer.nbytes for layer in profile.layers) // 4 // 50)
        scheduled = run(profile, cluster, "bytescheduler",
                        SchedulingParams(partition_bytes=fine, credit_bytes=credit_for(arch, fine)),
                        warmup=0, iterations=1).iteration_time
        slack = (3 if arch == "ps" else 1) * transfer_seconds(arch, fine, cluster.workers)
        assert bound - 1e-9 <= scheduled <= bound + slack, (layers, scheduled, bound)
        for partition in (unit, 4 * unit):
            for policy in ("bytescheduler", "fifo"):
                other = run(profile, cluster, policy, SchedulingParams(partition_bytes=partition,
                                                                        credit_bytes=2 * partition),
                            warmup=0, iterations=1).iteration_time
                assert other >= bound - 1e-9, (layers, policy, partition, other, bound)


def test_the_breakdown_charges_every_millisecond_from_the_ideal_to_the_plan() -> None:
    profile = load_profile("resnet50-h100-bf16")
    cluster = Cluster(workers=16, arch="allreduce", bandwidth=100e9 / 8)
    result = breakdown(profile, cluster, plan_seconds=0.03)
    assert [s.name for s in result.stages] == list(STAGES)
    assert [cause for cause, _ in result.gaps()] == [GAPS[name] for name in STAGES[1:]]
    ideal, achievable = result.stages[0].iteration_time, result.stages[1].iteration_time
    assert ideal <= achievable
    assert sum(seconds for _, seconds in result.gaps()) == pytest.approx(0.03 - ideal)
    free, hops, costs = (s.iteration_time for s in result.stages[2:5])
    assert achievable <= free <= hops <= costs  # each stage only adds a cost


def test_simulate_reports_the_achievable_bound_and_the_breakdown_on_request() -> None:
    report = simulate("resnet50-h100-bf16", policies="plan", arch="ps", workers=4, bandwidth="25Gbps")
    prediction = report.predictions[0]
    assert prediction.breakdown is None
    data = report.to_json()["predictions"][0]
    assert data["achievable"]["iteration_time"] == prediction.achievable_time >= prediction.ideal_time
    assert "achievable" in report.table()
    detailed = simulate("resnet50-h100-bf16", policies="plan", arch="ps", workers=4, bandwidth="25Gbps",
                        breakdown=True)
    assert detailed.to_json()["predictions"][0]["breakdown"]["gaps"][0]["cause"] == "order constraint"
    assert "per-message cost" in detailed.table()
