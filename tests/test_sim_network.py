"""The simulator's building blocks: event loop, processor-sharing fabric, all-reduce and PS."""

from __future__ import annotations

import math

import pytest

from bytesched.core.task import SubTask
from bytesched.sim.allreduce import Allreduce, CollectiveCost
from bytesched.sim.engine import EventLoop, Timer
from bytesched.sim.network import PULL, PUSH, SPREAD, FullDuplexFabric, SharedMediumFabric
from bytesched.sim.ps import Assignment, ParameterServer

from coretools import BufferTask


def arrivals(loop: EventLoop, log: list[tuple[str, float]], name: str):  # type: ignore[no-untyped-def]
    return lambda: log.append((name, loop.now))


# -- event loop -------------------------------------------------------------------------------
def test_event_loop_runs_in_time_order_ties_in_scheduling_order() -> None:
    loop = EventLoop()
    seen: list[str] = []
    loop.call_at(2.0, seen.append, "late")
    loop.call_at(1.0, seen.append, "first")
    loop.call_at(1.0, seen.append, "second")
    cancelled = loop.call_at(0.5, seen.append, "never")
    cancelled.cancel()
    assert loop.run() is False  # ran out of events
    assert seen == ["first", "second", "late"]
    assert loop.now == 2.0
    with pytest.raises(ValueError, match="before now"):
        loop.call_at(1.0, seen.append, "past")


def test_event_loop_stop_ends_run() -> None:
    loop = EventLoop()
    loop.call_at(1.0, loop.stop)
    loop.call_at(2.0, pytest.fail, "ran past stop()")
    assert loop.run() is True
    assert loop.now == 1.0


def test_a_retimed_timer_runs_once_in_the_order_of_its_last_setting() -> None:
    """A Timer moved later keeps its place in the run order as of its last setting, exactly as
    cancelling and re-scheduling with call_at would (the fabric's results depend on it)."""
    loop = EventLoop()
    seen: list[tuple[str, float]] = []
    timer = Timer(loop, lambda: seen.append(("timer", loop.now)))
    timer.set(1.0)
    loop.call_at(2.0, lambda: seen.append(("scheduled before", loop.now)))
    timer.set(3.0)  # later: it waits on its entry at 1.0
    timer.set(2.0)  # now after "scheduled before" among the events at 2.0
    loop.call_at(2.0, lambda: seen.append(("scheduled after", loop.now)))
    earlier = Timer(loop, lambda: seen.append(("earlier", loop.now)))
    earlier.set(4.0)
    earlier.set(0.5)  # earlier: a new entry; the one at 4.0 is skipped
    cleared = Timer(loop, lambda: seen.append(("cleared", loop.now)))
    cleared.set(1.5)
    cleared.set(math.inf)
    assert loop.run() is False
    assert seen == [("earlier", 0.5), ("scheduled before", 2.0), ("timer", 2.0), ("scheduled after", 2.0)]
    with pytest.raises(ValueError, match="before now"):
        timer.set(1.0)


# -- processor sharing ------------------------------------------------------------------------
def test_icpe_worked_check_two_flows_share_a_link() -> None:
    """ICPE'20 §3.1: 1.0 s and 3.0 s of work at full rate on one link end at 2.0 s and 4.0 s."""
    loop = EventLoop()
    fabric = SharedMediumFabric(loop, bandwidth=1.0, multiplicity=[1], num_servers=2)
    log: list[tuple[str, float]] = []
    fabric.send(0, PUSH, 0, 1.0, 0.0, arrivals(loop, log, "short"))
    fabric.send(0, PUSH, 1, 3.0, 0.0, arrivals(loop, log, "long"))
    loop.run()
    assert log == [("short", pytest.approx(2.0)), ("long", pytest.approx(4.0))]


def test_messages_on_one_connection_go_one_after_another() -> None:
    loop = EventLoop()
    fabric = FullDuplexFabric(loop, [10.0], [1], num_servers=1, server_bandwidth=10.0)
    log: list[tuple[str, float]] = []
    fabric.send(0, PUSH, 0, 10.0, 0.5, arrivals(loop, log, "a"))
    fabric.send(0, PUSH, 0, 10.0, 0.5, arrivals(loop, log, "b"))
    fabric.send(0, PULL, 0, 20.0, 0.0, arrivals(loop, log, "pull"))  # the other direction is free
    loop.run()
    # each push: 0.5 s fixed cost, then 1 s of bytes; the pull (2 s) overlaps them (full duplex)
    assert log == [("a", pytest.approx(1.5)), ("pull", pytest.approx(2.0)), ("b", pytest.approx(3.0))]


def test_identical_workers_incast_on_one_server() -> None:
    """A class of 8 identical workers pushing to one server: the server NIC carries 8 flows."""
    loop = EventLoop()
    fabric = FullDuplexFabric(loop, [100.0], [8], num_servers=2, server_bandwidth=100.0)
    log: list[tuple[str, float]] = []
    fabric.send(0, PUSH, 0, 100.0, 0.0, arrivals(loop, log, "incast"))
    loop.run()
    assert log == [("incast", pytest.approx(8.0))]  # 8 x 100 bytes through a 100 B/s server


def test_spread_message_is_paced_by_the_most_loaded_server() -> None:
    loop = EventLoop()
    fabric = FullDuplexFabric(loop, [40.0, 40.0], [1, 1], num_servers=4, server_bandwidth=10.0)
    log: list[tuple[str, float]] = []
    fabric.send(0, PUSH, SPREAD, 40.0, 0.0, arrivals(loop, log, "spread"))  # 10 bytes per server
    fabric.send(1, PUSH, 2, 10.0, 0.0, arrivals(loop, log, "single"))  # shares server 2
    loop.run()
    # server 2 has two flows at 5 B/s: both finish at 2 s; alone, the spread one would take 1 s
    assert dict(log) == {"spread": pytest.approx(2.0), "single": pytest.approx(2.0)}


def test_spread_message_follows_servers_that_get_busy_and_idle_while_it_moves() -> None:
    """The loads the fabric keeps per server link stay right as a spread message joins busy
    servers and single-server messages come and go under it (its pace changes three times)."""
    loop = EventLoop()
    fabric = FullDuplexFabric(loop, [100.0, 100.0, 100.0], [1, 1, 1], num_servers=2, server_bandwidth=10.0)
    log: list[tuple[str, float]] = []
    fabric.send(1, PUSH, 0, 10.0, 0.0, arrivals(loop, log, "server0"))  # alone on server 0: 10 B/s
    loop.call_at(0.5, fabric.send, 0, PUSH, SPREAD, 40.0, 0.0, arrivals(loop, log, "spread"))  # 20 B per server
    loop.call_at(2.5, fabric.send, 2, PUSH, 1, 5.0, 0.0, arrivals(loop, log, "server1"))
    loop.run()
    # From 0.5 s server 0 carries two flows at 5 B/s: server0's last 5 B end at 1.5 s, when the
    # spread has 15 B per server left. Alone it goes at 10 B/s until 2.5 s (5 B left); then
    # server 1 carries two flows at 5 B/s, and both end at 3.5 s.
    assert dict(log) == {"server0": pytest.approx(1.5), "spread": pytest.approx(3.5),
                         "server1": pytest.approx(3.5)}
    assert len(log) == 3


def test_shared_medium_counts_every_worker_and_both_directions() -> None:
    loop = EventLoop()
    fabric = SharedMediumFabric(loop, bandwidth=12.0, multiplicity=[3], num_servers=1)
    log: list[tuple[str, float]] = []
    fabric.send(0, PUSH, 0, 2.0, 0.0, arrivals(loop, log, "push"))
    fabric.send(0, PULL, 0, 2.0, 0.0, arrivals(loop, log, "pull"))
    loop.run()
    assert [t for _, t in log] == [pytest.approx(1.0), pytest.approx(1.0)]  # 6 flows of 2 B at 2 B/s
    assert fabric.allreduce_seconds(12.0, workers=3) == pytest.approx(4.0)  # 2(n-1) b / B
    full = FullDuplexFabric(EventLoop(), [12.0], [3], num_servers=1, server_bandwidth=12.0)
    assert full.allreduce_seconds(12.0, workers=3) == pytest.approx(2 * 2 / 3 * 12.0 / 12.0)


def test_bad_bandwidth_is_refused() -> None:
    with pytest.raises(ValueError, match="server bandwidth"):
        FullDuplexFabric(EventLoop(), [1.0], [1], num_servers=1, server_bandwidth=0.0)
    with pytest.raises(ValueError, match="capacity"):
        SharedMediumFabric(EventLoop(), bandwidth=-1.0, multiplicity=[1], num_servers=1)


# -- all-reduce -------------------------------------------------------------------------------
def subtasks(*sizes: int) -> list[SubTask]:
    out = []
    for i, size in enumerate(sizes):
        task = BufferTask(f"t{i}", i, size)
        out += SubTask.of(task, [(None, size)])
    return out


def test_ring_allreduce_cost_and_one_collective_at_a_time() -> None:
    loop = EventLoop()
    fabric = FullDuplexFabric(loop, [100.0], [4], num_servers=1, server_bandwidth=100.0)
    ring = Allreduce(loop, CollectiveCost(fabric, 4, overhead=0.3, latency=0.01, algorithm="ring"), num_classes=1)
    log: list[tuple[str, float]] = []
    for sub in subtasks(400, 200):
        ring.submit(sub, arrivals(loop, log, sub.task.name))
    loop.run()
    first = 0.3 + 2 * 3 * 0.01 + 2 * 3 / 4 * 400 / 100
    second = first + 0.3 + 2 * 3 * 0.01 + 2 * 3 / 4 * 200 / 100
    assert log == [("t0", pytest.approx(first)), ("t1", pytest.approx(second))]


def test_collective_waits_for_every_worker_class() -> None:
    loop = EventLoop()
    fabric = FullDuplexFabric(loop, [100.0, 100.0], [1, 1], num_servers=1, server_bandwidth=100.0)
    ring = Allreduce(loop, CollectiveCost(fabric, 2, overhead=0.0, latency=0.0, algorithm="ring"), num_classes=2)
    log: list[tuple[str, float]] = []
    (sub,) = subtasks(100)
    ring.submit(sub, arrivals(loop, log, "class0"))
    loop.call_at(5.0, ring.submit, sub, arrivals(loop, log, "class1"))
    loop.run()
    assert log == [("class0", pytest.approx(6.0)), ("class1", pytest.approx(6.0))]


def test_horovod_fusion_batches_one_cycle_up_to_the_threshold() -> None:
    loop = EventLoop()
    fabric = FullDuplexFabric(loop, [1000.0], [2], num_servers=1, server_bandwidth=1000.0)
    ring = Allreduce(loop, CollectiveCost(fabric, 2, overhead=1.0, latency=0.0, algorithm="ring"), num_classes=1,
                         fusion_threshold=300, cycle_time=0.5)
    log: list[tuple[str, float]] = []
    for sub in subtasks(100, 100, 100, 100):
        ring.submit(sub, arrivals(loop, log, sub.task.name))
    loop.run()
    # the first cycle (t=0) fuses t0..t2 (300 bytes) into one collective, t3 is a second one
    one = 1.0 + 300 / 1000
    assert [name for name, _ in log] == ["t0", "t1", "t2", "t3"]
    assert [t for _, t in log] == [pytest.approx(one)] * 3 + [pytest.approx(one + 1.0 + 100 / 1000)]
    assert ring.collectives == 2


def test_work_submitted_between_cycles_waits_for_the_next_one() -> None:
    loop = EventLoop()
    fabric = FullDuplexFabric(loop, [1000.0], [2], num_servers=1, server_bandwidth=1000.0)
    ring = Allreduce(loop, CollectiveCost(fabric, 2, overhead=0.0, latency=0.0, algorithm="ring"), num_classes=1,
                         fusion_threshold=10**6, cycle_time=0.5)
    log: list[tuple[str, float]] = []
    (sub,) = subtasks(100)
    loop.call_at(0.2, ring.submit, sub, arrivals(loop, log, "t0"))
    loop.run()
    assert log == [("t0", pytest.approx(0.5 + 0.1))]


# -- parameter server -------------------------------------------------------------------------
def test_mxnet_assignment_hashes_small_keys_and_spreads_big_ones() -> None:
    mxnet = Assignment("mxnet", num_servers=4, bigarray_bound=1000)
    assert mxnet.place(3, 4 * 999) == 3 * 9973 % 4
    assert mxnet.place(3, 4 * 1000) == SPREAD
    assert Assignment("round-robin", 4, 1000).place(6, 10**9) == 2
    assert Assignment("mxnet", 1, 1000).place(6, 10**9) == 0
    with pytest.raises(ValueError, match="unknown"):
        Assignment("random", 4, 1000)


def test_a_ps_hop_delays_its_message_but_not_the_next_one_on_the_connection() -> None:
    """Two pushes and pulls of 100 bytes at 100 B/s to one server, overhead 0.5 s and latency
    2 s each way: the overhead occupies the connection, the latency does not. The first push
    leaves at 1.5 s, arrives at 3.5, its pull leaves at 5 and arrives at 7; the second push
    leaves at 3 (right behind the first), arrives at 5, and its pull waits for the first pull's
    bytes (until 5) and then takes 1.5 s: it leaves at 6.5 and arrives at 8.5."""
    loop = EventLoop()
    fabric = FullDuplexFabric(loop, [100.0], [1], num_servers=1, server_bandwidth=math.inf)
    ps = ParameterServer(loop, fabric, Assignment("round-robin", 1, 10**6), num_classes=1, overhead=0.5, latency=2.0)
    log: list[tuple[str, float]] = []
    first, second = subtasks(100, 100)
    ps.start(0, first, server=0, update=0.0, done=arrivals(loop, log, "first"))
    ps.start(0, second, server=0, update=0.0, done=arrivals(loop, log, "second"))
    loop.run()
    assert log == [("first", pytest.approx(7.0)), ("second", pytest.approx(8.5))]


def test_pull_starts_only_after_every_class_pushed() -> None:
    loop = EventLoop()
    fabric = FullDuplexFabric(loop, [100.0, 100.0], [1, 1], num_servers=1, server_bandwidth=math.inf)
    ps = ParameterServer(loop, fabric, Assignment("round-robin", 1, 10**6), num_classes=2,
                         overhead=0.0, latency=0.0)
    log: list[tuple[str, float]] = []
    (sub,) = subtasks(100)
    ps.start(0, sub, server=0, update=0.25, done=arrivals(loop, log, "fast"))
    loop.call_at(3.0, ps.start, 1, sub, 0, 0.25, arrivals(loop, log, "straggler"))
    loop.run()
    # the straggler's push ends at 4 s, the update takes 0.25 s, then both pulls take 1 s
    assert log == [("fast", pytest.approx(5.25)), ("straggler", pytest.approx(5.25))]


def test_nccl_takes_the_tree_for_small_collectives_at_scale_and_the_ring_for_large_ones() -> None:
    bandwidth = 1e9
    fabric = FullDuplexFabric(EventLoop(), [bandwidth], [256], num_servers=1, server_bandwidth=bandwidth)
    cost = CollectiveCost(fabric, 256, overhead=0.0, latency=5e-6, algorithm="nccl")
    ring = CollectiveCost(fabric, 256, overhead=0.0, latency=5e-6, algorithm="ring")
    tree = CollectiveCost(fabric, 256, overhead=0.0, latency=5e-6, algorithm="tree")
    # ring: 2*255 hops of 5 us + 2*255/256 b/B; tree: 2*8 levels of 2 hops + 2 b / (0.92 B)
    assert ring.seconds(1e6) == pytest.approx(510 * 5e-6 + 2 * 255 / 256 * 1e6 / bandwidth)
    assert tree.seconds(1e6) == pytest.approx(32 * 5e-6 + 2 * 1e6 / (0.92 * bandwidth))
    assert cost.seconds(1e6) == tree.seconds(1e6) < ring.seconds(1e6)
    assert cost.seconds(1e9) == ring.seconds(1e9) < tree.seconds(1e9)
    two = CollectiveCost(FullDuplexFabric(EventLoop(), [bandwidth], [2], num_servers=1, server_bandwidth=bandwidth),
                         2, overhead=0.0, latency=5e-6, algorithm="nccl")
    assert two.seconds(1e3) == two.ring(1e3)  # a 2-rank tree has no fewer hops and less bandwidth


def test_unknown_collective_algorithm_is_refused() -> None:
    fabric = FullDuplexFabric(EventLoop(), [1.0], [2], num_servers=1, server_bandwidth=1.0)
    with pytest.raises(ValueError, match="collective algorithm 'butterfly'"):
        CollectiveCost(fabric, 2, overhead=0.0, latency=0.0, algorithm="butterfly")
