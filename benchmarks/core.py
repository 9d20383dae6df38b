"""``python -m benchmarks core``: how many sub-task lifecycles per second the runtime Core sustains.

A lifecycle is what the Core does for every partition of every gradient: the task is enqueued
and partitioned, becomes ready, its sub-task is ordered by priority and admitted under the
credit, started, and finished. The tasks here start a no-op communication (``start`` reports the
finish at once), so the figure is the Core's own cost per sub-task, the ceiling of what it can
schedule. Producers behave like training steps: each enqueues a model's gradients in backward
order (last layer first), all ready, and waits for them all before the next step.

Two figures put the rate in context, measured in the same run: the same lifecycles in a bare
single-threaded loop over a deque and a heap (the least any Python scheduler does), and the Core
thread's CPU use while idle (the original ByteScheduler busy-polled; this Core must sleep).
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import os
import platform
import statistics
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable

from bytesched.core import CommTask, Config, Core, SchedulingParams, SubTask

PIECE_BYTES = 4_000
"""Partition size of the benchmark: each tensor is ``partitions`` pieces of this many bytes (far
below the credit, so the window admits every ready piece and only the Core's overhead counts)."""

STEP_TIMEOUT_S = 60.0


class BenchError(RuntimeError):
    """The benchmark could not measure (the Core failed, lost sub-tasks or stopped answering)."""


@dataclass(frozen=True)
class Workload:
    """What one measurement runs: ``steps`` steps of ``tensors`` tensors per producer."""

    tensors: int
    partitions: int
    producers: int
    steps: int

    @property
    def subtasks(self) -> int:
        """Sub-task lifecycles in one measurement."""
        return self.steps * self.producers * self.tensors * self.partitions

    @classmethod
    def at_least(cls, subtasks: int, tensors: int, partitions: int, producers: int) -> "Workload":
        """The smallest whole number of steps giving ``subtasks`` lifecycles or more."""
        per_step = producers * tensors * partitions
        return cls(tensors, partitions, producers, max(1, math.ceil(subtasks / per_step)))


@dataclass(frozen=True)
class Timing:
    """One measurement: wall-clock and this process's CPU time (all its threads), in seconds."""

    wall: float
    cpu: float

    @classmethod
    def since(cls, wall0: float, cpu0: float) -> "Timing":
        """From ``time.perf_counter()`` and ``time.process_time()`` readings until now."""
        return cls(time.perf_counter() - wall0, time.process_time() - cpu0)


@dataclass(frozen=True)
class Rate:
    """Sub-task lifecycles per second over repeated measurements.

    Per second of wall-clock time, and per second of the process's CPU time: on a machine shared
    with other jobs the wall-clock rate drops while the CPU rate stays (the Core's threads take
    turns on the GIL, so on an idle machine the two are close).
    """

    subtasks: int
    timings: list[Timing]

    @property
    def median(self) -> float:
        """The figure reported (robust to a repeat disturbed by another process)."""
        return statistics.median(self.subtasks / t.wall for t in self.timings)

    @property
    def cpu_median(self) -> float:
        """Median lifecycles per second of CPU time."""
        return statistics.median(self.subtasks / t.cpu for t in self.timings)

    def as_dict(self) -> dict[str, Any]:
        """JSON form: both medians and every run."""
        return {"subtasks": self.subtasks,
                "median": round(self.median), "runs": [round(self.subtasks / t.wall) for t in self.timings],
                "cpu_median": round(self.cpu_median), "cpu_runs": [round(self.subtasks / t.cpu) for t in self.timings]}


# ----------------------------------------------------------------------------------------------
# Through the runtime Core.


class _Step:
    """One producer's step: armed before it enqueues, counted down on the Core thread.

    Only the Core thread touches ``unfinished`` while a step runs (the producer arms the next step
    only after ``done`` is set), so no lock is needed.
    """

    def __init__(self) -> None:
        self.unfinished = 0
        self.done = threading.Event()

    def arm(self, tasks: int) -> None:
        """A new step of ``tasks`` tasks is about to be enqueued."""
        self.done.clear()
        self.unfinished = tasks

    def task_finished(self) -> None:
        """Called by a task's :meth:`~CommTask.on_finish` on the Core thread."""
        self.unfinished -= 1
        if self.unfinished == 0:
            self.done.set()


class NoOpTask(CommTask):
    """A tensor whose communication finishes the moment it starts: only the Core's work counts.

    The cheapest plugin possible: its pieces (``partitions`` of :data:`PIECE_BYTES`, the
    benchmark's partition size) are computed once per producer, not per task, so the figure is
    the Core's cost, not a plugin's.
    """

    def __init__(self, name: str, priority: int, pieces: list[tuple[None, int]], step: _Step) -> None:
        super().__init__(name, priority, len(pieces) * PIECE_BYTES)
        self._pieces = pieces
        self._step = step

    def partition(self, size: float) -> list[tuple[None, int]]:
        if size != PIECE_BYTES:
            raise BenchError(f"the benchmark's Core partitions at {size} bytes, not {PIECE_BYTES}")
        return self._pieces

    def start(self, subtask: SubTask) -> None:
        self.notify_finish(subtask)

    def on_finish(self) -> None:
        self._step.task_finished()


def _bench_config() -> Config:
    return Config(params=SchedulingParams(partition_bytes=PIECE_BYTES))


def _produce(core: Core, workload: Workload, producer: int, go: threading.Barrier) -> None:
    """Run ``workload.steps`` steps: enqueue every tensor, last layer first, then wait for all."""
    names = [f"p{producer}.layer{t}" for t in range(workload.tensors)]
    pieces = [(None, PIECE_BYTES)] * workload.partitions
    step = _Step()
    go.wait()
    for _ in range(workload.steps):
        step.arm(workload.tensors)
        for priority in reversed(range(workload.tensors)):
            core.enqueue(NoOpTask(names[priority], priority, pieces, step), ready=True)
        if not step.done.wait(STEP_TIMEOUT_S):
            raise BenchError(f"producer {producer}: a step did not finish within {STEP_TIMEOUT_S:.0f} s "
                             f"({step.unfinished} tasks unfinished; Core failure: {core.failure!r})")


def core_timing(workload: Workload) -> Timing:
    """``workload`` through a fresh Core fed by ``workload.producers`` threads."""
    core = Core(_bench_config()).start()
    errors: list[BaseException] = []

    def producer(index: int) -> None:
        try:
            _produce(core, workload, index, go)
        except BaseException as exc:  # reported by the measuring thread
            errors.append(exc)
            go.abort()

    go = threading.Barrier(workload.producers + 1)
    threads = [threading.Thread(target=producer, args=(i,), name=f"bench-producer-{i}", daemon=True)
               for i in range(workload.producers)]
    try:
        for thread in threads:
            thread.start()
        go.wait()
        wall0, cpu0 = time.perf_counter(), time.process_time()
        for thread in threads:
            thread.join()
        timing = Timing.since(wall0, cpu0)
        if errors:
            raise BenchError(f"a producer failed: {errors[0]}") from errors[0]
        finished = core.take_stats().subtasks_finished
    finally:
        core.shutdown(timeout=10.0)
    if finished != workload.subtasks:
        raise BenchError(f"the Core finished {finished} sub-tasks, expected {workload.subtasks}")
    return timing


def _on_core_thread(core: Core, fn: Callable[[], float]) -> float:
    """Run ``fn`` on the Core thread and return its result."""
    box: list[float] = []
    done = threading.Event()

    def call() -> None:
        box.append(fn())
        done.set()

    core.call_soon(call)
    if not done.wait(10.0):
        raise BenchError("the Core did not run a call within 10 s")
    return box[0]


def idle_cpu_percent(seconds: float) -> float:
    """CPU time of an idle Core's thread as a percentage of ``seconds`` of wall time.

    The thread's own CPU clock (``time.thread_time``) is read on the Core thread itself through
    :meth:`Core.call_soon`, at the start and at the end: nanosecond resolution, no ``/proc``.
    """
    core = Core(_bench_config()).start()
    try:
        time.sleep(0.2)  # past start-up, into the blocking wait
        cpu0, wall0 = _on_core_thread(core, time.thread_time), time.perf_counter()
        time.sleep(seconds)
        cpu1, wall1 = _on_core_thread(core, time.thread_time), time.perf_counter()
    finally:
        core.shutdown(timeout=10.0)
    return 100.0 * (cpu1 - cpu0) / (wall1 - wall0)


# ----------------------------------------------------------------------------------------------
# The reference: the same lifecycles with nothing but a deque of events and a heap.


class _Piece:
    __slots__ = ("task", "index", "nbytes")

    def __init__(self, task: "_Tensor", index: int, nbytes: int) -> None:
        self.task = task
        self.index = index
        self.nbytes = nbytes


class _Tensor:
    __slots__ = ("priority", "seq", "pieces", "remaining")

    def __init__(self, priority: int, seq: int, partitions: int) -> None:
        self.priority = priority
        self.seq = seq
        self.pieces = [_Piece(self, i, PIECE_BYTES) for i in range(partitions)]
        self.remaining = partitions


def reference_timing(workload: Workload) -> Timing:
    """``workload`` through a bare single-threaded loop doing the same steps.

    Events go through a deque, ready pieces through a heap ordered like the Core's (priority,
    enqueue order, index); a start is a call that appends the finish event. No threads, locks,
    credit, statistics or checks: the least any Python scheduler does per sub-task.
    """
    events: deque[tuple[bool, Any]] = deque()
    heap: list[tuple[int, int, int, _Piece]] = []
    finished = 0
    seq = 0

    def start(piece: _Piece) -> None:
        events.append((True, piece))

    wall0, cpu0 = time.perf_counter(), time.process_time()
    for _ in range(workload.steps * workload.producers):
        for priority in reversed(range(workload.tensors)):
            events.append((False, _Tensor(priority, seq, workload.partitions)))
            seq += 1
        while events:
            is_finish, item = events.popleft()
            if is_finish:
                finished += 1
                item.task.remaining -= 1
            else:
                for piece in item.pieces:
                    heapq.heappush(heap, (item.priority, item.seq, piece.index, piece))
                while heap:
                    start(heapq.heappop(heap)[3])
    timing = Timing.since(wall0, cpu0)
    if finished != workload.subtasks:
        raise BenchError(f"reference loop finished {finished} pieces, expected {workload.subtasks}")
    return timing


# ----------------------------------------------------------------------------------------------
# The command.


def run(subtasks: int, tensors: int, partitions: int, producers: int, repeats: int,
        idle_seconds: float) -> dict[str, Any]:
    """Measure everything; the result is what ``--json`` prints."""
    load_before = os.getloadavg()[0]
    single = Workload.at_least(subtasks, tensors, partitions, 1)
    concurrent = Workload.at_least(subtasks, tensors, partitions, producers)
    reference = Rate(single.subtasks, [reference_timing(single) for _ in range(repeats)])
    one = Rate(single.subtasks, [core_timing(single) for _ in range(repeats)])
    many = Rate(concurrent.subtasks, [core_timing(concurrent) for _ in range(repeats)])
    return {
        "benchmark": "core",
        "workload": {"tensors": tensors, "partitions": partitions, "piece_bytes": PIECE_BYTES,
                     "producers": producers, "repeats": repeats},
        "subtasks_per_s": {
            "reference": reference.as_dict(),
            "core_1_producer": one.as_dict(),
            "core_concurrent": {"producers": producers, **many.as_dict()},
        },
        "idle": {"seconds": idle_seconds, "core_thread_cpu_percent": round(idle_cpu_percent(idle_seconds), 3)},
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(),
                    "load_average_1min": [round(load_before, 2), round(os.getloadavg()[0], 2)]},
    }


def _format(result: dict[str, Any]) -> str:
    w = result["workload"]
    rates = result["subtasks_per_s"]
    ref = rates["reference"]
    load = result["machine"]["load_average_1min"]
    lines = [
        f"python -m benchmarks core: {w['tensors']} tensors x {w['partitions']} partitions per step, median of "
        f"{w['repeats']} (load average {load[0]:g} before, {load[1]:g} after)",
        f"  {'sub-task lifecycles per second of':36s} {'wall time':>11s} {'CPU time':>11s}",
        f"  {'bare deque+heap loop (reference)':36s} {ref['median']:>11,} {ref['cpu_median']:>11,}",
    ]
    for key, label in (("core_1_producer", "Core, 1 producer"),
                       ("core_concurrent", f"Core, {w['producers']} producers")):
        rate = rates[key]
        lines.append(f"  {label:36s} {rate['median']:>11,} {rate['cpu_median']:>11,}  "
                     f"({100 * rate['median'] / ref['median']:.0f}% and "
                     f"{100 * rate['cpu_median'] / ref['cpu_median']:.0f}% of the reference)")
    idle = result["idle"]
    lines.append(f"  {'Core thread CPU while idle':36s} {idle['core_thread_cpu_percent']:>10.3f}% "
                 f"over {idle['seconds']:g} s")
    return "\n".join(lines)


def _positive(kind: Callable[[str], Any]) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not value > 0 or (isinstance(value, float) and math.isinf(value)):
            raise argparse.ArgumentTypeError(f"{text!r} must be positive and finite")
        return value
    return parse


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``core`` benchmark to ``python -m benchmarks``."""
    parser = subparsers.add_parser("core", help="sub-task lifecycles per second through the Core",
                                   description="How many sub-task lifecycles per second the runtime Core sustains, "
                                               "next to a bare deque+heap loop, and its CPU use while idle.")
    parser.add_argument("--subtasks", type=_positive(int), default=200_000,
                        help="sub-task lifecycles per measurement (rounded up to whole steps; default 200000)")
    parser.add_argument("--tensors", type=_positive(int), default=100,
                        help="tensors (CommTasks) per step per producer (default 100)")
    parser.add_argument("--partitions", type=_positive(int), default=4,
                        help=f"sub-tasks per tensor, of {PIECE_BYTES} bytes each (default 4)")
    parser.add_argument("--producers", type=_positive(int), default=4,
                        help="producer threads of the concurrent measurement (default 4)")
    parser.add_argument("--repeats", type=_positive(int), default=5,
                        help="repeats of each measurement; the median is reported (default 5)")
    parser.add_argument("--idle-seconds", type=_positive(float), default=3.0,
                        help="how long the idle Core's CPU use is measured (default 3)")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    """Run the benchmark and print the result."""
    result = run(args.subtasks, args.tensors, args.partitions, args.producers, args.repeats, args.idle_seconds)
    print(json.dumps(result, indent=2) if args.json else _format(result))
    return 0
