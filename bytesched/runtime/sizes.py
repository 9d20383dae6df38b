"""What switches a Core's partition and credit sizes at step boundaries: the start-up plan (and,
after sizes, its trial against staying out) or the tuning session (never both:
:func:`~.plan.wants_plan` leaves tuned jobs to the tuner, whose first points a
:class:`~.tuning_warm_start.TuningWarmStart` may measure in the plan's place, switching nothing).

A plugin makes the ones its job wants, calls :meth:`SizeSwitches.on_step` at every step boundary
while :attr:`~SizeSwitches.active`, and applies the sizes it returns (staying out, where
:attr:`~SizeSwitches.plan` passes through, means passing through); once all are over, the
boundary costs the plugin one attribute test.
"""

from __future__ import annotations

from typing import Callable, Protocol

from bytesched.core import SchedulingParams
from bytesched.sim.plan import STAY_OUT
from bytesched.tuning import TuningSession

from .path_trial import TrialOutcome
from .startup_plan import PlanOutcome, StartupPlan
from .plan_trial import PlanTrial
from .tuning_warm_start import TuningWarmStart

SETTLE_LIMIT = 100
"""Steps after which :func:`step_until_settled` gives up: a plan and its trial take 14, a plan
that stays out and a path trial as many."""


class Settles(Protocol):
    """A plugin object whose sizes or path a plan, a trial or tuning may still switch."""

    @property
    def settled(self) -> bool:
        """Nothing will switch them any more (every rank settles at the same step)."""


def step_until_settled(plugin: Settles, step: Callable[[], None], limit: int = SETTLE_LIMIT) -> None:
    """Run ``step`` (one training iteration) until no plan, trial or tuning will switch
    ``plugin``'s path or sizes any more, e.g. before timing it. Every rank settles at the same
    step, so ranks that call this together stay in step."""
    for _ in range(limit):
        if plugin.settled:
            return
        step()
    raise RuntimeError(f"bytesched had not settled its path after {limit} more steps")


class SizeSwitches:
    """The start-up plan and tuning session of one Core, and what they settled on."""

    def __init__(self, planning: StartupPlan | TuningWarmStart | None = None,
                 tuning: TuningSession | None = None) -> None:
        self.planning = planning
        self.tuning = tuning
        self.plan: PlanOutcome | None = None
        """The sizes the start-up plan chose and every rank applied, once it did; while its trial
        runs, what the trial applied last."""
        self.trial: PlanTrial | None = None
        """The sized plan's trial against staying out, while it runs (:mod:`.plan_trial`)."""
        self.trial_outcome: TrialOutcome | None = None
        """What that trial measured and kept, once it decided."""
        self._tuned: SchedulingParams | None = None

    @property
    def tuned(self) -> SchedulingParams | None:
        """The sizes tuning kept (the same on every rank), once it kept them (rank 0 may still
        be checking the followers' confirmations)."""
        return self._tuned if self.tuning is None else self.tuning.final

    @property
    def active(self) -> bool:
        """A plan or a tuning session still has a step boundary to hear of."""
        return self.planning is not None or self.trial is not None or self.tuning is not None

    @property
    def times_steps(self) -> bool:
        """A tuning session or a plan trial times the coming steps: a plugin whose training thread
        runs ahead of its communication (MXNet's) lets each step finish before its boundary."""
        return self.tuning is not None or self.trial is not None

    def end_trial(self) -> None:
        """The job set sizes itself: the plan's trial, if it still runs, switches nothing more
        (its outcome stays None)."""
        self.trial = None

    def on_step(self, step: int, samples: float = 1.0, now: float | None = None) -> SchedulingParams | None:
        """Step ``step`` is about to begin: the sizes to switch to before it, or None."""
        params = None
        if self.trial is not None:
            switch = self.trial.on_step(step, now)
            if switch is not None:
                self.plan, params = switch, switch.params
            if self.trial.done:
                self.trial_outcome, self.trial = self.trial.outcome, None
        if self.planning is not None:
            params = self.planning.on_step(step)
            if self.planning.done:
                planning, self.planning = self.planning, None
                plan = self.plan = planning.outcome
                if isinstance(planning, StartupPlan) and planning.tries_sizes and plan is not None \
                        and plan.params != STAY_OUT:
                    self.trial = PlanTrial(plan, planning.ranks, now, planning.stay_out_fusion)
        if self.tuning is not None:
            params = self.tuning.on_step(step, samples, now)
            if self.tuning.done:  # the session logged the kept sizes
                self._tuned, self.tuning = self.tuning.final, None
        return params
