"""get_within: a timed wait on a SimpleQueue that ends by its timeout."""

from __future__ import annotations

import queue
import threading
import time

import pytest

from bytesched.core.waiting import get_within

TRIES = 20_000
LATE_S = 0.2  # far beyond any wait here, and any preemption: a wait this long missed its timeout


def test_short_waits_end_by_their_timeout_even_after_a_wait_that_took_an_item() -> None:
    """Each try leaves the queue's internal lock free (a put, then a get of it), then waits 0.1 us.
    A bare ``SimpleQueue.get(timeout=1e-7)`` missed that deadline about 4 times in 10,000 on the
    development VM and waited for the rescuer's put instead."""
    items: queue.SimpleQueue[str] = queue.SimpleQueue()
    waiting_since: list[float | None] = [None]
    done = threading.Event()

    def rescue() -> None:  # ends a missed wait, so that the test reports it rather than hanging
        while not done.wait(0.02):
            since = waiting_since[0]
            if since is not None and time.monotonic() - since > LATE_S:
                items.put("rescue")

    rescuer = threading.Thread(target=rescue, daemon=True)
    rescuer.start()
    late = 0
    try:
        for _ in range(TRIES):
            items.put("item")
            assert get_within(items, None) == "item"
            waiting_since[0] = began = time.monotonic()
            try:
                get_within(items, 1e-7)
            except queue.Empty:
                pass
            waiting_since[0] = None
            late += time.monotonic() - began > LATE_S
            while not items.empty():
                items.get_nowait()
    finally:
        done.set()
        rescuer.join(1)
    assert late == 0, f"{late} of {TRIES} waits of 0.1 us lasted over {LATE_S * 1e3:g} ms"


def test_get_within_returns_what_was_put_and_times_out_when_nothing_comes() -> None:
    items: queue.SimpleQueue[int] = queue.SimpleQueue()
    threading.Timer(0.05, items.put, args=(7,)).start()
    assert get_within(items, 2.0) == 7
    began = time.monotonic()
    with pytest.raises(queue.Empty):
        get_within(items, 0.1)
    assert 0.09 <= time.monotonic() - began < 1.0
