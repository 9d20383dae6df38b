"""The runtime Core: one scheduler thread fed by concurrent producers, bounded shutdown, errors."""

from __future__ import annotations

import gc
import logging
import queue
import random
import re
import threading
import time
import weakref
from typing import Callable

import psutil
import pytest

import bytesched.core as core_mod
from bytesched.core import CommTask, Config, Core, CoreShutdownError, Scheduler, SchedulingParams, SubTask
from bytesched.core.forward import ForwardRecorder
from bytesched.core.policies import TicTacPolicy, make_policy
from bytesched.core.policies.tictac import TicTacGraph

from coretools import BufferTask


class Network:
    """Finishes started sub-tasks from worker threads after a random short delay (like a backend)."""

    def __init__(self, workers: int = 3, seed: int = 0) -> None:
        self.inbox: queue.SimpleQueue = queue.SimpleQueue()
        self.rng = random.Random(seed)
        self.threads = [threading.Thread(target=self._serve, daemon=True) for _ in range(workers)]
        for t in self.threads:
            t.start()

    def submit(self, sub: SubTask) -> None:
        self.inbox.put(sub)

    def _serve(self) -> None:
        while (sub := self.inbox.get()) is not None:
            if self.rng.random() < 0.1:
                time.sleep(0.0005)
            sub.task.notify_finish(sub)

    def close(self) -> None:
        for _ in self.threads:
            self.inbox.put(None)
        for t in self.threads:
            t.join(5)


def make_core(credit: float = 4000, partition: float = 1000, **kw) -> Core:
    return Core(Config(params=SchedulingParams(partition_bytes=partition, credit_bytes=credit), **kw)).start()


def test_concurrent_producers_all_finish_within_credit() -> None:
    core = make_core()
    net = Network()
    violations: list[str] = []
    done = threading.Semaphore(0)

    class Task(BufferTask):
        def start(self, sub: SubTask) -> None:
            window = core.scheduler.window
            if window.inflight_count > 1 and window.inflight_bytes > 4000:
                violations.append(f"{window.inflight_bytes} bytes in flight")
            super().start(sub)
            net.submit(sub)

        def on_finish(self) -> None:
            super().on_finish()
            done.release()

    tasks: list[Task] = []
    lock = threading.Lock()

    def produce(p: int) -> None:
        rng = random.Random(p)
        for i in range(300):
            t = Task(f"p{p}.t{i}", rng.randrange(10), 4 * rng.randrange(1, 800))
            with lock:
                tasks.append(t)
            if rng.random() < 0.5:
                core.enqueue(t, ready=True)
            else:
                core.enqueue(t)
                t.notify_ready()

    producers = [threading.Thread(target=produce, args=(p,)) for p in range(4)]
    for t in producers:
        t.start()
    for t in producers:
        t.join()
    for _ in range(len(tasks)):
        assert done.acquire(timeout=30), "a task never finished"
    net.close()
    core.shutdown(5)
    assert not violations
    # every partition started once; the Core released the completed tasks' sub-tasks
    assert all(t.finished_callbacks == 1 and sum(s.nbytes for s in t.started) == t.nbytes
               and len({s.index for s in t.started}) == len(t.started) and t.subtasks == () for t in tasks)
    assert core.scheduler.idle and not core.running


class Instant(CommTask):
    """Three partitions, each finished the moment it starts; ``done`` is set once all have."""

    def __init__(self, name: str, done: threading.Event) -> None:
        super().__init__(name, 0, 3000)
        self.done = done

    def partition(self, size: float) -> list[tuple[None, int]]:
        return [(None, 1000)] * 3

    def start(self, sub: SubTask) -> None:
        self.notify_finish(sub)

    def on_finish(self) -> None:
        self.done.set()


def completed(core: Core) -> weakref.ref[Instant]:
    """A weak reference to an :class:`Instant` task the Core completed (and handled), the caller
    holding no other."""
    done = threading.Event()
    task = Instant("w", done)
    core.enqueue(task, ready=True)
    assert done.wait(5)
    return weakref.ref(task)


def test_a_completed_task_is_freed_without_the_cyclic_garbage_collector() -> None:
    """Task and sub-tasks point at each other; the Core cuts that cycle once the task completed,
    so a training step's tasks die by reference counting (no collector pauses on the Core)."""
    core = make_core()
    gc.disable()
    try:
        alive = completed(core)
        assert core.take_stats().subtasks_finished == 3  # answered on the Core thread after the cut
        assert alive() is None
    finally:
        gc.enable()
        core.shutdown(1)


def test_the_core_thread_keeps_nothing_of_its_last_wake_up_while_it_waits() -> None:
    """Once the last finishes of a step were handled and the Core's thread waits for its next
    event, none of their sub-tasks (nor, through them, their tasks) stays referenced: a step's
    tasks die then, not during the next step, where Python's collector would count them. No event
    follows the finishes here, so a thread that kept its last run of them would keep the task."""
    core = make_core()
    gc.disable()
    try:
        alive = completed(core)
        deadline = time.monotonic() + 2.0
        while alive() is not None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert alive() is None
    finally:
        gc.enable()
        core.shutdown(1)


def core_thread_cpu(core: Core) -> float:
    tid = core._thread.native_id  # type: ignore[union-attr]
    (thread,) = [t for t in psutil.Process().threads() if t.id == tid]
    return thread.user_time + thread.system_time


def test_idle_core_uses_no_cpu() -> None:
    core = make_core()
    time.sleep(0.2)
    before = core_thread_cpu(core)
    time.sleep(1.0)
    used = core_thread_cpu(core) - before
    core.shutdown(1)
    assert used < 0.05, f"idle Core thread used {used:.3f} s of CPU in 1 s"


class Polled:
    """Operations that end when the test says so and are only seen ending when polled (as
    Horovod's handles): a :class:`~bytesched.core.core.Completions`."""

    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.in_flight: list[SubTask] = []
        self.ended: set[str] = set()
        self.polls = 0
        self.polling_threads: set[int] = set()

    def poll(self) -> float | None:
        self.polls += 1
        self.polling_threads.add(threading.get_ident())
        if not self.in_flight:
            return None
        for sub in [s for s in self.in_flight if s.task.name in self.ended]:
            self.in_flight.remove(sub)
            sub.task.notify_finish(sub)
        return self.delay


def test_the_core_polls_completions_between_events_and_sleeps_between_polls() -> None:
    core = make_core()
    source = Polled(delay=0.01)
    stop_polling = core.poll_completions(source)
    try:
        tasks = [BufferTask(f"t{i}", i, 400, on_start=source.in_flight.append) for i in range(3)]
        for task in tasks:
            core.enqueue(task, ready=True)
        deadline = time.monotonic() + 5
        while len(source.in_flight) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        before, polls = core_thread_cpu(core), source.polls
        time.sleep(0.5)  # three operations in flight, none ended: a poll per 10 ms, no spinning
        used = core_thread_cpu(core) - before
        assert used < 0.1, f"the Core thread used {used:.2f} s of CPU in 0.5 s while polling"
        assert 10 <= source.polls - polls <= 60
        source.ended.update({"t2", "t0"})
        assert core.wait_idle(0) is False
        deadline = time.monotonic() + 2
        while sum(t.finished_callbacks for t in tasks) < 2 and time.monotonic() < deadline:
            time.sleep(0.005)
        assert [t.finished_callbacks for t in tasks] == [1, 0, 1]
        stop_polling()  # t1 is still in flight: it is still reported
        source.ended.add("t1")
        assert core.wait_idle(2.0) and tasks[1].finished_callbacks == 1
        assert source.polling_threads == {core._thread.ident}  # type: ignore[union-attr]
        time.sleep(0.05)  # the poll that finds nothing in flight drops the stopped source
        polls = source.polls
        time.sleep(0.05)
        assert source.polls == polls  # no longer polled
    finally:
        core.shutdown(1)


class Mailbox:
    """Events that "engine" threads post and only a wait delivers, on the waiting thread (as the
    MXNet Dependency Proxies' queue): an :class:`~bytesched.core.core.EventSource`."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._posted: list[Callable[[], None]] = []
        self._woken = self._closed = False
        self.waits = self.wakes = 0
        self.delivering_threads: set[int] = set()

    def post(self, event: Callable[[], None]) -> None:
        with self._changed:
            self._posted.append(event)
            self._changed.notify_all()

    def wake(self) -> None:
        with self._changed:
            self.wakes += 1
            self._woken = True
            self._changed.notify_all()

    def close(self) -> None:
        with self._changed:
            self._closed = True
            self._changed.notify_all()

    def wait(self, timeout: float | None) -> bool:
        self.waits += 1
        with self._changed:
            self._changed.wait_for(lambda: self._posted or self._woken or self._closed, timeout)
            events, self._posted, self._woken = self._posted, [], False
            closed = self._closed
        for event in events:
            self.delivering_threads.add(threading.get_ident())
            event()
        return bool(events) or not closed


def engine_finishes(source: Mailbox) -> Callable[[SubTask], None]:
    """A start that finishes its sub-task through ``source``, from another thread, a moment later."""
    def start(sub: SubTask) -> None:
        timer = threading.Timer(0.001, source.post, args=(lambda: sub.task.notify_finish(sub),))
        timer.daemon = True
        timer.start()
    return start


def test_a_core_waiting_on_an_event_source_gets_its_events_on_its_thread_and_is_woken_by_others() -> None:
    core = make_core(credit=1000, partition=400)
    source = Mailbox()
    core.wait_on(source)
    core.wait_on(source)  # the same source again: nothing changes
    try:
        tasks = [BufferTask(f"t{i}", i, 800, on_start=engine_finishes(source)) for i in range(20)]
        for task in tasks:  # ready from this thread: each ready event must wake the Core
            core.enqueue(task)
            task.notify_ready()
        assert core.wait_idle(5.0), "sub-tasks finished through the source never reached the Core"
        assert [t.finished_callbacks for t in tasks] == [1] * 20
        assert sum(len(t.started) for t in tasks) == 40  # two partitions each, one credit at a time
        assert source.delivering_threads == {core._thread.ident}  # type: ignore[union-attr]
        assert source.waits > 0
        for _ in range(20):  # asleep in the source's wait with no timeout, and answering at once
            began = time.monotonic()
            assert core.query(lambda: 1) == 1 and time.monotonic() - began < 1.0
        before = core_thread_cpu(core)
        time.sleep(0.5)
        assert core_thread_cpu(core) - before < 0.05, "the Core spun while waiting on its source"
        with pytest.raises(RuntimeError, match="already waits on another event source"):
            core.wait_on(Mailbox())
    finally:
        core.shutdown(1)


def test_an_enqueue_of_a_task_not_ready_waits_for_its_ready_event_without_waking_the_source() -> None:
    """The Core has nothing to do for a task before it is ready, and the ready event comes
    through the source, which wakes the Core: the training thread's enqueues cost no wake-up."""
    core = make_core(credit=1000, partition=400)
    source = Mailbox()
    core.wait_on(source)
    try:
        tasks = [BufferTask(f"t{i}", i, 800, on_start=engine_finishes(source)) for i in range(20)]
        wakes = source.wakes
        for task in tasks:
            core.enqueue(task)
        assert source.wakes == wakes, "an enqueue of a task not ready woke the Core's source"
        for task in tasks:  # as the engine's ready proxies do, from another thread
            source.post(task.notify_ready)
        assert core.wait_idle(5.0), "tasks enqueued without a wake-up were never scheduled"
        assert [t.finished_callbacks for t in tasks] == [1] * 20
        assert [len(t.started) for t in tasks] == [2] * 20
    finally:
        core.shutdown(1)


def test_a_closed_event_source_leaves_the_core_on_its_own_queue() -> None:
    core = make_core()
    source = Mailbox()
    core.wait_on(source)
    try:
        source.close()
        task = BufferTask("after", 0, 400)
        core.enqueue(task, ready=True)
        deadline = time.monotonic() + 5
        while not task.started and time.monotonic() < deadline:
            time.sleep(0.01)
        waits = source.waits
        task.notify_finish(task.started[0])  # from this thread, as any backend's thread would
        assert core.wait_idle(2.0) and task.finished_callbacks == 1
        assert source.waits == waits, "the Core kept waiting on a closed source"
    finally:
        core.shutdown(1)


def test_shutdown_with_work_in_flight_is_bounded_and_tells_the_task() -> None:
    core = make_core()
    stuck = BufferTask("stuck", 0, 400)  # started, never finished by anyone
    core.enqueue(stuck, ready=True)
    deadline = time.monotonic() + 5
    while not stuck.started and time.monotonic() < deadline:
        time.sleep(0.01)
    t0 = time.monotonic()
    core.shutdown(timeout=0.5)
    assert time.monotonic() - t0 < 3
    assert len(stuck.errors) == 1 and isinstance(stuck.errors[0], CoreShutdownError)
    with pytest.raises(RuntimeError, match="shut down"):
        core.enqueue(BufferTask("late", 0, 4))


def test_wait_idle_returns_once_every_finish_was_handled() -> None:
    """What the start-up plan waits for before it stops observing: a started, unfinished sub-task
    keeps the Core busy (False after the timeout); once its finish was handled, True at once."""
    core = make_core()
    try:
        assert core.wait_idle(1.0)
        task = BufferTask("busy", 0, 400)
        core.enqueue(task, ready=True)
        deadline = time.monotonic() + 5
        while not task.started and time.monotonic() < deadline:
            time.sleep(0.01)
        began = time.monotonic()
        assert not core.wait_idle(0.05) and time.monotonic() - began < 1.0
        task.notify_finish(task.started[0])
        assert core.wait_idle(1.0) and task.finished_callbacks == 1
    finally:
        core.shutdown()


def test_enqueue_before_start_is_an_error() -> None:
    core = Core(Config())
    with pytest.raises(RuntimeError, match="not started"):
        core.enqueue(BufferTask("x", 0, 4))


def test_signals_of_a_task_never_enqueued_name_it() -> None:
    task = BufferTask("orphan", 0, 8)
    sched = Scheduler(make_policy("fifo", SchedulingParams()))
    sched.enqueue(task, 0.0)  # partitioned by a bare Scheduler, never handed to a Core
    for signal in (task.notify_ready, lambda: task.notify_finish(task.subtasks[0])):
        with pytest.raises(RuntimeError, match="CommTask 'orphan' was not enqueued to a Core"):
            signal()


def test_a_failing_start_fails_that_task_only() -> None:
    core = make_core()
    finished = threading.Event()

    class Broken(BufferTask):
        def start(self, sub: SubTask) -> None:
            raise ValueError("backend refused")

    class Fine(BufferTask):
        def start(self, sub: SubTask) -> None:
            self.notify_finish(sub)

        def on_finish(self) -> None:
            finished.set()

    broken = Broken("broken", 0, 4)
    core.enqueue(broken, ready=True)
    core.enqueue(Fine("fine", 1, 4), ready=True)
    assert finished.wait(5)
    assert [type(e) for e in broken.errors] == [ValueError]
    core.shutdown(0.2)


def test_a_protocol_violation_stops_the_core_loudly() -> None:
    core = make_core()
    task = BufferTask("twice", 0, 4)
    core.enqueue(task, ready=True)
    task.notify_ready()
    deadline = time.monotonic() + 5
    while core.running and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not core.running and "ready twice" in str(core.failure)
    with pytest.raises(RuntimeError, match="failed earlier"):
        core.enqueue(BufferTask("next", 0, 4))


def test_stall_warning_names_the_tensor_and_partition(caplog: pytest.LogCaptureFixture) -> None:
    core = make_core(stall_warning_s=0.2)
    core.enqueue(BufferTask("layer3.weight", 0, 400), ready=True)
    with caplog.at_level(logging.WARNING, logger="bytesched"):
        time.sleep(0.6)
    core.shutdown(0.1)
    assert any("layer3.weight" in r.getMessage() and "partition 0" in r.getMessage() for r in caplog.records)


def test_stall_timeout_fails_the_core_and_its_tasks_from_the_stall_check(monkeypatch: pytest.MonkeyPatch) -> None:
    exits: list[str] = []
    monkeypatch.setattr(core_mod.core, "exit_later", lambda reason, grace_s=10.0: exits.append(reason))
    core = make_core(stall_warning_s=0.2, stall_timeout_s=0.4)
    task = BufferTask("layer3.weight", 0, 400)
    core.enqueue(task, ready=True)
    deadline = time.monotonic() + 5
    while core.running and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not core.running
    assert "stall timeout: tensor 'layer3.weight' partition 0 of 1" in str(core.failure)
    assert task.errors and task.errors[0] is core.failure  # the training loop hears of it
    assert len(exits) == 1 and re.fullmatch(r"tensor 'layer3\.weight' partition 0 of 1 \(started \d+ s ago\) "
                                            r"on rank 0 \(BYTESCHED_STALL_TIMEOUT_S=0\.4\)", exits[0]), exits
    with pytest.raises(RuntimeError, match="failed earlier"):
        core.enqueue(BufferTask("next", 0, 4))


def test_a_core_thread_blocked_in_a_start_is_reported_by_the_stall_check(monkeypatch: pytest.MonkeyPatch,
                                                                          caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(core_mod.stall_check, "QUERY_S", 0.2)
    core = make_core(stall_warning_s=0.2)
    blocked = threading.Event()
    task = BufferTask("layer3.weight", 0, 4, on_start=lambda sub: blocked.wait(2.0))  # a backend stuck in start()
    with caplog.at_level(logging.WARNING, logger="bytesched"):
        core.enqueue(task, ready=True)
        time.sleep(1.0)
        blocked.set()
    core.shutdown(1.0)
    assert any("Core thread of rank 0 has not answered" in r.getMessage() for r in caplog.records), caplog.text


def test_set_params_and_stats_through_the_core() -> None:
    core = make_core(credit=4, partition=4)
    held: list[SubTask] = []
    core.enqueue(BufferTask("a", 0, 16, on_start=held.append), ready=True)
    time.sleep(0.1)
    assert len(held) == 1  # credit of 4 bytes: one piece at a time
    core.set_params(SchedulingParams(partition_bytes=4, credit_bytes=1000))
    time.sleep(0.1)
    assert len(held) == 4
    for sub in held:
        sub.task.notify_finish(sub)
    time.sleep(0.1)
    stats = core.take_stats()
    assert (stats.subtasks_started, stats.subtasks_finished, stats.bytes_started) == (4, 4, 16)
    core.shutdown(1)


def test_one_core_per_process() -> None:
    cfg = Config()
    first = core_mod.init(cfg)
    try:
        assert core_mod.init(cfg) is first and core_mod.get_core() is first
        with pytest.raises(RuntimeError, match="another configuration"):
            core_mod.init(Config(policy="p3"))
    finally:
        core_mod.shutdown(1)
    with pytest.raises(RuntimeError, match="not initialised"):
        core_mod.get_core()


SCRIPT = ["ready 5", "ready 4", "finish", "ready 3", "finish", "finish", "ready 2", "ready 1", "finish",
          "ready 0", *["finish"] * 40]
"""Readiness in backward order (task 5 first), interleaved with completions of the oldest sub-task
in flight; then every remaining sub-task completes, oldest first."""


def branching_graph() -> TicTacGraph:
    """The first forward pass of an Inception-style block over SCRIPT's tasks, as a plugin traces
    it: a stem reading t0, branches reading t1, t2 then t3, and t4, joined, then a layer reading
    t5. TIC ranks t4 (one transfer past the stem) before t3 (two)."""
    recorder = ForwardRecorder(key=lambda name: name)
    recorder.op(["x", "t0"], ["stem"])
    recorder.op(["stem", "t1"], ["a"])
    recorder.op(["stem", "t2"], ["b1"])
    recorder.op(["b1", "t3"], ["b2"])
    recorder.op(["stem", "t4"], ["c"])
    recorder.op(["a", "b2", "c"], ["joined"])
    recorder.op(["joined", "t5"], ["out"])
    return recorder.finish().tictac_graph({f"t{i}": [f"t{i}"] for i in range(6)})


def scripted_order(policy: str, drive: str, graph: TicTacGraph | None = None) -> list[tuple[str, int]]:
    """The start order of SCRIPT's events under ``policy``: through the threaded Core (``core``),
    or through the bare Scheduler as the simulator drives it (``scheduler``), time advancing by
    one millisecond per event in both; a ``tictac`` policy ordered by TIC on ``graph`` (the
    Core's is given it as a plugin gives it)."""
    params = SchedulingParams(partition_bytes=1000, credit_bytes=2500)
    started: list[SubTask] = []
    finished = 0
    if drive == "scheduler":
        leader = make_policy(policy, params)
        if graph is not None:
            assert isinstance(leader, TicTacPolicy)
            leader.set_graph(graph, variant="tic")
        scheduler = Scheduler(leader)
        tasks = [BufferTask(f"t{i}", i, 1000 * (i % 3 + 1)) for i in range(6)]
        for task in tasks:
            scheduler.enqueue(task, 0.0)
        for step, event in enumerate(SCRIPT, start=1):
            now = step * 1e-3
            if event == "finish":
                if finished < len(started):
                    started += scheduler.finish(started[finished], now)
                    finished += 1
            else:
                started += scheduler.ready(tasks[int(event.split()[1])], now)
        return [(s.task.name, s.index) for s in started]
    core = Core(Config(params=params, policy=policy)).start()
    try:
        if graph is not None:
            assert core.set_graph(graph) == [f"t{i}" for i in (0, 1, 2, 4, 3, 5)]
        tasks = [BufferTask(f"t{i}", i, 1000 * (i % 3 + 1), on_start=started.append) for i in range(6)]
        for task in tasks:
            core.enqueue(task)

        def settle() -> None:  # every event posted so far was handled (starts included)
            done = threading.Event()
            core.call_soon(done.set)
            assert done.wait(10.0)

        settle()
        for event in SCRIPT:
            if event == "finish":
                if finished < len(started):
                    sub = started[finished]
                    sub.task.notify_finish(sub)
                    finished += 1
            else:
                tasks[int(event.split()[1])].notify_ready()
            settle()
            time.sleep(1e-3)
        return [(s.task.name, s.index) for s in started]
    finally:
        core.shutdown(5.0)


@pytest.mark.parametrize("policy", core_mod.config.POLICIES)
def test_the_runtime_core_starts_in_the_order_the_simulator_drives(policy: str) -> None:
    """Same events, same order: the runtime Core and the simulator are two drivers of one state
    machine, for every policy a job can run."""
    expected = scripted_order(policy, "scheduler")
    assert {name for name, _ in expected} == {f"t{i}" for i in range(6)}  # every task ran
    assert scripted_order(policy, "core") == expected


def test_a_tictac_core_given_a_traced_graph_starts_in_the_order_the_simulator_drives() -> None:
    """The graph is an input like the events: ordered by TIC on a branching forward pass, the
    runtime Core and the bare Scheduler start the same sequence, which is not the tasks' own
    priority order (the policy without a graph)."""
    expected = scripted_order("tictac", "scheduler", branching_graph())
    assert scripted_order("tictac", "core", branching_graph()) == expected
    assert expected != scripted_order("tictac", "scheduler")
