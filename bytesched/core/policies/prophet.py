"""``prophet``: gradient blocks sized by predicted generation times (Zhang et al., ICPP'21, §4).

During backward, Prophet sends a block of lower-priority gradients only if it will be through
before the next higher-priority gradient is generated (its Constraint 11), so that gradient
finds the link free; once the highest-priority gradient is out, the rest go strictly by priority.
It needs two things it learns as training runs:

- the generation time of every gradient relative to its iteration's start (the "stepwise pattern"),
  from the ready times of the tasks;
- the bandwidth ``B`` of the link, from the sub-tasks that finished.

The Scheduler has no clock, so when a block is held back for a gradient that is predicted but
has not come, the policy asks to be woken (:meth:`ProphetPolicy.wake_at`) at the moment that
gradient counts as late; it then stops waiting for it. docs/policies.md gives the full rule.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from typing import ClassVar

from ..config import ConfigError, SchedulingParams
from ..task import CommTask, SubTask
from .base import CreditPolicy, Window
from .bytescheduler import ByteSchedulerPolicy


class _PrefixMin:
    """Values at positions ``0..n-1``; the position of the least among the first ``k`` in
    O(log n), and point updates in O(log n) (a segment tree of argmins)."""

    def __init__(self, values: list[float]) -> None:
        size = 1
        while size < len(values):
            size *= 2
        self._size = size
        self._values = values + [math.inf] * (size - len(values))
        self._best = [0] * size + list(range(size))
        for node in range(size - 1, 0, -1):
            self._best[node] = self._least(self._best[2 * node], self._best[2 * node + 1])

    def _least(self, i: int, j: int) -> int:
        return i if self._values[i] <= self._values[j] else j

    def set(self, i: int, value: float) -> None:
        self._values[i] = value
        node = (i + self._size) // 2
        while node:
            self._best[node] = self._least(self._best[2 * node], self._best[2 * node + 1])
            node //= 2

    def argmin(self, k: int) -> int | None:
        """Position of the least finite value among positions ``0..k-1``, or None."""
        best: int | None = None
        lo, hi = self._size, self._size + k
        while lo < hi:
            if lo & 1:
                best = self._best[lo] if best is None else self._least(best, self._best[lo])
                lo += 1
            if hi & 1:
                hi -= 1
                best = self._best[hi] if best is None else self._least(best, self._best[hi])
            lo //= 2
            hi //= 2
        return best if best is not None and self._values[best] < math.inf else None


class _Forecast:
    """One iteration's predicted generation times, and which gradients are still to come."""

    def __init__(self, start: float, profile: list[tuple[int, str, float]], slack: float) -> None:
        profile.sort()  # (priority, name, offset): highest priority first
        self.slack = slack
        self.forward = False
        self._priorities = [priority for priority, _, _ in profile]
        self._position = {name: i for i, (_, name, _) in enumerate(profile)}
        self._due = [start + offset for _, _, offset in profile]
        self._pending = _PrefixMin(list(self._due))

    def generated(self, name: str, priority: int) -> None:
        """Gradient ``name`` is ready; the highest-priority one ends the backward phase."""
        i = self._position.get(name)
        if i is not None:
            self._pending.set(i, math.inf)
        if priority <= self._priorities[0]:
            self.forward = True

    def next_higher(self, priority: int, now: float) -> float:
        """Earliest predicted generation of a gradient of higher priority (lower number) than
        ``priority`` that has not come yet and is not late (``now >= due + slack``); inf if none."""
        k = bisect_left(self._priorities, priority)
        while (i := self._pending.argmin(k)) is not None:
            due = self._due[i]
            if now < due + self.slack:
                return due
            self._pending.set(i, math.inf)  # late: stop waiting for it this iteration
        return math.inf


class _Link:
    """Prophet's view of the link: its bandwidth ``B`` and when it will have sent what started.

    ``B`` is the bytes delivered per second while anything is in flight, measured over each busy
    period (from the start that made the link busy to the finish that left it idle) and smoothed,
    so concurrent sub-tasks sharing the link do not count as slow ones. The drain time adds
    ``size / B`` per start, as ``T_used`` does in Prophet's Algorithm 1.
    """

    def __init__(self, smoothing: float) -> None:
        self.bandwidth: float | None = None
        self._smoothing = smoothing
        self._inflight = 0
        self._busy_since = 0.0
        self._busy_bytes = 0
        self._drain_at = -math.inf

    def started(self, nbytes: int, now: float) -> None:
        if self._inflight == 0:
            self._busy_since = now
            self._busy_bytes = 0
        self._inflight += 1
        if self.bandwidth is not None:
            self._drain_at = max(self._drain_at, now) + nbytes / self.bandwidth

    def finished(self, nbytes: int, now: float) -> None:
        self._inflight -= 1
        self._busy_bytes += nbytes
        if self._inflight == 0:
            busy = now - self._busy_since
            if busy > 0 and self._busy_bytes > 0:
                sample = self._busy_bytes / busy
                old = self.bandwidth
                self.bandwidth = sample if old is None else old + self._smoothing * (sample - old)
            self._drain_at = now

    def free_at(self, now: float) -> float:
        """When everything started so far should be through (``now`` if it already is)."""
        return max(self._drain_at, now)


class ProphetPolicy(CreditPolicy):
    """Prophet's Algorithm 1 as an admission rule over the priority queue.

    - No profile yet (the first iteration) or no bandwidth measured: ``bytescheduler``.
    - Backward phase: the head of the queue (highest-priority ready sub-task) starts iff
      ``free_at + size / B <= due``, ``due`` the next predicted generation of a gradient of
      higher priority. No such gradient to wait for: the credit window decides.
    - Forward phase (the profile's highest-priority gradient is ready): the credit window.

    An iteration starts at the ready event of a task whose name was already ready in the current
    iteration (every gradient is generated once per iteration). Generation offsets and ``B`` are
    exponentially smoothed with weight ``smoothing`` on the newest value. A predicted gradient is
    late once ``now >= due + slack``, with ``slack = late_fraction *`` the profiled spread of
    generation offsets; the policy then stops waiting for it, so it never waits forever.
    """

    name = "prophet"
    default_partition_bytes: ClassVar[float] = ByteSchedulerPolicy.default_partition_bytes

    def __init__(self, params: SchedulingParams, *, smoothing: float = 0.5, late_fraction: float = 0.1) -> None:
        super().__init__(params)
        if not 0 < smoothing <= 1:
            raise ConfigError(f"prophet smoothing={smoothing!r} must be in (0, 1]")
        if not (late_fraction >= 0 and math.isfinite(late_fraction)):
            raise ConfigError(f"prophet late_fraction={late_fraction!r} must be a finite number >= 0")
        self.smoothing = smoothing
        self.late_fraction = late_fraction
        self.link = _Link(smoothing)
        self.offsets: dict[str, float] = {}
        """Smoothed generation time of each gradient, relative to its iteration's start."""
        self._start = math.nan
        self._observed: dict[str, tuple[int, float]] = {}  # this iteration: name -> (priority, offset)
        self._forecast: _Forecast | None = None
        self._now = 0.0
        self._hold_until: float | None = None

    # -- learning -------------------------------------------------------------------------
    def on_ready(self, task: CommTask, now: float) -> None:
        if task.name in self._observed or math.isnan(self._start):
            self._begin_iteration(now)
        self._observed[task.name] = (task.priority, now - self._start)
        if self._forecast is not None:
            self._forecast.generated(task.name, task.priority)

    def _begin_iteration(self, now: float) -> None:
        for name, (_, offset) in self._observed.items():
            old = self.offsets.get(name)
            self.offsets[name] = offset if old is None else old + self.smoothing * (offset - old)
        if self._observed:
            profile = [(priority, name, self.offsets[name]) for name, (priority, _) in self._observed.items()]
            spread = max(p[2] for p in profile) - min(p[2] for p in profile)
            self._forecast = _Forecast(now, profile, self.late_fraction * spread)
        self._observed = {}
        self._start = now

    def on_finish(self, sub: SubTask, now: float) -> None:
        self.link.finished(sub.nbytes, now)

    # -- deciding -------------------------------------------------------------------------
    def peek(self, now: float) -> SubTask | None:
        self._now = now
        self._hold_until = None
        return super().peek(now)

    def pop(self) -> SubTask:
        sub = super().pop()
        self.link.started(sub.nbytes, self._now)  # the Scheduler starts it at the time it peeked
        return sub

    def admits(self, sub: SubTask, window: Window, now: float) -> bool:
        forecast, bandwidth = self._forecast, self.link.bandwidth
        if forecast is None or forecast.forward or bandwidth is None:
            return super().admits(sub, window, now)
        due = forecast.next_higher(sub.task.priority, now)
        if due == math.inf:
            return super().admits(sub, window, now)
        if self.link.free_at(now) + sub.nbytes / bandwidth <= due:
            return True
        self._hold_until = due + forecast.slack
        return False

    def wake_at(self) -> float | None:
        """When the gradient the head of the queue waits for becomes late (always after the
        last ``now``), or None if nothing is held back for a predicted gradient."""
        return self._hold_until
