"""The pieces a parameter-server job's start-up plan adds to the runtime: rank 0's value over the
rank-0 channel (real sockets), a Core that stays out of the way without announcing its starts
and returns to rank 0's order, and the simulator's view of the job's servers. The plan's course
on real MXNet servers is in test_mxnet_ps.py."""

from __future__ import annotations

import math
import threading
import time
from typing import Any

import pytest

from bytesched.core import Config, Core, SchedulingParams, SubTask
from bytesched.core.channel import ChannelError
from bytesched.launch.ports import free_port
from bytesched.runtime.calibration import NetworkCost
from bytesched.runtime.channel_ranks import ChannelRanks
from bytesched.runtime.startup_plan import StartupPlan
from coretools import BufferTask
from test_channel import connected, make_config, wait_until
from test_plan import BroadcastingRanks, RecordingCore, _observed_step, _timed, calibration_on_the_fake_clock  # noqa: F401 (an autouse fixture: the calibration runs on the fake clock)


def ranks_of(channels: list[Any], timeout: float = 5.0) -> list[ChannelRanks]:
    return [ChannelRanks(rank, len(channels), "ps", channel, lambda: None, timeout)
            for rank, channel in enumerate(channels)]


def broadcast_on_every_rank(ranks: list[ChannelRanks], value: int) -> list[Any]:
    """Every rank's broadcast_int, concurrently: its result or the exception it raised."""
    results: list[Any] = [None] * len(ranks)

    def call(rank: int) -> None:
        try:
            results[rank] = ranks[rank].broadcast_int(value if rank == 0 else -1)
        except Exception as exc:
            results[rank] = exc
    threads = [threading.Thread(target=call, args=(r,)) for r in range(len(ranks))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(15)
    return results


def test_every_rank_gets_rank0s_values_in_order() -> None:
    with connected(3, make_config(free_port())) as (leader, followers):
        ranks = ranks_of([leader, *followers])
        assert broadcast_on_every_rank(ranks, 4_000_000) == [4_000_000] * 3
        assert broadcast_on_every_rank(ranks, 0) == [0] * 3


def test_rank0_names_a_follower_that_never_takes_the_value() -> None:
    with connected(3, make_config(free_port())) as (leader, followers):
        ranks = ranks_of([leader, *followers], timeout=1.0)
        started = time.monotonic()
        with pytest.raises(ChannelError, match=r"no 'ranks.received' report from rank\(s\) 2"):
            threading.Thread(target=ranks[1].broadcast_int, args=(-1,), daemon=True).start()
            ranks[0].broadcast_int(7)
        assert time.monotonic() - started < 5


def test_a_follower_that_hears_nothing_says_so_within_the_timeout() -> None:
    with connected(2, make_config(free_port())) as (leader, followers):
        follower = ranks_of([leader, *followers], timeout=0.5)[1]
        with pytest.raises(ChannelError, match="rank 1 received no value from rank 0 within 0.5 s"):
            follower.broadcast_int(-1)


def test_a_plan_whose_ranks_cannot_agree_stops_instead_of_staying_out() -> None:
    """A backend's failed broadcast fails on every rank alike, so each can stay out; over the
    channel one rank may have the value and another not, so the error goes to the job."""
    class Unreachable(BroadcastingRanks):
        def broadcast_int(self, value: int) -> int:
            raise ChannelError("rank 1 received no value from rank 0 within 1 s")

    plan = StartupPlan(RecordingCore(), Unreachable(1), _timed(0.0001, 0.001), arch="ps",
                       model_bytes=1_000_000, drain=lambda: None, servers=2, bigarray_bound=1_000_000)
    plan.on_step(0)
    plan.on_step(1)
    with pytest.raises(ChannelError, match="received no value"):
        plan.on_step(2)


def test_a_ps_plan_simulates_the_jobs_servers(monkeypatch: pytest.MonkeyPatch) -> None:
    import bytesched.runtime.startup_plan as plan_module

    clusters: list[Any] = []
    real = plan_module.make_plan
    monkeypatch.setattr(plan_module, "make_plan", lambda profile, cluster, *margins, **options:
                        clusters.append(cluster) or real(profile, cluster, *margins, **options))
    core = RecordingCore()
    plan = StartupPlan(core, BroadcastingRanks(0), _timed(0.0002, 0.004), arch="ps", model_bytes=2_000_000,
                       drain=lambda: None, servers=2, bigarray_bound=1_000_000)
    plan.on_step(0)
    plan.on_step(1)
    _observed_step(core)
    plan.on_step(2)
    (cluster,) = clusters
    assert (cluster.arch, cluster.workers, cluster.servers, cluster.bigarray_bound) == ("ps", 2, 2, 1_000_000)
    # the 2 MB timed key is below the bound, so on one server: it took both workers' 2 MB each
    # way (striped, each server would have taken half of that)
    assert cluster.bandwidth == pytest.approx(2 * 2 * 2_000_000 / (0.004 - 0.0002), rel=0.1)
    assert "and the push+pull (4 B in" in plan.outcome.summary  # type: ignore[union-attr]


def test_network_cost_of_a_ps_counts_the_busiest_link() -> None:
    """A push+pull of 10 MB in 81 ms, 1 ms of it fixed, is 2 x 10 MB over the busiest link in
    80 ms: a worker's, or a server's carrying every worker's share."""
    cost = NetworkCost(0.001, 0.081, 10_000_000)
    assert cost.simulator_options("ps", 2)["bandwidth"] == pytest.approx(250e6)
    assert cost.simulator_options("ps", 4, servers=2)["bandwidth"] == pytest.approx(500e6)
    assert cost.simulator_options("ps", 4, servers=4, striped=False)["bandwidth"] == pytest.approx(1e9)
    assert cost.simulator_options("ps", 2)["overhead"] == pytest.approx(0.0005)


class RecordingChannel:
    """Rank 0's side of the channel as the Core uses it: the announcements, recorded."""

    def __init__(self) -> None:
        self.announced: list[str] = []

    def publish_order(self, keys: list[tuple[str, int, int]]) -> None:
        self.announced += [name for name, _, _ in keys]


def test_a_core_staying_out_starts_on_readiness_unannounced_and_returns_to_rank0s_order() -> None:
    """Rank 0 of a rank0-order job, switched to start on readiness: nothing is announced and
    the Core lets the backend start ready tensors by itself. Back in rank 0's order, with a
    credit set meanwhile, it announces again and holds back what the credit does not admit."""
    channel = RecordingChannel()
    unlimited = SchedulingParams(partition_bytes=math.inf, credit_bytes=math.inf)
    core = Core(Config(params=unlimited), rank=0, order="rank0", channel=channel).start()  # type: ignore[arg-type]
    started: list[SubTask] = []
    try:
        core.start_on_ready()
        assert core.start_order == "immediate" and core.releases_on_ready()
        core.enqueue(BufferTask("a", 0, 64, on_start=lambda sub: (started.append(sub), sub.task.notify_finish(sub))),
                     ready=True)
        assert wait_until(lambda: len(started) == 1) and channel.announced == []

        core.set_params(SchedulingParams(partition_bytes=64, credit_bytes=64))
        core.restore_order()
        assert core.start_order == "rank0" and not core.releases_on_ready()
        held = [BufferTask(name, 0, 64, on_start=started.append) for name in ("b", "c")]
        for task in held:
            core.enqueue(task, ready=True)
        assert wait_until(lambda: len(started) == 2) and channel.announced == ["b"]
        time.sleep(0.2)
        assert len(started) == 2, "the 64-byte credit admitted a second 64-byte piece"
        held[0].notify_finish(started[1])
        assert wait_until(lambda: channel.announced == ["b", "c"])
    finally:
        core.shutdown(5.0)
