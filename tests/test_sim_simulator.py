"""The simulator drives the real Scheduler: every policy, identical and heterogeneous workers,
the global barrier versus crossing it, and stalls reported instead of hanging."""

from __future__ import annotations

import dataclasses
import math

import pytest

from bytesched.core.config import SIMULATED_POLICIES, SchedulingParams
from bytesched.core.policies import PriorityPolicy, Window, register
from bytesched.core.policies.tictac import Layer as TicTacLayer, TicTacGraph, tac_order
from bytesched.core.task import SubTask
from bytesched.sim import Cluster, Layer, ModelProfile, SimulationError, Tensor, WorkerSpec, VANILLA, run
from bytesched.sim.simulator import transfer_estimate, make_fabric
from bytesched.sim.engine import EventLoop
from bytesched.sim.profile import load_profile

MB = 1_000_000


def small_model() -> ModelProfile:
    """Five layers with a big tensor near the output, as VGG16 has."""
    sizes = [(2 * MB, 4_000), (3 * MB, 4_000), (6 * MB, 8_000), (40 * MB, 16_000), (4 * MB, 400)]
    return ModelProfile("small", tuple(
        Layer(f"layer{i}", 2e-3 + 1e-3 * i, 4e-3 + 1e-3 * i, (Tensor(f"w{i}", w), Tensor(f"b{i}", b)), update=2e-4)
        for i, (w, b) in enumerate(sizes)), batch_size=16)


def cluster(arch: str, **changes: object) -> Cluster:
    return Cluster(**{"workers": 4, "arch": arch, "bandwidth": 10e9 / 8, **changes})  # type: ignore[arg-type]


PARAMS = SchedulingParams(partition_bytes=2 * MB, credit_bytes=8 * MB)


@pytest.mark.parametrize("arch", ["allreduce", "ps"])
@pytest.mark.parametrize("policy", [VANILLA, *SIMULATED_POLICIES])
def test_every_registered_policy_runs(arch: str, policy: str) -> None:
    result = run(small_model(), cluster(arch), policy, PARAMS)
    assert 0 < result.iteration_time < 1.0
    assert result.subtasks_per_iteration >= 10  # every tensor communicated each iteration


@pytest.mark.parametrize("arch", ["allreduce", "ps"])
def test_tictac_gets_the_layer_chain_with_transfer_times(arch: str) -> None:
    profile, c = small_model(), cluster(arch)
    result = run(profile, c, "tictac", PARAMS)
    fabric = make_fabric(c, EventLoop(), c.worker_classes())
    expected = TicTacGraph.layer_chain([
        TicTacLayer(layer.forward, layer.backward,
                    {t.name: transfer_estimate(c, fabric, t.nbytes, 2 * MB) for t in layer.tensors})
        for layer in profile.layers])
    ranks = result.leader_policy.ranks  # type: ignore[attr-defined]
    assert sorted(ranks, key=ranks.__getitem__) == tac_order(expected)


def test_prophet_learns_generation_times_and_bandwidth() -> None:
    result = run(small_model(), cluster("ps"), "prophet", PARAMS, warmup=2, iterations=1)
    prophet = result.leader_policy
    assert set(prophet.offsets) == {t.name for layer in small_model().layers for t in layer.tensors}  # type: ignore[attr-defined]
    assert prophet.link.bandwidth is not None and prophet.link.bandwidth > 0  # type: ignore[attr-defined]


@pytest.mark.parametrize("arch", ["allreduce", "ps"])
@pytest.mark.parametrize("policy", [VANILLA, "bytescheduler"])
def test_identical_workers_simulated_once_match_simulating_each(arch: str, policy: str) -> None:
    """Four workers that differ by a billionth in speed are simulated one by one; the result is
    the identical-workers shortcut's (one class of four counting four flows on shared links)."""
    profile = small_model()
    together = run(profile, cluster(arch), policy, PARAMS).iteration_time
    apart_cluster = cluster(arch, worker_specs=tuple((r, WorkerSpec(compute=1 + r * 1e-9)) for r in range(1, 4)))
    assert len(apart_cluster.worker_classes()) == 4
    apart = run(profile, apart_cluster, policy, PARAMS).iteration_time
    assert apart == pytest.approx(together, rel=1e-6)


@pytest.mark.parametrize("arch", ["allreduce", "ps"])
def test_a_straggler_slows_everybody(arch: str) -> None:
    profile = small_model()
    base = run(profile, cluster(arch), "bytescheduler", PARAMS).iteration_time
    slow = run(profile, cluster(arch, worker_specs=((2, WorkerSpec(compute=3.0)),)), "bytescheduler", PARAMS)
    assert slow.iteration_time >= 3.0 * sum(layer.forward + layer.backward for layer in profile.layers)
    assert slow.iteration_time > base * 1.5


def test_a_slower_link_slows_the_ring() -> None:
    profile = small_model()
    base = run(profile, cluster("allreduce"), VANILLA, PARAMS).iteration_time
    slow = run(profile, cluster("allreduce", worker_specs=((3, WorkerSpec(bandwidth=1e9 / 8)),)), VANILLA, PARAMS)
    assert slow.iteration_time > base * 3  # the whole ring runs at the slowest link (10x slower)


def test_vanilla_waits_at_the_barrier_and_bytescheduler_crosses_it() -> None:
    profile = small_model()
    for policy, crossing in ((VANILLA, False), ("bytescheduler", True)):
        result = run(profile, cluster("ps"), policy, PARAMS, warmup=1, iterations=1, trace=True)
        trace = result.trace
        assert trace is not None
        comm_end = {}  # (iteration, layer) -> when its last sub-task finished
        layer_of = {t.name: i for i, layer in enumerate(profile.layers) for t in layer.tensors}
        for sub in trace.subtasks:
            key = (sub.task.instance, layer_of[sub.task.name])
            comm_end[key] = max(comm_end.get(key, 0.0), sub.t_finish)
        forward_start = {(it, layer): start for it, kind, layer, start, _ in trace.compute if kind == "forward"}
        all_done = max(t for (it, _), t in comm_end.items() if it == 0)
        for layer in range(len(profile.layers)):
            assert forward_start[1, layer] >= comm_end[0, layer] - 1e-12  # never before its own data
        crossed = forward_start[1, 0] < all_done
        assert crossed == crossing, policy


def test_heterogeneous_ps_where_a_flow_is_rebound_at_the_same_mark_completes() -> None:
    """Regression: a flow that its own link limited and then the server again, within one
    instant, got the same completion mark twice; the second copy made the completion fail with
    a KeyError (VGG16, 8 workers of slightly different speeds, no per-message cost)."""
    profile = load_profile("vgg16")
    specs = tuple((r, WorkerSpec(compute=1 + r / 80)) for r in range(8))
    result = run(profile, cluster("ps", workers=8, bandwidth=25e9 / 8, overhead=0.0, latency=0.0, worker_specs=specs),
                 "fifo", warmup=0, iterations=1, trace=True)
    assert result.trace is not None
    # every tensor's bytes once; the plugin's layout cuts those above MXNet's big-array bound
    tensors = [t for layer in profile.layers for t in layer.tensors]
    assert sum(s.nbytes for s in result.trace.subtasks) == sum(t.nbytes // 4 * 4 for t in tensors)
    assert len(result.trace.subtasks) > profile.num_tensors
    assert all(s.t_ready <= s.t_start <= s.t_finish for s in result.trace.subtasks)
    slowest = (1 + 7 / 80) * sum(layer.forward + layer.backward for layer in profile.layers)
    assert result.iteration_time >= slowest


def test_deterministic() -> None:
    a = run(small_model(), cluster("ps"), "prophet", PARAMS, trace=True)
    b = run(small_model(), cluster("ps"), "prophet", PARAMS, trace=True)
    assert a.iteration_starts == b.iteration_starts
    assert a.trace and b.trace
    assert ([(s.key, s.t_start, s.t_finish) for s in a.trace.subtasks]
            == [(s.key, s.t_start, s.t_finish) for s in b.trace.subtasks])


def test_shared_medium_is_slower_than_full_duplex_links() -> None:
    profile = small_model()
    full = run(profile, cluster("ps"), "bytescheduler", PARAMS).iteration_time
    shared = run(profile, cluster("ps", topology="shared"), "bytescheduler", PARAMS).iteration_time
    assert shared > 2 * full  # one medium carries every worker's pushes and pulls


class _NeverStarts(PriorityPolicy):
    """A broken policy: admits nothing, ever."""

    name = "test-never-starts"
    default_partition_bytes = math.inf

    def admits(self, sub: SubTask, window: Window, now: float) -> bool:
        return False


register(_NeverStarts)


def test_a_stalled_job_is_reported_not_hung() -> None:
    with pytest.raises(SimulationError, match=r"'test-never-starts'.*stalled.*tasks unfinished \(w4"):
        run(small_model(), cluster("allreduce"), "test-never-starts", PARAMS)


def test_bad_arguments_name_the_culprit() -> None:
    with pytest.raises(ValueError, match="priorities has 3 entries"):
        run(small_model(), cluster("ps"), "bytescheduler", PARAMS, priorities=[0, 1, 2])
    with pytest.raises(ValueError, match="iterations=0"):
        run(small_model(), cluster("ps"), "bytescheduler", PARAMS, iterations=0)
    with pytest.raises(ValueError, match="policy 'nope' is unknown"):
        run(small_model(), cluster("ps"), "nope", PARAMS)


def test_a_scheduled_ps_job_is_laid_out_as_the_mxnet_plugin_lays_it_out() -> None:
    """bytesched's partitions go where ScheduledKVStore puts them (a big tensor striped over the
    servers, its partitions alternating; small tensors whole on the least-loaded server), not
    where MXNet's key rule would put equal pieces; the plain store keeps MXNet's rule."""
    from bytesched.ps_layout import ServerKeyTable, mxnet_server_of
    from bytesched.sim.ps import plugin_layout
    from bytesched.sim.simulator import tensor_plans
    profile = ModelProfile("mixed", (Layer("a", 0.001, 0.002, (Tensor("medium", 2_000_000), Tensor("small", 400_000))),
                                     Layer("b", 0.001, 0.002, (Tensor("tiny", 400_000), Tensor("big", 18_000_000)))),
                           batch_size=1)
    plans = plugin_layout(tensor_plans(profile, 4 * MB), 2, 1_000_000, 4 * MB)
    table = ServerKeyTable(2, 1_000_000)
    for index, plan in enumerate(plans):
        layout = table.add(index, (plan.nbytes // 4,), "float32", 4 * MB)
        assert plan.pieces == tuple((r, mxnet_server_of(k, 2)) for r, k in zip(layout.ranges, layout.server_keys))
    medium, small, tiny, big = (plan.pieces for plan in plans)
    assert [medium[0][1], small[0][1], tiny[0][1]] == [0, 1, 1]  # least loaded; MXNet's rule: 0, 1, 0
    assert [server for _, server in big] == [0, 1] * (len(big) // 2)
    assert all(b - a < 1_000_000 for (a, b), _ in big)

    result = run(profile, cluster("ps", workers=2, servers=2), "bytescheduler",
                 SchedulingParams(partition_bytes=4 * MB, credit_bytes=16 * MB), warmup=0, iterations=1, trace=True)
    assert result.trace is not None
    sent = sorted((s.task.name, s.index, s.nbytes) for s in result.trace.subtasks)
    assert sent == sorted((plan.name, i, (b - a) * 4) for plan in plans for i, ((a, b), _) in enumerate(plan.pieces))
    vanilla = run(profile, cluster("ps", workers=2, servers=2), VANILLA, warmup=0, iterations=1, trace=True)
    assert vanilla.trace is not None and len(vanilla.trace.subtasks) == 4


def test_a_fusing_plugin_sends_buckets_that_gate_every_layer_they_hold() -> None:
    """With bucket_bytes (the plugins' fusion) a scheduled all-reduce job sends runs of
    consecutive tensors as one task, ready with its earliest layer; each layer's next forward
    waits for the bucket holding its tensors. Many small tensors at a 1 ms per-message cost then
    take fewer messages and less time; vanilla is unchanged."""
    from bytesched.sim.simulator import fuse, tensor_plans
    profile = ModelProfile("tiny", tuple(Layer(f"l{i}", 1e-3, 2e-3, (Tensor(f"w{i}", 40_000), Tensor(f"b{i}", 400)))
                                         for i in range(6)), batch_size=1)
    buckets = fuse(tensor_plans(profile, 4 * MB), 100_000)
    assert [(b.name, b.layer, b.layers, b.nbytes, b.priority) for b in buckets] == [
        ("w0+3", 0, (0, 1), 80_800, 0), ("w2+3", 2, (2, 3), 80_800, 4), ("w4+3", 4, (4, 5), 80_800, 8)]
    assert [b.name for b in fuse(tensor_plans(profile, 4 * MB), 41_000)] == [f"w{i}+1" for i in range(6)]
    assert len(fuse(tensor_plans(profile, 4 * MB), 1_000)) == 12  # every w is larger: alone, and so is each b
    slow = Cluster(workers=2, arch="allreduce", bandwidth=1e9 / 8, overhead=1e-3, cycle_time=0.0)
    fused = dataclasses.replace(slow, bucket_bytes=100_000)
    alone, together = (run(profile, c, "bytescheduler", PARAMS, warmup=1, iterations=1, trace=True)
                       for c in (slow, fused))
    assert (alone.subtasks_per_iteration, together.subtasks_per_iteration) == (12, 3)
    assert together.iteration_time < alone.iteration_time - 2e-3  # 22.1 -> 19.7 ms: 9 messages fewer, partly hidden
    trace = together.trace
    assert trace is not None
    done = {}  # iteration 0: when each bucket finished
    for sub in trace.subtasks:
        if sub.task.instance == 0:
            done[sub.task.name] = max(done.get(sub.task.name, 0.0), sub.t_finish)
    forward = {layer: start for it, kind, layer, start, _ in trace.compute if kind == "forward" and it == 1}
    for bucket in buckets:
        for layer in bucket.gated_layers:
            assert forward[layer] >= done[bucket.name] - 1e-12
    assert run(profile, fused, VANILLA).iteration_time == run(profile, slow, VANILLA).iteration_time


def many_small_tensors() -> ModelProfile:
    """Forty layers of small tensors computed fast: every all-reduce is mostly its fixed cost."""
    return ModelProfile("small-tensors", tuple(
        Layer(f"layer{i}", 1e-4, 2e-4, (Tensor(f"w{i}", 40_000), Tensor(f"b{i}", 400)), update=1e-5)
        for i in range(40)), batch_size=16)


def test_batching_while_busy_sends_fewer_operations_in_rank0s_batches_on_every_worker() -> None:
    """Worker classes that differ (a billionth in speed) follow rank 0's announced batches: the job
    completes, with fewer collectives than sub-tasks, and faster where each collective costs 2 ms
    and the backend fuses nothing by itself (torch.distributed)."""
    spread = tuple((r, WorkerSpec(compute=1 + r * 1e-9)) for r in range(1, 4))
    c = cluster("allreduce", overhead=2e-3, worker_specs=spread, bucket_bytes=0, fusion_threshold=0)
    sized = SchedulingParams(partition_bytes=MB, credit_bytes=4 * MB)
    alone = run(many_small_tensors(), c, "bytescheduler", sized, trace=True)
    batched = run(many_small_tensors(), c, "bytescheduler", dataclasses.replace(sized, batch_bytes=MB), trace=True)
    subs = batched.trace.subtasks  # type: ignore[union-attr]
    operations = sum(1 for sub in subs if sub.batch is None or sub is sub.batch[0])
    assert len(subs) == len(alone.trace.subtasks) and operations < len(subs) / 4  # type: ignore[union-attr]
    assert batched.iteration_time < 0.7 * alone.iteration_time
