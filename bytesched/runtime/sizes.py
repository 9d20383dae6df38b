"""What switches a Core's partition and credit sizes at step boundaries: the start-up plan or the
tuning session (never both: :func:`~.plan.wants_plan` leaves tuned jobs to the tuner, whose first
points a :class:`~.warm_start.TuningWarmStart` may measure in the plan's place, switching nothing).

A plugin makes the ones its job wants, calls :meth:`SizeSwitches.on_step` at every step boundary
while :attr:`~SizeSwitches.active`, and applies the sizes it returns; once both are over, the
boundary costs the plugin one attribute test.
"""

from __future__ import annotations

from bytesched.core import SchedulingParams
from bytesched.tuning import TuningSession

from .plan import PlanOutcome, StartupPlan
from .warm_start import TuningWarmStart


class SizeSwitches:
    """The start-up plan and tuning session of one Core, and what they settled on."""

    def __init__(self, planning: StartupPlan | TuningWarmStart | None = None,
                 tuning: TuningSession | None = None) -> None:
        self.planning = planning
        self.tuning = tuning
        self.plan: PlanOutcome | None = None
        """The sizes the start-up plan chose and every rank applied, once it did."""
        self._tuned: SchedulingParams | None = None

    @property
    def tuned(self) -> SchedulingParams | None:
        """The sizes tuning kept (the same on every rank), once it kept them (rank 0 may still
        be checking the followers' confirmations)."""
        return self._tuned if self.tuning is None else self.tuning.final

    @property
    def active(self) -> bool:
        """A plan or a tuning session still has a step boundary to hear of."""
        return self.planning is not None or self.tuning is not None

    def on_step(self, step: int, samples: float = 1.0, now: float | None = None) -> SchedulingParams | None:
        """Step ``step`` is about to begin: the sizes to switch to before it, or None."""
        params = None
        if self.planning is not None:
            params = self.planning.on_step(step)
            if self.planning.done:
                self.plan, self.planning = self.planning.outcome, None
        if self.tuning is not None:
            params = self.tuning.on_step(step, samples, now)
            if self.tuning.done:  # the session logged the kept sizes
                self._tuned, self.tuning = self.tuning.final, None
        return params
