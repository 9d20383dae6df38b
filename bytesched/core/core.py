"""The runtime Core: one scheduler thread driving the :class:`Scheduler` state machine.

Framework threads never run scheduling logic; :meth:`Core.enqueue`, :meth:`CommTask.notify_ready`
and :meth:`CommTask.notify_finish` only put an event on a queue. The Core thread sleeps in a
blocking ``get`` (no polling, no CPU while idle), drains every pending event, feeds each to the
state machine and calls ``start()`` for the sub-tasks it answers with. Rank 0 announces that start
order to followers over the rank-0 channel; followers in ``rank0`` mode obey it.
"""

from __future__ import annotations

import atexit
import logging
import math
import queue
import threading
import time
from typing import Callable, Protocol

from .config import Config, SchedulingParams
from .policies import FollowOrderPolicy, ImmediatePolicy, Policy, make_policy
from .policies.follow import SubTaskKey
from .scheduler import Scheduler, Stats
from .task import CommTask, SubTask

log = logging.getLogger("bytesched")

_ENQUEUE, _ENQUEUE_READY, _READY, _FINISH, _PARAMS, _ANNOUNCE, _CALL, _STOP = range(8)


class CoreShutdownError(RuntimeError):
    """The Core stopped before this task's communication finished."""


class OrderChannel(Protocol):
    """What the Core needs from the rank-0 channel (see :mod:`bytesched.core.channel`)."""

    def publish_order(self, keys: list[SubTaskKey]) -> None:
        """Leader: tell every follower that these sub-tasks were started, in this order."""

    def subscribe_order(self, on_keys: Callable[[list[SubTaskKey]], None]) -> None:
        """Follower: call ``on_keys`` (from any thread) for each announcement, in order."""


class TimelineSink(Protocol):
    """What the Core needs from a timeline writer (see :mod:`bytesched.core.timeline`)."""

    def record(self, sub: SubTask) -> None:
        """``sub`` finished: write its queued and in-flight spans."""

    def close(self) -> None:
        """Flush and close; must not block for long."""


class Core:
    """The framework-agnostic scheduler of one process (paper §3.2: init, enqueue, shutdown).

    Args:
        config: validated settings (policy, partition and credit sizes, stall warning...).
        rank: this process's rank; rank 0 leads.
        order: ``"rank0"`` (followers obey rank 0's announced order; needs ``channel``) or
            ``"immediate"`` (followers start when ready; the backend negotiates order).
        channel: the rank-0 channel, required for ``rank0`` order with more than one rank.
        timeline: where finished sub-tasks are recorded, if anywhere.
    """

    def __init__(self, config: Config, *, rank: int = 0, order: str = "immediate",
                 channel: OrderChannel | None = None, timeline: TimelineSink | None = None,
                 policy: Policy | None = None) -> None:
        if order not in ("rank0", "immediate"):
            raise ValueError(f"order={order!r}: expected 'rank0' or 'immediate' (resolve 'auto' in the plugin)")
        self.config = config
        self.rank = rank
        self.order = order
        leader_policy = policy or make_policy(config.policy, config.params)
        if rank == 0:
            self.policy = leader_policy
        elif order == "rank0":
            self.policy = FollowOrderPolicy(leader_policy)
        else:
            self.policy = ImmediatePolicy(leader_policy)
        self.scheduler = Scheduler(self.policy)
        self._channel = channel
        self._timeline = timeline
        self._events: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._accepting = True
        self.failure: BaseException | None = None
        self._publish = channel is not None and rank == 0 and order == "rank0"
        if order == "rank0" and rank != 0 and channel is None:
            raise ValueError("a follower in rank0 order mode needs the rank-0 channel")

    # -- lifecycle ----------------------------------------------------------------------------
    def start(self) -> "Core":
        """Start the scheduler thread (idempotent)."""
        if self._thread is None:
            if self._channel is not None and self.rank != 0 and self.order == "rank0":
                self._channel.subscribe_order(lambda keys: self._events.put((_ANNOUNCE, keys)))
            self._thread = threading.Thread(target=self._run, name=f"bytesched-core-{self.rank}", daemon=True)
            self._thread.start()
        return self

    def shutdown(self, timeout: float = 30.0) -> None:
        """Let in-flight and ready work finish (up to ``timeout`` s), then stop the thread.

        Tasks still unfinished at the deadline get :class:`CoreShutdownError` through their
        ``on_error`` hook, so nobody waits on them forever. Never blocks longer than ``timeout``.
        """
        if not self._accepting:
            return
        self._accepting = False
        if self._thread is None:
            self._close_outputs()
            return
        self._events.put((_STOP, time.monotonic() + timeout))
        self._thread.join(timeout + 5.0)
        if self._thread.is_alive():
            log.error("bytesched Core thread did not stop within %.0f s; leaving it (daemon) behind", timeout)

    @property
    def running(self) -> bool:
        """The scheduler thread is alive."""
        return self._thread is not None and self._thread.is_alive()

    # -- plugin interface ---------------------------------------------------------------------
    def enqueue(self, task: CommTask, *, ready: bool = False) -> None:
        """Hand ``task`` to the Core; with ``ready=True`` it is also ready (saves one event)."""
        self._check_accepting(task)
        task.core = self
        self._events.put((_ENQUEUE_READY if ready else _ENQUEUE, task))

    def post_ready(self, task: CommTask) -> None:
        """Event: ``task`` is ready (use :meth:`CommTask.notify_ready`)."""
        self._events.put((_READY, task))

    def post_finish(self, sub: SubTask) -> None:
        """Event: ``sub`` finished (use :meth:`CommTask.notify_finish`)."""
        self._events.put((_FINISH, sub))

    def set_params(self, params: SchedulingParams) -> None:
        """New partition/credit sizes; callers apply them at a step all ranks agreed on."""
        self._events.put((_PARAMS, params))

    def call_soon(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` on the Core thread, in order with the other events."""
        self._events.put((_CALL, fn))

    def take_stats(self) -> Stats:
        """Counters since the previous call, read consistently on the Core thread."""
        box: list[Stats] = []
        done = threading.Event()
        self.call_soon(lambda: (box.append(self.scheduler.take_stats()), done.set()))
        if not done.wait(10.0) or not box:
            raise RuntimeError("bytesched Core did not answer within 10 s (is it running?)")
        return box[0]

    def _check_accepting(self, task: CommTask) -> None:
        if self.failure is not None:
            raise RuntimeError(f"bytesched Core failed earlier: {self.failure}") from self.failure
        if not self._accepting:
            raise RuntimeError(f"cannot enqueue {task!r}: the bytesched Core was shut down")
        if self._thread is None:
            raise RuntimeError(f"cannot enqueue {task!r}: the bytesched Core was not started (Core.start())")

    # -- the scheduler thread -----------------------------------------------------------------
    def _run(self) -> None:
        try:
            self._loop()
        except BaseException as exc:  # a bug or a protocol violation: fail loudly, wake waiters
            self.failure = exc
            self._accepting = False
            log.exception("bytesched Core stopped on an error")
            self._fail_unfinished(exc)
        finally:
            self._close_outputs()

    def _loop(self) -> None:
        get = self._events.get
        empty = self._events.empty
        sched = self.scheduler
        timeline = self._timeline
        clock = time.monotonic
        stop_deadline: float | None = None
        next_stall_check = clock() + self.config.stall_warning_s
        while True:
            timeout = self._wait_timeout(clock(), stop_deadline, next_stall_check)
            try:
                event = get(timeout=timeout)
            except queue.Empty:
                event = None
            started: list[SubTask] = []
            while event is not None:
                kind, obj = event
                now = clock()
                if kind == _FINISH:  # the most frequent event first: one per sub-task
                    started += sched.finish(obj, now)
                    if timeline is not None:
                        timeline.record(obj)
                    task = obj.task
                    if not task.remaining:
                        task.on_finish()
                elif kind == _ENQUEUE_READY:
                    sched.enqueue(obj, now)
                    started += sched.ready(obj, now)
                elif kind == _READY:
                    started += sched.ready(obj, now)
                elif kind == _ENQUEUE:
                    sched.enqueue(obj, now)
                elif kind == _PARAMS:
                    started += sched.set_params(obj, now)
                elif kind == _ANNOUNCE:
                    started += sched.announce(obj, now)
                elif kind == _CALL:
                    obj()
                elif kind == _STOP:
                    stop_deadline = obj
                event = get() if not empty() else None
            self._start_all(started)
            now = clock()
            if not started and sched.wake_at() is not None and now >= sched.wake_at():
                self._start_all(sched.tick(now))
            if now >= next_stall_check:
                self._warn_stalls(now)
                next_stall_check = now + self.config.stall_warning_s / 2
            if stop_deadline is not None and (sched.idle or now >= stop_deadline):
                if not sched.idle:
                    self._fail_unfinished(CoreShutdownError("the bytesched Core was shut down before this task finished"))
                return

    def _wait_timeout(self, now: float, stop_deadline: float | None, next_stall_check: float) -> float:
        deadline = next_stall_check
        wake = self.scheduler.wake_at()
        if wake is not None:
            deadline = min(deadline, wake)
        if stop_deadline is not None:
            deadline = min(deadline, stop_deadline)
        return max(0.0, deadline - now)

    def _start_all(self, started: list[SubTask]) -> None:
        if not started:
            return
        if self._publish:
            self._channel.publish_order([s.key for s in started])  # type: ignore[union-attr]
        for sub in started:
            try:
                sub.task.start(sub)
            except Exception as exc:  # the plugin's backend refused: that task fails, not the Core
                log.error("starting %r failed: %s", sub, exc)
                sub.task.on_error(exc)

    def _warn_stalls(self, now: float) -> None:
        limit = self.config.stall_warning_s
        for task in self.scheduler.unfinished():
            late = [s for s in task.subtasks
                    if math.isnan(s.t_finish) and now - s.t_start > limit]  # NaN start compares False
            if late:
                log.warning("stall: tensor %r partition %d of %d started %.0f s ago and has not finished "
                            "(rank %d; a peer may be missing this collective)",
                            task.name, late[0].index, len(task.subtasks), now - late[0].t_start, self.rank)
        if isinstance(self.policy, FollowOrderPolicy):
            missing = self.policy.waiting_for()
            if missing is not None:
                log.warning("stall: rank 0 started %r but rank %d has not produced that tensor yet", missing, self.rank)

    def _fail_unfinished(self, exc: BaseException) -> None:
        for task in self.scheduler.unfinished():
            try:
                task.on_error(exc)
            except Exception:  # a failing hook must not stop the others from being told
                log.exception("on_error of %r raised", task)

    def _close_outputs(self) -> None:
        if self._timeline is not None:
            self._timeline.close()


# ----------------------------------------------------------------------------------------------
# One Core per process.

_core: Core | None = None
_core_lock = threading.Lock()


def init(config: Config, **kwargs: object) -> Core:
    """Create and start this process's Core (the plugins call this; idempotent).

    A second call returns the running Core; it is an error if it asks for another config.
    """
    global _core
    with _core_lock:
        if _core is not None and _core._accepting:
            if _core.config != config:
                raise RuntimeError("bytesched Core is already running with another configuration; "
                                   "call bytesched.core.shutdown() first")
            return _core
        _core = Core(config, **kwargs).start()  # type: ignore[arg-type]
        return _core


def get_core() -> Core:
    """This process's Core; an error if :func:`init` was not called."""
    if _core is None:
        raise RuntimeError("bytesched Core is not initialised: call bytesched.core.init(config) first")
    return _core


def shutdown(timeout: float = 30.0) -> None:
    """Stop this process's Core, if any (also run at interpreter exit, with a short timeout)."""
    global _core
    with _core_lock:
        core, _core = _core, None
    if core is not None:
        core.shutdown(timeout)


atexit.register(shutdown, 5.0)

