"""StallWatch: waits outside the Core (passing through) warned about and ended like its sub-tasks."""

from __future__ import annotations

import logging
import threading
import time

import pytest

from bytesched.core import Config
from bytesched.runtime import stall_watch
from bytesched.runtime.stall_watch import StallWatch


@pytest.fixture
def exits(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, float]]:
    """What would have ended the process: (reason, grace)."""
    ended: list[tuple[str, float]] = []
    monkeypatch.setattr(stall_watch, "exit_later", lambda reason, grace_s: ended.append((reason, grace_s)))
    return ended


def test_a_long_wait_is_warned_about_once_naming_what_it_waits_for(
        exits: list[tuple[str, float]], caplog: pytest.LogCaptureFixture) -> None:
    watch = StallWatch(Config(stall_warning_s=0.1, stall_timeout_s=0.0), rank=3)
    with caplog.at_level(logging.WARNING, logger="bytesched"):
        with watch.waiting("the gradients of step 7"):
            time.sleep(0.5)
    watch.close()
    warnings = [r.getMessage() for r in caplog.records if "stall" in r.getMessage()]
    assert len(warnings) == 1 and "rank 3 has waited 0 s for the gradients of step 7" in warnings[0]
    assert exits == []  # no timeout set: warned, never ended


def test_a_wait_past_the_stall_timeout_ends_the_process(exits: list[tuple[str, float]]) -> None:
    watch = StallWatch(Config(stall_warning_s=0.05, stall_timeout_s=0.2), rank=0)
    started = time.monotonic()
    with watch.waiting("the gradients of step 2"):
        while not exits and time.monotonic() - started < 5.0:
            time.sleep(0.01)
    watch.close()
    [(reason, grace)] = exits
    assert "rank 0 waited 0 s for the gradients of step 2 (BYTESCHED_STALL_TIMEOUT_S=0.2)" in reason
    assert grace == stall_watch.EXIT_GRACE_S and time.monotonic() - started < 2.0


def test_short_waits_are_silent_and_the_thread_stops_at_close(
        exits: list[tuple[str, float]], caplog: pytest.LogCaptureFixture) -> None:
    watch = StallWatch(Config(stall_warning_s=0.3, stall_timeout_s=0.6), rank=1)
    with caplog.at_level(logging.WARNING, logger="bytesched"):
        for step in range(20):
            with watch.waiting(f"the gradients of step {step}"):
                time.sleep(0.05)
    watch.close()
    assert exits == [] and "stall" not in caplog.text
    assert not [t for t in threading.enumerate() if t.name == "bytesched-stall-watch"]


def test_waits_wake_no_other_thread(exits: list[tuple[str, float]]) -> None:
    """A wait costs the waiting thread two assignments: the watching thread sleeps through two
    hundred of them, each letting go of the GIL as a collective does (the kernel's count of the
    times it ran stays put)."""
    watch = StallWatch(Config(stall_warning_s=60.0, stall_timeout_s=0.0), rank=0)
    with watch.waiting("the gradients of step 0"):
        pass
    [thread] = [t for t in threading.enumerate() if t.name == "bytesched-stall-watch"]
    time.sleep(0.1)  # it reached its sleep

    def times_run() -> int:
        with open(f"/proc/self/task/{thread.native_id}/schedstat") as schedstat:
            return int(schedstat.read().split()[2])

    before = times_run()
    for step in range(1, 201):
        with watch.waiting(f"the gradients of step {step}"):
            time.sleep(0.001)
    assert times_run() - before <= 1
    watch.close()
    assert not thread.is_alive() and exits == []
