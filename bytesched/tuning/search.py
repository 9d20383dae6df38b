"""Bayesian optimisation of (partition, credit), and the batching threshold where the space has
it: scikit-optimize's Gaussian process and Expected Improvement over the lattice of
:mod:`bytesched.tuning.space` (paper §4.3).

The objective handed to the optimiser is ``-log(throughput)``: scikit-optimize minimises, and on
a log scale a 10% gain means the same at 100 and at 10,000 samples/s, so the exploration
parameter ``xi`` reads as "look for about that fraction more" whatever the model's speed. The
first trials are the points the caller suggests (the configured sizes, a previous job's best, the
simulator's predictions), topped up from a Latin hypercube (spread over every knob, which found
the optimum in 30% fewer trials than uniformly random first points in ``python -m benchmarks
tuning``) until :data:`MIN_INITIAL` are known; then each trial is the untried lattice point of
largest Expected Improvement over the best posterior mean of the points measured. The lattice
holds 169 points (1,859 with the batching axis), so EI is computed at every one of them:
scikit-optimize's own proposal, the best of 2000 random draws, may be a point already measured,
which it replaces by a random one (in the study, about one trial in three on the Transformer's
parameter-server landscape).

Noise: the process fits a white-noise term, so the best point is the measured point with the
best *posterior mean*, not the luckiest single measurement, and the search stops when the largest
Expected Improvement (without ``xi``) left anywhere on the lattice has stayed below ``min_gain``
for :data:`STOP_PATIENCE` trials, once :data:`MIN_TRIALS` were measured.

The linear algebra runs on one BLAS thread: the matrices are tiny, and OpenBLAS's default of one
spinning thread per core made each fit several times slower (and would steal the cores a
training step runs on).
"""

from __future__ import annotations

import math
import warnings
from typing import Any, Sequence

import numpy as np
from skopt import Optimizer
from skopt.acquisition import gaussian_ei
from skopt.space import Integer
from skopt.utils import cook_estimator
from threadpoolctl import threadpool_limits

from .space import Point, SearchSpace

MIN_INITIAL = 3
"""Points measured before the Gaussian process proposes (a Latin hypercube fills up the suggested)."""
MIN_GAIN = 0.02
"""Stop when no untried point is expected to be more than about 2% faster than the best..."""
STOP_PATIENCE = 2
"""...after each of this many trials in a row (one refit of the process can be overconfident)..."""
MIN_TRIALS_PER_KNOB = 4
"""...but not before this many trials per searched knob (8 for partition and credit, 12 with the
batching threshold): with fewer points the process's length scales are guesses. On a landscape
that looks flat from three points it stopped 5-8% short of the optimum with 2 knobs. With 3
knobs and 8 trials, 3 of 8 seeds kept a point 32-44% short on the plateau landscape of
``test_search_finds_the_batching_plateau_of_a_three_dimensional_landscape``; with 12, none was
more than 3% short."""
MIN_TRIALS = 2 * MIN_TRIALS_PER_KNOB
"""The earliest stop on the (partition, credit) lattice."""
XI = 0.03
"""Expected Improvement's exploration margin, in log-throughput units (3 % more). The paper's 0.1
(its §4.3) sent the search along the lattice's edges, where the process is least certain, before
the interior where the parameter servers' optima lie: on the study's Transformer PS landscape BO
then needed 12.5 trials on average, 7.6 with 0.03 (docs/tuning.md)."""
OPTIMISER_DRAWS = 1
"""Points scikit-optimize draws for its own acquisition after each fit: one, since
:meth:`BayesianSearch.ask` computes EI on the whole lattice instead."""


class BayesianSearch:
    """Ask for the next lattice point, tell its measured throughput, repeat until :meth:`should_stop`.

    Args:
        space: the lattice to search.
        seed: seeds the initial Latin hypercube and the acquisition sampling.
        xi: Expected Improvement's exploration margin, in log-throughput units.
        suggested: points to try first, in order (duplicates are tried once).
        min_gain, min_trials: the stop rule's threshold and earliest trial (see :meth:`should_stop`;
            by default :data:`MIN_TRIALS_PER_KNOB` per axis of ``space``).
    """

    def __init__(self, space: SearchSpace, *, seed: int = 0, xi: float = XI,
                 suggested: Sequence[Point] = (), min_gain: float = MIN_GAIN, min_trials: int | None = None) -> None:
        if not (xi >= 0 and math.isfinite(xi)):
            raise ValueError(f"xi={xi!r} must be a finite number >= 0")
        self.space = space
        self.xi = xi
        self.min_gain = min_gain
        self.min_trials = MIN_TRIALS_PER_KNOB * len(space.axes) if min_trials is None else min_trials
        dims = [Integer(0, axis.size - 1, name=axis.name) for axis in space.axes]
        # One fit of the kernel's hyper-parameters per trial (no restarts of the fit from random
        # starting points): that keeps a decision near a tenth of a second, and it is the
        # setting the study (`python -m benchmarks tuning`) measured.
        model = cook_estimator("GP", space=dims, random_state=seed, n_restarts_optimizer=0)
        self._optimizer = Optimizer(dims, base_estimator=model, acq_func="EI", acq_optimizer="sampling",
                                    acq_func_kwargs={"xi": xi},
                                    acq_optimizer_kwargs={"n_points": OPTIMISER_DRAWS},
                                    n_initial_points=MIN_INITIAL, initial_point_generator="lhs",
                                    random_state=seed)
        self._queue: list[tuple[Point, str]] = []
        self.measured: list[tuple[Point, float]] = []
        self.gains: list[float] = []
        """:meth:`expected_gain` after each trial."""
        for point in suggested:
            self.suggest(point, "suggested")

    # -- the loop -----------------------------------------------------------------------------
    def suggest(self, point: Point, source: str) -> None:
        """Try ``point`` before anything the optimiser proposes (``source`` names why, for the log)."""
        point = self._check(point)
        if all(point != p for p, _ in self._queue) and all(point != p for p, _ in self.measured):
            self._queue.append((point, source))

    def ask(self) -> tuple[Point, str]:
        """The next point to measure and where it came from (a suggestion, ``initial`` for the
        Latin hypercube, or ``bo``)."""
        while self._queue:
            point, source = self._queue.pop(0)
            if all(point != p for p, _ in self.measured):
                return point, source
        model = self._model()
        if model is None:  # the Latin hypercube's next point
            with warnings.catch_warnings(), threadpool_limits(limits=1):
                # a point the caller suggested may be drawn again: the optimiser then substitutes a
                # random one and warns, a useful trial all the same
                warnings.simplefilter("ignore", UserWarning)
                x = self._optimizer.ask()
            return tuple(int(v) for v in x), "initial"
        untried = self._untried()
        if not untried:  # every point was measured: the best again
            return self.best()[0], "bo"
        with threadpool_limits(limits=1):
            gain = gaussian_ei(self._optimizer.space.transform([list(p) for p in untried]), model,
                               y_opt=self._best_mean(model), xi=self.xi)
        return untried[int(np.argmax(gain))], "bo"

    def tell(self, point: Point, throughput: float) -> None:
        """``point`` ran at ``throughput`` samples/s (any positive unit, used consistently)."""
        point = self._check(point)
        if not (throughput > 0 and math.isfinite(throughput)):
            raise ValueError(f"throughput {throughput!r} at {self.space.describe(point)} must be positive and finite")
        self.measured.append((point, throughput))
        with threadpool_limits(limits=1):
            self._optimizer.tell(list(point), -math.log(throughput))
        self.gains.append(self.expected_gain())

    # -- what was learnt ----------------------------------------------------------------------
    @property
    def trials(self) -> int:
        return len(self.measured)

    def best(self) -> tuple[Point, float]:
        """The measured point believed fastest and its measured throughput.

        With a fitted model: the measured point of highest posterior mean (a single lucky
        measurement does not win); before that, the highest measurement.
        """
        if not self.measured:
            raise ValueError("nothing was measured yet")
        model = self._model()
        if model is None:
            return max(self.measured, key=lambda m: m[1])
        points = [p for p, _ in self.measured]
        with threadpool_limits(limits=1):
            mean = model.predict(self._optimizer.space.transform([list(p) for p in points]))
        best = int(np.argmin(mean))
        return self.measured[best]

    def expected_gain(self) -> float:
        """The largest Expected Improvement (with ``xi=0``) over the untried lattice points, in
        log-throughput units (0.01 is about 1% faster than the best); ``inf`` before a model."""
        model = self._model()
        if model is None:
            return math.inf
        untried = self._untried()
        if not untried:
            return 0.0
        with threadpool_limits(limits=1):
            return float(np.max(gaussian_ei(self._optimizer.space.transform([list(p) for p in untried]), model,
                                            y_opt=self._best_mean(model), xi=0.0)))

    def should_stop(self) -> bool:
        """Little is left to gain: at least ``min_trials`` were measured, and after each of the
        last :data:`STOP_PATIENCE` trials every untried point's expected improvement was below
        ``min_gain``."""
        recent = self.gains[-STOP_PATIENCE:]
        return self.trials >= self.min_trials and all(g < self.min_gain for g in recent)

    def _model(self) -> Any:
        models = self._optimizer.models
        return models[-1] if models else None

    def _untried(self) -> list[Point]:
        tried = {p for p, _ in self.measured}
        return [p for p in self.space.points() if p not in tried]

    def _best_mean(self, model: Any) -> float:
        """The best (least) posterior mean of ``-log(throughput)`` over the measured points."""
        with threadpool_limits(limits=1):
            return float(np.min(model.predict(self._optimizer.space.transform([list(p) for p, _ in self.measured]))))

    def _check(self, point: Point) -> Point:
        shape = self.space.shape
        checked = tuple(int(v) for v in point)
        if len(checked) != len(shape) or checked != tuple(point) or \
                not all(0 <= v < n for v, n in zip(checked, shape)):
            raise ValueError(f"{point!r} is not a point of the {self.space.arch} lattice "
                             f"({'x'.join(map(str, shape))})")
        return checked
