"""The search algorithms the study compares with Bayesian optimisation (paper §6.3, "Search cost").

All walk the same lattice as :class:`~bytesched.tuning.search.BayesianSearch` and share its
interface: ``ask()`` the next point, ``tell(point, throughput)`` what it measured.

- :class:`RandomSearch`: lattice points in random order, none twice.
- :class:`GridSearch`: the factor-2 grid (every second lattice point), row by row, from a random
  first cell (the grid search of the paper "splits each dimension by interval and tests grid
  points one by one"; the random start is what makes its cost vary between seeds).
- :class:`MomentumSearch`: gradient ascent with momentum on the log-scaled lattice, gradients by
  forward differences (one extra trial per dimension and step), restarted from a random point when stuck
  (the paper: "we randomly choose an initial point and restart the algorithm in case that it is
  stuck in a local optimum").
"""

from __future__ import annotations

from typing import Generator

import numpy as np

from bytesched.tuning.search import BayesianSearch
from bytesched.tuning.space import Point, SearchSpace


class Exhausted(Exception):
    """The search has no point left to try."""


class RandomSearch:
    """Every lattice point once, in random order."""

    def __init__(self, space: SearchSpace, rng: np.random.Generator) -> None:
        points = list(space.points())
        self._order = [points[i] for i in rng.permutation(len(points))]

    def ask(self) -> Point:
        if not self._order:
            raise Exhausted("random search tried every lattice point")
        return self._order.pop(0)

    def tell(self, point: Point, throughput: float) -> None:
        """Random search learns nothing."""


class GridSearch:
    """The factor-2 grid, row by row, starting at a random cell and wrapping around."""

    def __init__(self, space: SearchSpace, rng: np.random.Generator, stride: int = 2) -> None:
        grid = list(space.points(stride))
        start = int(rng.integers(len(grid)))
        self._order = grid[start:] + grid[:start]

    def ask(self) -> Point:
        if not self._order:
            raise Exhausted("grid search tried every grid point")
        return self._order.pop(0)

    def tell(self, point: Point, throughput: float) -> None:
        """Grid search learns nothing."""


class MomentumSearch:
    """Stochastic gradient ascent with momentum on the lattice (coordinates = lattice indices).

    Each step measures the current point and its upper neighbour in each dimension (the lower
    one at the upper bound), takes the relative differences as the gradient of throughput, and
    moves by ``velocity = momentum * velocity + rate * gradient`` (in lattice steps per unit of
    relative gain). A point is measured once; re-visits reuse the measurement. When the walk has
    moved only to points it already stood on for ``patience`` steps (stuck, or circling), it
    restarts from a random point.
    """

    def __init__(self, space: SearchSpace, rng: np.random.Generator, *, rate: float, momentum: float,
                 patience: int = 2) -> None:
        self.space = space
        self.rate = rate
        self.momentum = momentum
        self.patience = patience
        self._rng = rng
        self._known: dict[Point, float] = {}
        self._walk = self._steps()
        self._next: Point = next(self._walk)

    def ask(self) -> Point:
        return self._next

    def tell(self, point: Point, throughput: float) -> None:
        self._known[point] = throughput
        try:
            self._next = self._walk.send(throughput)
        except StopIteration:
            raise Exhausted("momentum search measured every lattice point") from None

    def _measure(self, point: Point) -> Generator[Point, float, float]:
        """Yield ``point`` to be measured unless it already was; its throughput."""
        if point not in self._known:
            yield point
        return self._known[point]

    def _steps(self) -> Generator[Point, float, None]:
        upper = np.array(self.space.shape) - 1
        while True:  # one restart per iteration
            if len(self._known) == int(np.prod(self.space.shape)):
                return  # every lattice point was measured
            x = self._rng.uniform(0, upper)
            velocity = np.zeros(len(upper))
            visited: set[Point] = set()
            still = 0
            while still < self.patience:
                here = self._round(x, upper)
                visited.add(here)
                value = yield from self._measure(here)
                gradient = np.zeros(len(upper))
                for dim in range(len(upper)):
                    step = 1 if here[dim] < upper[dim] else -1
                    there = list(here)
                    there[dim] += step
                    other = yield from self._measure(tuple(there))
                    gradient[dim] = step * (other - value) / value
                velocity = self.momentum * velocity + self.rate * gradient
                x = np.clip(x + velocity, 0, upper)
                still = still + 1 if self._round(x, upper) in visited else 0  # stuck, or circling

    @staticmethod
    def _round(x: np.ndarray, upper: np.ndarray) -> Point:
        return tuple(int(v) for v in np.clip(np.rint(x), 0, upper).astype(int))


class BOSearch:
    """:class:`BayesianSearch` behind the baselines' interface (its ``ask`` also says why)."""

    def __init__(self, search: BayesianSearch) -> None:
        self.search = search

    def ask(self) -> Point:
        return self.search.ask()[0]

    def tell(self, point: Point, throughput: float) -> None:
        self.search.tell(point, throughput)
