"""The discrete-event engine: a virtual clock and a heap of timed callbacks (SimPy-style, minus
the generators: the simulated components are small state machines that schedule their next
event themselves, which keeps the hot path free of coroutine overhead).
"""

from __future__ import annotations

import heapq
import math
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


class Timer:
    """A callback that is re-timed often, e.g. a shared link's next completion, which moves
    every time a flow joins or leaves.

    Re-timing it reserves the loop's next sequence number, exactly as cancelling an event and
    scheduling a new one with :meth:`EventLoop.call_at` would, so the run order (time, then
    sequence) is the same; but it pushes a heap entry only when the new time is earlier than
    the entry already waiting. A later entry is pushed when the earlier one comes due, with the
    sequence number reserved for it, so a link whose completion moves later 64 times in one
    instant costs one heap entry, not 64.
    """

    __slots__ = ("loop", "fn", "args", "when", "seq", "armed")

    def __init__(self, loop: "EventLoop", fn: Callable[..., Any], *args: Any) -> None:
        self.loop = loop
        self.fn = fn
        self.args = args
        self.when = math.inf  # when it is due (inf: not set)
        self.seq = -1  # its reserved sequence number
        self.armed: tuple[float, int] | None = None  # the (when, seq) of the heap entry it waits on

    def set(self, when: float) -> None:
        """Run the callback at virtual time ``when`` (not before now) instead of when it was
        due; ``math.inf`` clears it."""
        self.when = when
        if when == math.inf:
            return
        loop = self.loop
        if when < loop.now:
            raise ValueError(f"cannot time {self.fn!r} at t={when!r}, before now={loop.now!r}")
        self.seq = seq = loop._seq
        loop._seq = seq + 1
        armed = self.armed
        if armed is None or when < armed[0]:
            self.armed = (when, seq)
            heapq.heappush(loop._heap, (when, seq, self._come_due, (when, seq), None))

    def _come_due(self, when: float, seq: int) -> None:
        if self.armed != (when, seq):
            return  # superseded by an earlier entry
        self.armed = None
        if seq == self.seq and self.when == when:
            self.when = math.inf
            self.fn(*self.args)
        elif self.when < math.inf:  # it moved later: wait on the entry it reserved
            self.armed = (self.when, self.seq)
            heapq.heappush(self.loop._heap, (self.when, self.seq, self._come_due, self.armed, None))


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
