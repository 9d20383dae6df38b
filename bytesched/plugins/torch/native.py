"""The PyTorch plugin's hot path over torch.distributed in C++: a Core whose per-piece work runs
in native code (``csrc/torch_core.cc``, built by ``csrc/build.py``).

The Python :class:`~bytesched.core.core.Core` costs over a millisecond per tensor over
torch.distributed: about ten Python steps on three threads per piece, and a rank-0 channel
message per start. :class:`NativeCore` keeps the Core's interface, so the optimizer, the
start-up plan and the stall check drive it unchanged, and moves the per-piece work to C++:

- the training thread's hook enqueues the bucket's task with its wire buffer (one call);
- a C++ thread runs the native Scheduler (``csrc/scheduler.cc``, proven equal to
  :class:`~bytesched.core.scheduler.Scheduler` by ``tests/test_native_scheduler.py``), starts
  each piece as c10d's ``ProcessGroup::allreduce`` on a slice of the wire buffer, and takes its
  completion from the collective's future callback; rank 0 sends its start order to each
  follower over a TCP connection of its own (one message per wake-up), and a follower's Core
  starts exactly that order;
- the update thread waits, without the GIL, on the native queue of completed tasks
  (:class:`UpdateJobs`), and runs the user's optimizer as before.

What stays in Python: the task (the bucket's packing, its update cycle), the update, and what
reads a step's finished pieces, which the update thread hands over with each completed task
while anything reads them (the timeline, the start-up plan's observer). The stall check reads
the native state through :attr:`NativeCore.scheduler`'s snapshots. :func:`make_core` chooses
between the native and the Python Core (``BYTESCHED_NATIVE``) and says why.
See docs/architecture.md, "One gradient's way".
"""

from __future__ import annotations

import hashlib
import importlib
import itertools
import logging
import math
import threading
import time
from collections import deque
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Callable, Sequence, TypeVar

import torch

from bytesched.core import CommTask, Config, Core, SchedulingParams, SubTask
from bytesched.core.config import NATIVE_POLICIES, ConfigError
from bytesched.core.core import CoreShutdownError, TimelineSink, enqueue_refusal, exit_later
from bytesched.core.policies import FollowOrderPolicy, Policy, make_policy
from bytesched.core.stall_check import StallCheck, describe

log = logging.getLogger("bytesched")
T = TypeVar("T")


class NativeLibraryError(RuntimeError):
    """The native extension is missing or does not load (the message says how to build it)."""


def native_module() -> ModuleType:
    """``bytesched.plugins.torch._native``, or :class:`NativeLibraryError` naming the fix."""
    try:
        return importlib.import_module("bytesched.plugins.torch._native")
    except ImportError as error:
        raise NativeLibraryError(f"the native bytesched Core does not load ({error}): build it with "
                                 "`python csrc/build.py` (scripts/setup.sh does), or set BYTESCHED_NATIVE=off"
                                 ) from None


def native_refusal(config: Config, device: torch.device, policy: Policy | None, own_start: bool = False) -> str | None:
    """Why this job's Core cannot be native, or None if it can (``own_start``: the backend starts
    each piece its own way)."""
    if own_start:
        return "its backend starts each piece its own way"
    if policy is not None:
        return f"the plugin chose its own policy ({policy.name})"
    if config.policy not in NATIVE_POLICIES:
        return f"the {config.policy} policy has no native Scheduler (native: {', '.join(NATIVE_POLICIES)})"
    if device.type != "cpu":
        return f"the gradients live on {device.type}, and the native path runs on CPU tensors"
    return None


def make_core(config: Config, group: Any, device: torch.device, share_port: Callable[[int], int], *,
              own_start: bool = False, **kwargs: Any) -> Core:
    """The Core of a torch.distributed job: native where ``BYTESCHED_NATIVE`` and the job allow
    (:func:`native_refusal`), else the Python Core, with a log line naming why."""
    if config.native == "off":
        return Core(config, **kwargs)
    refusal = native_refusal(config, device, kwargs.get("policy"), own_start)
    if refusal is None:
        return NativeCore(config, group=group, share_port=share_port, **kwargs)  # type: ignore[return-value]  # keeps Core's interface
    if config.native == "on":
        raise ConfigError(f"BYTESCHED_NATIVE=on, but {refusal}: unset it or set it to off")
    log.info("bytesched: the Python Core schedules this job: %s", refusal)
    return Core(config, **kwargs)


@dataclass
class _Unfinished:
    """An unfinished task as the native Core reported it (what the stall check reads)."""

    name: str
    instance: int
    priority: int
    subtasks: list[SubTask]


class _Snapshot:
    """The native Scheduler's state as :mod:`bytesched.core.stall_check` reads a Scheduler's."""

    def __init__(self, native: Any) -> None:
        self._native = native

    def unfinished(self) -> list[_Unfinished]:
        tasks = []
        for _, name, instance, priority, pieces in self._native.snapshot():
            task = _Unfinished(name, instance, priority, [])
            task.subtasks = _subtasks(task, pieces)
            tasks.append(task)
        return tasks

    def instances(self, name: str) -> int:
        return self._native.instances(name)

    @property
    def idle(self) -> bool:
        return not self._native.snapshot()


class _AnnouncedOrder(FollowOrderPolicy):
    """A follower's rank-0 order as the stall check asks it (which announced key is missing here)."""

    def __init__(self, leader: Policy, native: Any) -> None:
        super().__init__(leader)
        self._native = native

    def waiting_for(self) -> tuple[str, int, int] | None:
        return self._native.announced_missing()


def _sizes(params: SchedulingParams) -> tuple[float, float, float]:
    """``params`` as the native Core takes them: partition (NaN: the policy's default), credit, batch."""
    partition = params.partition_bytes
    return math.nan if partition is None else float(partition), float(params.credit_bytes), float(params.batch_bytes)


def _subtasks(task: Any, pieces: Sequence[tuple[int, int, float, float]]) -> list[SubTask]:
    """SubTasks of ``task`` with the times the native Core recorded, (index, nbytes, start, finish) each."""
    subs = SubTask.of(task, [(None, nbytes) for _, nbytes, _, _ in pieces])
    for sub, (_, _, t_start, t_finish) in zip(subs, pieces):
        sub.t_start, sub.t_finish = t_start, t_finish
    return subs


class NativeCore:
    """The Core's interface (:class:`~bytesched.core.core.Core`) over the native hot path.

    Args:
        config: the job's settings (policy, sizes, stall warning and timeout, channel host and timeout).
        rank, order: as the Core's; in ``rank0`` order rank 0 sends its start order over the
            native order link, which needs ``share_port``.
        channel: the rank-0 channel (the stall check asks followers through it).
        timeline: where finished sub-tasks are recorded.
        group: the torch.distributed process group whose all-reduces carry the pieces.
        share_port: rank 0's value on every rank (the backend's broadcast): how followers learn
            the order link's port.
    """

    def __init__(self, config: Config, *, rank: int = 0, order: str = "immediate", channel: Any = None,
                 timeline: TimelineSink | None = None, group: Any, share_port: Callable[[int], int],
                 policy: Policy | None = None) -> None:
        if order not in ("rank0", "immediate"):
            raise ValueError(f"order={order!r}: expected 'rank0' or 'immediate' (resolve 'auto' in the plugin)")
        if policy is not None:
            raise ValueError("the native Core runs the configured policy")
        native = native_module()
        self.config = config
        self.rank = rank
        self.order = order
        self.timeline = timeline
        self._leader = make_policy(config.policy, config.params)
        mode = "leader" if rank == 0 else "follow" if order == "rank0" else "immediate"
        self._native = native.Core(group, config.policy, *_sizes(config.params), mode)
        self._policy: Policy = _AnnouncedOrder(self._leader, self._native) if mode == "follow" else self._leader
        self._group = group
        if order == "rank0" and group.size() > 1:
            self._link(share_port)
        self._tasks: dict[int, CommTask] = {}
        self._ids = itertools.count()
        self._observer: Callable[[SubTask], None] | None = None
        self._failure: BaseException | None = None
        self._accepting = True
        self._started = False
        self._stopped = False
        self._replaced: str | None = None  # what start_in_sequence or start_on_ready put in place of the order
        self._stall_check = StallCheck(self, channel)  # type: ignore[arg-type]  # answers query() as Core
        self._native.set_recording(timeline is not None)

    def _link(self, share_port: Callable[[int], int]) -> None:
        """Open the order link: rank 0 listens, the port travels by the backend's broadcast, the
        others connect (every rank calls this together, as it opens the rank-0 channel)."""
        config = self.config
        digest = hashlib.sha256(f"bytesched order link {config.job_token}".encode()).digest()
        followers = self._group.size() - 1
        port = share_port(self._native.listen(config.channel_host) if self.rank == 0 else 0)
        if self.rank == 0:
            self._native.accept(followers, digest, config.channel_timeout_s)
        else:
            self._native.connect(config.channel_host, port, self.rank, digest, config.channel_timeout_s)

    # -- lifecycle ----------------------------------------------------------------------------
    def start(self) -> "NativeCore":
        """Start the native Core's threads and the stall check (idempotent)."""
        if not self._started:
            self._native.start()
            self._stall_check.start()
            self._started = True
        return self

    def shutdown(self, timeout: float = 30.0) -> None:
        """Let in-flight work finish (up to ``timeout`` s), then stop; tasks still unfinished get
        :class:`CoreShutdownError` through their ``on_error`` hook, as with the Python Core."""
        if not self._accepting:
            return
        self._accepting = False
        left = self._native.stop(timeout) if self._started else []
        self._stopped = True
        self._stall_check.stop()
        for tid in left:
            task = self._tasks.pop(tid, None)
            if task is not None:
                task.on_error(CoreShutdownError("the bytesched Core was shut down before this task finished"))
        if self.timeline is not None:
            self.timeline.close()

    @property
    def running(self) -> bool:
        """The native Core's thread runs (started, not stopped, not failed)."""
        return self._started and not self._stopped and self.failure is None

    @property
    def failure(self) -> BaseException | None:
        """What stopped the Core (a protocol error, a failed order link, :meth:`fail`); None while it runs."""
        if self._failure is None:
            message = self._native.failure()
            if message is not None:
                self._failure = RuntimeError(f"the native bytesched Core stopped: {message}")
        return self._failure

    # -- the plugin interface -----------------------------------------------------------------
    def enqueue(self, task: CommTask, *, ready: bool = False) -> None:
        """Hand ``task`` (a :class:`~.task.GradientTask`: its ``wire`` buffer is what the pieces
        slice) to the native Core; ``ready``: it is also ready."""
        if self.failure is not None or not self._accepting or not self._started:
            raise self._refusal(task)
        tid = next(self._ids)
        task.core = self  # type: ignore[assignment]  # keeps Core's interface
        self._tasks[tid] = task
        self._native.enqueue(tid, task.name, task.priority, task.wire, ready)  # type: ignore[attr-defined]  # a GradientTask's

    def post_ready(self, task: CommTask) -> None:
        """Event: ``task`` is ready (use :meth:`CommTask.notify_ready`)."""
        for tid, known in self._tasks.items():
            if known is task:
                self._native.ready(tid)
                return
        raise RuntimeError(f"{task!r} was not enqueued to this Core")

    def set_params(self, params: SchedulingParams) -> None:
        """New partition/credit sizes, in order with the tasks enqueued around them."""
        self._leader.set_params(params)
        self._native.set_params(*_sizes(params))

    def observe(self, observer: Callable[[SubTask], None] | None) -> None:
        """Hand every finished sub-task to ``observer`` (None: stop), on the update thread, with
        its completed task; from the next completed task on."""
        self._observer = observer
        self._native.set_recording(observer is not None or self.timeline is not None)

    def wait_idle(self, timeout: float) -> bool:
        """Until every task enqueued so far has finished in the native Core (True), or ``timeout``
        seconds passed (False)."""
        return self._native.wait_idle(timeout)

    def start_in_sequence(self, names: Sequence[str]) -> None:
        """As :meth:`Core.start_in_sequence`: every rank starts whole tasks in the cycle ``names``."""
        self._native.replace_order("sequence", list(names))
        self._replaced = "sequence"

    def start_on_ready(self) -> None:
        """As :meth:`Core.start_on_ready`: every rank starts each sub-task once ready here."""
        self._native.replace_order("immediate", [])
        self._replaced = "immediate"

    def restore_order(self) -> None:
        """As :meth:`Core.restore_order`."""
        self._native.restore_order()
        self._replaced = None

    @property
    def start_order(self) -> str:
        """As :attr:`Core.start_order`: :attr:`order`, or what replaced it."""
        return self.order if self._replaced is None else self._replaced

    def started(self) -> tuple[int, int]:
        """The collectives and the pieces this Core started so far (a collective per piece, or
        per batch of pieces)."""
        return self._native.started()

    def releases_on_ready(self) -> bool:
        """Never: the native Core starts every piece itself."""
        return False

    def update_jobs(self) -> "UpdateJobs":
        """A job queue for an update thread that also hands it the native Core's completed tasks."""
        return UpdateJobs(self)

    # -- what the stall check and the runtime ask ---------------------------------------------
    @property
    def policy(self) -> Policy:
        """The leader's policy (a follower in rank-0 order: its order, for the stall check)."""
        return self._policy

    @property
    def scheduler(self) -> _Snapshot:
        """The native Scheduler's state, read when asked (:mod:`~bytesched.core.stall_check`)."""
        return _Snapshot(self._native)

    def query(self, fn: Callable[[], T], timeout: float = 10.0) -> T:
        """``fn()``, here: what it reads of the native Core is a snapshot taken under its lock."""
        return fn()

    def call_soon(self, fn: Callable[[], None]) -> None:
        """``fn()``, here (see :meth:`query`)."""
        fn()

    def fail(self, error: BaseException, exit_reason: str) -> None:
        """As :meth:`Core.fail`: every unfinished task gets ``error``, the process ends unless it
        exits by itself in time."""
        exit_later(exit_reason)
        self._failure = error
        self._native.fail(str(error))

    def describe_waiting(self, timeout: float = 2.0) -> str:
        """What this rank's communication waits for (the oldest sub-task in flight, or queued)."""
        unfinished = self.scheduler.unfinished()
        in_flight = [s for t in unfinished for s in t.subtasks if math.isnan(s.t_finish) and not math.isnan(s.t_start)]
        if in_flight:
            return describe(min(in_flight, key=lambda s: s.t_start), time.monotonic())
        if unfinished:
            return f"tensor {unfinished[0].name!r} (ready, not started yet)"
        return "no communication (nothing in flight)"

    def _refusal(self, task: CommTask) -> RuntimeError:
        return enqueue_refusal(task, self.failure, self._accepting)

    # -- completions, on an update thread -----------------------------------------------------
    def _deliver(self, completions: list[tuple[int, bool, str | None, int, float, Any]]) -> None:
        """Hand each completed or failed task to its plugin (:meth:`CommTask.on_finish`, or
        ``on_error``), and its finished pieces to the timeline and the observer."""
        for tid, done, error, instance, t_ready, pieces in completions:
            task = self._tasks.pop(tid, None) if done else self._tasks.get(tid)
            if task is None:
                continue
            if error is not None:
                task.on_error(self._failure if self._failure is not None and str(self._failure) == error
                              else RuntimeError(f"the all-reduce of {task.name!r} failed: {error}"))
            if not done:
                continue
            task.instance, task.t_ready = instance, t_ready
            if pieces is not None and (self.timeline is not None or self._observer is not None):
                observer = self._observer
                for sub in _subtasks(task, pieces):
                    if self.timeline is not None:
                        self.timeline.record(sub)
                    if observer is not None:
                        observer(sub)
            task.on_finish()


class UpdateJobs:
    """An update thread's job queue on the native path: ``get`` waits (without the GIL) on the
    native Core's completed tasks as well as on the jobs other threads ``put``, so that a
    gradient's completion reaches the update thread with no Python thread in between.

    Completed tasks become jobs on whichever update thread takes them (:meth:`CommTask.on_finish`
    queues its plugin's job, on that plugin's queue: several optimizers may share a Core).
    Implements what :class:`~.pipeline.UpdatePipeline` uses of ``queue.SimpleQueue``."""

    def __init__(self, core: NativeCore) -> None:
        self._core = core
        self._native = core._native
        self._consumer = self._native.add_consumer()
        self._jobs: deque[Any] = deque()
        self._reader: int | None = None  # the update thread, once it waits here

    def put(self, job: Any) -> None:
        self._jobs.append(job)
        if threading.get_ident() != self._reader:
            self._native.wake(self._consumer)

    def get(self) -> Any:
        self._reader = threading.get_ident()
        while not self._jobs:
            self._core._deliver(self._native.wait(self._consumer, -1.0))
        return self._jobs.popleft()

    def get_nowait(self) -> Any:
        return self._jobs.popleft()

    def empty(self) -> bool:
        return not self._jobs
