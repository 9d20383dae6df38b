"""Waits the Core cannot see, held to the same stall warning and timeout as its sub-tasks.

A plugin that passes through (the start-up plan stayed out) waits for the framework's own
collectives: no sub-task of the Core is in flight, so the Core's stall check (which warns after
``BYTESCHED_STALL_WARNING_S`` and, with ``BYTESCHED_STALL_TIMEOUT_S``, ends the job) would never
fire while a peer that stopped producing gradients holds every other rank in that wait. A
:class:`StallWatch` gives such waits the same bounds: a warning naming what this rank waits for,
and, past the timeout, the end of the process with the Core's fault exit code. The waiting thread
sits in the library's C++ (a Horovod handle, a Gloo or NCCL work), where no exception can reach
it, so the process is ended rather than the wait raised.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from typing import Iterator

from bytesched.core import Config
from bytesched.core.core import exit_later

log = logging.getLogger("bytesched")

EXIT_GRACE_S = 1.0
"""Seconds the timed-out process gets to flush its logs: its training thread, blocked in a
collective, cannot end it any sooner by itself."""


class StallWatch:
    """Watches one wait at a time (``with watch.waiting("what"): ...``) on a thread of its own,
    started at the first wait and idle on a condition between waits."""

    def __init__(self, config: Config, rank: int) -> None:
        self._warning_s = config.stall_warning_s
        self._timeout_s = config.stall_timeout_s
        self._rank = rank
        self._changed = threading.Condition()
        self._what: str | None = None  # the wait in progress
        self._since = 0.0
        self._thread: threading.Thread | None = None
        self._closed = False

    @contextlib.contextmanager
    def waiting(self, what: str) -> Iterator[None]:
        """The calling thread waits for ``what`` until the block ends."""
        with self._changed:
            if self._thread is None and not self._closed:
                self._thread = threading.Thread(target=self._run, name="bytesched-stall-watch", daemon=True)
                self._thread.start()
            self._what, self._since = what, time.monotonic()
            self._changed.notify()
        try:
            yield
        finally:
            with self._changed:
                self._what = None
                self._changed.notify()

    def close(self) -> None:
        """Stop the watching thread (a wait in progress is no longer watched)."""
        with self._changed:
            self._closed = True
            self._changed.notify()
        if self._thread is not None:
            self._thread.join(timeout=5.0)

    def _run(self) -> None:
        with self._changed:
            while not self._closed:
                if self._what is None:
                    self._changed.wait()
                    continue
                what, since, warned = self._what, self._since, False
                while self._what == what and self._since == since and not self._closed:
                    waited = time.monotonic() - since
                    if self._timeout_s > 0 and waited >= self._timeout_s:
                        self._time_out(what, waited)
                        return
                    if not warned and waited >= self._warning_s:
                        log.warning("stall: rank %d has waited %.0f s for %s (a peer may be missing this "
                                    "collective)", self._rank, waited, what)
                        warned = True
                    deadlines = [self._timeout_s] if self._timeout_s > 0 else []
                    if not warned:
                        deadlines.append(self._warning_s)
                    self._changed.wait(min(deadlines) - waited if deadlines else None)

    def _time_out(self, what: str, waited: float) -> None:
        reason = (f"rank {self._rank} waited {waited:.0f} s for {what} "
                  f"(BYTESCHED_STALL_TIMEOUT_S={self._timeout_s:g}); a peer is missing this collective")
        log.error("bytesched: stall timeout: %s", reason)
        exit_later(reason, grace_s=EXIT_GRACE_S)
