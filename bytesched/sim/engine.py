"""The discrete-event engine: a virtual clock and a heap of timed callbacks (SimPy-style, minus
the generators: the simulated components are small state machines that schedule their next
event themselves, which keeps the hot path free of coroutine overhead).
"""

from __future__ import annotations

import heapq
from typing import Any, Callable


class Event:
    """The handle of a callback scheduled with :meth:`EventLoop.call_at`: :meth:`cancel` makes
    the loop skip it (lazy deletion)."""

    __slots__ = ("cancelled",)

    def __init__(self) -> None:
        self.cancelled = False

    def cancel(self) -> None:
        """Do not run this event (it stays in the heap until its time comes)."""
        self.cancelled = True


class EventLoop:
    """Runs callbacks in time order; ties run in the order they were scheduled, so a simulation
    is deterministic."""

    def __init__(self) -> None:
        self.now = 0.0
        # (when, tie-breaking sequence number, callback, its arguments, its handle if cancellable)
        self._heap: list[tuple[float, int, Callable[..., Any], tuple[Any, ...], Event | None]] = []
        self._seq = 0
        self._stopped = False

    def call_at(self, when: float, fn: Callable[..., Any], *args: Any) -> Event:
        """Run ``fn(*args)`` at virtual time ``when`` (not before now); the returned handle
        can cancel it."""
        if when < self.now:
            raise ValueError(f"cannot schedule {fn!r} at t={when!r}, before now={self.now!r}")
        event = Event()
        heapq.heappush(self._heap, (when, self._seq, fn, args, event))
        self._seq += 1
        return event

    def call_later(self, delay: float, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` after ``delay`` seconds of virtual time (``delay >= 0``). Not
        cancellable (no handle to allocate: most events of a simulation are these); use
        :meth:`call_at` for a callback that may be cancelled."""
        if delay < 0:
            raise ValueError(f"cannot schedule {fn!r} {delay!r}s in the past")
        heapq.heappush(self._heap, (self.now + delay, self._seq, fn, args, None))
        self._seq += 1

    def stop(self) -> None:
        """End :meth:`run` after the current callback."""
        self._stopped = True

    def run(self) -> bool:
        """Process events until :meth:`stop` is called (True) or none is left (False)."""
        heap = self._heap
        pop = heapq.heappop
        self._stopped = False
        while heap:
            when, _, fn, args, event = pop(heap)
            if event is not None and event.cancelled:
                continue
            self.now = when
            fn(*args)
            if self._stopped:
                return True
        return False
