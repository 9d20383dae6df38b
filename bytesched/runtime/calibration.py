"""What one communication operation costs on the job's own network, measured, for the simulator.

The simulator needs two figures of a network: the fixed cost of every message and the bandwidth
it delivers. Nominal figures (a NIC's rate, the paper's 0.3 ms) can be off by an order of
magnitude once the library's negotiation, its round trips and Python are paid, so the start-up
plan times the backend's own per-tensor operation (an all-reduce) on 4 bytes, whose time is all
fixed cost, and on a large buffer, from which the delivered bandwidth follows. Every rank runs
the same sequence of operations (they are collectives); rank 0's figures are what it plans with.

Noise on a shared machine (other processes, the training job's own threads) only ever adds time,
and comes in bursts. So the two sizes are timed in interleaved rounds, a burst then inflates some
samples of both rather than all of one, and each figure is the fastest of its samples, the
operation's cost without interference. Where rank 0 still finds the figures inconsistent (the
small operation no faster than the large), every rank times them again
(:meth:`~bytesched.runtime.start_observer.StartObserver` decides that together).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Callable

from bytesched.sim.plan import rule_threshold

FIXED_BYTES = 4
"""The small operation's size: one float32, so its time is all fixed cost."""
ROUNDS = 3
"""Rounds of timing after one untimed call of each size (which pays connection set-up and
first-use costs)."""
FIXED_PER_ROUND = 5
"""Small operations per round, then one large: the small ones are cheap and the noisier."""
LARGE_BYTES_RANGE = (4_000_000, 16_000_000)
"""The large operation moves the model's gradient bytes, within these bounds: large enough that
bandwidth dominates its time (below that, Horovod's cycle can hide the bytes' cost, and the
fit is refused: docs/plan.md, "What it costs"), small enough that calibrating costs under a second
at 1 Gbit/s."""


class InconsistentCalibration(ValueError):
    """The small operation was timed no faster than the large one: no network follows from them."""


def median_seconds(operation: Callable[[], None], repeats: int) -> float:
    """Median wall-clock seconds of ``operation`` over ``repeats`` calls after an untimed one
    (which pays connection set-up and first-use costs)."""
    operation()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        operation()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def large_bytes_for(model_bytes: int) -> int:
    """The large operation's size for a model of ``model_bytes`` gradient bytes (a multiple of 4,
    the same on every rank since every rank passes the same model)."""
    low, high = LARGE_BYTES_RANGE
    return max(low, min(high, model_bytes)) // 4 * 4


@dataclass(frozen=True)
class NetworkCost:
    """The medians of one small and one large operation, and the simulator's network from them."""

    fixed_seconds: float
    """A 4-byte operation: the per-operation cost, independent of size."""
    large_seconds: float
    """An operation of ``large_bytes``."""
    large_bytes: int

    def __post_init__(self) -> None:
        if not (0 < self.fixed_seconds < self.large_seconds):
            raise InconsistentCalibration(
                f"calibration is inconsistent: a 4-byte operation took {self.fixed_seconds:.4g} s and "
                f"{self.large_bytes} bytes {self.large_seconds:.4g} s (expected 0 < small < large)")

    def simulator_options(self, arch: str, workers: int, servers: int | None = None,
                          striped: bool = True) -> dict[str, float]:
        """``overhead``, ``latency`` and ``bandwidth`` (bytes/s) with which the simulator's cost
        model reproduces both measurements.

        All-reduce (ring): ``overhead + 2(n-1) latency + 2(n-1)/n bytes / bandwidth``. A PS
        push+pull: two messages, each ``overhead + latency + busiest link's bytes / bandwidth``;
        a worker's link carries the key's bytes, the busiest server's link every worker's share of
        it: ``1/servers`` of it if MXNet ``striped`` the key over the servers, all of it if not
        (``servers`` None: as many servers as workers, striped). Latency is folded into the
        overhead (set to 0): one fixed cost was measured.
        """
        variable = self.large_seconds - self.fixed_seconds
        if arch == "allreduce":
            factor = 2 * (workers - 1) / workers if workers > 1 else 0.0
            return {"overhead": self.fixed_seconds, "latency": 0.0,
                    "bandwidth": factor * self.large_bytes / variable if factor else float("inf")}
        if arch == "ps":
            servers = workers if servers is None else servers
            busiest = max(1.0, workers / servers if striped else float(workers))
            return {"overhead": self.fixed_seconds / 2, "latency": 0.0,
                    "bandwidth": 2 * busiest * self.large_bytes / variable}
        raise ValueError(f"architecture {arch!r}: expected allreduce or ps")

    def batch_threshold(self) -> int:
        """The size below which pieces are worth batching, from the linear cost
        ``f(d) = a + b d`` through both measurements (Caramel's rule,
        :func:`~bytesched.sim.plan.rule_threshold`)."""
        return rule_threshold(self.fixed_seconds, (self.large_seconds - self.fixed_seconds) / self.large_bytes)

    def describe(self) -> str:
        """One phrase for a log line."""
        return (f"{FIXED_BYTES} B in {self.fixed_seconds * 1e3:.2f} ms, {self.large_bytes / 1e6:g} MB in "
                f"{self.large_seconds * 1e3:.1f} ms")


def measure_network(operation: Callable[[int], Callable[[], None]], large_bytes: int,
                    clock: Callable[[], float] = time.perf_counter) -> NetworkCost:
    """Time ``operation(FIXED_BYTES)`` and ``operation(large_bytes)`` in :data:`ROUNDS` interleaved
    rounds and keep each one's fastest (module doc); ``operation(n)`` returns a blocking call that
    communicates ``n`` bytes (every rank must run this together). Raises
    :class:`InconsistentCalibration` after the last operation if the figures contradict each other."""
    small, large = operation(FIXED_BYTES), operation(large_bytes)
    small()
    large()
    fixed, big = [], []
    for _ in range(ROUNDS):
        for _ in range(FIXED_PER_ROUND):
            fixed.append(_seconds(small, clock))
        big.append(_seconds(large, clock))
    return NetworkCost(min(fixed), min(big), large_bytes)


def _seconds(call: Callable[[], None], clock: Callable[[], float]) -> float:
    started = clock()
    call()
    return clock() - started
