"""Waiting on a ``queue.SimpleQueue`` with a timeout that always ends.

CPython 3.11's ``SimpleQueue.get(timeout=t)`` can wait until the next ``put`` instead of ``t``
seconds. It finds the queue empty but its internal lock free (every ``get`` that waited and then
took an item leaves it so), takes the lock, then works out what is left of ``t``; if its thread
was delayed past the deadline in between by more than a microsecond, the remainder is negative,
and a negative wait on the lock means no timeout. Inside a training process, whose threads
compete for the cores, the Core's sub-millisecond waits for its next poll did so a few times a
minute and slept until the stall check's next query (figures: docs/experiments/per-tensor-cost.md,
"Figures behind the PyTorch plugin's rules").

A non-blocking ``get`` first leaves the lock held by the empty queue, so the timed ``get`` that
follows waits on the lock itself, once, for the whole timeout (or until a ``put`` releases it).
"""

from __future__ import annotations

import queue
from typing import TypeVar

T = TypeVar("T")


def get_within(items: "queue.SimpleQueue[T]", timeout: float | None) -> T:
    """The next of ``items``, waiting up to ``timeout`` seconds (None: as long as it takes);
    ``queue.Empty`` if none came in time."""
    try:
        return items.get_nowait()
    except queue.Empty:
        return items.get(timeout=timeout)
