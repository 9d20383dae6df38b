"""The runtime Core: one scheduler thread driving the :class:`Scheduler` state machine.

Framework threads never run scheduling logic; :meth:`Core.enqueue`, :meth:`CommTask.notify_ready`
and :meth:`CommTask.notify_finish` only put an event on a queue. The Core thread sleeps in a
blocking ``get`` (no CPU while idle), drains every pending event, feeds each to the state machine
and calls ``start()`` for the sub-tasks it answers with. Rank 0 announces that start order to
followers over the rank-0 channel; followers in ``rank0`` mode obey it. Stalled sub-tasks are
watched from a thread beside it (:mod:`.stall_check`), so this one only schedules.

A backend whose library reports the end of an operation only when asked (Horovod's PyTorch
binding) registers its in-flight operations as :class:`Completions`, and the Core polls them
between events: a finish then costs no thread of its own and no hand-off to the Core thread.
A backend whose events arrive outside Python (MXNet's engine, through the Dependency Proxies'
C++ queue) is an :class:`EventSource` the Core thread waits on instead of its own queue
(:meth:`Core.wait_on`): an engine event then wakes the Core directly, and every event put on
the Core's queue from another thread wakes the source's wait.
"""

from __future__ import annotations

import logging
import math
import os
import queue
import threading
import time
from typing import Any, Callable, Protocol, Sequence, TypeVar

from .config import Config, SchedulingParams
from .policies import FollowOrderPolicy, ImmediatePolicy, Policy, TicTacPolicy, make_policy
from .policies.follow import SubTaskKey, announcement
from .policies.tictac import TicTacGraph
from .policies.sequence import SequencePolicy
from .scheduler import Scheduler, Stats
from .stall_check import StallCheck, describe
from .task import CommTask, SubTask, start_operation
from .waiting import get_within

log = logging.getLogger("bytesched")
T = TypeVar("T")

# Events are (kind, object) tuples, except a finish, the one event per sub-task: the bare SubTask.
_ENQUEUE, _ENQUEUE_READY, _READY, _PARAMS, _ANNOUNCE, _CALL, _STOP = range(7)


FAULT_EXIT_CODE = 70
"""Exit status of a process that bytesched ended because the job cannot go on (a lost rank, a
sub-task past ``BYTESCHED_STALL_TIMEOUT_S``) and that did not exit by itself in time."""
EXIT_GRACE_S = 10.0
IDLE_POLL_S = 0.001
"""How often :meth:`Core.wait_idle` asks the Core thread whether it is idle."""



def enqueue_refusal(task: CommTask, failure: BaseException | None, accepting: bool) -> RuntimeError:
    """Why a Core refuses ``task``: it failed (``failure``), was shut down (not ``accepting``) or
    was never started."""
    if failure is not None:
        error = RuntimeError(f"bytesched Core failed earlier: {failure}")
        error.__cause__ = failure
        return error
    if not accepting:
        return RuntimeError(f"cannot enqueue {task!r}: the bytesched Core was shut down")
    return RuntimeError(f"cannot enqueue {task!r}: the bytesched Core was not started (Core.start())")

class CoreShutdownError(RuntimeError):
    """The Core stopped before this task's communication finished."""


def exit_later(reason: str, grace_s: float = EXIT_GRACE_S) -> None:
    """Give the process ``grace_s`` seconds to exit by itself (the failed tasks raise in the training
    loop), then end it with :data:`FAULT_EXIT_CODE`: a backend stuck in a collective with a dead peer
    (Horovod, Gloo) would otherwise hang the process, and its job, forever."""
    def end() -> None:
        time.sleep(grace_s)
        log.critical("bytesched: ending this process (exit code %d) because %s", FAULT_EXIT_CODE, reason)
        logging.shutdown()
        os._exit(FAULT_EXIT_CODE)

    threading.Thread(target=end, name="bytesched-exit", daemon=True).start()


class OrderChannel(Protocol):
    """What the Core needs from the rank-0 channel (see :mod:`bytesched.core.channel`)."""

    def publish_order(self, keys: list[SubTaskKey]) -> None:
        """Leader: tell every follower that these sub-tasks were started, in this order."""

    def subscribe_order(self, on_keys: Callable[[list[SubTaskKey]], None]) -> None:
        """Follower: call ``on_keys`` (from any thread) for each announcement, in order."""


class Completions(Protocol):
    """Operations in flight whose end only polling can see; polled on the Core thread, where the
    backend also starts them (so neither side needs a lock)."""

    def poll(self) -> float | None:
        """Report the operations that ended (each sub-task's ``notify_finish``, or its failure);
        return the seconds after which polling again is worth it, or None if none is in flight."""


class EventSource(Protocol):
    """Events from outside Python that the Core thread waits for itself (see :meth:`Core.wait_on`)."""

    def wait(self, timeout: float | None) -> bool:
        """Wait (without the GIL) up to ``timeout`` seconds (None: as long as it takes) for events
        or for :meth:`wake`, and deliver what came, on this thread (they reach the Core as
        ``notify_ready``/``notify_finish``); False once the source closed for good."""

    def wake(self) -> None:
        """From any thread: make the current :meth:`wait` return, or the next one at once."""


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
        leader_policy = policy if policy is not None else make_policy(config.policy, config.params)
        if rank == 0:
            self.policy = leader_policy
        elif order == "rank0":
            self.policy = FollowOrderPolicy(leader_policy)
        else:
            self.policy = ImmediatePolicy(leader_policy)
        self.scheduler = Scheduler(self.policy)
        self._channel = channel
        self.timeline = timeline
        """Where finished sub-tasks are recorded (None: off); a plugin adds its training loop's
        spans to the same file when it is a :class:`~bytesched.core.timeline.ChromeTimeline`."""
        self._events: queue.SimpleQueue = queue.SimpleQueue()
        self.post_finish: Callable[[SubTask], None] = self._events.put
        """Event: a sub-task finished (use :meth:`CommTask.notify_finish`); the queue's own ``put``,
        so that the most frequent event costs no Python call and no tuple (:meth:`_post` once
        the Core waits on an :class:`EventSource`)."""
        self._source: EventSource | None = None  # what the Core thread waits on besides its queue
        self._ident: int | None = None  # the Core thread's
        self._thread: threading.Thread | None = None
        self._accepting = True
        self._stall_check = StallCheck(self, channel)
        self.failure: BaseException | None = None
        self._publish = channel is not None and rank == 0 and order == "rank0"
        self._observer: Callable[[SubTask], None] | None = None
        self._replaced_order: tuple[Policy, bool] | None = None  # what start_in_sequence/on_ready replaced
        self._completions: list[Completions] = []  # Core thread only
        self._stopping: list[Completions] = []  # polled until nothing of theirs is in flight
        self._next_poll: float | None = None  # when the Completions want polling; None: nothing in flight
        if order == "rank0" and rank != 0 and channel is None:
            raise ValueError("a follower in rank0 order mode needs the rank-0 channel")

    # -- lifecycle ----------------------------------------------------------------------------
    def start(self) -> "Core":
        """Start the scheduler thread (idempotent)."""
        if self._thread is None:
            if self._channel is not None and self.rank != 0 and self.order == "rank0":
                self._channel.subscribe_order(lambda keys: self._post((_ANNOUNCE, keys)))
            self._thread = threading.Thread(target=self._run, name=f"bytesched-core-{self.rank}", daemon=True)
            self._thread.start()
            self._stall_check.start()
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
        self._post((_STOP, time.monotonic() + timeout))
        self._thread.join(timeout + 5.0)
        if self._thread.is_alive():
            log.error("bytesched Core thread did not stop within %.0f s; leaving it (daemon) behind", timeout)

    @property
    def running(self) -> bool:
        """The scheduler thread is alive."""
        return self._thread is not None and self._thread.is_alive()

    # -- plugin interface ---------------------------------------------------------------------
    def enqueue(self, task: CommTask, *, ready: bool = False) -> None:
        """Hand ``task`` to the Core; with ``ready=True`` it is also ready (saves one event).

        A task that is not ready yet gives the Core nothing to do before its ready event, which
        wakes the Core's thread anyway: its enqueue waits in the queue, ahead of that event,
        without waking the :class:`EventSource` the thread may sleep in. On the MXNet stacks,
        where the training thread enqueues every key, that wake-up cost a Core wake-up per key."""
        if self.failure is not None or not self._accepting or self._thread is None:
            raise self._refusal(task)
        task.core = self
        # The signal sent once per sub-task: the queue's put (no Python call) unless a source waits.
        task.notify_finish = self.post_finish  # type: ignore[method-assign, assignment]  # the per-task signal
        if ready:
            self._post((_ENQUEUE_READY, task))
        else:
            self._events.put((_ENQUEUE, task))

    def poll_completions(self, source: Completions) -> Callable[[], None]:
        """Poll ``source`` between events from now on; returns the way to stop, which takes
        effect once none of its operations is in flight (their sub-tasks still finish)."""
        def stop() -> None:
            if source in self._completions and source not in self._stopping:
                self._stopping.append(source)
                self._poll(time.monotonic())
        self._on_core_thread(lambda: self._completions.append(source))
        return lambda: self._on_core_thread(stop)

    def wait_on(self, source: EventSource) -> None:
        """From now on the Core thread waits on ``source`` rather than on its own queue alone (see
        the module doc), until the source closes; events put on the queue from other threads
        wake it. Call it before the source's first task is enqueued; idempotent for one source.

        Raises:
            RuntimeError: the Core already waits on another source.
        """
        def attach() -> None:
            if self._source is source:
                return
            if self._source is not None:
                raise RuntimeError("the bytesched Core already waits on another event source")
            self._source = source
            self.post_finish = self._post
            for task in self.scheduler.unfinished():  # enqueued before: their finishes wake it too
                task.notify_finish = self._post  # type: ignore[method-assign, assignment]  # as in enqueue
        self._on_core_thread(attach)

    def _post(self, event: Any) -> None:
        """Put ``event`` on the Core's queue, and wake the source the Core thread may wait on
        (not needed from the Core thread itself, which looks at the queue before it waits)."""
        self._events.put(event)
        source = self._source  # read after the put: a source attached before it is woken
        if source is not None and threading.get_ident() != self._ident:
            source.wake()

    def _on_core_thread(self, fn: Callable[[], None]) -> None:
        """``fn()`` on the Core thread, or here if the thread is not running (so nothing races)."""
        if self.running:
            self.query(fn)
        else:
            fn()

    def releases_on_ready(self) -> bool:
        """Would this Core start every sub-task the moment its tensor is ready (its policy never
        holds one back)? A plugin whose backend can then start a task's sub-tasks by itself may
        do so and set :attr:`CommTask.released_on_ready`: the hops to the Core thread and back
        leave the critical path. A later change of sizes applies to tasks made after it."""
        return not self.policy.holds_back()

    def post_ready(self, task: CommTask) -> None:
        """Event: ``task`` is ready (use :meth:`CommTask.notify_ready`)."""
        self._post((_READY, task))

    def set_params(self, params: SchedulingParams) -> None:
        """New partition/credit sizes; callers apply them at a step all ranks agreed on."""
        self._post((_PARAMS, params))

    def observe(self, observer: Callable[[SubTask], None] | None) -> None:
        """From now on, also hand every finished sub-task to ``observer`` (None: stop), on the
        Core thread, as the timeline gets them: how the start-up plan sees a step's gradients.
        Returns once the Core switched, so the caller may then read what the old one recorded."""
        self.query(lambda: setattr(self, "_observer", observer))

    def wait_idle(self, timeout: float) -> bool:
        """Until every sub-task enqueued so far has finished and the Core has handled its finish
        (True), or ``timeout`` seconds passed (False). A framework can see a collective's result
        before its completion event reaches the Core (MXNet's engine writes the weights it feeds
        first): the start-up plan waits here so that its observer has seen every finish."""
        deadline = time.monotonic() + timeout
        while True:
            if self.query(lambda: self.scheduler.idle):
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(IDLE_POLL_S)

    def set_graph(self, graph: TicTacGraph) -> list[str] | None:
        """The iteration's computation graph as a plugin traced it (the first forward pass, with
        no durations): a ``tictac`` policy orders its tasks by TIC on it from now on, also those
        already waiting (:meth:`~.policies.tictac.TicTacPolicy.set_graph`). Returns the order
        (task names, first first), or None where the Core's policy is not ``tictac``, which
        has no use for a graph. Every rank may call it: only the policy that orders (rank 0's,
        over Horovod each rank's own) reads it."""
        def apply() -> list[str] | None:
            policy: Any = self.policy if self._replaced_order is None else self._replaced_order[0]
            while not isinstance(policy, TicTacPolicy) and hasattr(policy, "leader"):
                policy = policy.leader
            if not isinstance(policy, TicTacPolicy):
                return None
            policy.set_graph(graph, variant="tic")
            return sorted(policy.ranks, key=policy.ranks.__getitem__)
        if self.running:
            return self.query(apply, timeout=120.0)
        return apply()

    def start_in_sequence(self, names: Sequence[str]) -> None:
        """From now on, every rank starts whole tasks in the cycle ``names`` (each task name once
        per step, the same list on every rank), and rank 0 announces nothing
        (:class:`~.policies.sequence.SequencePolicy`). For a ``rank0``-order job that stays out
        of the way; call it on every rank at the same step boundary, with nothing in flight."""
        self._replace_order(lambda leader: SequencePolicy(leader, names))

    def start_on_ready(self) -> None:
        """From now on, every rank starts each sub-task as soon as it is ready here, and rank 0
        announces nothing (:class:`~.policies.follow.ImmediatePolicy`). For a ``rank0``-order
        parameter-server job that stays out of the way: with nothing held back, a synchronous
        server needs no common order (see :func:`~.policies.follow.ps_order`). Call it on every
        rank at the same step boundary, with nothing in flight."""
        self._replace_order(ImmediatePolicy)

    def restore_order(self) -> None:
        """Back to the order mode the Core started with (after :meth:`start_in_sequence` or
        :meth:`start_on_ready`), keeping the sizes set meanwhile; every rank calls it at the same
        step boundary, with nothing in flight."""
        def switch() -> None:
            if self._replaced_order is None:
                return
            policy, self._publish = self._replaced_order
            policy.set_params(self.policy.params)  # the sizes set while replaced
            self.policy = policy
            self.scheduler.set_policy(policy)
            self._replaced_order = None
        self.query(switch)

    @property
    def start_order(self) -> str:
        """How this Core starts tasks now: its :attr:`order` mode, or ``sequence`` / ``immediate``
        while :meth:`start_in_sequence` / :meth:`start_on_ready` replaced it."""
        return self.order if self._replaced_order is None else self.policy.name

    def _replace_order(self, make: Callable[[Policy], Policy]) -> None:
        def switch() -> None:
            leader = getattr(self.policy, "leader", self.policy)
            if self._replaced_order is None:
                self._replaced_order = (self.policy, self._publish)
            self.policy = make(leader)
            self.scheduler.set_policy(self.policy)
            self._publish = False
        self.query(switch)

    def query(self, fn: Callable[[], T], timeout: float = 10.0) -> T:
        """``fn()`` run on the Core thread, in order with the other events (its exception is
        raised here, and the Core goes on); a RuntimeError if no answer came within ``timeout``."""
        done = threading.Event()
        box: list[Any] = []
        errors: list[BaseException] = []

        def call() -> None:
            try:
                box.append(fn())
            except BaseException as exc:  # handed to the caller, the Core goes on
                errors.append(exc)
            done.set()
        self.call_soon(call)
        if not done.wait(timeout):
            raise RuntimeError(f"bytesched Core did not answer within {timeout:g} s (is it running?)")
        if errors:
            raise errors[0]
        return box[0]

    def fail(self, error: BaseException, exit_reason: str) -> None:
        """Stop the Core with ``error`` (every unfinished task gets it, the next ``enqueue``
        raises it), and end the process unless it exits by itself in time (:func:`exit_later`
        with ``exit_reason``): the stall check's way to end a job a peer left waiting."""
        exit_later(exit_reason)

        def raise_it() -> None:
            raise error
        self.call_soon(raise_it)

    def call_soon(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` on the Core thread, in order with the other events."""
        self._post((_CALL, fn))

    def take_stats(self) -> Stats:
        """Counters since the previous call, read consistently on the Core thread."""
        return self.query(self.scheduler.take_stats)

    def describe_waiting(self, timeout: float = 2.0) -> str:
        """What this rank's communication waits for: the oldest sub-task in flight (or queued),
        for the message of a fault. Safe from any thread; never blocks longer than ``timeout``."""
        try:
            return self.query(lambda: self._waiting_for(time.monotonic()), timeout)
        except RuntimeError:
            return "unknown (the bytesched Core did not answer)"

    def _refusal(self, task: CommTask) -> RuntimeError:
        return enqueue_refusal(task, self.failure, self._accepting)

    # -- the scheduler thread -----------------------------------------------------------------
    def _run(self) -> None:
        self._ident = threading.get_ident()
        try:
            self._loop()
        except BaseException as exc:  # a bug or a protocol violation: fail loudly, wake waiters
            self.failure = exc
            self._accepting = False
            log.exception("bytesched Core stopped on an error")
            self._fail_unfinished(exc)
        finally:
            self._stall_check.stop()
            self._close_outputs()

    def _loop(self) -> None:
        events = self._events
        get = events.get
        empty = events.empty
        sched = self.scheduler
        clock = time.monotonic
        stop_deadline: float | None = None
        while True:
            timeout = self._wait_timeout(clock(), stop_deadline)
            source = self._source
            if source is None:
                try:
                    event = get_within(events, timeout)
                except queue.Empty:
                    event = None
            else:  # its events reach the queue from this thread; others' puts wake its wait
                if empty() and not source.wait(timeout):
                    self._source = None  # closed: the queue alone from now on
                event = get() if not empty() else None
            started: list[SubTask] = []
            finished: list[SubTask] = []  # a run of finishes, handed to the Scheduler in one call
            while event is not None:
                if type(event) is SubTask:  # a finish, the most frequent event: one per sub-task
                    finished.append(event)
                else:
                    now = clock()
                    if finished:  # events are handled in arrival order
                        started += self._finish(finished, now)
                        finished = []
                    kind, obj = event
                    if kind == _ENQUEUE_READY:
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
            if finished:
                started += self._finish(finished, clock())
            self._start_all(started)
            now = clock()
            wake_at = sched.wake_at()
            if not started and wake_at is not None and now >= wake_at:
                self._start_all(sched.tick(now))
            if self._completions and (self._next_poll is None or now >= self._next_poll):
                self._poll(now)
            if stop_deadline is not None and (sched.idle or now >= stop_deadline):
                if not sched.idle:
                    self._fail_unfinished(
                        CoreShutdownError("the bytesched Core was shut down before this task finished"))
                return
            # Nothing of this wake-up stays referenced while the thread waits for the next: its
            # last run of finishes and its last event's task would keep the sub-tasks, their tasks
            # and what those hold alive into the next step, where Python's cyclic garbage
            # collector counts them.
            started = finished = obj = None  # type: ignore[assignment]  # dropped, not used again

    def _finish(self, subs: list[SubTask], now: float) -> list[SubTask]:
        """A run of finish events: what they start; records them and tells completed tasks."""
        started, completed = self.scheduler.finish_many(subs, now)
        if self.timeline is not None:
            for sub in subs:
                self.timeline.record(sub)
        if self._observer is not None:
            for sub in subs:
                self._observer(sub)
        for task in completed:
            task.on_finish()
            task.subtasks = ()  # cut the task <-> sub-task cycle (see CommTask.subtasks)
        return started

    def _poll(self, now: float) -> None:
        """Poll every :class:`Completions` (their finishes arrive as events), drop those stopping
        with nothing in flight, and note when to poll next."""
        delays = []
        for source in list(self._completions):
            delay = source.poll()
            if delay is not None:
                delays.append(delay)
            elif source in self._stopping:
                self._completions.remove(source)
                self._stopping.remove(source)
        self._next_poll = now + min(delays) if delays else None

    def _wait_timeout(self, now: float, stop_deadline: float | None) -> float | None:
        """How long the thread may sleep in ``get`` (None: until an event comes)."""
        deadlines = [d for d in (self.scheduler.wake_at(), stop_deadline, self._next_poll) if d is not None]
        return max(0.0, min(deadlines) - now) if deadlines else None

    def _start_all(self, started: list[SubTask]) -> None:
        if not started:
            return
        if self._publish:
            self._channel.publish_order(announcement(started))  # type: ignore[union-attr]  # set with a channel
        for sub in started:
            try:
                start_operation(sub)
            except Exception as exc:  # the plugin's backend refused: those tasks fail, not the Core
                log.error("starting %r failed: %s", sub.batch or sub, exc)
                for task in {id(s.task): s.task for s in sub.batch or (sub,)}.values():
                    task.on_error(exc)

    def _waiting_for(self, now: float) -> str:
        unfinished = self.scheduler.unfinished()
        in_flight = [s for t in unfinished for s in t.subtasks if math.isnan(s.t_finish) and not math.isnan(s.t_start)]
        if in_flight:
            return describe(min(in_flight, key=lambda s: s.t_start), now)
        if unfinished:
            return f"tensor {unfinished[0].name!r} (ready, not started yet)"
        return "no communication (nothing in flight)"

    def _fail_unfinished(self, exc: BaseException) -> None:
        for task in self.scheduler.unfinished():
            try:
                task.on_error(exc)
            except Exception:  # a failing hook must not stop the others from being told
                log.exception("on_error of %r raised", task)

    def _close_outputs(self) -> None:
        if self.timeline is not None:
            self.timeline.close()


# ----------------------------------------------------------------------------------------------
# One Core per process.

_core: Core | None = None
_core_lock = threading.Lock()


def init(config: Config, *, make: Callable[..., Core] | None = None, **kwargs: Any) -> Core:
    """Create and start this process's Core (idempotent). The plugins get theirs from
    :func:`bytesched.runtime.start_core`, which also stops it at exit; whoever calls ``init``
    directly calls :func:`shutdown` (the Core's thread is a daemon: it never keeps a process alive).
    ``make(config, **kwargs)`` makes it (default :class:`Core`; a plugin's backend may make one
    with the same interface whose hot path is native, as the PyTorch plugin's over torch.distributed).

    A second call returns the running Core; it is an error if it asks for another config.
    """
    global _core
    with _core_lock:
        if _core is not None and _core._accepting:
            if _core.config != config:
                raise RuntimeError("bytesched Core is already running with another configuration; "
                                   "call bytesched.core.shutdown() first")
            return _core
        _core = (make or Core)(config, **kwargs).start()
        return _core


def get_core() -> Core:
    """This process's Core; an error if :func:`init` was not called."""
    if _core is None:
        raise RuntimeError("bytesched Core is not initialised: call bytesched.core.init(config) first")
    return _core


def shutdown(timeout: float = 30.0) -> None:
    """Stop this process's Core, if any (:func:`bytesched.runtime.shutdown` calls this, at the end
    of a ``running()`` block or at interpreter exit, after the plugins' objects closed)."""
    global _core
    with _core_lock:
        core, _core = _core, None
    if core is not None:
        core.shutdown(timeout)

