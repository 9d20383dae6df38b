"""A simulated worker: its compute chain, its CommTasks, and the Scheduler it drives.

One :class:`WorkerClass` stands for a group of identical workers. Its device runs forward then
backward, layer by layer (the paper's assumptions 1-2: a chain, run without preemption). Each
gradient computed by the backward pass makes its :class:`SimCommTask` ready in the real
:class:`~bytesched.core.scheduler.Scheduler`, and every sub-task the Scheduler answers with is
started on the simulated backend, exactly as the runtime Core does with a real one.

The next iteration's forward pass of layer ``i`` waits either for layer ``i``'s communication
only (bytesched crossing the global barrier) or for all communication and the update (the
vanilla frameworks' barrier).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol, Sequence

from ..core.scheduler import Scheduler
from ..core.policies.follow import announcement
from ..core.task import CommTask, SubTask, split_elements, start_operation
from .engine import Event, EventLoop
from .profile import ELEMENT_BYTES, ModelProfile


class Backend(Protocol):
    """Where started sub-tasks go: the simulated all-reduce or parameter server."""

    def start(self, klass: int, sub: SubTask, task: "SimCommTask", done: Callable[[], None]) -> None:
        """Communicate ``sub`` for every worker of ``klass``; call ``done`` when it completed."""


class BatchingBackend(Backend, Protocol):
    """A backend that also runs several sub-tasks as one operation (batching while busy)."""

    def start_batch(self, klass: int, batch: Sequence[SubTask], done: Callable[[], None]) -> None:
        """Communicate ``batch`` as one operation for every worker of ``klass``; ``done`` when it completed."""


@dataclass(frozen=True)
class TensorPlan:
    """One gradient tensor as the simulation schedules it."""

    name: str
    layer: int
    nbytes: int
    priority: int
    key_base: int
    """Number of the tensor's first partition among all keys (PS placement)."""
    update: float
    """Server/device update time of this tensor (its share of the layer's update)."""
    pieces: tuple[tuple[tuple[int, int], int], ...] | None = None
    """Its partitions as the MXNet plugin lays them out on a parameter server: element ranges
    in the plugin's order, each with its server (:func:`~bytesched.sim.ps.plugin_layout`).
    None: equal pieces of the policy's partition size, placed by the cluster's assignment."""
    layers: tuple[int, ...] = ()
    """A fusion bucket's (:func:`~bytesched.sim.simulator.fuse`): the layers of its tensors, whose
    next forward passes all wait for it; ``layer`` is the earliest, whose backward makes it
    ready. Empty for a single tensor (only ``layer``)."""

    @property
    def gated_layers(self) -> tuple[int, ...]:
        """The layers whose next forward pass waits for this communication."""
        return self.layers or (self.layer,)


class SimCommTask(CommTask):
    """One gradient's communication in one iteration, for one class of workers.

    Partitions are float32 element ranges (:func:`split_elements`); starting one hands it to
    the simulated backend, which calls back when it is done.
    """

    def __init__(self, plan: TensorPlan, worker: "WorkerClass") -> None:
        super().__init__(plan.name, plan.priority, plan.nbytes)
        self.plan = plan
        self.worker = worker
        self.iteration = worker.iteration
        self.batcher = worker.batcher

    def partition(self, size: float) -> list[tuple[tuple[int, int], int]]:
        if self.plan.pieces is not None:  # laid out at ``size`` already, as the plugin does at init
            ranges = [piece for piece, _server in self.plan.pieces]
        else:
            ranges = split_elements(self.nbytes // ELEMENT_BYTES, ELEMENT_BYTES, size)
        return [((a, b), (b - a) * ELEMENT_BYTES) for a, b in ranges]

    def start(self, subtask: SubTask) -> None:
        self.worker.backend.start(self.worker.index, subtask, self, lambda: self.worker.finished(subtask))

    def on_finish(self) -> None:
        self.worker.communicated(self)


class Gather(Protocol):
    """A second phase of communication after the Scheduler's (a decoupled all-reduce's
    all-gathers, :mod:`bytesched.sim.decoupled`), which the next forward pass waits for instead."""

    def enqueued(self, worker: "WorkerClass", iteration: int, tasks: Sequence[SimCommTask]) -> None:
        """``tasks`` are the communication of ``iteration`` on ``worker``."""

    def reduced(self, worker: "WorkerClass", task: SimCommTask) -> None:
        """The Scheduler's phase of ``task`` is done; call ``worker.gathered(task)`` once the
        second is."""

    def forward_begins(self, worker: "WorkerClass", iteration: int) -> None:
        """``worker`` begins the forward pass that follows ``iteration``."""


class _Batcher:
    """A worker class's :class:`~bytesched.core.task.Batcher`: a batch is one operation of the
    simulated backend, and each of its sub-tasks finishes when it does."""

    def __init__(self, worker: "WorkerClass", backend: BatchingBackend) -> None:
        self.worker = worker
        self.backend = backend

    def start_batch(self, batch: Sequence[SubTask]) -> None:
        worker = self.worker

        def done() -> None:
            for sub in batch:
                worker.finished(sub)
        self.backend.start_batch(worker.index, batch, done)


class WorkerClass:
    """A group of identical workers simulated as one: compute chain plus Scheduler driver."""

    def __init__(self, index: int, loop: EventLoop, profile: ModelProfile, plans: Sequence[TensorPlan],
                 scheduler: Scheduler, backend: Backend, *, compute_scale: float, barrier: bool,
                 update_on_device: bool, gather: Gather | None = None,
                 batches: BatchingBackend | None = None) -> None:
        self.index = index
        self.loop = loop
        self.scheduler = scheduler
        self.backend = backend
        self.gather = gather
        self.barrier = barrier
        self.batcher = None if batches is None else _Batcher(self, batches)
        """Where its tasks' sub-tasks start in batches (batching while busy), or None."""
        layers = profile.layers
        self.forward = [layer.forward * compute_scale for layer in layers]
        self.backward = [layer.backward * compute_scale for layer in layers]
        # All-reduce applies the update on the worker's device; a PS applies it on the server.
        self.update = [layer.update * compute_scale if update_on_device else 0.0 for layer in layers]
        self.total_update = sum(self.update)
        self.compute_time = sum(self.forward) + sum(self.backward) + self.total_update
        """One iteration's compute on this class's device."""
        self.tensors_of: list[list[TensorPlan]] = [[] for _ in layers]
        self._gates = [0] * len(layers)  # per layer, the tasks its next forward pass waits for
        for plan in plans:
            self.tensors_of[plan.layer].append(plan)
            for layer in plan.gated_layers:
                self._gates[layer] += 1
        self.iteration = -1
        self.iteration_starts: list[float] = []
        self.backward_starts: list[float] = []
        self.on_backward_start: Callable[[int], None] | None = None
        self.followers: list[WorkerClass] = []
        self.compute_spans: list[tuple[int, str, int, float, float]] | None = None
        self.finished_subtasks: list[SubTask] | None = None
        self._unfinished: dict[int, list[int]] = {}
        self._tasks: list[list[SimCommTask]] = []
        self._blocked: int | None = None
        self._tick: Event | None = None
        self._tick_at: float | None = None

    # -- compute chain ------------------------------------------------------------------------
    def begin(self) -> None:
        """Start the first iteration (no previous communication to wait for)."""
        self._next_iteration()

    def _next_iteration(self) -> None:
        self.iteration += 1
        if self.gather is not None and self.iteration > 0:
            self.gather.forward_begins(self, self.iteration - 1)
        self._forward(0)

    def _gate_open(self, layer: int) -> bool:
        previous = self._unfinished.get(self.iteration - 1)
        if previous is None:
            return True
        if self.barrier:
            return layer > 0 or not any(previous)
        return previous[layer] == 0

    def _forward(self, layer: int) -> None:
        if not self._gate_open(layer):
            self._blocked = layer
            return
        self._blocked = None
        now = self.loop.now
        if layer == 0:
            self.iteration_starts.append(now)
        if self.barrier:
            duration = (self.total_update if layer == 0 and self.iteration > 0 else 0.0) + self.forward[layer]
        else:
            duration = (self.update[layer] if self.iteration > 0 else 0.0) + self.forward[layer]
        self._span("forward", layer, now, duration)
        self.loop.call_later(duration, self._forward_done, layer)

    def _forward_done(self, layer: int) -> None:
        if layer + 1 < len(self.forward):
            self._forward(layer + 1)
        else:
            self._begin_backward()

    def _begin_backward(self) -> None:
        now = self.loop.now
        self.backward_starts.append(now)
        if self.on_backward_start is not None:
            self.on_backward_start(self.iteration)
        self._unfinished[self.iteration] = list(self._gates)
        self._tasks = []
        for layer in range(len(self.tensors_of) - 1, -1, -1):
            tasks = [SimCommTask(plan, self) for plan in self.tensors_of[layer]]
            for task in tasks:
                self.scheduler.enqueue(task, now)
            self._tasks.append(tasks)
        if self.gather is not None:
            self.gather.enqueued(self, self.iteration, [task for tasks in self._tasks for task in tasks])
        self._backward(len(self.backward) - 1)

    def _backward(self, layer: int) -> None:
        duration = self.backward[layer]
        self._span("backward", layer, self.loop.now, duration)
        self.loop.call_later(duration, self._backward_done, layer)

    def _backward_done(self, layer: int) -> None:
        now = self.loop.now
        tasks = self._tasks[len(self.backward) - 1 - layer]
        for task in tasks:
            self._start(self.scheduler.ready(task, now))
        if layer > 0:
            self._backward(layer - 1)
        else:
            self._next_iteration()

    def _span(self, kind: str, layer: int, start: float, duration: float) -> None:
        if self.compute_spans is not None:
            self.compute_spans.append((self.iteration, kind, layer, start, start + duration))

    # -- communication ------------------------------------------------------------------------
    def communicated(self, task: SimCommTask) -> None:
        """Every sub-task of ``task`` finished: its layer may be one step closer to its gate
        (once its second phase is done too, if there is one)."""
        if self.gather is not None:
            self.gather.reduced(self, task)
        else:
            self.gathered(task)

    def gathered(self, task: SimCommTask) -> None:
        """``task``'s communication is through: its layers are one step closer to their gate."""
        counts = self._unfinished[task.iteration]
        for layer in task.plan.gated_layers:
            counts[layer] -= 1
        self._check_gate(task.iteration)

    def _check_gate(self, iteration: int) -> None:
        if self._blocked is not None and iteration == self.iteration - 1 and self._gate_open(self._blocked):
            self._forward(self._blocked)

    def finished(self, sub: SubTask) -> None:
        """The backend completed ``sub`` (as the Core's finish event)."""
        started = self.scheduler.finish(sub, self.loop.now)
        if self.finished_subtasks is not None:
            self.finished_subtasks.append(sub)
        if sub.task.remaining == 0:
            sub.task.on_finish()
        self._start(started)

    def announce(self, keys: list[tuple[str, int, int]]) -> None:
        """Rank 0 started these sub-tasks (followers in rank-0 order mode)."""
        self._start(self.scheduler.announce(keys, self.loop.now))

    def _start(self, started: list[SubTask]) -> None:
        if started:
            if self.followers:
                keys = announcement(started)
                for follower in self.followers:
                    follower.announce(keys)
            for sub in started:
                start_operation(sub)
        self._arm_tick()

    # -- policies that want to be woken (time windows) ----------------------------------------
    def _arm_tick(self) -> None:
        wake = self.scheduler.wake_at()
        if wake is None:
            return
        when = max(wake, self.loop.now)
        if when == self._tick_at:
            return  # already due then, or already ticked at this instant to no effect
        if self._tick is not None:
            self._tick.cancel()
        self._tick_at = when
        self._tick = self.loop.call_at(when, self._on_tick)

    def _on_tick(self) -> None:
        self._tick = None
        self._start(self.scheduler.tick(self.loop.now))
