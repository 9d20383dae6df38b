"""What a timed run cost in CPU: the reporting rank's process (all its threads) and the machine.

Every emulated host shares the host's cores: at 4 ranks, or 2 workers with 2 servers, the
processes want more CPU than there is, and a configuration can then be slower only because it
needs more CPU (a scheduler thread, more messages), not because it schedules the network worse.
A real cluster gives each host its own cores. These two numbers, recorded with every run, tell a
CPU-bound cell from a network-bound one and show what bytesched's machinery costs per step.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

PROC_STAT = Path("/proc/stat")
IDLE_FIELDS = (3, 4)
"""Of the ``cpu`` line's counters (user nice system idle iowait irq softirq steal ...), the ones
that are not work: idle and iowait."""


@dataclass(frozen=True)
class Usage:
    """One timed run: wall seconds, the process's CPU seconds, the machine's busy fraction."""

    seconds: float
    cpu_seconds: float
    machine_busy: float | None
    """Share of all cores' time spent working (0 to 1); None where /proc/stat is not readable."""


def machine_ticks() -> tuple[int, int] | None:
    """(busy, total) clock ticks of all cores since boot, or None without a Linux /proc."""
    try:
        fields = PROC_STAT.read_text().split("\n", 1)[0].split()
    except OSError:
        return None
    counters = [int(value) for value in fields[1:]]
    idle = sum(counters[i] for i in IDLE_FIELDS if i < len(counters))
    total = sum(counters[:8])  # guest time is already counted in user time
    return total - idle, total


class Stopwatch:
    """Started when the timed steps start; :meth:`stop` gives their :class:`Usage`."""

    def __init__(self) -> None:
        self._wall = time.perf_counter()
        self._cpu = time.process_time()
        self._ticks = machine_ticks()

    def stop(self) -> Usage:
        seconds = time.perf_counter() - self._wall
        cpu_seconds = time.process_time() - self._cpu
        ticks = machine_ticks()
        busy = None
        if self._ticks is not None and ticks is not None and ticks[1] > self._ticks[1]:
            busy = (ticks[0] - self._ticks[0]) / (ticks[1] - self._ticks[1])
        return Usage(seconds, cpu_seconds, busy)
