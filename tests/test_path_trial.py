"""The path trial's and the plan trial's counting and decisions, without processes (the switches
they drive, on real ranks, are in test_torch_plan.py and test_ps_plan.py)."""

from __future__ import annotations

import pytest

from bytesched.core import SchedulingParams
from bytesched.core.channel import ChannelError
from bytesched.runtime.path_trial import CORE_MARGIN, TRIAL_STEPS, PathTrial
from bytesched.runtime.startup_plan import PlanOutcome
from bytesched.runtime.plan_trial import PlanTrial
from bytesched.runtime.sizes import SizeSwitches
from bytesched.sim.plan import STAY_OUT


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
    assert kept.summary == "97.9 ms per step on the Core, 100.0 passing through: keeping the Core"


def test_a_trial_asked_for_its_medians_early_or_too_short_says_so() -> None:
    trial = PathTrial()
    for second in range(TRIAL_STEPS + 2):
        trial.boundary(float(second))
    with pytest.raises(RuntimeError, match=f"the path trial is not over: {TRIAL_STEPS + 1} of "
                                           f"{2 * TRIAL_STEPS} steps timed"):
        trial.medians_ms()
    with pytest.raises(ValueError, match="at least 2 steps per path"):
        PathTrial(steps=1)


class Rank:
    """One rank's view of the broadcast: rank 0's values, whatever this rank offers."""

    def __init__(self, rank: int, rank0s: list[int]) -> None:
        self.rank, self.size, self._rank0s, self.offered = rank, 2, rank0s, []

    def broadcast_int(self, value: int) -> int:
        self.offered.append(value)
        if self.rank == 0:
            self._rank0s.append(value)
            return value
        return self._rank0s[len(self.offered) - 1]


SIZED = PlanOutcome(SchedulingParams(partition_bytes=1_000_000, credit_bytes=4_000_000), 2, "chose 1 MB / 4 MB")


def trial_steps(ranks: list[Rank], sized_ms: float, staying_out_ms: float,
                stay_out_fusion: float | None = None) -> list[list[PlanOutcome | None]]:
    """Both ranks' plan trials from the plan's step 2, fed steps of ``sized_ms`` then
    ``staying_out_ms`` (rank 1 reads its clock 5 ms late each step); what each returned per step."""
    trials = [PlanTrial(SIZED, rank, now=float(rank.rank), stay_out_fusion=stay_out_fusion) for rank in ranks]
    clocks = [float(rank.rank) for rank in ranks]
    returned: list[list[PlanOutcome | None]] = [[], []]
    for step in range(3, 3 + 2 * TRIAL_STEPS):
        for i, trial in enumerate(trials):
            clocks[i] += (sized_ms if step <= 2 + TRIAL_STEPS else staying_out_ms) / 1e3 + 0.005 * i
            returned[i].append(trial.on_step(step, now=clocks[i]))
        assert all(trial.done == (step == 2 + 2 * TRIAL_STEPS) for trial in trials)
    return returned


def test_a_plan_trial_stays_out_after_the_sizes_steps_and_keeps_the_sizes_only_if_faster() -> None:
    """After the sized plan's steps every rank stays out and passes through; rank 0's medians,
    broadcast, decide on every rank (rank 1's summary carries rank 0's numbers): faster sizes come
    back (as the plan's outcome with the trial's summary), slower or tied sizes leave the job
    passing through."""
    rank0s: list[int] = []
    returned = trial_steps([Rank(0, rank0s), Rank(1, rank0s)], sized_ms=80.0, staying_out_ms=100.0)
    for steps in returned:
        staying_out = steps[TRIAL_STEPS - 1]
        assert staying_out is not None and staying_out.params == STAY_OUT and staying_out.passes_through
        assert staying_out.step == 2 + TRIAL_STEPS
        kept = steps[-1]
        assert kept is not None and kept.params == SIZED.params and kept.step == 2 + 2 * TRIAL_STEPS
        assert kept.summary == ("chose 1 MB / 4 MB; trial: 80.0 ms per step on the plan's 1MB partitions, "
                                "4MB credit, 100.0 passing through: keeping the plan's 1MB partitions, 4MB credit")
        assert ([s for i, s in enumerate(steps) if i not in (TRIAL_STEPS - 1, len(steps) - 1)]
                == [None] * (len(steps) - 2))
    rank0s.clear()
    ranks = [Rank(0, rank0s), Rank(1, rank0s)]
    returned = trial_steps(ranks, sized_ms=100.0 * (1 - CORE_MARGIN), staying_out_ms=100.0)
    assert returned[0][-1] is None and returned[1][-1] is None
    assert ranks[1].offered == [103_000, 105_000]  # rank 1's own medians, read 5 ms late: not used
    assert rank0s == [98_000, 100_000]  # rank 0's, in microseconds, decided on both ranks


def test_a_plan_trial_stays_out_in_the_fusion_a_plan_that_stays_out_gives() -> None:
    """Where the plugin offered its fusion bound, the trial's steps passing through run fused as a
    plan that stays out would run them; the sizes, if they come back, keep the plugin's own bound."""
    rank0s: list[int] = []
    for steps in trial_steps([Rank(0, rank0s), Rank(1, rank0s)], sized_ms=80.0, staying_out_ms=100.0,
                             stay_out_fusion=6e6):
        staying_out, kept = steps[TRIAL_STEPS - 1], steps[-1]
        assert staying_out is not None and (staying_out.fusion_bytes, staying_out.passes_through) == (6e6, True)
        assert kept is not None and kept.fusion_bytes is None


class FailingRank(Rank):
    """A rank whose broadcast raises ``error``."""

    def __init__(self, error: Exception) -> None:
        super().__init__(1, [])
        self.error = error

    def broadcast_int(self, value: int) -> int:
        raise self.error


def test_a_plan_trial_whose_broadcast_fails_in_the_backend_stays_out_and_says_why(
        caplog: pytest.LogCaptureFixture) -> None:
    """A backend's broadcast that fails leaves the rank on the framework's own path (where the
    trial's last steps ran, so nothing switches) with a warning naming the reason, even where its
    own medians favour the sizes; a failing rank-0 channel raises (module doc)."""
    failing = [FailingRank(RuntimeError("Horovod has been shut down")) for _ in range(2)]
    returned = trial_steps(failing, sized_ms=50.0, staying_out_ms=100.0)
    assert returned[0][-1] is None and returned[1][-1] is None  # no switch back to the sizes
    assert "rank 1): 50.0 ms per step on the plan's 1MB partitions, 4MB credit, 100.0 passing through: " \
           "passing through (rank 0's medians could not be received: Horovod has been shut down)" in caplog.text
    with pytest.raises(ChannelError, match="no value"):
        trial_steps([FailingRank(ChannelError("no value from rank 0"))] * 2, sized_ms=50.0, staying_out_ms=100.0)


def test_a_plan_that_stays_out_has_no_trial() -> None:
    with pytest.raises(ValueError, match="this plan stays out"):
        PlanTrial(PlanOutcome(STAY_OUT, 2, "staying out"), Rank(0, []))


def test_size_switches_apply_the_trials_outcomes_as_the_plan_and_end_it_when_the_job_sets_sizes() -> None:
    """SizeSwitches hands a plugin each switch of the trial as its sizes and as ``plan`` (what the
    plugins read to pass through), keeps the trial's outcome, and stays active (and timing its
    steps) until the trial decided; a job that sets sizes itself ends the trial."""
    switches = SizeSwitches()
    switches.plan, switches.trial = SIZED, PlanTrial(SIZED, Rank(0, []), now=0.0)
    assert switches.active and switches.times_steps
    applied = []
    for step in range(3, 3 + 2 * TRIAL_STEPS):
        ms = 50.0 if step <= 2 + TRIAL_STEPS else 100.0
        applied.append(switches.on_step(step, now=(step - 2) * ms / 1e3))
    assert applied[TRIAL_STEPS - 1] == STAY_OUT and applied[-1] == SIZED.params
    assert switches.plan is not None and switches.plan.params == SIZED.params
    assert switches.plan.step == 2 + 2 * TRIAL_STEPS
    assert switches.trial_outcome is not None and not switches.trial_outcome.passes_through
    assert not switches.active and not switches.times_steps
    switches.trial = PlanTrial(SIZED, Rank(0, []), now=0.0)
    switches.end_trial()
    assert not switches.active and switches.on_step(3, now=1.0) is None
