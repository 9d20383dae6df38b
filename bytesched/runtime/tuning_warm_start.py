"""Tuning's first points from the job's own step: the start-up plan's measurements, handed to the
Bayesian search instead of a choice.

With ``BYTESCHED_TUNING=1`` the tuner's first trial runs the configured sizes. Meanwhile the job
measures what the start-up plan measures (step 1 through the Core, a 4-byte and a large
operation of the backend at the boundary of step 2; :mod:`.start_observer`), and rank 0 simulates
that step over the tuner's factor-2 grid on a background thread
(:func:`bytesched.tuning.predicted_points.predict_points`). The best predicted points are the next ones
tried, before the search's own guesses: the plan refined by measurement. Nothing switches sizes
here, so every rank keeps following the tuning session.

``BYTESCHED_TUNING_PROFILE`` and ``BYTESCHED_TUNING_BANDWIDTH`` (a shipped profile and a stated
bandwidth) take precedence; a job of one rank, or one that only loads a previous job's best
(``BYTESCHED_TUNING_LOAD`` alone), does not measure. Explicit sizes do not switch it off: under
tuning they are only the opening trial's. A measurement that fails costs the warm start (a
warning), never the job.
"""

from __future__ import annotations

import logging
from typing import Callable, Sequence

from bytesched.core import Config
from bytesched.tuning.session import predicted_in_background
from bytesched.tuning.space import Point, SearchSpace
from bytesched.tuning.predicted_points import predict_points

from .start_observer import ObservedJob, StartObserver

log = logging.getLogger("bytesched")


def wants_warm_start(config: Config, world_size: int) -> bool:
    """Should this tuned job measure its own step for the tuner's first points (module doc)?"""
    return config.tuning and world_size > 1 and not (config.tuning_profile or config.tuning_bandwidth)


class TuningWarmStart(StartObserver):
    """Drive :meth:`on_step` on every rank as a :class:`~.plan.StartupPlan` is driven (it never
    returns sizes); give the tuning session :meth:`predictions` (see the module doc)."""

    outcome = None
    """No plan is applied (what a :class:`~.startup.Startup` reads of a finished plan)."""
    tries_sizes = False
    stay_out_fusion = None

    _measured = False
    _job: ObservedJob | None = None

    @property
    def done(self) -> bool:
        return self._measured

    def _after_observing(self, step: int, start: float, end: float) -> None:
        network, failure = self._time_backend()  # every rank: a collective
        self._measured = True
        if self._ranks.rank != 0:
            return None
        if network is None:
            log.warning("bytesched tuning: no warm start from the observed step: %s", failure)
            return None
        try:
            self._job = self._observed_job(network, start, end)
        except Exception as exc:  # nothing observed, or the simulator refused the measurements
            log.warning("bytesched tuning: no warm start from the observed step: %s", exc)
            return None
        log.info("bytesched tuning: warm start %s", self._job.describe(self.operation_name))
        return None

    def predictions(self, space: SearchSpace, policy: str) -> Callable[[], Sequence[Point] | None]:
        """Rank 0: the tuner's poll for the points predicted best from the observed step (None
        until they are ready; an empty list where there is no measurement)."""
        started: Callable[[], Sequence[Point] | None] | None = None

        def poll() -> Sequence[Point] | None:
            nonlocal started
            if started is None:
                if not self._measured:
                    return None
                job = self._job
                if job is None:
                    return ()
                started = predicted_in_background(lambda: predict_points(job.profile, job.cluster, space,
                                                                         policy=policy))
            return started()
        return poll
