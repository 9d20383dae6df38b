"""The native Scheduler (csrc/scheduler.cc) decides as the Python one does: both are fed the same
randomized event traces (enqueue, ready, finish runs, set_params, announce, changes of order;
partitions, credits and batching thresholds from one byte to unlimited, tasks of two batchers and
of none) and must answer every event with the same sub-tasks started, in the same order and the
same batches, the same tasks completed, and the same credit window."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Any

import pytest

from bytesched.core import CommTask, SchedulingError, SchedulingParams, Scheduler, SubTask, UNLIMITED, split_elements
from bytesched.core.policies import FollowOrderPolicy, ImmediatePolicy, Policy, make_policy
from bytesched.core.policies.follow import JOINS
from bytesched.core.policies.sequence import SequencePolicy

from conftest import require

native = require("bytesched.plugins.torch._native", "the native Scheduler (python csrc/build.py)")

TRACES = 2000
EVENTS = 80
NAMES = ("a", "b", "c", "d", "e", "f")
PARTITIONS = (None, 1, 3, 7, 16, 100, 1000, 4096, 12.5, UNLIMITED)
CREDITS = (1, 4, 15, 64, 500, 4096, 9.5, UNLIMITED)
BATCHES = (0, 0, 0, 1, 8, 64, 500, 12.5, UNLIMITED)
BATCHERS = (None, "A", "B")  # the Python tasks' batchers; the native ones are their indices - 1
MODES = ("leader", "immediate", "follow", "sequence")


class TraceTask(CommTask):
    """A task of ``numel`` elements of ``itemsize`` bytes, cut as the PyTorch plugin's GradientTask
    cuts its wire buffer (one piece where the size covers it, else :func:`split_elements`)."""

    def __init__(self, tid: int, name: str, priority: int, numel: int, itemsize: int, batcher: Any) -> None:
        super().__init__(name, priority, numel * itemsize)
        self.batcher = batcher
        self.tid = tid
        self.numel = numel
        self.itemsize = itemsize

    def partition(self, size: float) -> list[tuple[Any, int]]:
        if size >= self.nbytes:
            return [(None, self.nbytes)]
        return [(None, (b - a) * self.itemsize) for a, b in split_elements(self.numel, self.itemsize, size)]

    def start(self, subtask: SubTask) -> None:
        """Never called: the trace starts nothing, it compares what the Schedulers answer."""


def _native_size(value: float | None) -> float:
    return math.nan if value is None else float(value)


def _params(rng: random.Random) -> SchedulingParams:
    return SchedulingParams(partition_bytes=rng.choice(PARTITIONS), credit_bytes=rng.choice(CREDITS),
                            batch_bytes=rng.choice(BATCHES))


def _native_params(params: SchedulingParams) -> tuple[float, float, float]:
    return _native_size(params.partition_bytes), float(params.credit_bytes), float(params.batch_bytes)


def _python_policy(mode: str, leader: Policy, names: tuple[str, ...]) -> Policy:
    """A policy of ``mode`` over ``leader``, as the Core makes it (Core.__init__, _replace_order)."""
    if mode == "leader":
        return leader
    if mode == "immediate":
        return ImmediatePolicy(leader)
    if mode == "follow":
        return FollowOrderPolicy(leader)
    return SequencePolicy(leader, names)


@dataclass
class Trace:
    """Both Schedulers and what the trace knows of their tasks."""

    rng: random.Random
    mode: str
    names: tuple[str, ...]
    python: Scheduler
    leader: Policy
    native: Any
    now: float = 0.0
    tasks: dict[int, TraceTask] = field(default_factory=dict)
    pending: list[int] = field(default_factory=list)  # enqueued, not ready
    inflight: list[tuple[int, int]] = field(default_factory=list)
    announced: set[tuple[str, int, int]] = field(default_factory=set)
    batched: int = 0  # sub-tasks started joining a batch
    log: list[str] = field(default_factory=list)

    def compare(self, started: list[SubTask], native_started: list[tuple[int, int]],
                completed: list[CommTask] | None = None, native_completed: list[int] | None = None) -> None:
        keys = [(sub.task.tid, sub.index, sub.batch is not None and sub is not sub.batch[0])  # type: ignore[attr-defined]
                for sub in started]
        assert keys == native_started, self._context("started")
        if completed is not None:
            assert [task.tid for task in completed] == native_completed, self._context("completed")  # type: ignore[attr-defined]
        window = self.python.window
        assert (window.inflight_bytes, window.inflight_count) == self.native.window, self._context("window")
        assert self.python.waiting == self.native.waiting, self._context("waiting")
        assert self.python.idle == self.native.idle, self._context("idle")
        self.inflight += [(tid, index) for tid, index, _ in keys]
        self.batched += sum(joins for _, _, joins in keys)

    def _context(self, what: str) -> str:
        return f"{what} differs after: " + " | ".join(self.log[-8:])


def _new_trace(seed: int) -> Trace:
    rng = random.Random(seed)
    leader_name = rng.choice(("bytescheduler", "bytescheduler", "fifo"))
    params = _params(rng)
    leader = make_policy(leader_name, params)
    mode = rng.choice(MODES)
    names = tuple(rng.sample(NAMES, rng.randint(2, len(NAMES))))
    python = Scheduler(_python_policy(mode, leader, names))
    twin = native.Scheduler(leader_name, *_native_params(params), "leader")
    if mode != "leader":
        twin.set_policy(mode, list(names))
    trace = Trace(rng, mode, names, python, leader, twin)
    trace.log.append(f"seed {seed}: {leader_name} {params} in {mode} order, names {names}")
    return trace


def _enqueue(trace: Trace) -> None:
    rng = trace.rng
    tid = len(trace.tasks)
    name = rng.choice(trace.names)
    numel = rng.choice((0, rng.randint(1, 8), rng.randint(1, 60), rng.randint(1, 600)))
    batcher = rng.choice(BATCHERS)
    task = TraceTask(tid, name, rng.randint(-3, 10), numel, rng.choice((1, 2, 4, 8)), batcher)
    trace.tasks[tid] = task
    trace.log.append(f"{trace.now:.0f} enqueue {tid} {name} p{task.priority} {numel}x{task.itemsize} {batcher}")
    trace.python.enqueue(task, trace.now)
    trace.native.enqueue(tid, name, task.priority, numel, task.itemsize, BATCHERS.index(batcher) - 1, trace.now)
    if rng.random() < 0.6:
        _ready(trace, tid)
    else:
        trace.pending.append(tid)


def _ready(trace: Trace, tid: int) -> None:
    trace.log.append(f"{trace.now:.0f} ready {tid}")
    task = trace.tasks[tid]
    trace.compare(trace.python.ready(task, trace.now), trace.native.ready(tid, trace.now))


def _finish(trace: Trace) -> None:
    rng = trace.rng
    run = rng.sample(trace.inflight, rng.randint(1, min(4, len(trace.inflight))))
    for key in run:
        trace.inflight.remove(key)
    trace.log.append(f"{trace.now:.0f} finish {run}")
    subs = [trace.tasks[tid].subtasks[index] for tid, index in run]
    started, completed = trace.python.finish_many(subs, trace.now)
    native_started, native_completed = trace.native.finish_many(run, trace.now)
    trace.compare(started, native_started, completed, native_completed)


def _set_params(trace: Trace) -> None:
    params = _params(trace.rng)
    trace.log.append(f"{trace.now:.0f} set_params {params}")
    trace.compare(trace.python.set_params(params, trace.now),
                  trace.native.set_params(*_native_params(params), trace.now))


def _announce(trace: Trace) -> None:
    """Rank 0's order as a follower hears it: keys of enqueued tasks and of instances yet to come,
    each once, in an order of their own, some of them joining the key before them in a batch."""
    rng = trace.rng
    candidates = [(task.name, task.instance, sub.index) for task in trace.tasks.values() for sub in task.subtasks]
    for name in NAMES:
        coming = trace.python.instances(name) + rng.randint(0, 1)
        candidates += [(name, coming, index) for index in range(rng.randint(1, 3))]
    fresh = [key for key in candidates if key not in trace.announced]
    keys = rng.sample(fresh, min(len(fresh), rng.randint(1, 6)))
    if rng.random() < 0.5:
        keys.sort(key=lambda key: (key[1], key[2]))
    trace.announced.update(keys)
    keys = [(name, instance, index | JOINS if i and rng.random() < 0.4 else index)
            for i, (name, instance, index) in enumerate(keys)]
    trace.log.append(f"{trace.now:.0f} announce {keys}")
    trace.compare(trace.python.announce(keys, trace.now), trace.native.announce(keys, trace.now))


def _switch(trace: Trace) -> None:
    """A change of order (Core.start_in_sequence and the like), refused by both alike while a
    ready sub-task waits, in the policy's queue or in the open batch."""
    mode = trace.rng.choice(MODES)
    trace.log.append(f"{trace.now:.0f} order {mode}")
    refused = []
    for switch in (lambda: trace.python.set_policy(_python_policy(mode, trace.leader, trace.names)),
                   lambda: trace.native.set_policy(mode, list(trace.names))):
        try:
            switch()
            refused.append(False)
        except (SchedulingError, native.SchedulingError):
            refused.append(True)
    assert refused[0] == refused[1], trace._context("refusal of a change of order")
    if not refused[0]:
        trace.mode = mode
        trace.announced.clear()


def run_trace(seed: int) -> Trace:
    trace = _new_trace(seed)
    rng = trace.rng
    for _ in range(EVENTS):
        trace.now += rng.choice((0.0, 0.5, 1.0))
        roll = rng.random()
        if roll < 0.3:
            _enqueue(trace)
        elif roll < 0.4 and trace.pending:
            _ready(trace, trace.pending.pop(rng.randrange(len(trace.pending))))
        elif roll < 0.75 and trace.inflight:
            _finish(trace)
        elif roll < 0.82:
            _set_params(trace)
        elif roll < 0.92 and trace.mode == "follow":
            _announce(trace)
        elif roll < 0.95:
            _switch(trace)
    while trace.inflight:  # the end of the step: everything in flight lands
        _finish(trace)
    return trace


def test_random_traces_start_the_same_subtasks_in_the_same_order() -> None:
    starts = batched = 0
    for seed in range(TRACES):
        trace = run_trace(seed)
        starts += sum(1 for task in trace.tasks.values() for sub in task.subtasks if not math.isnan(sub.t_start))
        batched += trace.batched
    assert starts > 50 * TRACES and batched > 5 * TRACES  # the traces exercised the Schedulers


def test_traces_cover_every_order_and_credit_edge() -> None:
    """The traces reach the cases the rules single out: a sub-task that exactly uses up the
    credit, one larger than the whole credit started alone, one held back; every order mode."""
    seen: set[str] = set()
    for seed in range(300):
        trace = _new_trace(seed)
        seen.add(trace.mode)
        original = trace.python.schedule

        def watch(now: float, trace: Trace = trace, original: Any = original) -> list[SubTask]:
            window = trace.python.window
            before = (window.inflight_bytes, window.inflight_count)
            started = original(now)
            credit = trace.leader.params.credit_bytes
            if started and isinstance(trace.python.policy, type(trace.leader)) and credit < math.inf:
                if before[1] == 0 and started[0].nbytes > credit:
                    seen.add("larger than the credit, alone")
                if window.inflight_bytes == credit:
                    seen.add("exactly the credit")
            if trace.python.waiting and isinstance(trace.python.policy, type(trace.leader)):
                seen.add("held back")
            if any(sub.batch is not None for sub in started):
                seen.add("a follower's batch" if trace.mode == "follow" else "a batch")
            if trace.python._open:
                seen.add("a batch held while busy")
            return started

        trace.python.schedule = watch  # type: ignore[method-assign]
        rng = trace.rng
        for _ in range(EVENTS):
            roll = rng.random()
            if roll < 0.4:
                _enqueue(trace)
            elif roll < 0.5 and trace.mode == "follow":
                _announce(trace)
            elif trace.inflight:
                _finish(trace)
    assert seen >= {"leader", "immediate", "follow", "sequence", "larger than the credit, alone", "exactly the credit",
                    "held back", "a batch", "a batch held while busy", "a follower's batch"}


@pytest.mark.parametrize("numel", [0, 1, 2, 7, 1000, 4097, 100_003])
@pytest.mark.parametrize("itemsize", [1, 2, 4, 8])
def test_split_elements_cuts_where_python_cuts(numel: int, itemsize: int) -> None:
    for size in (1, 3, 4, 7.5, 8, 100, 1e3, 4096.25, 2 ** 40, 1e300, math.inf):
        assert native.split_elements(numel, itemsize, float(size)) == split_elements(numel, itemsize, size), size


def test_protocol_violations_are_refused_as_in_python() -> None:
    twin = native.Scheduler("bytescheduler", math.nan, 10.0, 0.0, "leader")
    twin.enqueue(0, "w", 0, 4, 4, -1, 0.0)
    assert twin.ready(0, 0.0) == [(0, 0, False)]
    with pytest.raises(native.SchedulingError, match="ready twice"):
        twin.ready(0, 1.0)
    with pytest.raises(native.SchedulingError, match="before it was enqueued"):
        twin.ready(7, 1.0)
    twin.enqueue(1, "w", 0, 4, 4, -1, 0.0)
    with pytest.raises(native.SchedulingError, match="never started"):
        twin.finish_many([(1, 0)], 1.0)
    assert twin.finish_many([(0, 0)], 1.0) == ([], [0])
    with pytest.raises(native.SchedulingError, match="is for followers"):
        twin.announce([("w", 0, 0)], 1.0)
    assert issubclass(native.SchedulingError, RuntimeError) and issubclass(SchedulingError, RuntimeError)


def test_a_sequence_refuses_a_task_outside_it() -> None:
    twin = native.Scheduler("bytescheduler", math.nan, 10.0, 0.0, "leader")
    twin.set_policy("sequence", ["a", "b"])
    twin.enqueue(0, "z", 0, 4, 4, -1, 0.0)
    with pytest.raises(native.SchedulingError, match="'z' is not in the sequence every rank agreed on"):
        twin.ready(0, 0.0)


@pytest.mark.parametrize("policy", ["p3", "prophet", "tictac"])
def test_policies_without_a_native_scheduler_are_named(policy: str) -> None:
    with pytest.raises(native.SchedulingError, match=f"policy '{policy}' has no native Scheduler"):
        native.Scheduler(policy, math.nan, 10.0, 0.0, "leader")
