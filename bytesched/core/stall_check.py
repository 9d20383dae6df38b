"""The stall check: a thread beside the Core that watches its sub-tasks in flight.

A sub-task in flight longer than ``BYTESCHED_STALL_WARNING_S`` is logged with its tensor and
partition; rank 0, which has the rank-0 channel, first asks every follower whether it started
that sub-task, so that the warning names the ranks that have not (the question a user asks first).
Past ``BYTESCHED_STALL_TIMEOUT_S`` (when set) the Core fails with :class:`StallTimeout` and the
process is ended if it does not exit by itself.

The check runs on a thread of its own so that the Core's thread does scheduling only: it sleeps
between checks, reads the Core's state through :meth:`Core.query` (one call on the Core thread
per check, which lists the late sub-tasks), and does its logging, channel round trips and exits
here. A Core thread that does not answer within :data:`QUERY_S` is itself reported: a ``start()``
blocked in a backend would stop every other check.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from typing import TYPE_CHECKING, Any

from .policies.follow import FollowOrderPolicy, SubTaskKey
from .task import SubTask

if TYPE_CHECKING:
    from .core import Core
    from .scheduler import Scheduler

log = logging.getLogger("bytesched")

STALL_QUERY, STALL_ANSWER = "stall.query", "stall.answer"  # rank-0 channel kinds: who has started what
QUERY_S = 5.0
"""How long a check waits for the Core thread's answer before it reports the Core as stuck."""


class StallTimeout(RuntimeError):
    """A sub-task was in flight longer than ``BYTESCHED_STALL_TIMEOUT_S``."""


class StallCheck:
    """Checks ``core``'s sub-tasks in flight every half warning period (see the module doc).

    Args:
        core: the Core whose sub-tasks are checked (its config holds the warning and timeout).
        channel: the rank-0 channel, if the job has one: rank 0 asks the followers through it,
            followers answer through it.
    """

    def __init__(self, core: "Core", channel: Any | None) -> None:
        self._core = core
        self._channel: Any = channel  # used only where it is not None
        config = core.config
        self._warning_s = config.stall_warning_s
        self._timeout_s = config.stall_timeout_s
        self.period = min(self._warning_s, self._timeout_s if self._timeout_s > 0 else math.inf) / 2
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"bytesched-stall-check-{core.rank}", daemon=True)

    def start(self) -> None:
        """Start checking; a follower also starts answering rank 0's questions."""
        if self._channel is not None and self._core.rank != 0:
            self._channel.subscribe(STALL_QUERY, self._answer)
        self._thread.start()

    def stop(self) -> None:
        """Stop checking (from any thread, the Core's included: it does not wait)."""
        self._stopped.set()

    def _run(self) -> None:
        while not self._stopped.wait(self.period):
            try:
                if not self.check(time.monotonic()):
                    return
            except Exception:  # a bug in the check must not end the process's only stall guard silently
                log.exception("bytesched: the stall check failed")

    def check(self, now: float) -> bool:
        """One check at ``now``; False once there is nothing more to watch (the Core stopped, or
        this check failed it)."""
        core = self._core
        timeout = self._timeout_s
        try:
            stuck, late, missing = core.query(lambda: (
                late_subtasks(core.scheduler, now, timeout) if timeout > 0 else [],
                late_subtasks(core.scheduler, now, self._warning_s),
                _waiting_for_announced(core)), timeout=QUERY_S)
        except RuntimeError:  # no answer
            if not core.running:
                return False
            log.warning("stall: the bytesched Core thread of rank %d has not answered for %.0f s (a backend's "
                        "start() blocked?)", core.rank, QUERY_S)
            return True
        if stuck:
            what = describe(stuck[0], now)
            core.fail(StallTimeout(f"stall timeout: {what} on rank {core.rank}, longer than "
                                   f"BYTESCHED_STALL_TIMEOUT_S={timeout:g}; a peer is missing this collective "
                                   f"(see the stall warnings above for which rank)"),
                      exit_reason=f"{what} on rank {core.rank} (BYTESCHED_STALL_TIMEOUT_S={timeout:g})")
            return False
        if late and core.rank == 0 and self._channel is not None:
            self._ask_who_is_missing(late, now)
        else:
            for sub in late:
                log.warning("stall: %s on rank %d and has not finished (a peer may be missing this "
                            "collective)", describe(sub, now), core.rank)
        if missing is not None:
            log.warning("stall: rank 0 started %r but rank %d has not produced that tensor yet", missing, core.rank)
        return True

    def _ask_who_is_missing(self, late: list[SubTask], now: float) -> None:
        """Rank 0: ask every follower whether it started the late sub-tasks, then warn naming the
        ranks that have not."""
        keys = [list(s.key) for s in late]
        try:
            self._channel.broadcast(STALL_QUERY, {"keys": keys})
            answers = self._channel.gather(STALL_ANSWER, timeout=min(10.0, self._warning_s))
        except Exception as exc:  # ChannelError: a follower did not answer (it may be the culprit)
            answers, reason = {}, f"the ranks could not be asked: {exc}"
        else:
            reason = ""
        for i, sub in enumerate(late):
            missing = [rank for rank, body in sorted(answers.items()) if not _started_at(body, i, sub.key)]
            who = (f"rank(s) {', '.join(map(str, missing))} have not started it" if missing
                   else reason or "every rank has started it (a slow network or backend?)")
            log.warning("stall: %s on rank 0 and has not finished: %s", describe(sub, now), who)

    def _answer(self, body: dict[str, Any]) -> None:
        """Follower (the channel's thread): tell rank 0 which of the queried sub-tasks this rank
        started, read on the Core thread."""
        keys = body.get("keys", [])
        scheduler = self._core.scheduler
        self._core.call_soon(lambda: self._channel.report(
            STALL_ANSWER, {"keys": keys, "started": [has_started(scheduler, key) for key in keys]}))


def late_subtasks(scheduler: "Scheduler", now: float, limit: float) -> list[SubTask]:
    """The oldest sub-task of each unfinished task in flight for over ``limit`` s (Core thread)."""
    late = []
    for task in scheduler.unfinished():
        subs = [s for s in task.subtasks if math.isnan(s.t_finish) and now - s.t_start > limit]
        if subs:  # NaN t_start (not started) compares False above
            late.append(subs[0])
    return late


def has_started(scheduler: "Scheduler", key: list[Any]) -> bool:
    """This rank started the sub-task ``key`` (name, instance, index) (Core thread)."""
    name, instance, index = key
    for task in scheduler.unfinished():
        if task.name == name and task.instance == instance:
            return index < len(task.subtasks) and not math.isnan(task.subtasks[index].t_start)
    return instance < scheduler.instances(name)  # finished already, or not enqueued yet


def describe(sub: SubTask, now: float) -> str:
    """``tensor 'w' partition 1 of 3 (started 12 s ago)`` for logs and errors."""
    return (f"tensor {sub.task.name!r} partition {sub.index} of {len(sub.task.subtasks)} "
            f"(started {now - sub.t_start:.0f} s ago)")


def _waiting_for_announced(core: "Core") -> SubTaskKey | None:
    """A follower in rank0 order: the sub-task rank 0 started that this rank has not produced."""
    return core.policy.waiting_for() if isinstance(core.policy, FollowOrderPolicy) else None


def _started_at(body: dict[str, Any], i: int, key: tuple[Any, ...]) -> bool:
    """A follower's stall answer says it started the ``i``-th queried sub-task ``key``."""
    keys, started = body.get("keys", []), body.get("started", [])
    return i < len(keys) and i < len(started) and tuple(keys[i]) == tuple(key) and bool(started[i])
