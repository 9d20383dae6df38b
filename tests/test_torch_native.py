"""The native Core over torch.distributed (bytesched/plugins/torch/native.py, csrc/torch_core.cc),
on two Gloo ranks made in this process (one thread each): rank 0 sends its start order over the
native order link and the follower starts exactly that order, whole tasks reduced exactly; a
collective that cannot start fails its task and the Core goes on; stopping names what was left;
what the stall check reads; and which Core a job gets."""

from __future__ import annotations

import dataclasses
import datetime
import logging
import random
import threading
import time
from typing import Any, Callable, Iterator

import pytest
import torch
import torch.distributed as dist

from bytesched.core import CommTask, Config, Core, SchedulingParams, SubTask, from_env
from bytesched.core.config import ConfigError
from bytesched.core.core import CoreShutdownError
from bytesched.core.stall_check import late_subtasks
from conftest import require

require("bytesched.plugins.torch._native", "the native Core (python csrc/build.py)")
from bytesched.plugins.torch import native as native_module  # noqa: E402  # after the skip without the build
from bytesched.plugins.torch.native import NativeCore, make_core  # noqa: E402  # likewise

TIMEOUT_S = 30.0


class WireTask(CommTask):
    """A task over a tensor, as the plugin's GradientTask hands it over (``wire``); it records
    what the Core tells it."""

    def __init__(self, name: str, priority: int, wire: torch.Tensor) -> None:
        super().__init__(name, priority, wire.numel() * wire.element_size())
        self.wire = wire
        self.errors: list[BaseException] = []
        self.finished = threading.Event()

    def partition(self, size: float) -> list[tuple[Any, int]]:
        raise AssertionError("the native Core cuts the wire buffer itself")

    def start(self, subtask: SubTask) -> None:
        raise AssertionError("the native Core starts the pieces itself")

    def on_error(self, error: BaseException) -> None:
        self.errors.append(error)

    def on_finish(self) -> None:
        self.finished.set()


def _gloo(store: dist.Store, rank: int, size: int) -> dist.ProcessGroup:
    backend = dist.ProcessGroupGloo(store, rank, size, datetime.timedelta(seconds=TIMEOUT_S))
    group = dist.ProcessGroup(store, rank, size)
    group._set_default_backend(dist.ProcessGroup.BackendType.GLOO)
    group._register_backend(torch.device("cpu"), dist.ProcessGroup.BackendType.GLOO, backend)
    return group


def on_ranks(size: int, fn: Callable[[int], Any]) -> list[Any]:
    """``fn(rank)`` on one thread per rank; the results by rank (an exception is raised here)."""
    results: list[Any] = [None] * size
    errors: list[BaseException] = []

    def run(rank: int) -> None:
        try:
            results[rank] = fn(rank)
        except BaseException as error:  # handed to the test's thread
            errors.append(error)
    threads = [threading.Thread(target=run, args=(rank,)) for rank in range(size)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(TIMEOUT_S * 2)
    if errors:
        raise errors[0]
    assert not any(thread.is_alive() for thread in threads), "a rank hung"
    return results


@pytest.fixture
def groups() -> Iterator[list[dist.ProcessGroup]]:
    store = dist.HashStore()
    made = on_ranks(2, lambda rank: _gloo(store, rank, 2))
    yield made


def native_cores(groups: list[dist.ProcessGroup], params: SchedulingParams, **changes: Any) -> list[NativeCore]:
    """A started native Core per rank in rank-0 order, the order link's port shared in memory."""
    config = dataclasses.replace(from_env({}), params=params, **changes)
    port: list[int] = []
    shared = threading.Event()

    def share(value: int) -> int:
        if not port:
            if value:
                port.append(value)
                shared.set()
        shared.wait(TIMEOUT_S)
        return port[0]

    def make(rank: int) -> NativeCore:
        return NativeCore(config, rank=rank, order="rank0", group=groups[rank], share_port=share).start()
    return on_ranks(2, make)


def settle(tasks: list[WireTask]) -> None:
    for task in tasks:
        assert task.finished.wait(TIMEOUT_S), f"{task!r} did not finish"


def drain(core: NativeCore, tasks: list[WireTask]) -> None:
    """Take the Core's completions on this thread, as an update thread does, until ``tasks`` finished."""
    jobs = core.update_jobs()
    for task in tasks:
        task.on_finish = lambda task=task: (jobs.put(task), task.finished.set())  # type: ignore[method-assign]
    done: set[int] = set()
    while len(done) < len(tasks):
        done.add(id(jobs.get()))


def reduced_in_random_order(core: NativeCore, tasks: list[WireTask], seed: int) -> list[torch.Tensor]:
    """Every task made ready on ``core`` in a random order (``seed``), all of them reduced
    without an error: their buffers."""
    order = list(range(len(tasks)))
    random.Random(seed).shuffle(order)
    for i in order:
        core.enqueue(tasks[i], ready=True)
    drain(core, tasks)
    assert all(not task.errors for task in tasks)
    return [task.wire for task in tasks]


def test_followers_start_rank_0s_order_and_every_sum_is_exact(groups: list[dist.ProcessGroup]) -> None:
    """40 tensors of 1 to 300 elements, made ready in another random order on each rank, cut in
    12-byte pieces under a 40-byte credit: were the follower's collectives not rank 0's, Gloo
    would pair pieces of different tensors (wrong sums, or sizes that do not match)."""
    cores = native_cores(groups, SchedulingParams(partition_bytes=12, credit_bytes=40))
    sizes = [random.Random(7).randint(1, 300) for _ in range(40)]

    def train(rank: int) -> list[torch.Tensor]:
        tasks = [WireTask(f"t{i}", priority=i % 5, wire=torch.arange(n, dtype=torch.float32) * (rank + 1))
                 for i, n in enumerate(sizes)]
        return reduced_in_random_order(cores[rank], tasks, seed=rank)
    try:
        results = on_ranks(2, train)
    finally:
        on_ranks(2, lambda rank: cores[rank].shutdown(5.0))
    for n, reduced0, reduced1 in zip(sizes, *results):
        expected = torch.arange(n, dtype=torch.float32) * 3
        assert torch.equal(reduced0, expected) and torch.equal(reduced1, expected)


def test_batches_while_busy_are_rank_0s_on_every_rank_and_sum_exactly(groups: list[dist.ProcessGroup]) -> None:
    """Batching while busy under 256 bytes: small pieces of one element type start together in
    fewer collectives than pieces, a larger tensor and another element type's alone; the follower
    starts rank 0's batches (a batch of other pieces would pair other elements)."""
    cores = native_cores(groups, SchedulingParams(partition_bytes=None, credit_bytes=1_000, batch_bytes=256))
    sizes = [random.Random(3).randint(1, 40) for _ in range(60)] + [400]

    def train(rank: int) -> list[torch.Tensor]:
        tasks = [WireTask(f"t{i}", priority=i, wire=(torch.arange(n) * (rank + 1)).to(
            torch.float64 if i % 7 == 0 else torch.float32)) for i, n in enumerate(sizes)]
        return reduced_in_random_order(cores[rank], tasks, seed=rank + 10)
    try:
        results = on_ranks(2, train)
        started = [core.started() for core in cores]
    finally:
        on_ranks(2, lambda rank: cores[rank].shutdown(5.0))
    for task_sums in zip(*results):
        expected = torch.arange(task_sums[0].numel()).to(task_sums[0].dtype) * 3
        assert all(torch.equal(summed, expected) for summed in task_sums)
    assert started[0] == started[1] and started[0][0] < started[0][1] == len(sizes)


def test_a_piece_that_cannot_start_fails_its_task_and_the_core_goes_on(groups: list[dist.ProcessGroup]) -> None:
    """Gloo refuses 16-bit unsigned integers when the all-reduce is issued: the task is told
    (naming the tensor and Gloo's reason), still completes, and the next task is reduced."""
    cores = native_cores(groups, SchedulingParams(partition_bytes=None, credit_bytes=64))

    def train(rank: int) -> tuple[WireTask, WireTask]:
        bad = WireTask("bad", 0, torch.zeros(4, dtype=torch.uint16))
        good = WireTask("good", 1, torch.ones(4))
        for task in (bad, good):
            cores[rank].enqueue(task, ready=True)
        drain(cores[rank], [bad, good])
        return bad, good
    try:
        results = on_ranks(2, train)
    finally:
        on_ranks(2, lambda rank: cores[rank].shutdown(5.0))
    for bad, good in results:
        assert len(bad.errors) == 1 and "the all-reduce of 'bad' failed" in str(bad.errors[0])
        assert "Invalid scalar type" in str(bad.errors[0])
        assert not good.errors and torch.equal(good.wire, torch.full((4,), 2.0))


def test_what_the_stall_check_reads_and_what_stopping_and_failing_leave(
        groups: list[dist.ProcessGroup], monkeypatch: pytest.MonkeyPatch) -> None:
    """Rank 0 starts a tensor the follower has not produced: rank 0 sees it in flight (the stall
    check's late sub-task), the follower names the announced key it is missing; the follower's own
    tensor waits unannounced. Stopping within its bound tells each unfinished task so; failing
    (the stall timeout's way) tells every unfinished task the error and refuses new ones."""
    monkeypatch.setattr(native_module, "exit_later", lambda reason: None)  # the test process stays
    cores = native_cores(groups, SchedulingParams(partition_bytes=None, credit_bytes=64))
    leader, follower = cores
    stuck = WireTask("stuck", 0, torch.ones(4))
    waiting = WireTask("waiting", 0, torch.ones(4))
    leader.enqueue(stuck, ready=True)
    follower.enqueue(waiting, ready=True)
    assert until(lambda: follower.policy.waiting_for() is not None)  # type: ignore[attr-defined]
    assert follower.policy.waiting_for() == ("stuck", 0, 0)  # type: ignore[attr-defined]
    late = late_subtasks(leader.scheduler, time.monotonic() + 100.0, 50.0)  # type: ignore[arg-type]
    assert [(sub.task.name, sub.index, len(sub.task.subtasks)) for sub in late] == [("stuck", 0, 1)]
    assert "tensor 'stuck' partition 0 of 1" in leader.describe_waiting()
    assert follower.describe_waiting() == "tensor 'waiting' (ready, not started yet)"

    began = time.monotonic()
    follower.shutdown(0.2)
    assert time.monotonic() - began < 5.0
    assert [type(error) for error in waiting.errors] == [CoreShutdownError]
    with pytest.raises(RuntimeError, match="shut down"):
        follower.enqueue(WireTask("later", 0, torch.ones(1)), ready=True)

    jobs = leader.update_jobs()
    updates = threading.Thread(target=jobs.get)  # delivers the failure; ends at the None put below
    updates.start()
    error = RuntimeError("stall timeout: tensor 'stuck' (a test)")
    leader.fail(error, exit_reason="a test")
    assert until(lambda: bool(stuck.errors)) and stuck.errors == [error] and leader.failure is error
    with pytest.raises(RuntimeError, match="failed earlier: stall timeout"):
        leader.enqueue(WireTask("later", 0, torch.ones(1)), ready=True)
    jobs.put(None)
    updates.join(TIMEOUT_S)
    groups[1].allreduce([torch.ones(4)]).wait()  # the collective rank 0 started, so Gloo is idle again
    leader.shutdown(0.2)


def test_no_thread_outside_python_holds_the_plugins_tensors(groups: list[dist.ProcessGroup]) -> None:
    """The Core's thread and Gloo's threads hold tensors of the Core's own over a task's memory,
    never the plugin's tensor: letting go of the last C++ reference to a tensor with a Python
    object takes the GIL, which a thread outside Python cannot do once the interpreter finalizes
    (Gloo lets go of a collective's tensors when it is done with it; at exit that aborted the
    process). A tensor waiting in the follower's Core for rank 0's order, and one whose all-reduce
    is in flight on rank 0, keep the reference count they had before they were enqueued."""
    cores = native_cores(groups, SchedulingParams(partition_bytes=8, credit_bytes=64))
    leader, follower = cores
    in_flight = WireTask("in flight", 0, torch.ones(4))
    waiting = WireTask("waiting", 1, torch.ones(4))
    before = (in_flight.wire._use_count(), waiting.wire._use_count())
    try:
        follower.enqueue(waiting, ready=True)
        leader.enqueue(in_flight, ready=True)
        assert until(lambda: "'in flight' partition" in leader.describe_waiting())
        assert until(lambda: follower.describe_waiting() == "tensor 'waiting' (ready, not started yet)")
        assert (in_flight.wire._use_count(), waiting.wire._use_count()) == before
    finally:
        groups[1].allreduce([torch.zeros(2)]).wait()  # each piece rank 0 started, so Gloo is idle again
        groups[1].allreduce([torch.zeros(2)]).wait()
        on_ranks(2, lambda rank: cores[rank].shutdown(0.2))


def until(condition: Callable[[], bool]) -> bool:
    """Poll ``condition`` until it holds (True) or the test's timeout passed (False)."""
    deadline = time.monotonic() + TIMEOUT_S
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_the_job_gets_the_core_it_can_have(one_rank_group: object, caplog: pytest.LogCaptureFixture) -> None:
    """bytescheduler and fifo on CPU gradients: native; other policies, CUDA gradients or a backend
    that starts its pieces itself: the Python Core, with a log line naming why (an error where
    BYTESCHED_NATIVE=on asked for native)."""
    share = lambda value: value  # noqa: E731 (one rank)
    cpu, cuda = torch.device("cpu"), torch.device("cuda")

    def core(config: Config, device: torch.device = cpu, **options: Any) -> Core:
        return make_core(config, dist.group.WORLD, device, share, **options, rank=0, order="rank0")

    native = core(from_env({}))
    assert isinstance(native, NativeCore)
    assert type(core(from_env({"BYTESCHED_NATIVE": "off"}))) is Core
    with caplog.at_level(logging.INFO, logger="bytesched"):
        assert type(core(from_env({"BYTESCHED_POLICY": "p3"}))) is Core
        assert type(core(from_env({}), cuda)) is Core
        assert type(core(from_env({}), own_start=True)) is Core
    messages = [record.getMessage() for record in caplog.records]
    assert any("the p3 policy has no native Scheduler" in m for m in messages), messages
    assert any("the gradients live on cuda" in m for m in messages), messages
    assert any("starts each piece its own way" in m for m in messages), messages
    with pytest.raises(ConfigError, match="BYTESCHED_NATIVE=on, but the prophet policy has no native Scheduler"):
        core(from_env({"BYTESCHED_NATIVE": "on", "BYTESCHED_POLICY": "prophet"}))
