"""Whether a start-up plan's sizes are kept, decided by timing them against staying out.

The plan predicts from one observed step and two timed operations; where the network is noisy
while it times them, or the simulator misses a cost (the Core's work per partition, the channel's
announcements), sizes predicted to gain can lose (docs/plan.md, "2-13, where sizes were chosen").
A job that keeps sizes should have seen them win. So, after a sized plan, every rank runs
:data:`~.path_trial.TRIAL_STEPS` steps on its sizes, then as many staying out (no partitioning, no credit limit) on the
framework's own path (passing through), the first step of each left out, and keeps the sizes
only if they ran faster by :data:`~.path_trial.CORE_MARGIN`: otherwise it stays on the
framework's own path, the baseline a user runs without bytesched (in the fusion a plan that
stays out would give the plugin, :attr:`~.plan.StartupPlan.stay_out_fusion`). By default a
parameter server's plan is tried, and a torch.distributed job's on the CPU (:func:`wants_trial`
says why).

Rank 0's medians decide, broadcast to every rank (a parameter server's workers have no
collective but the rank-0 channel's broadcast): in synchronous data-parallel training every rank
runs at the slowest one's pace, so every rank's step lasts as long as rank 0's. A broadcast that
fails in the backend leaves the job where the trial ends, on the framework's own path, with a
warning naming the reason, as the plan's own broadcast does (:mod:`.startup_plan`); one over the rank-0
channel raises, since ranks that cannot hear each other cannot agree on anything. The switches come
back from :meth:`PlanTrial.on_step` as plan outcomes, which a plugin applies as it applies the
plan's own: the sizes, or staying out and passing through.
"""

from __future__ import annotations

import dataclasses
import logging
import time

from bytesched.core import Config
from bytesched.core.channel import ChannelError
from bytesched.sim.plan import STAY_OUT

from .lifecycle import Ranks
from .path_trial import PathTrial, TrialOutcome
from .startup_plan import PlanOutcome

log = logging.getLogger("bytesched")

US = 1e3
"""Microseconds per millisecond: the medians travel in the integer broadcast as microseconds."""


def wants_trial(config: Config, arch: str, announced_on_cpu: bool = False) -> bool:
    """Whether a plan's sizes are tried: ``BYTESCHED_PLAN_TRIAL``, or where unset, on a parameter
    server (``arch="ps"``) and over an all-reduce whose followers wait for rank 0's announced order
    with the gradients on the CPU (``announced_on_cpu``: torch.distributed), not over Horovod.

    Why the backends differ: a sized plan that lost was measured on a parameter server, never
    over Horovod. Over torch.distributed every partition also waits for rank 0's announcement,
    which the simulator does not model, so untried sizes need a larger predicted gain
    (:data:`~.plan.RANK0_ORDER_MARGIN`) than tried ones (:data:`~.plan.RANK0_TRIED_MARGIN`), and
    tried sizes ran faster than staying out. On a GPU it is not the default there: every sized
    plan measured there lost, and none was measured with a trial. Over Horovod a trial that keeps
    the sizes can leave the job slower than the same sizes untried, for as long as it was
    measured (Horovod's response cache takes part). The figures: docs/plan.md ("What it costs")
    and docs/experiments/plan-trial.md."""
    if config.plan_trial is not None:
        return config.plan_trial
    return arch == "ps" or announced_on_cpu


class PlanTrial:
    """Times a sized plan against staying out, from the boundary of the plan's own step.

    Call :meth:`on_step` at every later step boundary on every rank, with the same step numbers,
    until :attr:`done`; apply the outcome it returns (None: nothing changes).
    """

    def __init__(self, sized: PlanOutcome, ranks: Ranks, now: float | None = None,
                 stay_out_fusion: float | None = None) -> None:
        if sized.params == STAY_OUT:
            raise ValueError("a plan trial times sizes against staying out; this plan stays out")
        self._sized = sized
        self._ranks = ranks
        self._stay_out_fusion = stay_out_fusion
        """The fusion bound a plan that stays out would have given the plugin (None: its own), so
        that the steps passing through are timed as such a plan would run them."""
        self._counter = PathTrial(core_path=f"the plan's {sized.describe()}")
        self._counter.boundary(time.monotonic() if now is None else now)
        self.outcome: TrialOutcome | None = None
        """What the trial measured and kept, once it decided (the same on every rank)."""

    @property
    def done(self) -> bool:
        """The trial decided: :meth:`on_step` switches nothing more."""
        return self.outcome is not None

    def on_step(self, step: int, now: float | None = None) -> PlanOutcome | None:
        """Step ``step`` is about to begin: the plan to apply before it, or None."""
        action = self._counter.boundary(time.monotonic() if now is None else now)
        if action == "pass_through":
            return PlanOutcome(STAY_OUT, step, f"{self._sized.summary}; trial: staying out from step {step}",
                               fusion_bytes=self._stay_out_fusion, passes_through=True)
        if action != "decide":
            return None
        try:
            outcome = self._counter.decide(self._rank0s_medians)
        except ChannelError:
            raise
        except Exception as exc:  # the backend's broadcast failed: stay on the framework's path
            outcome = TrialOutcome(*self._counter.medians_ms(), passes_through=True, core_path=self._counter.core_path,
                                   reason=f"rank 0's medians could not be received: {exc}")
            log.warning("bytesched plan trial (rank %d): %s", self._ranks.rank, outcome.summary)
        else:
            log.log(logging.INFO if self._ranks.rank == 0 else logging.DEBUG, "bytesched plan trial: %s",
                    outcome.summary)
        self.outcome = outcome
        if outcome.passes_through:
            return None
        return dataclasses.replace(self._sized, step=step, summary=f"{self._sized.summary}; trial: {outcome.summary}")

    def _rank0s_medians(self, medians: tuple[float, float]) -> list[list[float]]:
        """Rank 0's pair of medians on every rank (see the module docstring)."""
        return [[self._ranks.broadcast_int(round(value * US)) / US for value in medians]]
