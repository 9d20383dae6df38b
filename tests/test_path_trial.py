"""The path trial's counting and decisions, and the plan trial as a plugin's start-up carries it
(rank 0's medians over the plan's broadcast), without processes (the switches they drive, on real
ranks, are in test_torch_plan.py and test_ps_plan.py; the controller's decisions alone in
test_startup_controller.py)."""

from __future__ import annotations

import pytest

from bytesched.core import SchedulingParams
from bytesched.core.channel import ChannelError
from bytesched.runtime import Path, PathAdapter, Startup, StartupController
from bytesched.runtime.path_trial import CORE_MARGIN, TRIAL_STEPS, PathTrial
from bytesched.runtime.startup_plan import PlanOutcome
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


class MadePlan:
    """A start-up plan that was made at step 2 with ``outcome`` (what a Startup hears of it)."""

    def __init__(self, outcome: PlanOutcome, ranks: Rank, stay_out_fusion: float | None = None) -> None:
        self._made, self.ranks, self.stay_out_fusion = outcome, ranks, stay_out_fusion
        self.outcome: PlanOutcome | None = None
        self.tries_sizes = True

    @property
    def done(self) -> bool:
        return self.outcome is not None

    def on_step(self, step: int) -> SchedulingParams | None:
        if step == self._made.step:
            self.outcome = self._made
            return self._made.params
        return None


class Recorder(PathAdapter):
    """A plugin that records what its start-up applied, per step."""

    def __init__(self) -> None:
        self.applied: list[tuple[object, ...]] = []

    def _apply_sizes(self, params: SchedulingParams) -> None:
        self.applied.append(("sizes", params))

    def _switch_path(self, path: Path, reason: str) -> None:
        self.applied.append(("path", path))

    def _fuse(self, fusion_bytes: float, temporary: bool) -> None:
        self.applied.append(("fuse", fusion_bytes, temporary))

    def _unfuse(self) -> None:
        self.applied.append(("unfuse",))


SIZED = PlanOutcome(SchedulingParams(partition_bytes=1_000_000, credit_bytes=4_000_000), 2, "chose 1 MB / 4 MB")


Steps = list[list[tuple[list[tuple[object, ...]], PlanOutcome | None]]]
"""Per rank, per step: what its plugin applied, and the plan it then reports."""


def trial_steps(ranks: list[Rank], sized_ms: float, staying_out_ms: float,
                stay_out_fusion: float | None = None) -> Steps:
    """Both ranks' plan trials from the plan's step 2, fed steps of ``sized_ms`` then
    ``staying_out_ms`` (rank 1 reads its clock 5 ms late each step); per step, what each rank's
    plugin applied and the plan it then reports."""
    plugins = [Recorder() for _ in ranks]
    for rank, plugin in zip(ranks, plugins):
        plugin._startup = Startup(plugin, StartupController(), planning=MadePlan(SIZED, rank, stay_out_fusion))
        plugin._startup.on_step(2, now=float(rank.rank))
        assert plugin.applied == [("sizes", SIZED.params), ("path", Path.CORE)] and plugin.plan == SIZED
    clocks = [float(rank.rank) for rank in ranks]
    returned: Steps = [[], []]
    for step in range(3, 3 + 2 * TRIAL_STEPS):
        for i, plugin in enumerate(plugins):
            clocks[i] += (sized_ms if step <= 2 + TRIAL_STEPS else staying_out_ms) / 1e3 + 0.005 * i
            plugin.applied = []
            plugin._startup.on_step(step, now=clocks[i])
            returned[i].append((plugin.applied, plugin.plan))
        assert all(plugin.settled == (step == 2 + 2 * TRIAL_STEPS) for plugin in plugins)
    return returned


def test_a_plan_trial_stays_out_after_the_sizes_steps_and_keeps_the_sizes_only_if_faster() -> None:
    """After the sized plan's steps every rank stays out and passes through; rank 0's medians,
    broadcast, decide on every rank (rank 1's summary carries rank 0's numbers): faster sizes come
    back (as the plan's outcome with the trial's summary), slower or tied sizes leave the job
    passing through."""
    rank0s: list[int] = []
    returned = trial_steps([Rank(0, rank0s), Rank(1, rank0s)], sized_ms=80.0, staying_out_ms=100.0)
    for steps in returned:
        applied, staying_out = steps[TRIAL_STEPS - 1]
        assert applied == [("sizes", STAY_OUT), ("path", Path.PASS_THROUGH)]
        assert staying_out is not None and staying_out.params == STAY_OUT and staying_out.passes_through
        assert staying_out.step == 2 + TRIAL_STEPS
        applied, kept = steps[-1]
        assert applied == [("sizes", SIZED.params), ("path", Path.CORE)]  # nothing was fused to undo
        assert kept is not None and kept.params == SIZED.params and kept.step == 2 + 2 * TRIAL_STEPS
        assert kept.summary == ("chose 1 MB / 4 MB; trial: 80.0 ms per step on the plan's 1MB partitions, "
                                "4MB credit, 100.0 passing through: keeping the plan's 1MB partitions, 4MB credit")
        assert ([a for i, (a, _) in enumerate(steps) if i not in (TRIAL_STEPS - 1, len(steps) - 1)]
                == [[]] * (len(steps) - 2))
    rank0s.clear()
    ranks = [Rank(0, rank0s), Rank(1, rank0s)]
    returned = trial_steps(ranks, sized_ms=100.0 * (1 - CORE_MARGIN), staying_out_ms=100.0)
    assert returned[0][-1][0] == [] and returned[1][-1][0] == []
    assert ranks[1].offered == [103_000, 105_000]  # rank 1's own medians, read 5 ms late: not used
    assert rank0s == [98_000, 100_000]  # rank 0's, in microseconds, decided on both ranks


def test_a_plan_trial_stays_out_in_the_fusion_a_plan_that_stays_out_gives() -> None:
    """Where the plugin offered its fusion bound, the trial's steps passing through run fused as a
    plan that stays out would run them (this plugin only, undone when the sizes come back); the
    sizes, if they come back, keep the plugin's own bound."""
    rank0s: list[int] = []
    for steps in trial_steps([Rank(0, rank0s), Rank(1, rank0s)], sized_ms=80.0, staying_out_ms=100.0,
                             stay_out_fusion=6e6):
        (applied, staying_out), (kept_applied, kept) = steps[TRIAL_STEPS - 1], steps[-1]
        assert ("fuse", 6e6, True) in applied
        assert staying_out is not None and (staying_out.fusion_bytes, staying_out.passes_through) == (6e6, True)
        assert kept is not None and kept.fusion_bytes is None and ("unfuse",) in kept_applied


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
    assert returned[0][-1][0] == [] and returned[1][-1][0] == []  # no switch back to the sizes
    assert "rank 1): 50.0 ms per step on the plan's 1MB partitions, 4MB credit, 100.0 passing through: " \
           "passing through (rank 0's medians could not be received: Horovod has been shut down)" in caplog.text
    with pytest.raises(ChannelError, match="no value"):
        trial_steps([FailingRank(ChannelError("no value from rank 0"))] * 2, sized_ms=50.0, staying_out_ms=100.0)


def test_a_startup_times_the_trials_steps_and_a_job_that_sets_sizes_ends_the_trial() -> None:
    """The Startup stays active (and timing its steps) until the trial decided; a job that sets
    sizes itself ends the trial, which then switches nothing and keeps no outcome."""
    plugin = Recorder()
    plugin._startup = startup = Startup(plugin, StartupController(), planning=MadePlan(SIZED, Rank(0, [])))
    startup.on_step(2, now=0.0)
    assert startup.active and startup.times_steps and not plugin.settled
    startup.sizes_set()
    assert plugin.applied[-1] == ("path", Path.CORE)
    plugin.applied = []
    for step in range(3, 3 + 2 * TRIAL_STEPS):
        startup.on_step(step, now=float(step))
    assert plugin.applied == [] and plugin.settled and not startup.times_steps and plugin.plan_trial is None
