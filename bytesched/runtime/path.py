"""The start-up controller: which sizes, which path and which fusion a plugin runs, from which step.

Theory of operation. A job starts on bytesched's path with no partitioning and no credit limit
(or, with scheduling off, on the framework's own path for good). At one step boundary the start-up
plan's outcome arrives (:mod:`.startup_plan`), and the controller answers with a :class:`Switch`:

- **sizes chosen**: the Core runs them; where the plugin tries them (:mod:`.plan_trial`), a trial
  begins: :data:`~.path_trial.TRIAL_STEPS` steps on the sizes, as many staying out and passing
  through, then the trial's result decides whether the sizes come back;
- **staying out, and the plan says pass through** (or the plugin's framework always does, as
  MXNet's engine does): the gradients take the framework's own path, unless the plugin measures
  paths (:mod:`.path_trial`), where a trial begins on the Core (staying out) and its result
  decides; a plugin that cannot pass through now (another optimizer shares its Core) stays on
  the Core;
- **staying out on the Core**: the Core runs without limits, in the buckets' agreed sequence
  where the plugin's collectives need one order on every rank (torch.distributed).

A trial's result is every rank's medians gathered by the plugin's backend: the controller says
when it wants them (:attr:`StartupController.wants_medians`) and how they are to be gathered
(:attr:`StartupController.gathers_slowest`), and is told them (:meth:`StartupController.decided`)
or that gathering failed (:meth:`StartupController.undecided`). A job that sets sizes itself ends
any trial (:meth:`StartupController.sizes_set`).

Every answer is the same on every rank: each rank feeds its controller the same step numbers and
the same plan and trial results, which the plugins agree on over their backends. The controller
reads no clock and calls nothing: the plugins' adapters (:mod:`.startup`) do both, and the tests
drive it directly over every order of events it can see.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass
from typing import Sequence

from bytesched.core import SchedulingParams
from bytesched.core.config import SCHEDULING_OFF
from bytesched.sim.plan import STAY_OUT

from .path_trial import PathTrial, TrialOutcome
from .startup_plan import PlanOutcome


class Path(enum.Enum):
    """The two ways a gradient can travel."""

    CORE = "bytesched's Core"
    PASS_THROUGH = "the framework's own path"


@dataclass(frozen=True)
class Switch:
    """What a plugin applies before step :attr:`step` begins, in the order of the fields."""

    step: int
    params: SchedulingParams | None = None
    """The Core's new partition and credit sizes (None: as they are)."""
    fusion_bytes: float | None = None
    """The plan's fusion bound, for every plugin on the Core (None: as it is)."""
    trial_fusion_bytes: float | None = None
    """This plugin's fusion bound while a trial passes through, undone by :attr:`unfuse`."""
    path: Path | None = None
    """The path to take (None: the one taken); switching to the Core also restores rank 0's order
    of starts, which sizes that hold gradients back need."""
    unfuse: bool = False
    """Back to the plugin's own buckets, as they were before a trial fused them."""
    sequence: bool = False
    """Start the buckets in their agreed sequence on the Core (staying out over a backend that
    needs one collective order on every rank)."""
    reason: str = ""
    """Why the path switches, for the plugin's log line."""


class _Phase(enum.Enum):
    STARTING = "starting"  # before the plan's outcome: its observation and tuning set sizes
    PLAN_TRIAL = "plan trial"  # the plan's sizes against staying out
    PATH_TRIAL = "path trial"  # the Core staying out against passing through
    SETTLED = "settled"


class StartupController:
    """The start-up's decisions for one plugin object (see the module docstring).

    Args:
        scheduling: False where scheduling is off: passing through from the start, for good.
        passes_whenever_out: the plugin passes through wherever the plan stays out (MXNet, whose
            engine lets each layer go on once its own parameters are written), not only where the
            plan says to (:attr:`~.startup_plan.PlanOutcome.passes_through`).
        measures_paths: a plan that stays out and would pass through times the Core against
            passing through first (:mod:`.path_trial`), unless nothing could be measured.
    """

    def __init__(self, *, scheduling: bool = True, passes_whenever_out: bool = False,
                 measures_paths: bool = False) -> None:
        self._passes_whenever_out = passes_whenever_out
        self._measures_paths = measures_paths
        self.path = Path.CORE if scheduling else Path.PASS_THROUGH
        """The path taken now."""
        self.plan: PlanOutcome | None = None
        """The plan every rank applied, once it did; while a plan trial passes through, the staying
        out it applied."""
        self.plan_trial: TrialOutcome | None = None
        """What the plan trial measured and kept, once it decided."""
        self.path_trial: TrialOutcome | None = None
        """What the path trial measured and kept, once it decided."""
        self._phase = _Phase.STARTING if scheduling else _Phase.SETTLED
        self._trial: PathTrial | None = None
        self._sized: PlanOutcome | None = None  # the plan's sizes, while their trial runs
        self._trial_fusion: float | None = None
        self._wants_medians = False

    # -- what the plugin reads ---------------------------------------------------------------------
    @property
    def in_trial(self) -> bool:
        """A trial times the coming steps (else no trial will switch anything, though the plan may
        still be coming: :attr:`~.startup.Startup.active`)."""
        return self._phase in (_Phase.PLAN_TRIAL, _Phase.PATH_TRIAL)

    @property
    def wants_medians(self) -> bool:
        """A trial's steps are over: gather :meth:`medians` and report with :meth:`decided`."""
        return self._wants_medians

    @property
    def gathers_slowest(self) -> bool:
        """The medians to gather are every rank's, the slowest counting (the path trial's); else
        rank 0's, broadcast (the plan trial's: a parameter server's workers share no all-gather)."""
        return self._phase is _Phase.PATH_TRIAL

    def medians(self) -> tuple[float, float]:
        """This rank's median step (ms) on the Core's side and passing through."""
        assert self._trial is not None
        return self._trial.medians_ms()

    # -- events ------------------------------------------------------------------------------------
    def opening(self, stay_out_fusion: float | None) -> Switch | None:
        """Construction, before step 0: with scheduling off, pass through (in the buckets a plan
        that stays out would fuse, ``stay_out_fusion``)."""
        if self.path is Path.CORE:
            return None
        return Switch(0, fusion_bytes=stay_out_fusion, path=Path.PASS_THROUGH, reason=SCHEDULING_OFF)

    def planned(self, plan: PlanOutcome, now: float, *, tries_sizes: bool, stay_out_fusion: float | None,
                may_pass_through: bool, sequences: bool) -> Switch:
        """The plan's outcome arrived at the boundary of ``plan.step`` (``now``: monotonic
        seconds). ``tries_sizes``: sizes are tried against staying out; ``stay_out_fusion``: the
        fusion bound that goes with staying out; ``may_pass_through``: the plugin can pass through
        now; ``sequences``: staying out on the Core, its buckets go in their agreed sequence."""
        self._expect(_Phase.STARTING, "a plan")
        self.plan = plan
        self._phase = _Phase.SETTLED
        if plan.params != STAY_OUT:
            if tries_sizes:
                self._begin(_Phase.PLAN_TRIAL, now, f"the plan's {plan.describe()}")
                self._sized, self._trial_fusion = plan, stay_out_fusion
            return Switch(plan.step, plan.params, path=Path.CORE)
        switch = Switch(plan.step, plan.params, fusion_bytes=plan.fusion_bytes)
        if (plan.passes_through or self._passes_whenever_out) and may_pass_through:
            if not (self._measures_paths and plan.measured):
                self.path = Path.PASS_THROUGH
                return dataclasses.replace(switch, path=Path.PASS_THROUGH, reason="the plan stayed out of the way")
            self._begin(_Phase.PATH_TRIAL, now, "the Core")
        return dataclasses.replace(switch, sequence=sequences)

    def step(self, step: int, now: float) -> Switch | None:
        """Step ``step`` is about to begin, at ``now`` (monotonic seconds)."""
        if not self.in_trial or self._wants_medians:
            return None
        assert self._trial is not None
        action = self._trial.boundary(now)
        if action == "decide":
            self._wants_medians = True
            return None
        if action != "pass_through":
            return None
        self.path = Path.PASS_THROUGH
        if self._phase is _Phase.PATH_TRIAL:
            return Switch(step, path=Path.PASS_THROUGH, reason="the path trial times the library's own path")
        assert self._sized is not None
        self.plan = PlanOutcome(STAY_OUT, step, f"{self._sized.summary}; trial: staying out from step {step}",
                                fusion_bytes=self._trial_fusion, passes_through=True)
        return Switch(step, STAY_OUT, trial_fusion_bytes=self._trial_fusion, path=Path.PASS_THROUGH,
                      reason="the plan's trial times staying out")

    def decided(self, step: int, medians: Sequence[Sequence[float]]) -> Switch | None:
        """The ranks' medians (one pair per rank, or rank 0's alone) for the trial that wanted
        them at the boundary of ``step``: keep the faster path."""
        assert self._trial is not None and self._wants_medians
        outcome = self._trial.decide(lambda _: medians)
        if self._phase is _Phase.PATH_TRIAL:
            self.path_trial = outcome
            self._settle()
            if outcome.passes_through:
                return None
            self.path = Path.CORE
            return Switch(step, path=Path.CORE, reason=f"path trial: {outcome.summary}")
        sized = self._sized
        assert sized is not None
        self.plan_trial = outcome
        self._settle()
        if outcome.passes_through:
            return None
        self.plan = dataclasses.replace(sized, step=step, summary=f"{sized.summary}; trial: {outcome.summary}")
        self.path = Path.CORE
        return Switch(step, sized.params, path=Path.CORE, unfuse=self._trial_fusion is not None,
                      reason=f"plan trial: {outcome.summary}")

    def undecided(self, reason: str) -> None:
        """The medians could not be gathered (``reason``): the job stays where the trial ends,
        passing through."""
        assert self._trial is not None and self._wants_medians
        outcome = TrialOutcome(*self._trial.medians_ms(), passes_through=True, core_path=self._trial.core_path,
                               reason=reason)
        if self._phase is _Phase.PATH_TRIAL:
            self.path_trial = outcome
        else:
            self.plan_trial = outcome
        self._settle()

    def sizes_set(self) -> None:
        """The job set sizes itself: it runs on the Core from now on, and a trial still running
        switches nothing more (its outcome stays None)."""
        self.path = Path.CORE
        if self.in_trial:
            self._settle()

    # -- internals ---------------------------------------------------------------------------------
    def _begin(self, phase: _Phase, now: float, core_path: str) -> None:
        self._phase = phase
        self._trial = PathTrial(core_path=core_path)
        self._trial.boundary(now)

    def _settle(self) -> None:
        self._phase, self._trial, self._sized, self._wants_medians = _Phase.SETTLED, None, None, False

    def _expect(self, phase: _Phase, event: str) -> None:
        if self._phase is not phase:
            raise RuntimeError(f"the start-up controller got {event} while {self._phase.value}")
