"""The start-up controller alone (bytesched.runtime.path): every outcome of the plan, every trial
result and a job's own sizes at every step, fed as events; what it answers, and that its answers
agree with what it reports."""

from __future__ import annotations

import dataclasses
import itertools

import pytest

from bytesched.core import SchedulingParams
from bytesched.core.config import SCHEDULING_OFF
from bytesched.runtime import TRIAL_STEPS, Path, PlanOutcome, StartupController, Switch
from bytesched.runtime.path_trial import CORE_MARGIN
from bytesched.sim.plan import STAY_OUT

SIZES = SchedulingParams(partition_bytes=1_000_000, credit_bytes=4_000_000)
SIZED = PlanOutcome(SIZES, 2, "chose 1 MB / 4 MB")
STAYS_OUT = PlanOutcome(STAY_OUT, 2, "stays out", fusion_bytes=8e6, passes_through=True)
PLAN_STEP = 2
TRIAL_END = PLAN_STEP + 2 * TRIAL_STEPS  # the boundary at which a trial's medians are wanted


def planned(controller: StartupController, plan: PlanOutcome, *, tries_sizes: bool = False,
            may_pass_through: bool = True, sequences: bool = False) -> Switch:
    return controller.planned(plan, now=0.0, tries_sizes=tries_sizes, stay_out_fusion=6e6,
                              may_pass_through=may_pass_through, sequences=sequences)


def steps_until_medians(controller: StartupController) -> list[Switch | None]:
    """The trial's boundaries, 10 ms apart, until it wants its medians."""
    switches = [controller.step(step, now=(step - PLAN_STEP) * 0.01) for step in range(PLAN_STEP + 1, TRIAL_END + 1)]
    assert controller.wants_medians
    return switches


def test_scheduling_off_opens_passing_through_and_never_switches() -> None:
    controller = StartupController(scheduling=False)
    assert controller.opening(stay_out_fusion=4e6) == Switch(0, fusion_bytes=4e6, path=Path.PASS_THROUGH,
                                                             reason=SCHEDULING_OFF)
    assert controller.path is Path.PASS_THROUGH and not controller.in_trial and controller.step(1, 0.0) is None
    with pytest.raises(RuntimeError, match="got a plan while settled"):
        planned(controller, SIZED)
    assert StartupController().opening(stay_out_fusion=4e6) is None


def test_sizes_are_run_on_the_core_at_once_where_they_are_not_tried() -> None:
    controller = StartupController()
    assert planned(controller, SIZED) == Switch(PLAN_STEP, SIZES, path=Path.CORE)
    assert not controller.in_trial and controller.plan == SIZED and controller.step(3, 1.0) is None


@pytest.mark.parametrize("sized_ms, kept", [(80.0, True), (100.0 * (1 - CORE_MARGIN), False)])
def test_tried_sizes_stay_out_after_their_steps_and_come_back_only_if_faster(sized_ms: float, kept: bool) -> None:
    controller = StartupController()
    assert planned(controller, SIZED, tries_sizes=True) == Switch(PLAN_STEP, SIZES, path=Path.CORE)
    assert controller.in_trial and not controller.gathers_slowest
    switches = steps_until_medians(controller)
    out = PLAN_STEP + TRIAL_STEPS
    assert switches[TRIAL_STEPS - 1] == Switch(out, STAY_OUT, trial_fusion_bytes=6e6, path=Path.PASS_THROUGH,
                                               reason="the plan's trial times staying out")
    assert [s for s in switches if s is not None] == [switches[TRIAL_STEPS - 1]]
    assert controller.plan == PlanOutcome(STAY_OUT, out, f"{SIZED.summary}; trial: staying out from step {out}",
                                          fusion_bytes=6e6, passes_through=True)
    assert controller.path is Path.PASS_THROUGH
    switch = controller.decided(TRIAL_END, [[sized_ms, 100.0]])
    assert not controller.in_trial and controller.plan_trial is not None
    assert controller.plan_trial.passes_through is not kept
    if kept:
        assert switch == Switch(TRIAL_END, SIZES, path=Path.CORE, unfuse=True,
                                reason=f"plan trial: {controller.plan_trial.summary}")
        assert controller.plan == dataclasses.replace(
            SIZED, step=TRIAL_END, summary=f"{SIZED.summary}; trial: {controller.plan_trial.summary}")
        assert controller.path is Path.CORE
    else:
        assert switch is None and controller.path is Path.PASS_THROUGH and controller.plan.params == STAY_OUT


def test_a_trial_whose_medians_could_not_be_gathered_stays_passing_through() -> None:
    controller = StartupController()
    planned(controller, SIZED, tries_sizes=True)
    steps_until_medians(controller)
    controller.undecided("the broadcast failed")
    outcome = controller.plan_trial
    assert outcome is not None and outcome.passes_through and outcome.reason == "the broadcast failed"
    assert outcome.core_ms == pytest.approx(10.0) and controller.path is Path.PASS_THROUGH and not controller.in_trial


def test_staying_out_passes_through_where_the_plan_says_and_the_plugin_can() -> None:
    controller = StartupController()
    assert planned(controller, STAYS_OUT) == Switch(PLAN_STEP, STAY_OUT, fusion_bytes=8e6, path=Path.PASS_THROUGH,
                                                    reason="the plan stayed out of the way")
    assert controller.path is Path.PASS_THROUGH and not controller.in_trial


@pytest.mark.parametrize("plan, passes_whenever_out, may_pass_through", [
    (dataclasses.replace(STAYS_OUT, passes_through=False), False, True),  # the plan says: stay on the Core
    (STAYS_OUT, False, False),  # another optimizer shares the Core
])
def test_staying_out_on_the_core_starts_the_sequence_where_asked(plan: PlanOutcome, passes_whenever_out: bool,
                                                                 may_pass_through: bool) -> None:
    controller = StartupController(passes_whenever_out=passes_whenever_out)
    switch = planned(controller, plan, may_pass_through=may_pass_through, sequences=True)
    assert switch == Switch(PLAN_STEP, STAY_OUT, fusion_bytes=8e6, sequence=True)
    assert controller.path is Path.CORE and not controller.in_trial


def test_mxnet_passes_through_wherever_the_plan_stays_out() -> None:
    controller = StartupController(passes_whenever_out=True)
    switch = planned(controller, dataclasses.replace(STAYS_OUT, passes_through=False))
    assert switch.path is Path.PASS_THROUGH and controller.path is Path.PASS_THROUGH


@pytest.mark.parametrize("core_ms, kept", [(10.0, True), (30.0, False)])
def test_a_path_trial_begins_on_the_core_and_the_slowest_rank_decides(core_ms: float, kept: bool) -> None:
    controller = StartupController(measures_paths=True)
    assert planned(controller, STAYS_OUT, sequences=True) == Switch(PLAN_STEP, STAY_OUT, fusion_bytes=8e6,
                                                                    sequence=True)
    assert controller.path is Path.CORE and controller.in_trial and controller.gathers_slowest
    switches = steps_until_medians(controller)
    assert switches[TRIAL_STEPS - 1] == Switch(PLAN_STEP + TRIAL_STEPS, path=Path.PASS_THROUGH,
                                               reason="the path trial times the library's own path")
    assert controller.medians() == pytest.approx((10.0, 10.0))
    switch = controller.decided(TRIAL_END, [[5.0, 20.0], [core_ms, 20.0]])
    assert controller.path_trial is not None and controller.path_trial.core_ms == core_ms
    assert (switch is not None) is kept and not controller.in_trial
    assert controller.path is (Path.CORE if kept else Path.PASS_THROUGH)
    assert controller.plan == STAYS_OUT and controller.plan_trial is None


def test_nothing_measured_passes_through_without_a_path_trial() -> None:
    controller = StartupController(measures_paths=True)
    switch = planned(controller, dataclasses.replace(STAYS_OUT, measured=False))
    assert switch.path is Path.PASS_THROUGH and not controller.in_trial


def test_events_out_of_order_are_refused() -> None:
    controller = StartupController()
    planned(controller, SIZED)
    with pytest.raises(RuntimeError, match="got a plan while settled"):
        planned(controller, SIZED)


class Plugin:
    """What a plugin's state becomes from the switches it applied."""

    def __init__(self) -> None:
        self.path, self.params, self.fused, self.temporary, self.sequenced = Path.CORE, None, None, False, False

    def apply(self, switch: Switch | None, step: int) -> None:
        if switch is None:
            return
        assert switch.step == step
        if switch.params is not None:
            self.params = switch.params
        if switch.fusion_bytes is not None:
            self.fused = switch.fusion_bytes
        if switch.trial_fusion_bytes is not None:
            self.temporary = True
        if switch.path is not None:
            self.path = switch.path
        if switch.unfuse:
            assert self.temporary or self.fused is None  # only what a trial fused is undone
            self.temporary = False
        self.sequenced |= switch.sequence


@pytest.mark.parametrize("sized, tries_sizes, plan_passes, measured, passes_whenever_out, measures_paths, "
                         "may_pass_through", list(itertools.product([True, False], repeat=7)))
def test_every_order_of_events_keeps_the_answers_consistent(sized: bool, tries_sizes: bool, plan_passes: bool,
                                                            measured: bool, passes_whenever_out: bool,
                                                            measures_paths: bool, may_pass_through: bool) -> None:
    """For every plan outcome and plugin, each trial result (the Core's side faster, slower, not
    gathered) and a job's own sizes at every boundary (or never): the switches name their step,
    the plugin's path is the one the controller reports after every event, the controller
    settles by the trial's last boundary and switches nothing after, and the job ends where the
    rules put it."""
    plan = SIZED if sized else dataclasses.replace(STAYS_OUT, passes_through=plan_passes, measured=measured)
    for result, sets_sizes_at in itertools.product(("faster", "slower", "failed"), [None, *range(3, TRIAL_END + 2)]):
        controller = StartupController(passes_whenever_out=passes_whenever_out, measures_paths=measures_paths)
        plugin = Plugin()
        plugin.apply(controller.opening(None), 0)
        plugin.apply(planned(controller, plan, tries_sizes=tries_sizes, may_pass_through=may_pass_through), PLAN_STEP)
        assert plugin.path is controller.path
        trial = controller.in_trial
        for step in range(PLAN_STEP + 1, TRIAL_END + 3):
            if step == sets_sizes_at:
                controller.sizes_set()
                plugin.apply(Switch(step, SIZES, path=Path.CORE), step)
            was_settled = not controller.in_trial
            switch = controller.step(step, now=step * (0.01 if step <= PLAN_STEP + TRIAL_STEPS else 0.02))
            assert not (was_settled and switch is not None)
            plugin.apply(switch, step)
            if controller.wants_medians:
                if result == "failed":
                    controller.undecided("failed")
                else:
                    plugin.apply(controller.decided(step, [[10.0 if result == "faster" else 30.0, 20.0]]), step)
            assert plugin.path is controller.path and not controller.wants_medians
            assert not controller.in_trial or step < TRIAL_END
        if sets_sizes_at is not None:
            assert controller.path is Path.CORE and plugin.params == SIZES
            if sets_sizes_at <= TRIAL_END:  # the trial ended without an outcome
                assert controller.plan_trial is None and controller.path_trial is None
            continue
        passes = not sized and (plan_passes or passes_whenever_out) and may_pass_through
        if not trial:
            assert controller.path is (Path.PASS_THROUGH if passes else Path.CORE)
            assert controller.plan_trial is None and controller.path_trial is None
            continue
        kept = result == "faster"
        assert controller.path is (Path.CORE if kept else Path.PASS_THROUGH)
        assert (controller.plan_trial if sized else controller.path_trial) is not None
        if sized:
            assert tries_sizes and plugin.params == (SIZES if kept else STAY_OUT) and plugin.temporary is not kept
            assert controller.plan is not None and controller.plan.params == plugin.params
        else:
            assert passes and measures_paths and measured and plugin.params == STAY_OUT
