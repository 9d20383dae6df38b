"""The start-up plan: the partition and credit sizes a job gets with no settings, chosen from its
own measured step by the simulator, and applied by every rank at the same step.

Fixed sizes cannot suit every job: 4 MB partitions under a 16 MB credit win on a slow network and
lose to doing nothing where messages are expensive and bandwidth is plentiful. So a plugin drives
a :class:`StartupPlan` at every step boundary, and the plan runs this course::

    step 0                  step 1 (observed)             step 2 on
    |-- stay out ----------|-- stay out, recorded -------|-- the plan's sizes -->
    ^ no partitions,        ^ drain, then the Core        ^ drain; time a 4-byte and a large
      no credit limit         records each gradient's       operation; rank 0 simulates
                              size and ready time           (:func:`bytesched.sim.plan.make_plan`)
                                                            and broadcasts; every rank applies

Where the plan chooses sizes, they are then tried against staying out before they are kept
(:mod:`.plan_trial`). The observing and timing are :class:`~.start_observer.StartObserver`'s; a tuned job gets the
same measurements as its search's first points instead (:mod:`.tuning_warm_start`). Until the plan is
made the job stays out of the way (every gradient sent whole the moment it is
ready, the cheapest path through bytesched), so planning never makes a step slower than the
baseline by more than two drains. The operation timed is the backend's per-tensor one: an
all-reduce, or a parameter server's push+pull. Rank 0's choice travels in the backend's own
broadcast, a collective every rank calls at the same step boundary (a parameter server's, over
the rank-0 channel: :mod:`.channel_ranks`), so every rank applies the same sizes before any
CommTask of the next step exists. Where the plan stays out, a plugin that offered a larger fusion
bound (PyTorch on a GPU and over torch.distributed: :func:`stay_out_fusion`) is told in the same
broadcast to fuse its gradients into larger tasks, where asked to weigh it only if the simulator
predicts the observed step no slower in them (:func:`bytesched.sim.plan.fusion_pays`). A
measurement or simulation that fails leaves the job where it is, staying out of the way, with a
warning naming the reason: never a hang (every operation is a collective that every rank calls,
bounded by the backend's own timeouts or the channel's) and never different results (sizes change
how gradients travel, not what they sum to). A broadcast over the channel that fails is the
exception: it raises, since some ranks may hold the value.

The plan runs when ``BYTESCHED_PLAN`` is on (the default) and the job sets neither
``BYTESCHED_PARTITION_BYTES`` nor ``BYTESCHED_CREDIT_BYTES``, runs the ``bytescheduler`` policy,
does not tune, and has more than one rank (:func:`wants_plan`).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass
from typing import Callable

from bytesched.core import Config, Core, SchedulingParams
from bytesched.core.channel import ChannelError
from bytesched.core.config import UNLIMITED, format_size
from bytesched.sim.plan import (PASS_THROUGH_MARGIN, STAY_OUT, STAY_OUT_MARGIN, Plan, batch_thresholds,
                                fusion_pays, make_plan)

from .calibration import NetworkCost
from .lifecycle import Ranks
from .start_observer import ObservedJob, Operation, StartObserver

log = logging.getLogger("bytesched")

RANK0_ORDER_MARGIN = 0.2
"""The predicted gain an untried sized plan needs where followers wait for rank 0's announced order
(torch.distributed), a fraction of staying out's iteration time (so 1.25x predicted): each
partition then also waits for a channel message, which the simulator does not model, and where
the gradients live on a GPU the observed ready times are when their kernels were queued, not
run. Every untried sized plan measured there lost to staying out (docs/plan.md, "boundary of
step 2")."""
RANK0_TRIED_MARGIN = 0.05
"""The predicted gain a sized plan needs where followers wait for rank 0's announced order and its
sizes are then tried against staying out (:mod:`.plan_trial`; so 1.05x predicted): the trial, not
the prediction, keeps the sizes only where they ran faster; sizes predicted under
:data:`RANK0_ORDER_MARGIN`'s bar ran faster than DDP once tried (docs/plan.md, "boundary of
step 2")."""
PS_MARGIN = 0.05
"""The predicted gain a sized plan needs on a parameter server (so 1.05x predicted). Workers
follow rank 0's announced order there too, but a push waits for every worker's copy at the
server anyway, so the announcement costs less than over torch.distributed (docs/plan.md,
"boundary of step 2")."""
UNLIMITED_CODE = 0
"""How an unlimited size travels in the integer broadcast."""
KEEP_FUSION_CODE = 0
"""How "keep the plugin's fusion bound" travels in the integer broadcast."""
STAYS_ON_PATH, PASSES_THROUGH, PASSES_THROUGH_UNMEASURED = range(3)
"""How "stay on bytesched's path", "pass through" and "pass through, nothing was measured" travel
in the integer broadcast (:attr:`PlanOutcome.passes_through`, :attr:`PlanOutcome.measured`)."""
STAY_OUT_MIN_TASKS = 4
"""A plan that stays out closes each task it fuses at this share of the model at the latest, so
that a small model still makes several tasks and communication starts before the backward pass
ends (DDP starts its first bucket at 1 MB for the same reason)."""



@dataclass(frozen=True)
class PlanOutcome:
    """What every rank applied, and why (the same on every rank)."""

    params: SchedulingParams
    step: int
    summary: str
    """The one line rank 0 logged (on other ranks: the sizes they received)."""
    fusion_bytes: float | None = None
    """The fusion bound the plugin's gradients are to be fused under from ``step`` on; None: as
    they are."""
    passes_through: bool = False
    """It stays out, and no size was predicted to gain even a little (or nothing could be
    predicted): a plugin whose framework waits at the barrier (PyTorch) hands its gradients to the
    framework's own path (:attr:`bytesched.sim.plan.Plan.passes_through`); elsewhere it stays on
    bytesched's path, which crosses the barrier. MXNet's engine lets each layer go on once its own
    parameters are written, so its plugins pass through wherever the plan stays out."""
    measured: bool = True
    """False: nothing could be measured or simulated (the plan stayed out with a warning naming
    why), so there is nothing to weigh a path trial against either: a plugin that would time its
    paths (:mod:`.path_trial`) passes through at once, as the job would run without bytesched."""

    def describe(self) -> str:
        """What was applied, in a few words ("1MB partitions, 2MB credit")."""
        fused = "" if self.fusion_bytes is None else f", {_fused(self.fusion_bytes)}"
        params = self.params
        if params.partition_bytes == UNLIMITED and params.credit_bytes == UNLIMITED:
            return "no partitioning, no credit limit" + fused + (", passing through" if self.passes_through else "")
        partition = format_size(params.partition_bytes)  # type: ignore[arg-type]  # a plan's sizes are set
        batched = f", batching under {format_size(params.batch_bytes)}" if params.batch_bytes else ""
        return f"{partition} partitions, {format_size(params.credit_bytes)} credit{batched}{fused}"


def wants_plan(config: Config, world_size: int) -> bool:
    """Should this job plan its sizes at start-up (see the module docstring)?"""
    return (config.plan and world_size > 1 and config.policy == "bytescheduler"
            and not (config.tuning or config.tuning_load))


class StartupPlan(StartObserver):
    """Call :meth:`on_step` at every step boundary on every rank, with the same step numbers, and
    apply what it returns before the step's first CommTask.

    Args:
        core, ranks, operation, arch, model_bytes, drain, servers, bigarray_bound,
            fuses_submitted: what the observation needs (:class:`~.start_observer.StartObserver`).
        stay_out_bound: the fusion bound a plan that stays out of the way gives the plugin
            (:func:`stay_out_fusion`: a plugin that fuses gradients into tasks and can re-fuse
            them at the plan's step); None: the plugin keeps its tasks.
        weighs_fusion: it raises the plugin's bound only where the simulator predicts the observed step
            no slower in the fused tasks (:func:`bytesched.sim.plan.fusion_pays`); else wherever
            the bound would fuse.
        pass_through_margin: the predicted gain of the best sized candidate below which a plan
            that stays out passes through (:attr:`bytesched.sim.plan.Plan.passes_through`).
        tries_sizes: sizes it chooses are timed against staying out and passing through before
            they are kept (:mod:`.plan_trial`, ``BYTESCHED_PLAN_TRIAL``); only for a plugin that
            can pass through at any step boundary.
        batches: the plugin's backend can start batches (batching while busy): every size is
            also weighed with batching under the calibration's threshold and under the model's
            bytes (:func:`bytesched.sim.plan.batch_thresholds`).
    """

    def __init__(self, core: Core, ranks: Ranks, operation: Operation, *, arch: str, model_bytes: int,
                 drain: Callable[[], None], servers: int | None = None,
                 bigarray_bound: int | None = None, stay_out_bound: int | None = None,
                 pass_through_margin: float = PASS_THROUGH_MARGIN, tries_sizes: bool = False,
                 weighs_fusion: bool = False, batches: bool = False, fuses_submitted: bool = True) -> None:
        super().__init__(core, ranks, operation, arch=arch, model_bytes=model_bytes, drain=drain,
                         servers=servers, bigarray_bound=bigarray_bound, fuses_submitted=fuses_submitted)
        self._batches = batches
        self._stay_out_bound = stay_out_bound
        self._pass_through_margin = pass_through_margin
        self._weighs_fusion = weighs_fusion
        self.tries_sizes = tries_sizes
        self.outcome: PlanOutcome | None = None
        self.stay_out_fusion: int | None = None
        """Once the plan is made, the fusion bound that goes with staying out (None: the plugin
        keeps its own), the same on every rank: the plan's own where it stays out, and a trial's
        steps staying out."""

    @property
    def done(self) -> bool:
        """The plan is applied: on_step does nothing any more."""
        return self.outcome is not None

    def _before_observing(self) -> SchedulingParams:
        return STAY_OUT

    def _after_observing(self, step: int, start: float, end: float) -> SchedulingParams:
        self.outcome = self._decide(step, start, end)
        return self.outcome.params

    def _decide(self, step: int, start: float, end: float) -> PlanOutcome:
        network, failure = self._time_backend()
        summary = ""
        chosen, through = STAY_OUT, STAYS_ON_PATH
        fusion = None
        if self._ranks.rank == 0:
            chosen, through, fusion, summary, level = self._plan(network, failure, start, end)
            log.log(level, "bytesched plan: %s", summary)
        try:
            partition = self._ranks.broadcast_int(_encode(chosen.partition_bytes))
            credit = self._ranks.broadcast_int(_encode(chosen.credit_bytes))
            batch = self._ranks.broadcast_int(int(chosen.batch_bytes))
            fused = self._ranks.broadcast_int(KEEP_FUSION_CODE if fusion is None else int(fusion))
            through = self._ranks.broadcast_int(through)
        except ChannelError:
            raise  # ranks that cannot hear each other cannot agree to stay out either: the job stops
        except Exception as exc:
            log.warning("bytesched plan: rank %d could not receive rank 0's plan (%s); staying out of the way",
                        self._ranks.rank, exc)
            return PlanOutcome(STAY_OUT, step, "staying out of the way: the plan's broadcast failed")
        params = SchedulingParams(partition_bytes=_decode(partition), credit_bytes=_decode(credit), batch_bytes=batch)
        self.stay_out_fusion = None if fused == KEEP_FUSION_CODE else fused
        outcome = PlanOutcome(params, step, summary, self.stay_out_fusion if params == STAY_OUT else None,
                              through != STAYS_ON_PATH, through != PASSES_THROUGH_UNMEASURED)
        if self._ranks.rank != 0:
            outcome = dataclasses.replace(outcome, summary=f"rank 0's plan: {outcome.describe()}")
        log.debug("bytesched plan (rank %d) from step %d: %s", self._ranks.rank, step, outcome.summary)
        return outcome

    def _plan(self, network: NetworkCost | None, failure: str, start: float,
              end: float) -> tuple[SchedulingParams, int, int | None, str, int]:
        """Rank 0: the sizes to broadcast, whether to pass through (one of :data:`STAYS_ON_PATH`,
        :data:`PASSES_THROUGH`, :data:`PASSES_THROUGH_UNMEASURED`), the fusion bound that goes with
        staying out, the line that says why and the level to log it at."""
        bound = self._stay_out_bound  # where the plan stays out: what the plugin fuses to, or None
        if network is None:
            return self._stay_out(failure, bound)
        try:
            job = self._observed_job(network, start, end)
            started = time.perf_counter()
            thresholds = batch_thresholds(network.batch_threshold(), job.profile) if self._batches else ()
            plan = make_plan(job.profile, job.cluster, self._sized_margin(), self._pass_through_margin,
                             batch_thresholds=thresholds)
            fusion, fusion_note = self._weigh_fusion(bound, job, plan)
            seconds = time.perf_counter() - started
        except Exception as exc:  # nothing observed, or the simulator refused the measurements
            return self._stay_out(f"no plan could be made: {exc}", bound)
        chosen = _params_of(plan)
        summary = (f"{job.describe(self.operation_name)}; chose {plan.describe()}, predicted "
                   f"{plan.predicted_speedup:.2f}x over staying out (planned in {seconds:.2f} s)")
        if plan.policy == "fifo":
            summary += (f"; the best sizes predicted {plan.sized_gain:.2f}x"
                        + ("; passing through" if plan.passes_through else ""))
        if chosen == STAY_OUT and fusion_note:
            summary += f"; {fusion_note}"
        return chosen, PASSES_THROUGH if plan.passes_through else STAYS_ON_PATH, fusion, summary, logging.INFO

    def _weigh_fusion(self, bound: int | None, job: ObservedJob, plan: Plan) -> tuple[int | None, str]:
        """Rank 0: the fusion bound that goes with staying out, and the words that say so (empty:
        none). Weighing, the bound is kept only where the simulator predicts the observed step
        no slower in its tasks (:data:`~bytesched.sim.plan.FUSION_MARGIN`)."""
        if bound is None:
            return None, ""
        if not self._weighs_fusion:
            return bound, _fused(bound)
        pays, ratio = fusion_pays(plan, job.profile, job.cluster, bound)
        if pays:
            return bound, f"{_fused(bound)} (predicted {ratio:.2f}x the time in the observed tasks)"
        return None, (f"the observed tasks kept (fused into tasks filled to {format_size(bound)}: "
                      f"predicted {ratio:.2f}x their time)")

    def _sized_margin(self) -> float:
        """The predicted gain a sized plan needs over staying out of the way on this backend."""
        if self._arch == "ps":
            return PS_MARGIN
        if self._core.order == "rank0":
            return RANK0_TRIED_MARGIN if self.tries_sizes else RANK0_ORDER_MARGIN
        return STAY_OUT_MARGIN

    @staticmethod
    def _stay_out(reason: str, fusion: int | None) -> tuple[SchedulingParams, int, int | None, str, int]:
        """Nothing to plan from: as the job would run without bytesched (in tasks filled to
        ``fusion``, unweighed)."""
        summary = f"staying out of the way (no partitioning, no credit limit): {reason}; passing through"
        if fusion is not None:
            summary += f"; {_fused(fusion)}"
        return STAY_OUT, PASSES_THROUGH_UNMEASURED, fusion, summary, logging.WARNING


def _params_of(plan: Plan) -> SchedulingParams:
    return plan.params if plan.policy == "bytescheduler" else STAY_OUT


def _encode(size: float | None) -> int:
    assert size is not None  # the plan's sizes are always explicit
    return UNLIMITED_CODE if size == UNLIMITED else int(size)


def _decode(value: int) -> float:
    return UNLIMITED if value == UNLIMITED_CODE else value


def stay_out_fusion(model_bytes: int, fusion_bytes: float, cap: float) -> int | None:
    """The fusion bound of a plugin that stays out of the way with ``fusion_bytes`` now: ``cap``
    (``BYTESCHED_STAY_OUT_FUSION_BYTES``, :data:`bytesched.core.config.STAY_OUT_FUSION_BYTES` by default), at most a
    :data:`STAY_OUT_MIN_TASKS`-th of ``model_bytes``; None where that would not fuse further."""
    bound = int(min(cap, model_bytes // STAY_OUT_MIN_TASKS))
    return bound if bound > fusion_bytes else None


def _fused(fusion_bytes: float) -> str:
    return f"gradients fused into tasks filled to {format_size(fusion_bytes)}"
