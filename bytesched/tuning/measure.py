"""Measuring a trial: the training throughput over a window of steps, robust to outliers.

A trial's first steps are skipped (warm-up: the pipeline refills after a switch, MXNet
re-partitions its keys), and the window's slowest and fastest steps are dropped before averaging:
a garbage collection, a checkpoint or a data-loader hiccup lands in one step and would otherwise
decide which configuration "wins". Dropping both ends keeps the estimate unbiased when step times
are symmetric around their typical value.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

TRIM = 0.2
"""Fraction of the window's steps dropped at each end (the slowest and the fastest)."""


def robust_throughput(samples: list[float], durations: list[float], trim: float = TRIM) -> float:
    """Samples per second over the steps left after dropping the ``trim`` fraction of slowest
    and of fastest steps (by duration); ValueError if there is nothing to measure."""
    if len(samples) != len(durations):
        raise ValueError(f"{len(samples)} sample counts for {len(durations)} step durations")
    if not durations:
        raise ValueError("no step was measured in this trial's window")
    if not 0 <= trim < 0.5:
        raise ValueError(f"trim={trim!r} must be in [0, 0.5)")
    order = sorted(range(len(durations)), key=durations.__getitem__)
    cut = int(len(order) * trim)
    kept = order[cut:len(order) - cut]
    seconds = sum(durations[i] for i in kept)
    if not seconds > 0:
        raise ValueError(f"the measured steps took {seconds!r} s in total: is the clock monotonic?")
    return sum(samples[i] for i in kept) / seconds


@dataclass
class StepTimer:
    """Turns step-boundary calls into the duration of each step that just ended.

    ``observe(step, samples, now)`` is called before ``step`` begins; ``samples`` were processed
    by step ``step - 1``, which therefore lasted from the previous call to ``now``. A gap in the
    step numbers (a step without a call) measures nothing rather than a wrong duration.
    """

    _last_step: int | None = None
    _last_time: float = math.nan
    samples: dict[int, float] = field(default_factory=dict)
    durations: dict[int, float] = field(default_factory=dict)

    def observe(self, step: int, samples: float, now: float) -> None:
        if self._last_step is not None and step == self._last_step + 1:
            self.samples[self._last_step] = samples
            self.durations[self._last_step] = now - self._last_time
        self._last_step, self._last_time = step, now

    def throughput(self, first: int, stop: int) -> float:
        """Robust throughput of the measured steps in ``[first, stop)``; their records are dropped."""
        steps = [s for s in range(first, stop) if s in self.durations]
        samples = [self.samples.pop(s) for s in steps]
        durations = [self.durations.pop(s) for s in steps]
        for old in [s for s in self.durations if s < stop]:  # steps outside any window
            del self.durations[old], self.samples[old]
        return robust_throughput(samples, durations)
