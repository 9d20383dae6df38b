"""The sequence policy: every rank starts whole tasks in one agreed cycle of names, so that a
backend matching collectives by issue order (torch.distributed) needs no announcements from rank
0 where nothing is held back. Driven through the bare Scheduler, and through real Cores whose
ranks make their tasks ready in different orders."""

from __future__ import annotations

import itertools
import math
import threading
from typing import Callable

import pytest

from bytesched.core import Config, Core, SchedulingParams, Scheduler, SubTask
from bytesched.core.policies import make_policy
from bytesched.core.policies.sequence import SequenceError, SequencePolicy
from bytesched.core.scheduler import SchedulingError
from coretools import BufferTask

NAMES = ("fc", "conv2", "conv1")  # backward order: the last layer's gradient first
UNLIMITED = SchedulingParams(partition_bytes=math.inf, credit_bytes=math.inf)


def sequenced(params: SchedulingParams = UNLIMITED) -> Scheduler:
    return Scheduler(SequencePolicy(make_policy("bytescheduler", params), NAMES))


@pytest.mark.parametrize("ready_order", list(itertools.permutations(range(3))))
def test_tasks_start_in_the_cycle_whatever_order_they_become_ready(ready_order: tuple[int, ...]) -> None:
    """Every order in which three tasks become ready starts them fc, conv2, conv1: a task ready
    before its turn waits for the ones ahead of it."""
    scheduler = sequenced()
    tasks = [BufferTask(name, priority, 64) for priority, name in enumerate(reversed(NAMES))]
    by_name = {task.name: task for task in tasks}
    now = 0.0
    for task in tasks:
        scheduler.enqueue(task, now)
    order: list[str] = []
    for index in ready_order:
        now += 1.0
        order += [sub.task.name for sub in scheduler.ready(by_name[NAMES[index]], now)]
    assert order == list(NAMES)


def test_pieces_go_in_index_order_and_the_cycle_repeats_every_step() -> None:
    """Partitioned tasks start piece by piece before the next name's turn; the next step's
    tasks (instance 1) follow the same cycle."""
    scheduler = sequenced(SchedulingParams(partition_bytes=32, credit_bytes=math.inf))
    order = []
    for step in range(2):
        tasks = {name: BufferTask(name, 0, 64) for name in NAMES}
        for task in tasks.values():
            scheduler.enqueue(task, float(step))
        for name in ("conv1", "fc", "conv2"):
            order += [(sub.task.name, sub.task.instance, sub.index) for sub in scheduler.ready(tasks[name], step)]
    assert order == [(name, step, index) for step in range(2) for name in NAMES for index in range(2)]


def test_a_task_outside_the_sequence_is_refused_by_name() -> None:
    scheduler = sequenced()
    stray = BufferTask("head", 0, 64)
    scheduler.enqueue(stray, 0.0)
    with pytest.raises(SequenceError, match="'head' is not in the sequence"):
        scheduler.ready(stray, 0.0)


def test_a_sequence_needs_distinct_names() -> None:
    with pytest.raises(ValueError, match="distinct task names"):
        SequencePolicy(make_policy("bytescheduler", UNLIMITED), ("a", "b", "a"))


def test_the_policy_changes_only_while_nothing_waits() -> None:
    scheduler = Scheduler(make_policy("bytescheduler", SchedulingParams(partition_bytes=32, credit_bytes=32)))
    tasks = [BufferTask(name, p, 64) for p, name in enumerate(NAMES)]
    for task in tasks:
        scheduler.enqueue(task, 0.0)
        scheduler.ready(task, 0.0)  # the credit admits one piece: the rest wait
    with pytest.raises(SchedulingError, match="cannot change the policy while 5 ready sub-task"):
        scheduler.set_policy(SequencePolicy(scheduler.policy, NAMES))


def test_cores_of_two_ranks_start_in_one_order_though_their_tasks_become_ready_differently() -> None:
    """Two Cores switched to the sequence: rank 1's tasks become ready in the reverse order of
    rank 0's, and both start fc, conv2, conv1 in each of three steps."""
    cores = [Core(Config(params=UNLIMITED), rank=rank, order="immediate").start() for rank in (0, 1)]
    starts: dict[int, list[str]] = {0: [], 1: []}
    everything = threading.Event()

    def started(rank: int) -> Callable[[SubTask], None]:
        def start(sub: SubTask) -> None:  # on the Core thread: record, then finish at once
            starts[rank].append(sub.task.name)
            if len(starts[0]) == len(starts[1]) == 3 * len(NAMES):
                everything.set()
            sub.task.notify_finish(sub)
        return start

    try:
        for core in cores:
            core.start_in_sequence(NAMES)
            assert core.start_order == "sequence"
        for _step in range(3):
            for rank, core in enumerate(cores):
                for name in (NAMES if rank == 0 else tuple(reversed(NAMES))):
                    core.enqueue(BufferTask(name, 0, 64, on_start=started(rank)), ready=True)
        assert everything.wait(10), starts
        assert starts[0] == starts[1] == list(NAMES) * 3
    finally:
        for core in cores:
            core.shutdown(5.0)
