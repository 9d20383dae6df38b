"""Start-up plans and plan trials replaced in a test rank, for the MXNet test scripts.

The real simulation and timing still run first where they can, so that a replaced case pays what
a real plan costs; only the decision is replaced, identically on every rank (rank 0's is the one
broadcast and applied everywhere).
"""

from __future__ import annotations

from typing import Callable

from bytesched.core import SchedulingParams
from bytesched.runtime.calibration import InconsistentCalibration, NetworkCost

FORCED = SchedulingParams(partition_bytes=1000, credit_bytes=2000)
"""The sizes a ``forced`` plan picks: partitions that split every weight matrix of the test models."""

PLANS = ("measured", "forced", "failed")
TRIALS = ("measured", "keep", "leave")


def timed_but_fixed(measure: Callable[..., NetworkCost]) -> Callable[..., NetworkCost]:
    """``measure`` (``measure_network``) run for its operations, so that a case pays what
    calibrating costs, with fixed, consistent figures returned: a case whose outcome is forced
    must not depend on how fast a loaded machine runs them (the calibration refuses figures that
    contradict each other, and the plan then stays out)."""
    def timed(operation: Callable[[int], Callable[[], None]], large_bytes: int) -> NetworkCost:
        try:
            measure(operation, large_bytes)
        except InconsistentCalibration:
            pass
        return NetworkCost(0.0005, 0.05, large_bytes)
    return timed


def replace_plan(case: str, operation: str) -> None:
    """Make the start-up plan pick :data:`FORCED` (``forced``) or fail to time the network's
    ``operation`` (``failed``, e.g. "push+pull"); ``measured`` leaves it alone."""
    import bytesched.runtime.startup_plan as plan_module
    import bytesched.runtime.start_observer as observer_module
    from bytesched.sim.plan import Plan

    if case == "forced":
        real = plan_module.make_plan

        def forced(*args: object, **options: object) -> Plan:
            simulated = real(*args, **options)  # type: ignore[arg-type]
            return Plan("bytescheduler", FORCED, simulated.search_iteration_time, simulated.stay_out_iteration_time,
                        simulated.search_iteration_time)
        plan_module.make_plan = forced  # type: ignore[assignment]
        observer_module.measure_network = timed_but_fixed(observer_module.measure_network)  # type: ignore[assignment]
    elif case == "failed":
        def failing(*args: object) -> None:
            raise RuntimeError(f"the {operation} failed (injected by the test)")
        observer_module.measure_network = failing  # type: ignore[assignment]


def replace_trial(case: str) -> None:
    """Make every rank's plan trial measure the sizes twice as fast (``keep``) or half as fast
    (``leave``) as staying out; rank 0's medians are the ones broadcast and decided on;
    ``measured`` leaves the trial alone."""
    from bytesched.runtime.path_trial import PathTrial

    if case in ("keep", "leave"):
        medians = (10.0, 20.0) if case == "keep" else (20.0, 10.0)
        PathTrial.medians_ms = lambda self: medians  # type: ignore[method-assign]
