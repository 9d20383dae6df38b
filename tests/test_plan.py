"""The start-up plan's pieces without processes: the configuration that switches it on, the
profile it builds from the Core's observations, the calibration's arithmetic, and the course of
:class:`StartupPlan` over the steps with a recording Core and ranks. The real 2-rank jobs are in
test_torch_plan.py and test_mxnet_horovod.py."""

from __future__ import annotations

import dataclasses
import functools
import math
import re
import time
from types import SimpleNamespace
from typing import Any, Callable

import pytest

from bytesched.core import Config, ConfigError, SchedulingParams, from_env
from bytesched.core.config import STAY_OUT_FUSION_BYTES, UNLIMITED
import bytesched.runtime.startup_plan as plan_module
import bytesched.runtime.start_observer as observer_module
from bytesched.runtime.calibration import NetworkCost, large_bytes_for, measure_network
from bytesched.runtime.observed import NothingObserved, ObservedTask, StepRecorder, measured_profile
from bytesched.runtime.start_observer import CALIBRATION_ATTEMPTS
from bytesched.runtime.startup_plan import (PASSES_THROUGH_UNMEASURED, STAY_OUT, STAY_OUT_MIN_TASKS, StartupPlan,
                                    stay_out_fusion, wants_plan)
from bytesched.sim import Layer, ModelProfile, Tensor, make_cluster, run
from bytesched.sim.plan import (FINE_CREDITS, FINE_PARTITIONS, FUSION_MARGIN, PASS_THROUGH_MARGIN, SEARCH_ITERATIONS,
                                 SEARCH_WARMUP, Plan, batch_thresholds, candidate_sizes, fused_profile, fusion_pays,
                                 make_plan)


# -- when it runs -------------------------------------------------------------------------------
def test_from_env_plans_unless_told_otherwise_or_given_a_size() -> None:
    assert from_env({}).plan
    assert not from_env({"BYTESCHED_PLAN": "0"}).plan
    assert not from_env({"BYTESCHED_PARTITION_BYTES": "2MB"}).plan
    assert not from_env({"BYTESCHED_CREDIT_BYTES": "inf"}).plan
    assert not Config().plan  # a Config built in code keeps its explicit sizes
    with pytest.raises(ConfigError, match="BYTESCHED_PLAN='maybe' is not a switch"):
        from_env({"BYTESCHED_PLAN": "maybe"})


def test_a_fusion_bound_the_job_sets_is_kept_by_the_plan() -> None:
    assert not from_env({}).fusion_fixed
    assert from_env({"BYTESCHED_FUSION_BYTES": "1MB"}).fusion_fixed


@pytest.mark.parametrize("change, ranks, expected", [
    ({}, 2, True), ({}, 1, False), ({"policy": "p3"}, 2, False), ({"tuning": True}, 2, False),
    ({"tuning_load": "best.csv"}, 2, False), ({"plan": False}, 2, False)])
def test_wants_plan(change: dict[str, Any], ranks: int, expected: bool) -> None:
    assert wants_plan(dataclasses.replace(Config(plan=True), **change), ranks) is expected


# -- what it observes ---------------------------------------------------------------------------
def _sub(name: str, instance: int, t_ready: float, nbytes: int) -> Any:
    return SimpleNamespace(task=SimpleNamespace(name=name, instance=instance, t_ready=t_ready), nbytes=nbytes)


def test_recorder_sums_a_tasks_pieces_and_keeps_only_the_observed_step() -> None:
    recorder = StepRecorder()
    for sub in (_sub("a", 0, 0.5, 100), _sub("b", 0, 10.2, 40), _sub("b", 0, 10.2, 60), _sub("a", 1, 10.4, 100),
                _sub("c", 0, 20.0, 8)):
        recorder(sub)
    assert [(t.name, t.nbytes) for t in recorder.step(10.0, 20.0)] == [("b", 100), ("a", 100)]


def test_measured_profile_reads_backward_from_the_ready_times() -> None:
    """Ready at 40, 50, 70 ms after the step began: backward gaps of 10 and 20 ms (the first
    layer backward produced gets the median gap, 15 ms); the 25 ms before it are the forward
    pass, spread 15:10:20 over the layers. Forward order is the reverse of readiness."""
    tasks = [ObservedTask("head", 0.040, 400), ObservedTask("mid", 0.050, 800), ObservedTask("stem", 0.070, 6)]
    profile = measured_profile(tasks, start=0.0)
    assert [layer.name for layer in profile.layers] == ["2:stem", "1:mid", "0:head"]
    assert [round(layer.backward, 6) for layer in profile.layers] == [0.02, 0.01, 0.015]
    assert [round(layer.forward, 6) for layer in profile.layers] == [round(0.025 * b / 0.045, 6) for b in
                                                                     (0.02, 0.01, 0.015)]
    assert [t.nbytes for layer in profile.layers for t in layer.tensors] == [8, 800, 400]  # whole float32s
    assert profile.compute_time == pytest.approx(0.070)


def test_measured_profile_of_nothing_says_so() -> None:
    with pytest.raises(NothingObserved, match="no gradient was communicated"):
        measured_profile([], start=0.0)


# -- what it measures ---------------------------------------------------------------------------
def test_network_cost_reproduces_both_operations_in_the_simulators_model() -> None:
    """2 ranks: a 4-byte all-reduce of 1 ms and 10 MB in 81 ms give an overhead of 1 ms and a
    ring whose 2(n-1)/n = 1 x 10 MB take 80 ms: 125 MB/s."""
    cost = NetworkCost(0.001, 0.081, 10_000_000)
    assert cost.simulator_options("allreduce", 2) == {"overhead": 0.001, "latency": 0.0,
                                                       "bandwidth": pytest.approx(125e6)}
    with pytest.raises(ValueError, match="calibration is inconsistent"):
        NetworkCost(0.01, 0.001, 10)


def test_large_operation_is_the_model_within_bounds() -> None:
    assert large_bytes_for(100) == 4_000_000
    assert large_bytes_for(8_800_002) == 8_800_000
    assert large_bytes_for(10**9) == 16_000_000


class FakeClock:
    """The calibration's clock in these tests: the timed operations advance it by what they cost,
    so no test times the machine."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


CLOCK = FakeClock()


@pytest.fixture(autouse=True)
def calibration_on_the_fake_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(observer_module, "measure_network", functools.partial(measure_network, clock=CLOCK))


def _costing(seconds: list[float]) -> Callable[[], None]:
    """An operation whose calls cost ``seconds`` in turn, on the fake clock."""
    costs = iter(seconds)

    def call() -> None:
        CLOCK.now += next(costs)
    return call


def test_measure_network_interleaves_the_sizes_and_keeps_each_ones_fastest() -> None:
    """One untimed call of each size, then three rounds of five small and one large; a burst of
    load that slows some samples of both (here the first round) leaves the figures alone."""
    calls: list[int] = []
    small = _costing([0.050] + [0.0088] * 5 + [0.0012, 0.0011, 0.0013, 0.0010, 0.0014] * 2)
    large = _costing([0.200, 0.0046, 0.0402, 0.0400])

    def operation(nbytes: int) -> Callable[[], None]:
        run = small if nbytes == 4 else large
        return lambda: (calls.append(nbytes), run())

    cost = measure_network(operation, large_bytes=1_000_000, clock=CLOCK)
    rounds = ([4] * 5 + [1_000_000]) * 3
    assert calls == [4, 1_000_000, *rounds]
    assert (cost.fixed_seconds, cost.large_seconds) == (pytest.approx(0.0010), pytest.approx(0.0046))


def _timed_attempts(attempts: list[tuple[float, float]]) -> Callable[[int], Callable[[], None]]:
    """A backend whose operations cost ``(small, large)`` seconds, one pair per calibration attempt
    (16 small and 4 large calls each), on the fake clock."""
    small = _costing([cost for fixed, _ in attempts for cost in [fixed] * 16])
    large = _costing([cost for _, big in attempts for cost in [big] * 4])
    return lambda nbytes: small if nbytes == 4 else large


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


# -- its course over the steps ------------------------------------------------------------------
class RecordingCore:
    order = "immediate"

    def __init__(self) -> None:
        self.observer: Callable[[Any], None] | None = None
        self.switches: list[Any] = []

    def observe(self, observer: Callable[[Any], None] | None) -> None:
        self.switches.append(observer)
        self.observer = observer

    def wait_idle(self, timeout: float) -> bool:
        return True


class BroadcastingRanks:
    """Rank ``rank`` of 2; broadcast_int returns ``answers`` in turn (rank 0's values)."""

    def __init__(self, rank: int, answers: list[int] | None = None) -> None:
        self.rank, self.size, self.order = rank, 2, "immediate"
        self.sent: list[int] = []
        self._answers = answers

    def barrier(self) -> None:
        pass

    def broadcast_int(self, value: int) -> int:
        self.sent.append(value)
        return self._answers.pop(0) if self._answers is not None else value


def _timed(fixed: float, large: float) -> Callable[[int], Callable[[], None]]:
    """A backend whose 4-byte operation costs ``fixed`` seconds and any other ``large``, on the
    fake clock."""
    def cost(seconds: float) -> None:
        CLOCK.now += seconds
    return lambda nbytes: (lambda: cost(fixed if nbytes == 4 else large))


def _observed_step(core: RecordingCore) -> None:
    """What the Core hands the observer in a step: eight 4 MB gradients, 2 ms of backward apart."""
    for i in range(8):
        _spin(0.002)
        core.observer(_sub(f"g{i}", 1, time.monotonic(), 4_000_000))  # type: ignore[misc]


def test_rank0_plans_from_the_observed_step_and_broadcasts_its_choice() -> None:
    core, ranks, drains = RecordingCore(), BroadcastingRanks(0), []
    plan = StartupPlan(core, ranks, _timed(0.0002, 0.004), arch="allreduce", model_bytes=32_000_000,
                       drain=lambda: drains.append(1))
    assert plan.on_step(0) == STAY_OUT and not drains
    assert plan.on_step(1) is None and drains == [1] and core.observer is not None
    _observed_step(core)
    params = plan.on_step(2)
    assert drains == [1, 1] and core.switches[-1] is None and plan.done
    assert params == plan.outcome.params and plan.outcome.step == 2  # type: ignore[union-attr]
    encoded = [0 if s == UNLIMITED else s for s in (params.partition_bytes, params.credit_bytes)]  # type: ignore[union-attr]
    # no batching (0), the plugin keeps its fusion (0: it offered none); then whether to pass through
    assert ranks.sent == [1, *encoded, 0, 0, int(plan.outcome.passes_through)]  # type: ignore[union-attr]
    assert "measured 8 gradients (32.0 MB" in plan.outcome.summary  # type: ignore[union-attr]
    assert plan.outcome.fusion_bytes is None  # type: ignore[union-attr]
    assert plan.on_step(3) is None


def _planned(rank: int, ranks: BroadcastingRanks, fusion_bytes: float | None, fixed: float = 0.020,
             large: float = 0.030, model_bytes: int = 200_000_000, weighs_fusion: bool = False) -> StartupPlan:
    """A plan run through steps 0-2 (rank 0 observes eight 4 MB gradients); by default on a
    network whose every all-reduce costs 20 ms fixed, where it stays out of the way."""
    core = RecordingCore()
    bound = None if fusion_bytes is None else stay_out_fusion(model_bytes, fusion_bytes, STAY_OUT_FUSION_BYTES)
    plan = StartupPlan(core, ranks, _timed(fixed, large), arch="allreduce", model_bytes=model_bytes,
                       drain=lambda: None, stay_out_bound=bound, weighs_fusion=weighs_fusion)
    plan.on_step(0)
    plan.on_step(1)
    if rank == 0:
        _observed_step(core)
    plan.on_step(2)
    return plan


def test_staying_out_fuses_the_plugins_gradients_into_larger_tasks() -> None:
    """A plugin that can fuse further (1 MB buckets) is told to fuse up to DDP's 25 MB where the
    plan stays out; the bound travels with the sizes, and the log line says so."""
    ranks = BroadcastingRanks(0)
    outcome = _planned(0, ranks, fusion_bytes=1_000_000).outcome
    assert outcome is not None and outcome.params == STAY_OUT and outcome.fusion_bytes == STAY_OUT_FUSION_BYTES
    assert ranks.sent == [1, 0, 0, 0, STAY_OUT_FUSION_BYTES, int(outcome.passes_through)]
    assert outcome.summary.endswith("; gradients fused into tasks filled to 25MB")


def test_weighing_fuses_where_the_simulator_predicts_the_step_no_slower() -> None:
    """On the network whose every all-reduce costs 20 ms fixed and communication hides behind the
    backward pass, fewer tasks (the eight 4 MB gradients of a 32 MB model in pairs, a quarter of it
    each, but the first) are predicted no slower: the plan fuses and says what it predicted."""
    ranks = BroadcastingRanks(0)
    outcome = _planned(0, ranks, fusion_bytes=1_000_000, model_bytes=32_000_000, weighs_fusion=True).outcome
    assert outcome is not None and outcome.fusion_bytes == 8_000_000
    assert re.search(r"; gradients fused into tasks filled to 8MB "
                     r"\(predicted \d\.\d\dx the time in the observed tasks\)$", outcome.summary), outcome.summary


def test_weighing_keeps_the_tasks_where_fusing_is_predicted_to_cost(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where fused tasks are predicted to slow the step (communication starting later), a plan that
    stays out keeps the plugin's tasks, tells every rank so, and says why."""
    monkeypatch.setattr(plan_module, "fusion_pays", lambda plan, profile, cluster, bound: (False, 1.07))
    ranks = BroadcastingRanks(0)
    plan = _planned(0, ranks, fusion_bytes=1_000_000, weighs_fusion=True)
    assert plan.outcome is not None and plan.outcome.params == STAY_OUT and plan.outcome.fusion_bytes is None
    assert ranks.sent[4] == 0 and plan.stay_out_fusion is None
    assert plan.outcome.summary.endswith(
        "; the observed tasks kept (fused into tasks filled to 25MB: predicted 1.07x their time)")


def test_fused_profile_merges_as_the_plugin_merges_its_buckets() -> None:
    """The first layer stays alone, the others merge in runs closed once they hold the bound; a merged layer's
    gradient is ready when its first member's is (the last in backward), one tensor of them all."""
    tasks = [ObservedTask(f"g{i}", 0.05 + 0.02 * i, 4_000_000) for i in range(8)]
    profile = measured_profile(tasks, start=0.0)
    fused = fused_profile(profile, 12_000_000)
    assert [(layer.name, layer.nbytes, len(layer.tensors)) for layer in fused.layers] == \
        [("7:g7", 4_000_000, 1), ("6:g6+2", 12_000_000, 1), ("3:g3+2", 12_000_000, 1), ("0:g0", 4_000_000, 1)]
    assert fused.layers[1].backward == pytest.approx(sum(layer.backward for layer in profile.layers[1:4]))
    assert fused.compute_time == pytest.approx(profile.compute_time) and fused.nbytes == profile.nbytes


def test_fusion_pays_where_communication_hides_behind_backward_and_not_where_it_lasts_as_long() -> None:
    """Eight 4 MB gradients 20 ms of backward apart: where 4 MB take 4 ms, fused tasks of 12 MB
    still hide (predicted within 1 %); where they take 20 ms, the merged ones start later and the
    step is predicted longer."""
    tasks = [ObservedTask(f"g{i}", 0.05 + 0.02 * i, 4_000_000) for i in range(8)]
    profile = measured_profile(tasks, start=0.0)

    def cluster(large: float) -> Any:
        return make_cluster(arch="allreduce", workers=2, bucket_bytes=0,
                            **NetworkCost(0.0002, large, 16_000_000).simulator_options("allreduce", 2))

    fast, slow = cluster(0.016), cluster(0.080)
    assert fusion_pays(make_plan(profile, fast), profile, fast, 12_000_000)[0]
    pays, ratio = fusion_pays(make_plan(profile, slow), profile, slow, 12_000_000)
    assert not pays and ratio > 1 + FUSION_MARGIN


def test_a_smaller_model_is_fused_into_at_least_four_tasks() -> None:
    """32 MB of gradients: tasks of up to 8 MB, so communication still overlaps backward."""
    ranks = BroadcastingRanks(0)
    outcome = _planned(0, ranks, fusion_bytes=1_000_000, model_bytes=32_000_000).outcome
    assert outcome is not None and outcome.fusion_bytes == 32_000_000 // STAY_OUT_MIN_TASKS == 8_000_000


@pytest.mark.parametrize("fusion_bytes, model_bytes", [(None, 200_000_000), (STAY_OUT_FUSION_BYTES, 200_000_000),
                                                       (64_000_000, 200_000_000), (1_000_000, 4_000_000)])
def test_a_plugin_that_cannot_or_need_not_fuse_further_keeps_its_tasks(fusion_bytes: float | None,
                                                                       model_bytes: int) -> None:
    """No bound offered (PyTorch on the CPU, a bound the job set, MXNet), one already as large, or
    a model too small to make four tasks of more than the plugin's own bound."""
    ranks = BroadcastingRanks(0)
    outcome = _planned(0, ranks, fusion_bytes=fusion_bytes, model_bytes=model_bytes).outcome
    assert outcome is not None and outcome.params == STAY_OUT and outcome.fusion_bytes is None
    assert ranks.sent[4] == 0


def test_a_sized_plan_keeps_the_plugins_tasks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Partitions and credit schedule the tasks as they are: only staying out fuses them. Rank 0's
    simulation is replaced by one that picks sizes, so that how busy the machine is while the
    step is observed cannot change the choice."""
    sized = SchedulingParams(partition_bytes=1_000_000, credit_bytes=2_000_000)
    monkeypatch.setattr(plan_module, "make_plan", lambda *args, **options: Plan("bytescheduler", sized, 1.0, 1.2, 1.0))
    ranks = BroadcastingRanks(0)
    plan = _planned(0, ranks, fusion_bytes=1_000_000)
    outcome = plan.outcome
    assert outcome is not None and outcome.params == sized and outcome.fusion_bytes is None
    # The bound that goes with staying out still travels, for a trial's steps staying out.
    assert not outcome.passes_through and ranks.sent == [1, 1_000_000, 2_000_000, 0, STAY_OUT_FUSION_BYTES, 0]
    assert plan.stay_out_fusion == STAY_OUT_FUSION_BYTES


def test_a_follower_fuses_as_rank0_said() -> None:
    outcome = _planned(1, BroadcastingRanks(1, answers=[1, 0, 0, 0, 25_000_000, 1]), fusion_bytes=1_000_000).outcome
    assert outcome is not None and outcome.fusion_bytes == 25_000_000 and outcome.passes_through and outcome.measured
    assert outcome.summary == ("rank 0's plan: no partitioning, no credit limit, gradients fused into tasks filled to "
                               "25MB, passing through")


def test_a_follower_hears_that_rank0_measured_nothing() -> None:
    answers = [1, 0, 0, 0, 0, PASSES_THROUGH_UNMEASURED]
    outcome = _planned(1, BroadcastingRanks(1, answers=answers), fusion_bytes=None).outcome
    assert outcome is not None and outcome.passes_through and not outcome.measured


def test_a_follower_applies_what_rank0_broadcast() -> None:
    core = RecordingCore()
    plan = StartupPlan(core, BroadcastingRanks(1, answers=[1, 1_000_000, 0, 0, 0, 0]), _timed(0.0001, 0.001),
                       arch="allreduce", model_bytes=1_000_000, drain=lambda: None)
    plan.on_step(0)
    plan.on_step(1)
    params = plan.on_step(2)
    assert (params.partition_bytes, params.credit_bytes) == (1_000_000, math.inf)  # type: ignore[union-attr]
    assert plan.outcome.summary == "rank 0's plan: 1MB partitions, inf credit"  # type: ignore[union-attr]


def test_rank0_with_nothing_observed_stays_out_and_says_why(caplog: pytest.LogCaptureFixture) -> None:
    plan = StartupPlan(RecordingCore(), BroadcastingRanks(0), _timed(0.0001, 0.001), arch="allreduce",
                       model_bytes=1_000_000, drain=lambda: None)
    plan.on_step(0)
    plan.on_step(1)
    assert plan.on_step(2) == STAY_OUT
    assert "no gradient was communicated in the observed step" in caplog.text


def test_figures_rank0_finds_inconsistent_are_timed_again_on_every_rank() -> None:
    """A loaded machine timed the 4-byte all-reduce at 8.8 ms and 16 MB at 4.6 ms: rank 0 says so
    (0), every rank times both again, and the plan is made from the second attempt's figures."""
    attempts = [(0.0088, 0.0046), (0.0002, 0.004)]
    core, ranks = RecordingCore(), BroadcastingRanks(0)
    plan = StartupPlan(core, ranks, _timed_attempts(attempts), arch="allreduce", model_bytes=32_000_000,
                       drain=lambda: None)
    plan.on_step(0)
    plan.on_step(1)
    _observed_step(core)
    plan.on_step(2)
    assert ranks.sent[:2] == [0, 1]
    assert "the all-reduce (4 B in 0.20 ms, 16 MB in 4.0 ms)" in plan.outcome.summary  # type: ignore[union-attr]


def test_a_follower_times_again_when_rank0_says_so_whatever_its_own_figures() -> None:
    ranks = BroadcastingRanks(1, answers=[0, 1, 1_000_000, 0, 0, 0, 0])
    plan = StartupPlan(RecordingCore(), ranks, _timed_attempts([(0.0002, 0.004), (0.0002, 0.004)]),
                       arch="allreduce", model_bytes=1_000_000, drain=lambda: None)
    plan.on_step(0)
    plan.on_step(1)
    assert plan.on_step(2).partition_bytes == 1_000_000  # type: ignore[union-attr]
    assert ranks.sent[:2] == [1, 1]


def test_figures_inconsistent_in_every_attempt_leave_the_plan_out_of_the_way(caplog: pytest.LogCaptureFixture) -> None:
    ranks = BroadcastingRanks(0)
    plan = StartupPlan(RecordingCore(), ranks, _timed_attempts([(0.0088, 0.0046)] * CALIBRATION_ATTEMPTS),
                       arch="allreduce", model_bytes=32_000_000, drain=lambda: None)
    plan.on_step(0)
    plan.on_step(1)
    assert plan.on_step(2) == STAY_OUT and not plan.outcome.measured  # type: ignore[union-attr]
    assert ranks.sent[:CALIBRATION_ATTEMPTS] == [0] * CALIBRATION_ATTEMPTS
    assert f"expected 0 < small < large) in {CALIBRATION_ATTEMPTS} attempts" in caplog.text


def test_a_plan_first_told_of_a_later_step_is_a_usage_error() -> None:
    plan = StartupPlan(RecordingCore(), BroadcastingRanks(0), _timed(0.0001, 0.001), arch="allreduce",
                       model_bytes=1_000_000, drain=lambda: None)
    with pytest.raises(RuntimeError, match="first told of step 5"):
        plan.on_step(5)


def test_the_simulator_keeps_out_of_the_way_where_messages_cost_more_than_they_save() -> None:
    """The same observed step on a network whose every all-reduce costs 20 ms fixed: partitions
    only add messages, so the plan stays out; on a slow link with cheap messages it schedules."""
    tasks = [ObservedTask(f"g{i}", 0.05 + 0.02 * i, 4_000_000) for i in range(8)]
    profile = measured_profile(tasks, start=0.0)
    costly = make_cluster(arch="allreduce", workers=2, bucket_bytes=0,
                          **NetworkCost(0.020, 0.030, 16_000_000).simulator_options("allreduce", 2))
    assert make_plan(profile, costly).policy == "fifo"
    slow = make_cluster(arch="allreduce", workers=2, bucket_bytes=0,
                        **NetworkCost(0.0002, 0.130, 16_000_000).simulator_options("allreduce", 2))
    chosen = make_plan(profile, slow)
    assert chosen.policy == "bytescheduler" and chosen.predicted_speedup > 1.01
    assert run(profile, slow, "bytescheduler", chosen.params).iteration_time < \
        run(profile, slow, "fifo", STAY_OUT).iteration_time


def test_a_parameter_servers_plan_also_weighs_partitions_below_a_megabyte_on_a_small_model() -> None:
    """24 MB of gradients (48 of 500 KB over 190 ms of backward) on 4 workers and 4 servers, 16 MB
    pushed and pulled in 0.4 s: the plan also weighs 250 and 500 KB partitions there, and chooses
    one, predicted faster than every megabyte partition. All-reduce, and a model of 600 MB on the
    same servers, keep the 24 megabyte candidates."""
    small = measured_profile([ObservedTask(f"g{i}", 0.05 + 0.004 * i, 500_000) for i in range(48)], start=0.0)
    large = measured_profile([ObservedTask(f"g{i}", 0.05 + 0.004 * i, 12_500_000) for i in range(48)], start=0.0)
    network = NetworkCost(0.0008, 0.4, 16_000_000)
    ps = make_cluster(arch="ps", workers=4, servers=4, **network.simulator_options("ps", 4, 4))
    ring = make_cluster(arch="allreduce", workers=4, **network.simulator_options("allreduce", 4))
    megabyte = candidate_sizes()
    assert len(megabyte) == 24 and min(p.partition_bytes for p in megabyte) == 1_000_000
    assert candidate_sizes(small, ring) == candidate_sizes(large, ps) == megabyte
    fine = candidate_sizes(small, ps)[len(megabyte):]
    assert candidate_sizes(small, ps)[:len(megabyte)] == megabyte
    assert fine == [SchedulingParams(partition_bytes=p, credit_bytes=c) for p in FINE_PARTITIONS for c in FINE_CREDITS]
    chosen = make_plan(small, ps)
    assert chosen.policy == "bytescheduler" and chosen.params.partition_bytes in FINE_PARTITIONS
    best_megabyte = min(run(small, ps, "bytescheduler", p, iterations=SEARCH_ITERATIONS, warmup=SEARCH_WARMUP)
                        .iteration_time for p in megabyte)
    assert chosen.search_iteration_time < best_megabyte


def test_staying_out_passes_through_only_where_no_size_is_predicted_to_pay() -> None:
    """The same observed step (160 ms of backward, eight 4 MB gradients), held to a bar no size
    meets: on a slow link sizes are predicted to gain, communication is exposed, and the job stays
    on bytesched's path (which crosses the barrier); on a fast one nothing is, and it passes
    through."""
    tasks = [ObservedTask(f"g{i}", 0.05 + 0.02 * i, 4_000_000) for i in range(8)]
    profile = measured_profile(tasks, start=0.0)
    never_sized = 0.99  # a sized plan would need to be predicted 100x faster

    def planned(large_seconds: float, **margin: float) -> Plan:
        network = NetworkCost(0.0002, large_seconds, 16_000_000)
        return make_plan(profile, make_cluster(arch="allreduce", workers=2,
                                               **network.simulator_options("allreduce", 2)), never_sized, **margin)

    slow, fast = planned(0.130), planned(0.002)
    assert slow.policy == fast.policy == "fifo"
    assert slow.sized_gain > 1 + PASS_THROUGH_MARGIN and not slow.passes_through
    assert fast.sized_gain < 1 + PASS_THROUGH_MARGIN and fast.passes_through
    # The PyTorch plugin on a GPU: staying out always passes through.
    assert planned(0.130, pass_through_margin=math.inf).passes_through


def test_a_rank0_that_cannot_plan_passes_through(caplog: pytest.LogCaptureFixture) -> None:
    """Nothing measured, nothing predicted: the job runs as it would without bytesched, and says
    so to every rank (the last value sent), so that no plugin times its paths on nothing."""
    ranks = BroadcastingRanks(0)
    plan = StartupPlan(RecordingCore(), ranks, _timed(0.0001, 0.001), arch="allreduce", model_bytes=1_000_000,
                       drain=lambda: None)
    for step in range(3):
        plan.on_step(step)
    assert ranks.sent == [1, 0, 0, 0, 0, PASSES_THROUGH_UNMEASURED]
    assert plan.outcome is not None and plan.outcome.passes_through and not plan.outcome.measured
    assert plan.outcome.summary.endswith("; passing through")


def test_no_optimizer_joins_a_core_while_it_is_in_its_agreed_sequence() -> None:
    """A sequence covers the tasks of the optimizer that agreed it: another optimizer asking for
    the same Core meanwhile is refused with the way out, instead of issuing collectives outside
    the sequence; once the Core left the sequence (that optimizer closed), it is served."""
    from bytesched.core import init, shutdown
    from bytesched.runtime import start_core

    config = Config(fault_timeout_s=0.0)
    core = init(config, rank=0, order="immediate")
    try:
        core.start_in_sequence(["fc", "conv"])
        with pytest.raises(RuntimeError, match="create every ScheduledOptimizer before the first step"):
            start_core(config, BroadcastingRanks(0))
        core.restore_order()
        assert core.start_order == "immediate" and start_core(config, BroadcastingRanks(0)) is core
    finally:
        shutdown()


@pytest.mark.parametrize("arch, order, tries, margin", [
    ("allreduce", "immediate", False, 0.01), ("allreduce", "rank0", False, 0.2), ("allreduce", "rank0", True, 0.05),
    ("ps", "rank0", True, 0.05)])
def test_followers_waiting_for_rank0s_order_need_a_larger_predicted_gain(
        arch: str, order: str, tries: bool, margin: float, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where every partition also waits for rank 0's announcement (torch.distributed), which the
    simulator does not model, an untried sized plan must be predicted 25 % faster than staying
    out, a tried one 5 % (the trial keeps it only if it ran faster); on a parameter server, whose
    pushes wait for every worker anyway, 5 %."""
    import bytesched.runtime.startup_plan as plan_module

    margins: list[float] = []
    monkeypatch.setattr(plan_module, "make_plan", lambda profile, cluster, margin, through, **options:
                        margins.append(margin) or make_plan(profile, cluster, margin, through, **options))
    core = RecordingCore()
    core.order = order  # type: ignore[misc]
    ps = {"servers": 2, "bigarray_bound": 1_000_000} if arch == "ps" else {}
    plan = StartupPlan(core, BroadcastingRanks(0), _timed(0.0002, 0.004), arch=arch,
                       model_bytes=32_000_000, drain=lambda: None, tries_sizes=tries, **ps)
    plan.on_step(0)
    plan.on_step(1)
    _observed_step(core)
    plan.on_step(2)
    assert margins == [margin]


@pytest.mark.parametrize("fuses_submitted, threshold", [(True, 128 * 2**20), (False, 0)])
def test_the_plan_simulates_the_fusion_of_the_backend_it_runs_on(fuses_submitted: bool, threshold: float,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Over Horovod, whose cycle fuses what is submitted together, the plan's cluster fuses too;
    over torch.distributed, where every partition is a collective of its own, it fuses nothing."""
    import bytesched.runtime.startup_plan as plan_module

    clusters: list[Any] = []
    monkeypatch.setattr(plan_module, "make_plan", lambda profile, cluster, margin, through, **options:
                        clusters.append(cluster) or make_plan(profile, cluster, margin, through, **options))
    core = RecordingCore()
    plan = StartupPlan(core, BroadcastingRanks(0), _timed(0.0002, 0.004), arch="allreduce", model_bytes=32_000_000,
                       drain=lambda: None, fuses_submitted=fuses_submitted)
    plan.on_step(0)
    plan.on_step(1)
    _observed_step(core)
    plan.on_step(2)
    assert [cluster.fusion_threshold for cluster in clusters] == [threshold]


def test_the_plan_row_keeps_the_framework_path_where_the_runtime_times_it() -> None:
    """A parameter server's plan is tried against passing through, so the simulated plan row is never
    slower than vanilla there, even where every size the plan weighs is (ResNet50 on 4 GPU-class
    workers at 40 Gbit/s: the plan's 4 MB / 32 MB runs at 0.95x vanilla)."""
    from bytesched.sim import load_profile, simulate
    from bytesched.sim.plan import keeps_the_faster_path, make_plan

    profile, cluster = load_profile("resnet50-h100-bf16"), make_cluster(arch="ps", workers=4, bandwidth="40Gbps")
    chosen = make_plan(profile, cluster)
    assert chosen.policy == "bytescheduler" and keeps_the_faster_path(chosen, cluster)
    prediction = simulate(profile, policies="plan", cluster=cluster).predictions[0]
    sized = run(profile, cluster, chosen.policy, chosen.params).iteration_time
    assert prediction.vanilla.iteration_time < sized
    assert prediction.result("plan").speedup == pytest.approx(1.0)
    assert not keeps_the_faster_path(chosen, make_cluster(arch="allreduce", workers=4))


def test_the_batching_threshold_is_where_the_fixed_cost_stops_dominating() -> None:
    """f(d) = 1 ms + d / 125 MB/s: two pieces of x sent as one cost over 0.8 of sending them
    apart from x = 1.5 a / b = 187.5 KB on."""
    assert NetworkCost(0.001, 0.081, 10_000_000).batch_threshold() == 187_500


def _small_gradients(core: RecordingCore, count: int = 60) -> None:
    """What the Core hands the observer in a step: ``count`` 16 KB gradients, 0.1 ms apart."""
    for i in range(count):
        core.observer(_sub(f"g{i}", 1, 0.001 + 1e-4 * i, 16_000))  # type: ignore[misc]


@pytest.mark.parametrize("batches", [True, False])
def test_a_backend_that_batches_has_the_plan_weigh_batching_with_every_size(
        batches: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Sixty 16 KB gradients over a backend that runs every collective alone at 5 ms fixed cost:
    the plan weighs each size with batching under the calibration's threshold and under the
    model's 960 KB too, and picks a batched one, which every rank receives (the third value
    sent). A backend that does not batch weighs no threshold."""
    weighed: list[tuple[float, ...]] = []
    monkeypatch.setattr(plan_module, "make_plan", lambda *args, batch_thresholds=(), **options: weighed.append(
        tuple(batch_thresholds)) or make_plan(*args, batch_thresholds=batch_thresholds, **options))
    monkeypatch.setattr(time, "monotonic", lambda: 0.0)
    core, ranks = RecordingCore(), BroadcastingRanks(0)
    plan = StartupPlan(core, ranks, _timed(0.005, 0.15), arch="allreduce", model_bytes=960_000,
                       drain=lambda: None, batches=batches, fuses_submitted=False)
    plan.on_step(0)
    plan.on_step(1)
    _small_gradients(core)
    monkeypatch.setattr(time, "monotonic", lambda: 0.02)
    params = plan.on_step(2)
    threshold = NetworkCost(0.005, 0.15, 4_000_000).batch_threshold()
    if not batches:
        assert weighed == [()] and (params is None or not params.batch_bytes)
        return
    assert weighed == [(threshold, 960_000.0)]
    assert params is not None and params.batch_bytes in (threshold, 960_000)
    assert ranks.sent[3] == params.batch_bytes
    assert "while busy" in plan.outcome.summary  # type: ignore[union-attr]


def test_the_plan_weighs_batching_like_sizes_and_keeps_it_only_where_it_pays() -> None:
    """Batching is a candidate of the search, not an afterthought to sizes: on sixty small
    gradients where each collective pays 5 ms, every size alone stays out (each piece pays the
    fixed cost) and batching wins; where the fixed cost is negligible, no threshold is chosen."""
    profile = ModelProfile("small", tuple(Layer(f"l{i}", forward=0.001, backward=0.001,
                                                tensors=(Tensor(f"t{i}", 16_000),)) for i in range(60)))
    costly = make_cluster(arch="allreduce", workers=4, bandwidth="1Gbps", overhead="5ms", fusion_threshold=0)
    assert make_plan(profile, costly).policy == "fifo"
    thresholds = batch_thresholds(200_000, profile)
    assert thresholds == (200_000, 960_000.0)
    chosen = make_plan(profile, costly, batch_thresholds=thresholds)
    assert chosen.policy == "bytescheduler" and chosen.params.batch_bytes in thresholds
    assert "while busy" in chosen.describe()
    cheap = make_cluster(arch="allreduce", workers=4, bandwidth="1Gbps", overhead="1us", fusion_threshold=0)
    assert not make_plan(profile, cheap, batch_thresholds=thresholds).params.batch_bytes
    assert batch_thresholds(0, profile) == (960_000.0,)
