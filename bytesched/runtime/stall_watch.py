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
import math
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
    """Watches one wait at a time (``with watch.waiting("what"): ...``).

    A thread of its own, started at the first wait, looks at the wait in progress every half of
    the warning period (or of the timeout, if shorter), as the Core's stall check looks at its
    sub-tasks. So a wait costs the waiting thread two assignments and wakes no other thread: a
    job passing through waits once per step (per backward pass in barrier mode), and a watcher
    woken at each wait's start and end took the GIL twice per step from the training thread.
    A warning or the timeout comes at most half a period late.
    """

    def __init__(self, config: Config, rank: int) -> None:
        self._warning_s = config.stall_warning_s
        self._timeout_s = config.stall_timeout_s
        self._rank = rank
        self.period = min(self._warning_s, self._timeout_s if self._timeout_s > 0 else math.inf) / 2
        self._wait: tuple[str, float] | None = None  # the wait in progress: what, since when
        self._stopped = threading.Event()
        self._starting = threading.Lock()
        self._thread: threading.Thread | None = None

    @contextlib.contextmanager
    def waiting(self, what: str) -> Iterator[None]:
        """The calling thread waits for ``what`` until the block ends."""
        if self._thread is None:
            self._start()
        self._wait = (what, time.monotonic())
        try:
            yield
        finally:
            self._wait = None

    def close(self) -> None:
        """Stop the watching thread (a wait in progress is no longer watched)."""
        self._stopped.set()
        with self._starting:
            thread = self._thread
        if thread is not None:
            thread.join(timeout=5.0)

    def _start(self) -> None:
        with self._starting:
            if self._thread is None and not self._stopped.is_set():
                self._thread = threading.Thread(target=self._run, name="bytesched-stall-watch", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        warned: tuple[str, float] | None = None  # the wait last warned about
        while not self._stopped.wait(self.period):
            wait = self._wait
            if wait is None:
                continue
            what, since = wait
            waited = time.monotonic() - since
            if self._timeout_s > 0 and waited >= self._timeout_s:
                self._time_out(what, waited)
                return
            if waited >= self._warning_s and wait is not warned:
                log.warning("stall: rank %d has waited %.0f s for %s (a peer may be missing this "
                            "collective)", self._rank, waited, what)
                warned = wait

    def _time_out(self, what: str, waited: float) -> None:
        reason = (f"rank {self._rank} waited {waited:.0f} s for {what} "
                  f"(BYTESCHED_STALL_TIMEOUT_S={self._timeout_s:g}); a peer is missing this collective")
        log.error("bytesched: stall timeout: %s", reason)
        exit_later(reason, grace_s=EXIT_GRACE_S)
