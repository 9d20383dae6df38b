"""A plugin's start-up: the plan or tuning session that switches its Core's sizes, the controller
that decides its path (:mod:`.path`), and the adapter through which both reach the framework.

A plugin inherits :class:`PathAdapter`, implements its hooks (set the Core's sizes, take a path,
and where its framework can: fuse, unfuse, start a sequence, gather the ranks' medians), makes a
:class:`Startup`, hands it the start-up plan or tuning session its job wants, and calls
:meth:`Startup.on_step` at every step boundary while :attr:`Startup.active`; once nothing is
active, the boundary costs the plugin one attribute test. The plan and the tuning session time
and broadcast (:mod:`.startup_plan`, :mod:`bytesched.tuning`), the controller decides, this module
carries the results between them: rank 0's trial medians over the plan's broadcast, and every
rank's over the plugin's all-gather.
"""

from __future__ import annotations

import logging
import time
from typing import Callable, Protocol, Sequence

from bytesched.core import SchedulingParams
from bytesched.core.channel import ChannelError
from bytesched.tuning import TuningSession

from .path import Path, StartupController, Switch
from .lifecycle import Ranks
from .path_trial import TrialOutcome
from .startup_plan import PlanOutcome

log = logging.getLogger("bytesched")

SETTLE_LIMIT = 100
"""Steps after which :func:`step_until_settled` gives up: a plan and its trial take 14, a plan
that stays out and a path trial as many."""
US = 1e3
"""Microseconds per millisecond: the plan trial's medians travel in the integer broadcast as
microseconds."""


class PathAdapter:
    """What a plugin object implements for its start-up (the hooks), and what it answers its user
    about it (the properties). Each hook is called at a step boundary, before anything of the step
    is communicated; the hooks a framework cannot implement refuse, naming it."""

    _startup: Startup

    # -- what the user reads ----------------------------------------------------------------------
    @property
    def plan(self) -> PlanOutcome | None:
        """The sizes the start-up plan chose and every rank applied, once it did."""
        return self._startup.controller.plan

    @property
    def tuned_params(self) -> SchedulingParams | None:
        """The partition and credit sizes tuning kept (the same on every rank), once it is over."""
        return self._startup.tuned

    @property
    def passes_through(self) -> bool:
        """Gradients take the framework's own path: the plan stayed out of the way, a trial kept
        that path, or scheduling is off."""
        return self._startup.controller.path is Path.PASS_THROUGH

    @property
    def plan_trial(self) -> TrialOutcome | None:
        """What timing the plan's sizes against staying out measured and kept, once it did
        (``BYTESCHED_PLAN_TRIAL``)."""
        return self._startup.controller.plan_trial

    @property
    def path_trial(self) -> TrialOutcome | None:
        """What timing the Core's path against the framework's own measured and kept, once a plan
        that stayed out did so (``BYTESCHED_STAY_OUT_PATH``)."""
        return self._startup.controller.path_trial

    @property
    def settled(self) -> bool:
        """No start-up plan, trial or tuning will switch the sizes or the path any more (every
        rank settles at the same step)."""
        return not self._startup.active

    # -- the hooks --------------------------------------------------------------------------------
    def _apply_sizes(self, params: SchedulingParams) -> None:
        """Run the Core on ``params`` from this step on."""
        raise NotImplementedError(f"{type(self).__name__} sets no sizes")

    def _switch_path(self, path: Path, reason: str) -> None:
        """Take ``path`` from this step on (``reason``: for the log)."""
        raise NotImplementedError(f"{type(self).__name__} switches no path")

    def _may_pass_through(self) -> bool:
        """The framework's own path can be taken now."""
        return True

    def _sequences(self) -> bool:
        """Staying out on the Core, the buckets go in their agreed sequence."""
        return False

    def _fuse(self, fusion_bytes: float, temporary: bool) -> None:
        """Fuse the gradients into tasks filled to ``fusion_bytes``; ``temporary``: for a trial's
        steps passing through, undone by :meth:`_unfuse` (else: the plan's bound, for every plugin
        object on the Core)."""
        raise RuntimeError(f"{type(self).__name__} keeps its gradients' grouping: no plan gives it a fusion bound")

    def _unfuse(self) -> None:
        """Back to the buckets as they were before :meth:`_fuse` with ``temporary``."""
        raise RuntimeError(f"{type(self).__name__} keeps its gradients' grouping: there is nothing to unfuse")

    def _start_in_sequence(self) -> None:
        """Start the buckets in their agreed sequence on the Core."""
        raise RuntimeError(f"{type(self).__name__}'s backend orders its collectives itself: no sequence to start")

    def _gather_medians(self, medians: tuple[float, float]) -> Sequence[Sequence[float]]:
        """Every rank's pair of medians (ms), gathered over the backend (a collective)."""
        raise RuntimeError(f"{type(self).__name__}'s backend has no all-gather for a path trial")


class Planning(Protocol):
    """What switches the sizes until it is done: a :class:`~.startup_plan.StartupPlan` (whose
    outcome the controller then hears), or a :class:`~.tuning_warm_start.TuningWarmStart` (none)."""

    @property
    def done(self) -> bool:
        """It switches nothing more."""

    @property
    def ranks(self) -> Ranks:
        """The ranks its outcome was broadcast to (and a trial of its sizes is decided over)."""

    @property
    def outcome(self) -> PlanOutcome | None:
        """Once done, the plan every rank applied (None: no plan)."""

    @property
    def tries_sizes(self) -> bool:
        """Sizes it chooses are tried against staying out (:mod:`.plan_trial`)."""

    @property
    def stay_out_fusion(self) -> int | None:
        """Once done, the fusion bound that goes with staying out (None: the plugin's own)."""

    def on_step(self, step: int) -> SchedulingParams | None:
        """Step ``step`` is about to begin: the sizes to switch to before it, or None."""


class Settles(Protocol):
    """A plugin object whose sizes or path a plan, a trial or tuning may still switch."""

    @property
    def settled(self) -> bool:
        """Nothing will switch them any more (every rank settles at the same step)."""


def step_until_settled(plugin: Settles, step: Callable[[], None], limit: int = SETTLE_LIMIT) -> None:
    """Run ``step`` (one training iteration) until no plan, trial or tuning will switch
    ``plugin``'s path or sizes any more, e.g. before timing it. Every rank settles at the same
    step, so ranks that call this together stay in step."""
    for _ in range(limit):
        if plugin.settled:
            return
        step()
    raise RuntimeError(f"bytesched had not settled its path after {limit} more steps")


class Startup:
    """One plugin object's start-up plan or tuning session, its controller, and its adapter.

    Args:
        adapter: the plugin object the switches are applied to.
        controller: the decisions (:class:`~.path.StartupController`).
        planning, tuning: what switches the sizes at step boundaries; a plugin that learns the
            model's size at its first step sets them then. Never a plan and a tuning session both
            (:func:`~.startup_plan.wants_plan` leaves tuned jobs to the tuner, whose first points a
            :class:`~.tuning_warm_start.TuningWarmStart` may measure in the plan's place).
    """

    def __init__(self, adapter: PathAdapter, controller: StartupController,
                 planning: Planning | None = None, tuning: TuningSession | None = None) -> None:
        self.adapter = adapter
        self.controller = controller
        self.planning = planning
        self.tuning = tuning
        self._tuned: SchedulingParams | None = None
        self._plan_ranks: Ranks | None = None  # the ranks that decide the plan's trial

    @property
    def tuned(self) -> SchedulingParams | None:
        """The sizes tuning kept (the same on every rank), once it kept them (rank 0 may still
        be checking the followers' confirmations)."""
        return self._tuned if self.tuning is None else self.tuning.final

    @property
    def active(self) -> bool:
        """A plan, a trial or a tuning session still has a step boundary to hear of."""
        return self.planning is not None or self.tuning is not None or self.controller.in_trial

    @property
    def times_steps(self) -> bool:
        """A tuning session or a trial times the coming steps: a plugin whose training thread runs
        ahead of its communication (MXNet's) lets each step finish before its boundary."""
        return self.tuning is not None or self.controller.in_trial

    def opening(self, stay_out_fusion: float | None = None) -> None:
        """At construction: apply what the controller opens with (with scheduling off, passing
        through in ``stay_out_fusion``'s buckets)."""
        self._apply(self.controller.opening(stay_out_fusion))

    def sizes_set(self) -> None:
        """The job sets sizes itself (the plugin applies them): any trial ends, and the job takes
        the Core's path."""
        self.controller.sizes_set()
        self.adapter._switch_path(Path.CORE, "the job set sizes")

    def on_step(self, step: int, samples: float = 1.0, now: float | None = None) -> None:
        """Step ``step`` is about to begin (every rank calls this with the same numbers): apply
        what the plan, its trial, the path trial or tuning switch to before it."""
        now = time.monotonic() if now is None else now
        self._apply(self.controller.step(step, now))
        if self.controller.wants_medians:
            self._apply(self._decide(step))
        if self.planning is not None:
            params = self.planning.on_step(step)
            if not self.planning.done:
                self._apply(None if params is None else Switch(step, params))
            else:
                planning, self.planning = self.planning, None
                if planning.outcome is not None:
                    self._plan_ranks = planning.ranks
                    self._apply(self.controller.planned(
                        planning.outcome, now, tries_sizes=planning.tries_sizes,
                        stay_out_fusion=planning.stay_out_fusion, may_pass_through=self.adapter._may_pass_through(),
                        sequences=self.adapter._sequences()))
        if self.tuning is not None:
            params = self.tuning.on_step(step, samples, now)
            if self.tuning.done:  # the session logged the kept sizes
                self._tuned, self.tuning = self.tuning.final, None
            self._apply(None if params is None else Switch(step, params))

    def _decide(self, step: int) -> Switch | None:
        """The trial's ranks' medians, gathered as it asks, and what it decides from them."""
        controller, medians = self.controller, self.controller.medians()
        if controller.gathers_slowest:
            switch = controller.decided(step, self.adapter._gather_medians(medians))
            log.info("bytesched: the plan stayed out of the way; path trial: %s", _summary(controller.path_trial))
            return switch
        ranks = self._plan_ranks
        assert ranks is not None
        try:
            rank0s = [[ranks.broadcast_int(round(value * US)) / US for value in medians]]
        except ChannelError:
            raise  # ranks that cannot hear each other cannot agree on anything
        except Exception as exc:  # the backend's broadcast failed: stay on the framework's path
            controller.undecided(f"rank 0's medians could not be received: {exc}")
            log.warning("bytesched plan trial (rank %d): %s", ranks.rank, _summary(controller.plan_trial))
            return None
        switch = controller.decided(step, rank0s)
        log.log(logging.INFO if ranks.rank == 0 else logging.DEBUG, "bytesched plan trial: %s",
                _summary(controller.plan_trial))
        return switch

    def _apply(self, switch: Switch | None) -> None:
        """Hand ``switch`` to the adapter, in the order of its fields."""
        if switch is None:
            return
        adapter = self.adapter
        if switch.params is not None:
            adapter._apply_sizes(switch.params)
        if switch.fusion_bytes is not None:
            adapter._fuse(switch.fusion_bytes, temporary=False)
        if switch.trial_fusion_bytes is not None:
            adapter._fuse(switch.trial_fusion_bytes, temporary=True)
        if switch.path is not None:
            adapter._switch_path(switch.path, switch.reason)
        if switch.unfuse:
            adapter._unfuse()
        if switch.sequence:
            adapter._start_in_sequence()


def _summary(outcome: TrialOutcome | None) -> str:
    assert outcome is not None  # the controller just decided it
    return outcome.summary
