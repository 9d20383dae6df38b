"""Prophet (bytesched.core.policies.prophet): hand-computed holds and releases, and liveness.

The Scheduler is driven by a small discrete-event loop that honours ``wake_at`` the way the
runtime Core does (it calls ``tick`` when that time comes and nothing else happened).
"""

from __future__ import annotations

import heapq
import math
import random
from typing import Callable, Sequence

import pytest
from hypothesis import given, settings, strategies as st

from bytesched.core import CommTask, Scheduler, SchedulingParams, SubTask
from bytesched.core.config import ConfigError
from bytesched.core.policies import ByteSchedulerPolicy, Policy, ProphetPolicy, make_policy
from coretools import BufferTask

_ENQUEUE, _READY, _FINISH, _TICK = range(4)  # same-time events in this order


def tensor(name: str, priority: int, nbytes: int) -> BufferTask:
    """A tensor of ``nbytes`` one-byte elements (so partitions are exact byte counts)."""
    return BufferTask(name, priority, nbytes, itemsize=1)


FinishTime = Callable[[SubTask, float], float]


def serial_link(bandwidth: float) -> FinishTime:
    """Sub-tasks cross one link one after another, in the order they started, at ``bandwidth``."""
    free = -math.inf

    def finish(sub: SubTask, now: float) -> float:
        nonlocal free
        free = max(free, now) + sub.nbytes / bandwidth
        return free

    return finish


class Run:
    """The Scheduler driven in virtual time: tasks enqueued and made ready at given times, each
    started sub-task finishing when ``finish_time`` says, ``tick`` at every ``wake_at``."""

    def __init__(self, policy: Policy, arrivals: Sequence[tuple[float, float, CommTask]],
                 finish_time: FinishTime, max_events: int = 100_000) -> None:
        self.scheduler = Scheduler(policy)
        self.tasks = [task for _, _, task in arrivals]
        self.wakes: list[tuple[float, float | None]] = []  # (time, wake_at after that time's events)
        self.ticks = 0
        self.started: list[SubTask] = []
        events: list[tuple[float, int, int, object]] = []
        order = 0
        for enqueue_at, ready_at, task in arrivals:
            assert enqueue_at <= ready_at, "the test scenario enqueues every task before it is ready"
            events += [(enqueue_at, _ENQUEUE, order, task), (ready_at, _READY, order + 1, task)]
            order += 2
        heapq.heapify(events)
        count = 0
        while events:
            now = events[0][0]
            started: list[SubTask] = []
            while events and events[0][0] == now:
                _, kind, _, obj = heapq.heappop(events)
                count += 1
                assert count <= max_events, "the scheduler keeps asking to be woken without progress"
                if kind == _ENQUEUE:
                    self.scheduler.enqueue(obj, now)  # type: ignore[arg-type]
                elif kind == _READY:
                    started += self.scheduler.ready(obj, now)  # type: ignore[arg-type]
                elif kind == _FINISH:
                    started += self.scheduler.finish(obj, now)  # type: ignore[arg-type]
                else:
                    self.ticks += 1
                    started += self.scheduler.tick(now)
            self.started += started
            for sub in started:
                sub.task.start(sub)
                finish = finish_time(sub, now)
                assert finish >= now
                heapq.heappush(events, (finish, _FINISH, order, sub))
                order += 1
            wake = self.scheduler.wake_at()
            self.wakes.append((now, wake))
            if wake is not None:
                assert wake > now, f"wake_at()={wake} is not after now={now}: a driver would spin"
                heapq.heappush(events, (wake, _TICK, order, None))
                order += 1

    def starts(self, name: str, instance: int) -> list[float]:
        task = next(t for t in self.tasks if t.name == name and t.instance == instance)
        return [sub.t_start for sub in task.subtasks]

    def finishes(self, name: str, instance: int) -> list[float]:
        task = next(t for t in self.tasks if t.name == name and t.instance == instance)
        return [sub.t_finish for sub in task.subtasks]

    def wake_after(self, time: float) -> float | None:
        return next(wake for t, wake in self.wakes if t == time)


# Three gradients, 1000-byte partitions, a 1000 B/s link, a credit large enough never to matter.
# Iteration 1 (the profile): g2 (3000 B, lowest priority) ready at 0, g1 at 2, g0 at 3.5.
PARAMS = SchedulingParams(partition_bytes=1000, credit_bytes=10**9)
SIZES = {"g0": 1000, "g1": 1000, "g2": 3000}
PRIORITY = {"g0": 0, "g1": 1, "g2": 2}


def iteration(start: float, ready: dict[str, float]) -> list[tuple[float, float, CommTask]]:
    return [(start, start + offset, tensor(name, PRIORITY[name], SIZES[name])) for name, offset in ready.items()]


PROFILE = {"g2": 0.0, "g1": 2.0, "g0": 3.5}


def test_prophet_holds_a_block_that_would_overlap_a_higher_priority_gradient() -> None:
    arrivals = iteration(0.0, PROFILE) + iteration(10.0, PROFILE)
    prophet = Run(ProphetPolicy(PARAMS), arrivals, serial_link(1000.0))
    baseline = Run(ByteSchedulerPolicy(PARAMS), iteration(0.0, PROFILE) + iteration(10.0, PROFILE),
                   serial_link(1000.0))

    # Iteration 1 has no profile: exactly bytescheduler.
    for name in SIZES:
        assert prophet.starts(name, 0) == baseline.starts(name, 0)
    assert prophet.starts("g2", 0) == [0.0, 0.0, 0.0]
    # Iteration 2: g1 is predicted at 12 and B = 5000 B / 5 s busy = 1000 B/s. g2's first two
    # pieces end at 11 and 12 <= 12 (fit, admitted); the third would end at 13: held, with a
    # wake-up at 12 + slack (10% of the 3.5 s spread).
    assert prophet.starts("g2", 1) == [10.0, 10.0, 13.5]
    assert prophet.wake_after(10.0) == pytest.approx(12.35)
    # g1 arrives at 12 and ends at 13 <= 13.5 (g0's prediction): admitted. The held piece would
    # end at 14 > 13.5: still held until g0 arrives; then strictly by priority.
    assert prophet.starts("g1", 1) == [12.0]
    assert prophet.starts("g0", 1) == [13.5]
    # The point of it: g0 finds the link free and is through at 14.5; with bytescheduler the
    # third piece of g2 is still on the link and g0 ends at 15.
    assert prophet.finishes("g0", 1) == [14.5]
    assert baseline.starts("g2", 1) == [10.0, 10.0, 10.0]
    assert baseline.finishes("g0", 1) == [15.0]


def test_prophet_learns_generation_offsets_and_bandwidth() -> None:
    policy = ProphetPolicy(PARAMS)
    Run(policy, iteration(0.0, PROFILE) + iteration(10.0, {"g2": 0.0}), serial_link(1000.0))
    assert policy.offsets == PROFILE  # learned when g2 repeated, i.e. iteration 2 began
    assert policy.link.bandwidth == pytest.approx(1000.0)


def test_prophet_stops_waiting_for_a_late_gradient() -> None:
    # Iteration 3: g1 (predicted at 22) comes only at 30. The third piece of g2 is held at 20
    # with a wake-up at 22.35; then g1 counts as late, the next higher-priority gradient is g0
    # at 23.5, and the piece (link free at 22.35, ends at 23.35 <= 23.5) starts on that tick.
    late = {"g2": 0.0, "g1": 10.0, "g0": 3.5}
    run = Run(ProphetPolicy(PARAMS), iteration(0.0, PROFILE) + iteration(10.0, PROFILE) + iteration(20.0, late),
              serial_link(1000.0))
    assert run.wake_after(20.0) == pytest.approx(22.35)
    assert run.starts("g2", 2) == [20.0, 20.0, pytest.approx(22.35)]
    assert run.ticks >= 1
    assert run.starts("g0", 2) == [23.5]
    assert run.starts("g1", 2) == [30.0]


def test_prophet_sends_by_priority_once_the_highest_priority_gradient_is_ready() -> None:
    # Iteration 2: g0 comes early, at 10.5, before g1 (still predicted at 12). The backward
    # phase is over: the held third piece of g2 goes at once, after g0, under the credit.
    early = {"g2": 0.0, "g1": 2.0, "g0": 0.5}
    run = Run(ProphetPolicy(PARAMS), iteration(0.0, PROFILE) + iteration(10.0, early), serial_link(1000.0))
    assert run.starts("g2", 1) == [10.0, 10.0, 10.5]
    assert run.starts("g0", 1) == [10.5]
    assert run.finishes("g0", 1) == [13.0]  # behind the two pieces already on the link
    assert run.wake_after(10.5) is None


def test_prophet_is_what_make_policy_builds_and_rejects_bad_settings() -> None:
    assert isinstance(make_policy("prophet", PARAMS), ProphetPolicy)
    with pytest.raises(ConfigError, match="smoothing"):
        ProphetPolicy(PARAMS, smoothing=0.0)
    with pytest.raises(ConfigError, match="late_fraction"):
        ProphetPolicy(PARAMS, late_fraction=-1.0)


@st.composite
def workloads(draw: st.DrawFn) -> tuple[SchedulingParams, list[tuple[float, float, CommTask]], int]:
    """A few iterations of a few gradients: a stable pattern with jitter, some gradients late or
    missing, sizes and partition/credit sizes that make holds likely."""
    names = [f"w{i}" for i in range(draw(st.integers(1, 6)))]
    priority = {n: draw(st.integers(0, 4)) for n in names}
    size = {n: draw(st.integers(0, 5000)) for n in names}
    base = {n: draw(st.floats(0, 10)) for n in names}
    params = SchedulingParams(partition_bytes=draw(st.sampled_from([None, 300, 1000])),
                              credit_bytes=draw(st.sampled_from([1, 1000, 4000, math.inf])))
    arrivals: list[tuple[float, float, CommTask]] = []
    start = 0.0
    for _ in range(draw(st.integers(1, 5))):
        for n in names:
            if draw(st.integers(0, 9)) == 0:
                continue  # this gradient skips the iteration
            jitter = draw(st.one_of(st.floats(-1, 1), st.floats(5, 50)))  # small, or very late
            arrivals.append((start, start + max(0.0, base[n] + jitter), tensor(n, priority[n], size[n])))
        start += draw(st.floats(0, 30))
    return params, arrivals, draw(st.integers(0, 2**32 - 1))


@settings(max_examples=300, deadline=None)
@given(workloads())
def test_prophet_starts_every_subtask_once_after_it_is_ready(workload) -> None:  # type: ignore[no-untyped-def]
    params, arrivals, seed = workload
    rng = random.Random(seed)
    run = Run(ProphetPolicy(params), arrivals, lambda sub, now: now + rng.choice([0.0, rng.uniform(0, 3)]))
    assert run.scheduler.idle, f"never finished: {run.scheduler.unfinished()}"
    subtasks = [sub for task in run.tasks for sub in task.subtasks]
    assert sorted(map(id, run.started)) == sorted(map(id, subtasks))  # each started exactly once
    for sub in subtasks:
        assert sub.t_ready <= sub.t_start <= sub.t_finish
