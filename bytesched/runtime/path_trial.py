"""Which way a job stays out of the way, decided by timing both: the Core's path or the framework's.

A start-up plan that stays out (no partitioning, no credit limit) leaves two paths with the same
arithmetic: bytesched's Core, which still crosses the global barrier (the next forward pass
starts on the layers whose updates landed), or the framework's own all-reduce (passing through),
which costs no bytesched work per gradient. The simulator cannot tell which is faster: it has no
model of that work, and with ``fifo`` it predicts no gain from crossing (the first layer's
gradient is ready last and sent last), while a backend that runs two collectives at once (Gloo's
two threads) lets small late buckets finish beside a large one. Neither path won on every model
(docs/experiments/gpu.md). So where the rule is not known, the job
measures: :data:`TRIAL_STEPS` steps on the Core, then as many passing through, the first of
each left out (it waits for the switch). Every rank contributes its median step; the slowest
rank's counts, since the job runs at its pace. The Core is kept only when it was faster by more
than :data:`CORE_MARGIN`; otherwise the job passes through, the path with nothing of
bytesched's on it.

This module holds the counting and the decision; the plugin switches paths at the step
boundaries it is told and gathers the ranks' medians over its backend.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Callable, Sequence

TRIAL_STEPS = 6
"""Steps each path runs during the trial, the first of which is not timed."""
CORE_MARGIN = 0.02
"""How much faster than passing through the Core must have run to be kept: within it, the paths
tie, and the one without bytesched's work per gradient wins."""


@dataclass(frozen=True)
class TrialOutcome:
    """What the trial measured (ms per step, the slowest rank's median) and chose."""

    core_ms: float
    own_ms: float
    passes_through: bool
    core_path: str = "the Core"
    """What ran on the Core's side: the Core staying out, or a plan's sizes."""
    reason: str = ""
    """Why the job passes through whatever the numbers say (empty: the numbers decided)."""

    @property
    def summary(self) -> str:
        kept = "passing through" if self.passes_through else f"keeping {self.core_path}"
        if self.reason:
            kept += f" ({self.reason})"
        return (f"{self.core_ms:.1f} ms per step on {self.core_path}, {self.own_ms:.1f} passing through: "
                f"{kept}")


class PathTrial:
    """Counts the step boundaries of a trial that begins on the Core.

    :meth:`boundary` is called at every step boundary from the one where the trial begins; it
    says when to pass through (the Core's steps are over) and when to decide (the framework's
    are). Every rank calls it at the same boundaries, so every rank switches at the same step.
    """

    def __init__(self, steps: int = TRIAL_STEPS, margin: float | None = None, core_path: str = "the Core") -> None:
        if steps < 2:
            raise ValueError(f"a path trial needs at least 2 steps per path (one untimed), got {steps}")
        self._steps = steps
        self._margin = CORE_MARGIN if margin is None else margin
        self.core_path = core_path
        """What runs on the Core's side, as the outcome names it."""
        self._marks: list[float] = []

    def boundary(self, now: float) -> str | None:
        """A step boundary at ``now`` (monotonic seconds): ``"pass_through"`` when the Core's
        steps are over, ``"decide"`` when the framework's are, else None."""
        self._marks.append(now)
        done = len(self._marks) - 1  # steps completed since the trial began
        if done == self._steps:
            return "pass_through"
        if done == 2 * self._steps:
            return "decide"
        return None

    def medians_ms(self) -> tuple[float, float]:
        """This rank's median step on the Core and passing through, each path's first step left
        out."""
        steps = [(b - a) * 1e3 for a, b in zip(self._marks, self._marks[1:])]
        core, own = steps[:self._steps], steps[self._steps:2 * self._steps]
        if len(own) < self._steps:
            raise RuntimeError(f"the path trial is not over: {len(steps)} of {2 * self._steps} steps timed")
        return statistics.median(core[1:]), statistics.median(own[1:])

    def decide(self, gather: Callable[[tuple[float, float]], Sequence[Sequence[float]]]) -> TrialOutcome:
        """The outcome from every rank's medians; ``gather`` is the backend's all-gather of this
        rank's pair (a collective: every rank decides alike from the same numbers)."""
        ranks = gather(self.medians_ms())
        core_ms = max(pair[0] for pair in ranks)
        own_ms = max(pair[1] for pair in ranks)
        return TrialOutcome(core_ms, own_ms, not core_ms < own_ms * (1 - self._margin), self.core_path)
