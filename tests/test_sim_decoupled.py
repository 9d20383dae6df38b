"""The decoupled all-reduce (DeAR) in the simulator: reduce-scatters scheduled by the policy in the
backward pass, all-gathers in buckets in the next forward pass (bytesched.sim.decoupled)."""

from __future__ import annotations

import pytest

from bytesched.core.config import UNLIMITED, SchedulingParams
from bytesched.sim import Cluster, Layer, ModelProfile, Tensor, load_profile, run
from bytesched.sim.plan import make_plan

TWO_LAYERS = ModelProfile("two", (Layer("l0", 1.0, 1.0, (Tensor("g0", 100),)),
                                  Layer("l1", 1.0, 1.0, (Tensor("g1", 300),))))
FREE = Cluster(workers=2, bandwidth=100.0, overhead=0.0, latency=0.0, cycle_time=0.0, collective="ring")
"""2 workers at 100 B/s: a reduce-scatter or all-gather of b bytes takes b/200 s."""


def one_iteration(partition: float) -> float:
    return run(TWO_LAYERS, FREE, "bytescheduler", SchedulingParams(partition_bytes=partition, credit_bytes=UNLIMITED),
               warmup=0, iterations=1, decoupled=True).iteration_time


def test_all_gathers_go_in_forward_order_after_the_backward_pass_by_hand() -> None:
    # Backward from t=2: layer 1's 300 B ready at 3, reduce-scattered 3-4.5; layer 0's 100 B ready
    # at 4, reduce-scattered 4.5-5. The forward pass begins at 4 and waits for the all-gathers.
    # Whole tensors: one bucket of both, gathered 5-7; forward 7-9, next backward at 9.
    assert one_iteration(UNLIMITED) == pytest.approx(7.0)
    # 200 B buckets: layer 0 alone, gathered 5-5.5 (forward 5.5-6.5); layer 1 gathered 5.5-7
    # (forward 7-8).
    assert one_iteration(200) == pytest.approx(6.0)


def test_a_decoupled_all_reduce_pays_a_per_message_overhead_for_each_half() -> None:
    costly = Cluster(workers=2, bandwidth=100.0, overhead=0.25, latency=0.0, cycle_time=0.0, collective="ring")
    params = SchedulingParams(partition_bytes=UNLIMITED, credit_bytes=UNLIMITED)
    free = run(TWO_LAYERS, FREE, "bytescheduler", params, warmup=0, iterations=1, decoupled=True).iteration_time
    paid = run(TWO_LAYERS, costly, "bytescheduler", params, warmup=0, iterations=1, decoupled=True).iteration_time
    # on the critical path: layer 1's and layer 0's reduce-scatters, then the one all-gather
    assert paid - free == pytest.approx(3 * 0.25)


def test_only_an_all_reduce_job_under_a_policy_can_be_decoupled() -> None:
    with pytest.raises(ValueError, match="decoupled all-reduce needs an all-reduce cluster"):
        run(TWO_LAYERS, Cluster(workers=2, arch="ps"), "bytescheduler", decoupled=True)
    with pytest.raises(ValueError, match="under vanilla"):
        run(TWO_LAYERS, FREE, "vanilla", decoupled=True)


def test_a_decoupled_all_reduce_refuses_batching_while_busy_instead_of_ignoring_it() -> None:
    params = SchedulingParams(partition_bytes=100, credit_bytes=UNLIMITED, batch_bytes=50)
    with pytest.raises(ValueError, match="batch_bytes=50.*decoupled"):
        run(TWO_LAYERS, FREE, "bytescheduler", params, decoupled=True)


def test_the_plan_weighs_a_decoupled_all_reduce_only_when_asked() -> None:
    # the Transformer's forward pass is half its backward pass, and communication twice its
    # compute at 100 Gbit/s among 64 workers: the all-gathers fill the forward pass
    profile = load_profile("transformer-h100-bf16")
    cluster = Cluster(workers=64, bandwidth=100e9 / 8)
    priority = make_plan(profile, cluster)
    assert not priority.decoupled
    plan = make_plan(profile, cluster, decoupled=True)
    assert plan.decoupled and plan.policy == "bytescheduler"
    assert plan.search_iteration_time < priority.search_iteration_time
    assert "decoupled all-reduce" in plan.describe()
