"""Rank 0's tuning decisions, with no transport: which sizes each trial runs, when, what it
measured, what comes next and when to stop.

The schedule is a sequence of trials of ``steps_per_trial`` steps each, starting at the first
step the tuner sees. Trial 0 runs the job's configured sizes rounded to the lattice, which every
rank computes for itself (no message: a rank 0 slow to start must not make followers time out);
rank 0 announces every later trial. Within trial ``t`` (steps ``[s_t, s_t + steps_per_trial)``)::

    s_t            s_t + warmup                 s_t+1 - lead      s_t+1
     |-- warm-up --|------- measured window -------|---- lead ----|
                                                   ^ decide trial t+1 and announce it

The decision is taken ``lead`` steps before the switch so that the announcement reaches the
followers before they get there (they wait for it if it does not). Everything here is a pure
function of the step calls, so tests drive it with made-up clocks.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Protocol, Sequence

from ..core.config import ConfigError, SchedulingParams
from .log import TuningLog
from .measure import StepTimer
from .protocol import Switch, TuningProtocolError
from .space import Point

if TYPE_CHECKING:  # scikit-optimize is imported only when tuning is switched on
    from .search import BayesianSearch

log = logging.getLogger("bytesched")

ANNOUNCE_LEAD = 3
"""Steps between rank 0's decision and the switch. At least 2, so that by the time rank 0 checks
the followers' confirmations (``lead`` steps after a switch) a synchronous job has certainly
carried every follower past the switch."""
MIN_MEASURED = 3
"""Fewest steps a trial's measured window may have."""


@dataclass(frozen=True)
class TrialPlan:
    """How long trials last and which of their steps are measured."""

    steps_per_trial: int
    warmup: int
    lead: int = ANNOUNCE_LEAD

    def __post_init__(self) -> None:
        if self.steps_per_trial < self.warmup + self.lead + MIN_MEASURED:
            raise ConfigError(
                f"BYTESCHED_TUNING_STEPS_PER_TRIAL={self.steps_per_trial} leaves no room to measure: it must be at "
                f"least BYTESCHED_TUNING_WARMUP_STEPS ({self.warmup}) + {self.lead} (announcement lead) + "
                f"{MIN_MEASURED} (measured steps) = {self.warmup + self.lead + MIN_MEASURED}")


class Decider(Protocol):
    """What rank 0's session asks at every step: is there a switch to announce now?"""

    def on_step(self, step: int, samples: float, now: float) -> Switch | None: ...


class FixedChoice:
    """No tuning, but every rank must use these sizes (a previous job's best, which only rank 0
    reads): announced at the first step, as the final choice from ``lead`` steps later on, when
    synchronous training has certainly carried every rank past its start."""

    def __init__(self, params: SchedulingParams, lead: int = ANNOUNCE_LEAD) -> None:
        self.params = params
        self.lead = lead
        self._announced = False

    def on_step(self, step: int, samples: float, now: float) -> Switch | None:
        if self._announced:
            return None
        self._announced = True
        return Switch.of(0, step + self.lead, self.params, None)


class Tuner:
    """Bayesian-optimisation tuning on rank 0 (the paper's §4.3 and §5, "Auto-tuning support").

    Args:
        search: proposes points and learns from their throughput.
        plan: trial length, warm-up and announcement lead.
        opening: trial 0's point, the configured sizes on the lattice (every rank applies it
            at its first step by itself; it is not announced).
        max_trials: the search stops after this many trials (or earlier, see
            :meth:`BayesianSearch.should_stop`); the best point is then kept.
        tuning_log: where every trial is written, if anywhere.
        predictions: polled at each decision; once it returns points (the simulator's warm
            start, computed in the background) they are tried next.
    """

    def __init__(self, search: "BayesianSearch", plan: TrialPlan, *, opening: Point, max_trials: int,
                 tuning_log: TuningLog | None = None,
                 predictions: Callable[[], Sequence[Point] | None] | None = None) -> None:
        if max_trials < 1:
            raise ConfigError(f"BYTESCHED_TUNING_MAX_TRIALS={max_trials} must be at least 1")
        self.search = search
        self.plan = plan
        self.max_trials = max_trials
        self.opening = opening
        self._log = tuning_log
        self._predictions = predictions
        self._timer = StepTimer()
        self._trial: Switch | None = None
        self._point: Point | None = None
        self._source = ""
        self._best_measured = 0.0
        self.final: Switch | None = None

    @property
    def finished(self) -> bool:
        """The final choice was announced."""
        return self.final is not None

    def on_step(self, step: int, samples: float, now: float) -> Switch | None:
        """Record the step that just ended; return a switch to announce, if one is due now."""
        if self.final is not None:
            return None
        self._timer.observe(step, samples, now)
        trial = self._trial
        if trial is None:
            self._start_trial(0, step, (self.opening, "configured"))
            return None
        assert trial.next_step is not None
        decide_at = trial.next_step - self.plan.lead
        if step < decide_at:
            return None
        if step >= trial.next_step:
            raise TuningProtocolError(f"rank 0 reached step {step} without a call at step {decide_at}, where it "
                                      f"had to announce the switch of step {trial.next_step}: call on_step every step")
        throughput = self._measure(trial, decide_at)
        self.search.tell(self._point, throughput)  # type: ignore[arg-type]  # set by _start_trial
        self._best_measured = max(self._best_measured, throughput)
        if self._log is not None:
            self._log.trial(trial.trial, trial.params, throughput, self._best_measured, self._source)
        log.info("bytesched tuning: trial %d (%s) ran at %.1f samples/s", trial.trial,
                 self.search.space.describe(self._point), throughput)  # type: ignore[arg-type]  # as above
        if self.search.trials >= self.max_trials or self.search.should_stop():
            return self._finish(trial.trial + 1, trial.next_step)
        self._take_predictions()
        return self._start_trial(trial.trial + 1, trial.next_step, self.search.ask())

    def _measure(self, trial: Switch, decide_at: int) -> float:
        try:
            return self._timer.throughput(trial.step + self.plan.warmup, decide_at)
        except ValueError as exc:
            raise TuningProtocolError(f"trial {trial.trial} (steps {trial.step}..{decide_at - 1}) measured "
                                      f"nothing: {exc}; call on_step at every step boundary") from None

    def _start_trial(self, index: int, step: int, choice: tuple[Point, str]) -> Switch:
        self._point, self._source = choice
        self._trial = Switch.of(index, step, self.search.space.params(self._point), step + self.plan.steps_per_trial)
        return self._trial

    def _finish(self, index: int, step: int) -> Switch:
        point, throughput = self.search.best()
        params = self.search.space.params(point)
        if self._log is not None:
            self._log.best(params, throughput)
            self._log.close()
        log.info("bytesched tuning: finished after %d trials; keeping %s (%.1f samples/s)",
                 self.search.trials, self.search.space.describe(point), throughput)
        self.final = Switch.of(index, step, params, None)
        return self.final

    def _take_predictions(self) -> None:
        if self._predictions is None:
            return
        points = self._predictions()
        if points is None:
            return
        self._predictions = None
        for point in points:
            self.search.suggest(point, "predicted")
