"""The scheduling state machine (Algorithm 1), driven in virtual time, for every core policy."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings, strategies as st

from bytesched.core import (SchedulingError, SchedulingParams, Scheduler, SubTask, UNLIMITED, filled_runs, fusion_runs,
                            split_elements)
from bytesched.core.policies import FollowOrderPolicy, ImmediatePolicy, Policy, make_policy, ps_order

from coretools import BufferTask, VirtualDriver


def arrival_order(policy_name: str, credit: float) -> list[str]:
    """The §4.2 scenario: tensor 1 is in flight, then 2, 3, 4 arrive; 4 is the most urgent."""
    sched = Scheduler(make_policy(policy_name, SchedulingParams(partition_bytes=UNLIMITED, credit_bytes=credit)))
    driver = VirtualDriver(sched, duration=lambda sub: 10.0)
    tasks = [BufferTask(f"t{i}", priority=5 - i, nbytes=4) for i in range(1, 5)]
    for i, task in enumerate(tasks):
        sched.enqueue(task, 0.0)
        driver.at(float(i), "ready", task)
    driver.run()
    return [s.task.name for s in driver.started]


def test_section_4_2_credit_window_of_two() -> None:
    assert arrival_order("bytescheduler", credit=8) == ["t1", "t2", "t4", "t3"]


def test_section_4_2_stop_and_wait() -> None:
    assert arrival_order("p3", credit=8) == ["t1", "t4", "t3", "t2"]
    assert arrival_order("bytescheduler", credit=4) == ["t1", "t4", "t3", "t2"]


def test_fifo_keeps_readiness_order_and_never_partitions() -> None:
    assert arrival_order("fifo", credit=4) == ["t1", "t2", "t3", "t4"]
    sched = Scheduler(make_policy("fifo", SchedulingParams(partition_bytes=8)))
    task = BufferTask("big", 0, 4000)
    sched.enqueue(task, 0.0)
    assert len(task.subtasks) == 1


def test_oversized_subtask_starts_when_nothing_in_flight() -> None:
    sched = Scheduler(make_policy("bytescheduler", SchedulingParams(partition_bytes=UNLIMITED, credit_bytes=10)))
    small, big = BufferTask("small", 1, 8), BufferTask("big", 0, 400)
    sched.enqueue(small, 0.0)
    sched.enqueue(big, 0.0)
    first = sched.ready(small, 0.0)
    assert [s.task.name for s in first] == ["small"]
    assert sched.ready(big, 0.1) == []  # would exceed the credit while small is in flight
    after = sched.finish(first[0], 1.0)
    assert [s.task.name for s in after] == ["big"]
    assert sched.window.inflight_bytes == 400


def test_partition_priority_inherits_and_keeps_piece_order() -> None:
    sched = Scheduler(make_policy("bytescheduler", SchedulingParams(partition_bytes=40, credit_bytes=40)))
    low, high = BufferTask("low", 5, 100), BufferTask("high", 1, 100)
    for t in (low, high):
        sched.enqueue(t, 0.0)
    assert [s.nbytes for s in low.subtasks] == [36, 32, 32]  # 25 floats in pieces of <= 10
    driver = VirtualDriver(sched, duration=lambda sub: 1.0)
    driver.at(0.0, "ready", low)
    driver.at(0.5, "ready", high)
    driver.run()
    order = [(s.task.name, s.index) for s in driver.started]
    assert order == [("low", 0), ("high", 0), ("high", 1), ("high", 2), ("low", 1), ("low", 2)]


def test_partitions_are_zero_copy_views_covering_the_buffer() -> None:
    task = BufferTask("t", 0, 4 * 1001)
    sched = Scheduler(make_policy("bytescheduler", SchedulingParams(partition_bytes=400)))
    sched.enqueue(task, 0.0)
    for sub in task.subtasks:
        sub.payload[:] = bytes([sub.index % 251 + 1]) * sub.nbytes  # writes land in the task's buffer
    expected = b"".join(bytes([s.index % 251 + 1]) * s.nbytes for s in task.subtasks)
    assert bytes(task.buffer) == expected


def test_set_params_changes_credit_now_and_partition_for_later_tasks() -> None:
    sched = Scheduler(make_policy("bytescheduler", SchedulingParams(partition_bytes=40, credit_bytes=40)))
    a = BufferTask("a", 0, 160)
    sched.enqueue(a, 0.0)
    started = sched.ready(a, 0.0)
    assert len(started) == 1
    more = sched.set_params(SchedulingParams(partition_bytes=80, credit_bytes=1000), 1.0)
    assert len(more) == 3  # the larger credit releases a's queued pieces at once
    b = BufferTask("b", 0, 160)
    sched.enqueue(b, 1.0)
    assert [s.nbytes for s in b.subtasks] == [80, 80]
    assert [s.nbytes for s in a.subtasks] == [40, 40, 40, 40]


def test_protocol_violations_are_named() -> None:
    sched = Scheduler(make_policy("bytescheduler", SchedulingParams()))
    task = BufferTask("w", 0, 8)
    with pytest.raises(SchedulingError, match="before it was enqueued"):
        sched.ready(task, 0.0)
    sched.enqueue(task, 0.0)
    with pytest.raises(SchedulingError, match="enqueued twice"):
        sched.enqueue(task, 0.0)
    (sub,) = sched.ready(task, 0.0)
    with pytest.raises(SchedulingError, match="ready twice"):
        sched.ready(task, 0.0)
    sched.finish(sub, 1.0)
    with pytest.raises(SchedulingError, match="finished twice"):
        sched.finish(sub, 2.0)
    assert sched.idle


def test_instances_tell_iterations_apart() -> None:
    sched = Scheduler(make_policy("bytescheduler", SchedulingParams()))
    keys = []
    for _ in range(3):
        task = BufferTask("w", 0, 8)
        sched.enqueue(task, 0.0)
        (sub,) = sched.ready(task, 0.0)
        sched.finish(sub, 0.0)
        keys.append(sub.key)
    assert keys == [("w", 0, 0), ("w", 1, 0), ("w", 2, 0)]


def test_stats_count_bytes_delay_and_peak_credit() -> None:
    sched = Scheduler(make_policy("bytescheduler", SchedulingParams(partition_bytes=UNLIMITED, credit_bytes=8)))
    a, b = BufferTask("a", 0, 8), BufferTask("b", 1, 8)
    for t in (a, b):
        sched.enqueue(t, 0.0)
    (sa,) = sched.ready(a, 0.0)
    assert sched.ready(b, 0.0) == []
    (sb,) = sched.finish(sa, 2.0)
    sched.finish(sb, 3.0)
    stats = sched.take_stats()
    assert (stats.tasks, stats.subtasks_started, stats.bytes_started) == (2, 2, 16)
    assert stats.queue_delay_max == 2.0 and stats.queue_delay_mean == 1.0
    assert stats.max_inflight_bytes == 8
    assert sched.take_stats().subtasks_started == 0


def test_split_elements_edges() -> None:
    assert split_elements(0, 4, 100) == [(0, 0)]
    assert split_elements(10, 4, 1) == [(i, i + 1) for i in range(10)]  # at least one element each
    assert split_elements(10, 4, math.inf) == [(0, 10)]
    assert split_elements(10, 4, 12) == [(0, 3), (3, 6), (6, 8), (8, 10)]


# ---- followers -------------------------------------------------------------------------------

def test_fusion_runs_hold_at_most_the_bound_and_filled_runs_close_once_they_reach_it() -> None:
    """The two fusion rules on 1 MB items under a 1.6 MB bound (DDP's scaled cap on the emulated
    Transformer): at most the bound, no two items fit together; DDP's rule pairs them. A change of
    kind cuts a run under either rule, and an item larger than the bound is alone only under the first."""
    sizes = [1_000_000] * 5
    assert fusion_runs(sizes, 1_600_000) == [[0], [1], [2], [3], [4]]
    assert filled_runs(sizes, 1_600_000) == [[0, 1], [2, 3], [4]]
    assert filled_runs(sizes, 1_600_000, kinds="aabbb") == [[0, 1], [2, 3], [4]]
    assert filled_runs(sizes, 1_600_000, kinds="abbba") == [[0], [1, 2], [3], [4]]
    assert fusion_runs([100, 5_000, 100], 1_000) == [[0], [1], [2]]
    assert filled_runs([100, 5_000, 100], 1_000) == [[0, 1], [2]]


def test_rank0_follower_starts_exactly_in_announced_order() -> None:
    leader = make_policy("bytescheduler", SchedulingParams(partition_bytes=8, credit_bytes=8))
    sched = Scheduler(FollowOrderPolicy(leader))
    a, b = BufferTask("a", 0, 16), BufferTask("b", 1, 16)
    for t in (a, b):
        sched.enqueue(t, 0.0)
    assert sched.announce([("b", 0, 1), ("a", 0, 0)], 0.0) == []  # nothing ready yet
    assert sched.ready(a, 0.0) == []  # a#0 is announced second: it must wait for b#1
    out = sched.ready(b, 0.0)
    assert [s.key for s in out] == [("b", 0, 1), ("a", 0, 0)]
    out = sched.announce([("a", 0, 1), ("b", 0, 0)], 0.0)
    assert [s.key for s in out] == [("a", 0, 1), ("b", 0, 0)]
    assert len(sched.policy) == 0


def test_immediate_follower_partitions_like_the_leader() -> None:
    leader = make_policy("p3", SchedulingParams())
    sched = Scheduler(ImmediatePolicy(leader))
    task = BufferTask("t", 0, 400_000)
    sched.enqueue(task, 0.0)
    assert len(task.subtasks) == 3  # P3's 160 KB slices
    assert len(sched.ready(task, 0.0)) == 3  # all at once: the backend negotiates order


@pytest.mark.parametrize(("policy", "credit", "holds_back"), [
    ("fifo", 100, False), ("bytescheduler", UNLIMITED, False), ("bytescheduler", 100, True),
    ("tictac", UNLIMITED, False), ("tictac", 100, True), ("prophet", UNLIMITED, True), ("p3", UNLIMITED, True)])
def test_a_policy_that_never_holds_back_starts_every_ready_subtask_at_once(policy, credit, holds_back) -> None:
    """``holds_back()`` decides a PS's follower order (``ps_order``), so it must be true to the
    policy: one that says False never leaves a ready sub-task waiting."""
    leader = make_policy(policy, SchedulingParams(partition_bytes=64, credit_bytes=credit))
    assert leader.holds_back() is holds_back
    assert ps_order(leader) == ("rank0" if holds_back else "immediate")
    assert ps_order(leader, tuning=True) == "rank0"
    assert FollowOrderPolicy(leader).holds_back() and not ImmediatePolicy(leader).holds_back()
    sched = Scheduler(leader)
    tasks = [BufferTask(f"t{i}", i % 3, 200) for i in range(6)]
    for i, task in enumerate(tasks):
        sched.enqueue(task, float(i))
        sched.ready(task, float(i))  # nothing ever finishes
    if not holds_back:
        assert sched.waiting == 0
    elif policy != "prophet":  # Prophet holds back by its forecast, not in every scenario
        assert sched.waiting > 0


def test_a_task_released_on_ready_starts_whole_on_its_ready_event_whatever_the_credit() -> None:
    """The plugin's backend already runs it (CommTask.released_on_ready): the Scheduler records
    every piece as started and in flight, even where its credit would have held them back."""
    sched = Scheduler(make_policy("bytescheduler", SchedulingParams(partition_bytes=8, credit_bytes=8)))
    held, passed = BufferTask("held", 0, 24), BufferTask("passed", 1, 24)
    passed.released_on_ready = True
    for task in (held, passed):
        sched.enqueue(task, 0.0)
    assert [s.key for s in sched.ready(held, 1.0)] == [("held", 0, 0)]  # the credit holds two back
    assert [s.key for s in sched.ready(passed, 2.0)] == [("passed", 0, i) for i in range(3)]
    assert (sched.window.inflight_bytes, sched.window.inflight_count, sched.waiting) == (32, 4, 2)
    assert [s.t_start for s in passed.subtasks] == [2.0] * 3
    started, completed = sched.finish_many(passed.subtasks, 3.0)
    assert started == [] and completed == [passed]  # the window is still over the credit
    assert [s.key for s in sched.finish(held.subtasks[0], 4.0)] == [("held", 0, 1)]
    assert sched.stats.subtasks_started == 5 and sched.stats.bytes_started == 40


def test_announce_on_a_leader_is_an_error() -> None:
    with pytest.raises(SchedulingError, match="followers"):
        Scheduler(make_policy("bytescheduler", SchedulingParams())).announce([], 0.0)


# ---- properties over random task sets --------------------------------------------------------

task_sets = st.lists(
    st.tuples(st.integers(0, 6), st.integers(1, 400), st.floats(0, 20), st.floats(0.01, 5)),
    min_size=1, max_size=12)


@settings(max_examples=300, deadline=None)
@given(tasks=task_sets, partition=st.sampled_from([4, 64, 1000, UNLIMITED]),
       credit=st.sampled_from([4, 100, 2000, UNLIMITED]),
       policy=st.sampled_from(["bytescheduler", "fifo", "p3"]))
def test_every_subtask_starts_once_after_ready_within_credit(tasks, partition, credit, policy) -> None:
    sched = Scheduler(make_policy(policy, SchedulingParams(partition_bytes=partition, credit_bytes=credit)))

    def duration(sub) -> float:
        window = sched.window
        oversized = window.inflight_count == 1 and sub.nbytes > credit
        if policy == "bytescheduler" and not oversized:
            assert window.inflight_bytes <= credit
        if policy == "p3":
            assert window.inflight_count == 1
        head = sched.policy.peek(0.0)
        if policy != "fifo" and head is not None:
            # Priority: no more urgent sub-task is left waiting when this one starts.
            assert (sub.task.priority, sub.task.seq, sub.index) < (head.task.priority, head.task.seq, head.index)
        return durations[sub.task.name]

    driver = VirtualDriver(sched, duration)
    durations = {}
    objs = []
    for i, (prio, nelem, ready_at, dur) in enumerate(tasks):
        task = BufferTask(f"t{i}", prio, nelem * 4)
        durations[task.name] = dur
        sched.enqueue(task, 0.0)
        driver.at(ready_at, "ready", task)
        objs.append(task)
    driver.run()

    assert sched.idle and len(sched.policy) == 0
    all_subs = [s for t in objs for s in t.subtasks]
    assert sorted(id(s) for s in driver.started) == sorted(id(s) for s in all_subs)  # each exactly once
    for task in objs:
        assert task.finished_callbacks == 0  # on_finish is the runtime Core's call, not the scheduler's
        assert sum(s.nbytes for s in task.subtasks) == task.nbytes  # partitions cover the tensor
        limit = task.nbytes if policy == "fifo" or partition == UNLIMITED else max(partition, 4)
        assert all(s.nbytes <= limit for s in task.subtasks)
        for s in task.subtasks:
            assert s.t_ready <= s.t_start <= s.t_finish


def _generic_twin(policy_name: str, params: SchedulingParams) -> Policy:
    """``policy_name``'s policy, but releasing through the generic peek/admits/pop loop."""
    cls = type(make_policy(policy_name, params))
    return type(f"Generic{cls.__name__}", (cls,), {"release": Policy.release})(params)


@settings(max_examples=100, deadline=None)
@given(tasks=st.lists(st.tuples(st.integers(0, 6), st.integers(0, 400), st.floats(0, 20), st.floats(0, 5)),
                      min_size=1, max_size=12),
       partition=st.sampled_from([4, 64, 1000, UNLIMITED]), credit=st.sampled_from([1, 4, 100, 2000, UNLIMITED]),
       policy=st.sampled_from(["bytescheduler", "tictac", "p3"]))
def test_batched_release_decides_like_the_generic_loop(tasks, partition, credit, policy) -> None:
    """Each policy's own release() (no call per sub-task) starts the same sub-tasks at the same
    times as Policy.release, which asks peek/admits/pop one sub-task at a time."""
    params = SchedulingParams(partition_bytes=partition, credit_bytes=credit)
    own, generic = make_policy(policy, params), _generic_twin(policy, params)
    assert type(own).release is not Policy.release
    runs = []
    for pol in (own, generic):
        sched = Scheduler(pol)
        waiting: list[int] = []

        def duration(sub: SubTask, sched: Scheduler = sched, waiting: list[int] = waiting) -> float:
            waiting.append(len(sched.policy))
            return tasks[int(sub.task.name[1:])][3]

        driver = VirtualDriver(sched, duration)
        for i, (prio, nelem, ready_at, _) in enumerate(tasks):
            task = BufferTask(f"t{i}", prio, nelem * 4)
            sched.enqueue(task, 0.0)
            driver.at(ready_at, "ready", task)
        driver.run()
        assert sched.idle
        runs.append(([(s.key, s.t_start, s.t_finish) for s in driver.started], waiting, sched.take_stats()))
    assert runs[0] == runs[1]


@settings(max_examples=100, deadline=None)
@given(tasks=st.lists(st.tuples(st.integers(0, 6), st.integers(0, 400)), min_size=1, max_size=10),
       partition=st.sampled_from([4, 64, 1000, UNLIMITED]), credit=st.sampled_from([1, 4, 100, 2000, UNLIMITED]),
       policy=st.sampled_from(["bytescheduler", "tictac", "p3", "fifo", "prophet"]),
       run=st.integers(1, 6))
def test_a_run_of_finishes_decides_like_finishes_one_by_one(tasks, partition, credit, policy, run) -> None:
    """Scheduler.finish_many (the runtime Core's call for the finishes it drains together) starts
    the same sub-tasks at the same times, completes the same tasks and counts the same statistics
    as finish() called for each; and the Scheduler's count of waiting sub-tasks (which lets a
    finish skip the policy) always equals the policy's own."""
    outcomes = []
    for together in (False, True):
        sched = Scheduler(make_policy(policy, SchedulingParams(partition_bytes=partition, credit_bytes=credit)))
        in_flight: list[SubTask] = []
        starts: list[tuple[tuple[str, int, int], float]] = []
        completed: list[str] = []

        def started(subs: list[SubTask], sched: Scheduler = sched, in_flight: list[SubTask] = in_flight,
                    starts: list = starts) -> None:
            assert sched.waiting == len(sched.policy)
            in_flight.extend(subs)
            starts.extend((s.key, s.t_start) for s in subs)

        def finish_run(now: float, sched: Scheduler = sched, in_flight: list[SubTask] = in_flight,
                       completed: list[str] = completed, together: bool = together) -> None:
            subs = in_flight[:run]
            del in_flight[:run]
            if together:
                out, done = sched.finish_many(subs, now)
                completed.extend(t.name for t in done)
            else:
                out = []
                for sub in subs:
                    out += sched.finish(sub, now)
                    if not sub.task.remaining:
                        completed.append(sub.task.name)
            started(out)

        objs = [BufferTask(f"t{i}", prio, nelem * 4) for i, (prio, nelem) in enumerate(tasks)]
        for task in objs:
            sched.enqueue(task, 0.0)
        now = 0.0
        for task in objs:  # each ready in turn, then a run of the oldest finishes
            now += 1.0
            started(sched.ready(task, now))
            finish_run(now + 0.5)
        while in_flight:
            now += 1.0
            finish_run(now)
        assert sched.idle and sched.waiting == 0
        outcomes.append((starts, completed, sched.take_stats()))
    assert outcomes[0] == outcomes[1]
    assert sorted(outcomes[0][1]) == sorted(t.name for t in objs)  # every task completed once


def test_finish_many_names_a_protocol_violation() -> None:
    sched = Scheduler(make_policy("bytescheduler", SchedulingParams(partition_bytes=UNLIMITED)))
    task = BufferTask("w", 0, 8)
    sched.enqueue(task, 0.0)
    sub = task.subtasks[0]
    with pytest.raises(SchedulingError, match=r"SubTask\('w'#0\[0\], 8B\) finished but was never started"):
        sched.finish_many([sub], 1.0)
    assert sched.ready(task, 1.0) == [sub]
    with pytest.raises(SchedulingError, match="finished twice"):
        sched.finish_many([sub, sub], 2.0)


def test_subtasks_of_a_task_are_its_pieces_in_order_with_no_times_yet() -> None:
    task = BufferTask("w", 3, 40)
    task.instance = 2
    pieces = task.partition(16)
    subs = SubTask.of(task, pieces)
    assert [(s.task, s.index, s.payload, s.nbytes, s.key) for s in subs] == \
        [(task, i, payload, nbytes, ("w", 2, i)) for i, (payload, nbytes) in enumerate(pieces)]
    assert all(type(s) is SubTask and math.isnan(s.t_ready) and math.isnan(s.t_start) and math.isnan(s.t_finish)
               for s in subs)


# -- batching while busy ------------------------------------------------------------------------
class RecordingBatcher:
    """A backend that starts batches: records each batch's sub-tasks."""

    def __init__(self) -> None:
        self.batches: list[list[str]] = []

    def start_batch(self, batch: tuple[SubTask, ...]) -> None:
        self.batches.append([sub.task.name for sub in batch])


def _batching(credit: float = UNLIMITED, batch: float = 100, partition: float = UNLIMITED,
              policy: str = "bytescheduler") -> Scheduler:
    return Scheduler(make_policy(policy, SchedulingParams(partition_bytes=partition, credit_bytes=credit,
                                                          batch_bytes=batch)))


def _tasks(sched: Scheduler, sizes: list[int], batcher: object | None) -> list[BufferTask]:
    tasks = []
    for i, nbytes in enumerate(sizes):
        task = BufferTask(f"t{i}", priority=i, nbytes=nbytes)
        task.batcher = batcher  # type: ignore[assignment]
        sched.enqueue(task, 0.0)
        tasks.append(task)
    return tasks


def _names(subs: list[SubTask]) -> list[str]:
    return [sub.task.name for sub in subs]


def test_small_pieces_ready_while_another_is_in_flight_start_together_once_it_finishes() -> None:
    """The first piece starts alone (nothing in flight); t1-t3, ready while it is in flight, wait
    in the open batch (counted in the window) and start as one operation when it finishes."""
    sched = _batching(batch=100)
    t0, t1, t2, t3 = _tasks(sched, [40, 20, 20, 20], RecordingBatcher())
    (first,) = sched.ready(t0, 0.0)
    assert first.batch is None
    assert sched.ready(t1, 0.1) == [] and sched.ready(t2, 0.2) == [] and sched.ready(t3, 0.3) == []
    assert sched.window.inflight_count == 4 and sched.window.inflight_bytes == 100
    together = sched.finish(first, 1.0)
    assert _names(together) == ["t1", "t2", "t3"]
    assert all(sub.batch == tuple(together) for sub in together)
    assert all(sub.t_start == 1.0 for sub in together)
    stats = sched.take_stats()
    assert stats.subtasks_started == 4 and stats.bytes_started == 100


def test_a_batch_that_cannot_take_the_next_piece_starts_while_busy() -> None:
    sched = _batching(batch=50)
    t0, t1, t2, t3 = _tasks(sched, [40, 20, 20, 20], RecordingBatcher())
    (first,) = sched.ready(t0, 0.0)
    assert sched.ready(t1, 0.1) == [] and sched.ready(t2, 0.2) == []
    full = sched.ready(t3, 0.3)  # 20 + 20 + 20 > 50: t1 and t2 go, t3 opens the next batch
    assert _names(full) == ["t1", "t2"] and full[0].batch == tuple(full)
    assert sched.finish(first, 1.0) == []  # t1, t2 are still in flight: t3 waits
    last = sched.finish_many(full, 2.0)[0]
    assert _names(last) == ["t3"] and last[0].batch is None


def test_a_piece_at_or_above_the_threshold_closes_the_open_batch_and_goes_alone() -> None:
    sched = _batching(batch=50)
    t0, t1, t2 = _tasks(sched, [40, 20, 60], RecordingBatcher())
    sched.ready(t0, 0.0)
    assert sched.ready(t1, 0.1) == []
    started = sched.ready(t2, 0.2)
    assert _names(started) == ["t1", "t2"] and all(sub.batch is None for sub in started)


def test_only_tasks_of_one_batcher_batch_together_and_tasks_without_one_never_do() -> None:
    sched = _batching(batch=100)
    first, second = RecordingBatcher(), RecordingBatcher()
    (t0,) = _tasks(sched, [40], first)
    a, b = BufferTask("a", 1, 8), BufferTask("b", 2, 8)
    a.batcher, b.batcher = first, second  # type: ignore[assignment]
    c = BufferTask("c", 3, 8)
    for task in (a, b, c):
        sched.enqueue(task, 0.0)
    (head,) = sched.ready(t0, 0.0)
    assert sched.ready(a, 0.1) == []
    assert _names(sched.ready(b, 0.2)) == ["a"]  # another batcher: a's batch closes (a alone)
    assert _names(sched.ready(c, 0.3)) == ["b", "c"]  # no batcher: goes alone, after b's batch
    assert all(sub.batch is None for sub in a.subtasks + b.subtasks + c.subtasks)


def test_held_pieces_count_in_the_credit_window() -> None:
    sched = _batching(credit=60, batch=100)
    t0, t1, t2, t3 = _tasks(sched, [40, 20, 20, 20], RecordingBatcher())
    (first,) = sched.ready(t0, 0.0)
    assert sched.ready(t1, 0.1) == [] and sched.ready(t2, 0.2) == []  # 20 fits, 40 + 20 + 20 > 60
    assert sched.window.inflight_bytes == 60 and len(sched.policy) == 1
    assert _names(sched.finish(first, 1.0)) == ["t1", "t2"]  # t2 admitted now, then nothing else in flight


def test_switching_batching_off_starts_the_open_batch() -> None:
    sched = _batching(batch=100)
    t0, t1, t2 = _tasks(sched, [40, 20, 20], RecordingBatcher())
    sched.ready(t0, 0.0)
    sched.ready(t1, 0.1)
    sched.ready(t2, 0.2)
    started = sched.set_params(SchedulingParams(partition_bytes=UNLIMITED, credit_bytes=UNLIMITED), 0.3)
    assert _names(started) == ["t1", "t2"] and started[0].batch == tuple(started)


def test_the_policy_cannot_change_while_a_batch_is_open() -> None:
    sched = _batching(batch=100)
    t0, t1 = _tasks(sched, [40, 20], RecordingBatcher())
    sched.ready(t0, 0.0)
    sched.ready(t1, 0.1)
    with pytest.raises(SchedulingError, match="1 ready sub-task"):
        sched.set_policy(make_policy("fifo", SchedulingParams()))


def test_batching_never_reorders_the_policys_starts() -> None:
    """Partitioned tasks of mixed sizes arriving over time, credit-limited: with batching the
    pieces start in exactly the order they start without it, in fewer operations."""
    def run(batch: float) -> tuple[list[tuple[str, int]], int]:
        sched = _batching(credit=300, batch=batch, partition=64)
        tasks = _tasks(sched, [200, 12, 8, 8, 4, 130, 16, 8, 4, 8], RecordingBatcher())
        driver = VirtualDriver(sched, duration=lambda sub: 1.0 if sub.batch is None else 1.0 + 0.01 * len(sub.batch))
        for i, task in enumerate(reversed(tasks)):  # backward order: the most urgent last
            driver.at(0.1 * i, "ready", task)
        driver.run()
        operations = sum(1 for sub in driver.started if sub.batch is None or sub is sub.batch[0])
        return [(sub.task.name, sub.index) for sub in driver.started], operations
    plain, plain_operations = run(0)
    batched, batched_operations = run(40)
    assert sorted(batched) == sorted(plain) and batched_operations < plain_operations
    names = [name for name, _ in batched]
    assert names.index("t0") > names.index("t9")  # the policy's order, not readiness's, still rules


def test_a_follower_starts_rank0s_batches_whole_once_each_is_ready_here() -> None:
    from bytesched.core.policies.follow import JOINS, announcement
    leader = _batching(batch=100)
    lt = _tasks(leader, [40, 20, 20], RecordingBatcher())
    first = leader.ready(lt[0], 0.0)
    leader.ready(lt[1], 0.1)
    together = leader.finish(first[0], 0.2) if not leader.ready(lt[2], 0.2) else []
    keys = announcement(first + together)
    assert keys == [("t0", 0, 0), ("t1", 0, 0), ("t2", 0, JOINS)]
    follower = Scheduler(FollowOrderPolicy(make_policy("bytescheduler", SchedulingParams(
        partition_bytes=UNLIMITED, credit_bytes=UNLIMITED, batch_bytes=100))))
    ft = _tasks(follower, [40, 20, 20], RecordingBatcher())
    assert follower.announce(keys, 0.0) == []
    assert _names(follower.ready(ft[0], 0.1)) == ["t0"]
    assert follower.ready(ft[2], 0.2) == []  # t1 is not ready here: its batch waits whole
    batch = follower.ready(ft[1], 0.3)
    assert _names(batch) == ["t1", "t2"] and batch[0].batch == tuple(batch)
