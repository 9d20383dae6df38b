"""The path trial's counting and decision, without processes (the switches it drives, on real
ranks, are in test_torch_plan.py)."""

from __future__ import annotations

import pytest

from bytesched.runtime.path_trial import CORE_MARGIN, TRIAL_STEPS, PathTrial


def run(core_steps_ms: list[float], own_steps_ms: list[float]) -> PathTrial:
    """A trial fed boundaries ``core_steps_ms`` then ``own_steps_ms`` apart; asserts when it says
    to switch and to decide."""
    trial = PathTrial(steps=len(core_steps_ms))
    now = 100.0
    assert trial.boundary(now) is None  # the trial begins, on the Core
    actions = []
    for step_ms in core_steps_ms + own_steps_ms:
        now += step_ms / 1e3
        actions.append(trial.boundary(now))
    steps = len(core_steps_ms)
    assert actions == [None] * (steps - 1) + ["pass_through"] + [None] * (steps - 1) + ["decide"]
    return trial


def test_each_paths_first_step_is_left_out_of_its_median() -> None:
    trial = run([500.0, 10.0, 12.0, 11.0], [900.0, 20.0, 21.0, 22.0])
    assert trial.medians_ms() == pytest.approx((11.0, 21.0))


def test_the_slowest_rank_counts_and_the_core_needs_the_margin_to_be_kept() -> None:
    trial = run([0.0, 10.0, 10.0], [0.0, 10.0, 10.0])
    # Rank 1 is slower on the Core, rank 0 passing through: each path's slowest median counts.
    outcome = trial.decide(lambda mine: [mine, (30.0, 5.0)])
    assert (outcome.core_ms, outcome.own_ms, outcome.passes_through) == (30.0, pytest.approx(10.0), True)
    just_faster = 100.0 * (1 - CORE_MARGIN)
    assert trial.decide(lambda mine: [(just_faster, 100.0)]).passes_through  # a tie passes through
    kept = trial.decide(lambda mine: [(just_faster - 0.1, 100.0)])
    assert not kept.passes_through
    assert kept.summary == "97.9 ms per step through the Core, 100.0 passing through: staying on the Core"


def test_a_trial_asked_for_its_medians_early_or_too_short_says_so() -> None:
    trial = PathTrial()
    for second in range(TRIAL_STEPS + 2):
        trial.boundary(float(second))
    with pytest.raises(RuntimeError, match=f"the path trial is not over: {TRIAL_STEPS + 1} of "
                                           f"{2 * TRIAL_STEPS} steps timed"):
        trial.medians_ms()
    with pytest.raises(ValueError, match="at least 2 steps per path"):
        PathTrial(steps=1)
