"""The first steps of a job, measured: its step as the Core saw it and its backend's cost, on the
simulator's terms. What the start-up plan chooses sizes from, and what tuning's first points are
predicted from.

Every rank drives a :class:`StartObserver` at every step boundary, with the same step numbers::

    step 0                  step 1 (observed)             step 2
    |----------------------|------------------------------|-->
                            ^ drain, then the Core         ^ drain; every rank times a 4-byte and
                              records each gradient's        a large operation of the backend;
                              size and ready time            rank 0 turns both into a profile and
                                                             a cluster for the simulator

What happens with the measurements is the subclass's: :class:`~.plan.StartupPlan` simulates
candidate sizes and broadcasts a choice, :class:`~.tuning_warm_start.TuningWarmStart` hands the tuner
the best predicted points. Timing the backend is a collective that every rank calls at the same
boundary; a backend error fails it on every rank alike, and the subclass goes on without it.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Callable, TypeVar

from bytesched.core import Core, SchedulingParams
from bytesched.sim.profile import ModelProfile

from .calibration import InconsistentCalibration, NetworkCost, large_bytes_for, measure_network
from .lifecycle import Ranks
from .observed import StepRecorder, measured_profile

log = logging.getLogger("bytesched")

OBSERVED_STEP = 1
"""The step whose gradients are observed: the first one after start-up's one-off costs."""
CALIBRATION_ATTEMPTS = 3
"""How often the backend is timed before the plan gives up on figures rank 0 finds inconsistent."""
IDLE_TIMEOUT_S = 10.0
"""How long the observer waits, after its drain, for the Core to have handled every finish of the
observed step before it stops observing (past that it works from what it saw)."""

Operation = Callable[[int], Callable[[], None]]
"""``operation(nbytes)``: a blocking call of the library's per-tensor operation (an all-reduce,
or a parameter server's push+pull) on ``nbytes``, placed where the gradients live (a GPU's
memory), which every rank calls together."""


@dataclass(frozen=True)
class ObservedJob:
    """The observed step on the measured network, as the simulator takes it."""

    gradients: int
    profile: ModelProfile
    cluster: Any  # bytesched.sim.Cluster (the simulator is imported only when a job is built)
    network: NetworkCost

    def describe(self, operation_name: str) -> str:
        """What was measured, for a log line."""
        return (f"measured {self.gradients} gradients ({self.profile.nbytes / 1e6:.1f} MB, compute "
                f"{self.profile.compute_time * 1e3:.0f} ms) and the {operation_name} ({self.network.describe()})")


class StartObserver:
    """Observes step :data:`OBSERVED_STEP` and times the backend at the next boundary (module doc).

    Args:
        core: the Core whose finished sub-tasks reveal the observed step.
        ranks: the backend's ranks and collectives.
        operation: the backend's per-tensor operation, to time (:data:`Operation`).
        arch: ``allreduce`` or ``ps`` (the simulator's architecture for this job).
        model_bytes: the gradient bytes of the model, the same on every rank (sizes the
            calibration's large operation).
        drain: blocks until every communication and update already released has landed.
        servers, bigarray_bound: a parameter-server job's servers and MXNet's big-array bound
            (elements): where the timed float32 operation and the model's keys are placed.
        fuses_submitted: the all-reduce backend fuses what is submitted together (Horovod's
            cycle); False (torch.distributed): every task and partition is a collective of its
            own, and the simulated cluster fuses nothing either, or it would credit sizes with
            Horovod's fusion (docs/experiments/torch-distributed.md, "The plan's cluster").
    """

    def __init__(self, core: Core, ranks: Ranks, operation: Operation, *, arch: str, model_bytes: int,
                 drain: Callable[[], object], servers: int | None = None, bigarray_bound: int | None = None,
                 fuses_submitted: bool = True) -> None:
        self._core = core
        self._ranks = ranks
        self._operation = operation
        self._arch = arch
        self.operation_name = "push+pull" if arch == "ps" else "all-reduce"
        self._ps_options: dict[str, Any] = \
            {} if servers is None else {"servers": servers, "bigarray_bound": bigarray_bound}
        self._large_bytes = large_bytes_for(model_bytes)
        self._model_bytes = model_bytes
        self._drain = drain
        self._fuses_submitted = fuses_submitted
        self._recorder = StepRecorder()
        self._observed_from: float | None = None

    @property
    def ranks(self) -> Ranks:
        """The ranks the outcome is broadcast to (and a trial of a plan's sizes decided over)."""
        return self._ranks

    @property
    def done(self) -> bool:
        """The measurements were used: on_step does nothing any more."""
        raise NotImplementedError

    def on_step(self, step: int) -> SchedulingParams | None:
        """Step ``step`` is about to begin; returns the sizes to switch to before it, or None."""
        if self.done:
            return None
        if step < OBSERVED_STEP:
            return self._before_observing()
        if step == OBSERVED_STEP:
            self._drain()  # the observed step's forward pass waits for nothing of the step before
            self._core.observe(self._recorder)
            self._observed_from = time.monotonic()
            return None
        if self._observed_from is None:
            raise RuntimeError(f"{type(self).__name__} was first told of step {step}; every rank must call "
                               f"on_step from step 0 on")
        self._drain()
        if not self._core.wait_idle(IDLE_TIMEOUT_S):
            log.debug("bytesched: the Core still had sub-tasks in flight after %g s", IDLE_TIMEOUT_S)
        self._core.observe(None)
        # Every task of the observed step was ready once the drain returned (the Core may take
        # its ready events after step() was called), and none of the next step's can be yet.
        return self._after_observing(step, self._observed_from, time.monotonic())

    def _before_observing(self) -> SchedulingParams | None:
        """The sizes for the steps before the observed one (None: as they are)."""
        return None

    def _after_observing(self, step: int, start: float, end: float) -> SchedulingParams | None:
        """At the boundary of ``step``, the observed step having run from ``start`` to ``end``
        (monotonic seconds): use the measurements; the sizes to switch to, or None."""
        raise NotImplementedError

    def _time_backend(self) -> tuple[NetworkCost | None, str]:
        """Every rank: the backend's fixed cost and bandwidth (rank 0's are the ones planned with;
        None on a follower whose own were inconsistent), or None and why none could be had.

        Figures that contradict each other on rank 0 are measured again, up to
        :data:`CALIBRATION_ATTEMPTS` times: every rank follows rank 0's word, broadcast after each
        attempt, so all run the same collectives."""
        inconsistent = ""
        for _ in range(CALIBRATION_ATTEMPTS):
            network: NetworkCost | None = None
            try:
                network = measure_network(self._operation, self._large_bytes)
            except InconsistentCalibration as exc:  # every operation ran: the ranks are still in step
                inconsistent = str(exc)
            except Exception as exc:  # a backend error: every rank failed the same collective
                return None, f"timing the backend's {self.operation_name} failed: {exc}"
            consistent = self._ranks.broadcast_int(int(network is not None or self._ranks.rank != 0))
            if consistent:
                return network, ""
        return None, f"{inconsistent} in {CALIBRATION_ATTEMPTS} attempts"

    def _observed_job(self, network: NetworkCost, start: float, end: float) -> ObservedJob:
        """Rank 0: the observed step and the network as the simulator's profile and cluster
        (raises if nothing was observed or the simulator refuses the measurements)."""
        from bytesched.sim import make_cluster

        tasks = self._recorder.step(start, end)
        profile = measured_profile(tasks, start)
        striped = not self._ps_options or self._large_bytes // 4 >= self._ps_options["bigarray_bound"]
        options: dict[str, Any] = network.simulator_options(self._arch, self._ranks.size,
                                                            self._ps_options.get("servers"), striped)
        if not self._fuses_submitted:
            options["fusion_threshold"] = 0
        cluster = make_cluster(arch=self._arch, workers=self._ranks.size, bucket_bytes=0, **options, **self._ps_options)
        return ObservedJob(len(tasks), profile, cluster, network)


Observer = TypeVar("Observer", bound=StartObserver)
"""A kind of :class:`StartObserver`, as a plugin builds either with the same arguments."""
