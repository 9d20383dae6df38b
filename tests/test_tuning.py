"""Tuning's decision logic without processes: the lattice, the robust measurement, the switch
messages, the CSV log, the Bayesian search and its stop rule, rank 0's trial schedule, the
configuration, and the quick run of the search-cost study."""

from __future__ import annotations

import csv
import json
import math
import time
from pathlib import Path
from typing import Callable

import numpy as np
import pytest

from bytesched.core.config import UNLIMITED, Config, ConfigError, SchedulingParams, from_env
from bytesched.tuning.log import COLUMNS, TuningLog, load_best
from bytesched.tuning.measure import StepTimer, robust_throughput
from bytesched.tuning.protocol import Applied, Switch, TuningProtocolError
from bytesched.tuning.search import MIN_INITIAL, STOP_PATIENCE, BayesianSearch
from bytesched.tuning.session import make_session
from bytesched.tuning.space import SMALLEST_FLOOR, SPACES, space_for
from bytesched.tuning.tuner import ANNOUNCE_LEAD, FixedChoice, TrialPlan, Tuner

PS = space_for("ps")


def bowl(point: tuple[int, int], best: tuple[int, int] = (5, 7)) -> float:
    """A smooth landscape (samples/s) peaking at ``best``: 1000 there, less around."""
    return 1000.0 / (1 + 0.03 * ((point[0] - best[0]) ** 2 + (point[1] - best[1]) ** 2))


# -- the lattice ---------------------------------------------------------------------------------
def test_lattice_brackets_the_papers_optima() -> None:
    """Table 1's best sizes (MB) lie inside each architecture's bounds, with room on both sides."""
    table1 = {"ps": [(6, 21), (3, 17), (5, 29)], "allreduce": [(88, 171), (56, 64), (56, 103)]}
    for arch, optima in table1.items():
        space = SPACES[arch]
        for partition, credit in optima:
            assert space.partition.low * 2 <= partition * 1e6 <= space.partition.high / 2
            assert space.credit.low * 2 <= credit * 1e6 <= space.credit.high / 2


def test_lattice_values_and_nearest() -> None:
    axis = PS.partition
    assert axis.size == 13
    assert [axis.value(i) for i in (0, 2, 6, 12)] == [500_000, 1_000_000, 4_000_000, 32_000_000]
    assert axis.value(1) == round(500_000 * math.sqrt(2))
    assert axis.nearest(4_000_000) == 6 and axis.nearest(4_500_000) == 6 and axis.nearest(5_000_000) == 7
    assert axis.nearest(1) == 0 and axis.nearest(10**12) == 12 and axis.nearest(UNLIMITED) == 12
    assert PS.nearest(SchedulingParams(None, 16_000_000), default_partition=4_000_000) == (6, 6)
    assert PS.params((6, 6)) == SchedulingParams(4_000_000, 16_000_000)
    assert len(list(PS.points())) == 169 and len(list(PS.points(2))) == 49
    with pytest.raises(ValueError, match="partition index 13"):
        axis.value(13)
    with pytest.raises(ConfigError, match="'nccl' is unknown"):
        space_for("nccl")


def test_a_backend_that_batches_searches_the_batching_threshold_too() -> None:
    """The third axis: index 0 is off (0 bytes), then 62.5 KB .. 32 MB in factor-2 steps; 0 bytes
    and sizes round trip through ``nearest``; only a backend that batches gets the axis."""
    space = space_for("allreduce", model_bytes=24_000_000, batches=True)
    assert space.shape == (13, 13, 11) and space_for("allreduce", model_bytes=24_000_000).shape == (13, 13)
    batch = space.batch
    assert batch is not None and [batch.value(i) for i in (0, 1, 2, 10)] == [0, 62_500, 125_000, 32_000_000]
    assert batch.nearest(0) == 0 and batch.nearest(1) == 1 and batch.nearest(UNLIMITED) == 10
    assert batch.nearest(250_000) == 3 and batch.nearest(10**9) == 10
    assert space.params((6, 6, 0)).batch_bytes == 0 and space.params((6, 6, 3)).batch_bytes == 250_000
    for point in [(0, 0, 0), (3, 4, 5), (12, 12, 10)]:
        assert space.nearest(space.params(point), 0) == point
    assert space.nearest(SchedulingParams(None, 16_000_000), 4_000_000)[2] == 0  # batching off by default
    assert len(list(space.points())) == 13 * 13 * 11 and len(list(space.points(2))) == 7 * 7 * 6
    assert space.describe((6, 6, 0)).endswith("no batching")
    assert space.describe((6, 6, 3)).endswith("batching under 250KB")
    with pytest.raises(ValueError, match="3-dimensional"):
        space.params((6, 6))
    session = make_session(from_env({"BYTESCHED_TUNING": "1", "BYTESCHED_BATCH_BYTES": "250KB"}), rank=0,
                           world_size=1, channel=None, arch="allreduce", model_bytes=24_000_000, batches=True)
    assert session is not None and session.on_step(0).batch_bytes == 250_000  # type: ignore[union-attr]


def test_search_finds_the_batching_plateau_of_a_three_dimensional_landscape() -> None:
    """BO over (partition, credit, batching threshold) on a landscape like the simulator's over
    torch.distributed: batching gains up to 30 % as the threshold grows, then stays flat. Every
    seed keeps a point within 3 % of the best, and none stops before 12 trials (4 per knob)."""
    space = space_for("allreduce", model_bytes=24_000_000, batches=True)

    def plateau(point: tuple[int, ...]) -> float:
        gain = 0.7 + 0.3 * min(point[2], 7) / 7
        return 1000.0 * gain / (1 + 0.03 * ((point[0] - 5) ** 2 + (point[1] - 7) ** 2))

    for seed in range(8):
        search = BayesianSearch(space, seed=seed)
        assert search.min_trials == 12
        while not search.should_stop():
            assert search.trials < 40, f"seed {seed}: no stop after 40 trials"
            point, _ = search.ask()
            assert len(point) == 3
            search.tell(point, plateau(point))
        best, _ = search.best()
        assert plateau(best) >= 0.97 * 1000, (seed, best, search.measured)
        assert search.trials >= 12
    with pytest.raises(ValueError, match="13x13x11"):
        search.tell((1, 1), 1.0)


def test_floor_moves_the_lattice_down_for_the_session() -> None:
    """BYTESCHED_TUNING_FLOOR starts both axes lower; trial 0 (the configured 4 MB / 16 MB) is
    then the nearest point of the moved lattice."""
    config = from_env({"BYTESCHED_TUNING": "1", "BYTESCHED_TUNING_FLOOR": "256KB:1MB"})
    assert config.tuning_floor == (256_000, 1_000_000)
    space = space_for("allreduce", config.tuning_floor)
    assert space.params((0, 0)) == SchedulingParams(256_000, 1_000_000)
    assert (space.partition.high, space.credit.high) == (64 * 256_000, 64 * 1_000_000)
    session = make_session(config, rank=0, world_size=1, channel=None, arch="allreduce")
    assert session is not None and session.on_step(0) == SchedulingParams(4_096_000, 16_000_000)
    for bad in ("256KB", "256KB:inf", "256KB:0", "a:1MB"):
        with pytest.raises(ConfigError, match="BYTESCHED_TUNING_FLOOR"):
            from_env({"BYTESCHED_TUNING_FLOOR": bad})


def test_a_model_smaller_than_the_lattice_moves_it_down_to_end_at_the_whole_model() -> None:
    """Without a floor, a 24 MB model searches partitions of 375 KB to 24 MB (credits keep the
    architecture's ratio); VGG16-sized models keep the paper's bounds; an explicit floor wins; a
    tiny model stops at 64 KB. The session opens at the configured sizes' nearest moved point."""
    small = space_for("allreduce", model_bytes=24_000_000)
    assert (small.partition.low, small.credit.low, small.partition.high) == (375_000, 750_000, 24_000_000)
    assert space_for("allreduce", model_bytes=553_000_000) == SPACES["allreduce"]
    ps = space_for("ps", model_bytes=24_000_000)
    assert (ps.partition.low, ps.credit.low) == (375_000, 1_500_000)
    assert space_for("ps", model_bytes=40_000_000) == SPACES["ps"]
    tiny = space_for("ps", model_bytes=100_000)
    assert (tiny.partition.low, tiny.credit.low) == (SMALLEST_FLOOR, 4 * SMALLEST_FLOOR)
    assert space_for("allreduce", (256_000, 1_000_000), model_bytes=24_000_000).partition.low == 256_000
    session = make_session(from_env({"BYTESCHED_TUNING": "1"}), rank=0, world_size=1, channel=None,
                           arch="allreduce", model_bytes=24_000_000)
    opening = small.params(small.nearest(SchedulingParams(4_000_000, 16_000_000), 4_000_000))
    assert session is not None and session.on_step(0) == opening == SchedulingParams(4_242_641, 16_970_563)


# -- measuring a trial ----------------------------------------------------------------------------
def test_robust_throughput_ignores_outlier_steps() -> None:
    steady = [0.1] * 20
    assert robust_throughput([32] * 20, steady) == pytest.approx(320.0)
    spiky = steady[:]
    spiky[3], spiky[11] = 5.0, 0.001  # a garbage-collection pause and a timer glitch
    assert robust_throughput([32] * 20, spiky) == pytest.approx(320.0)
    assert sum([32] * 20) / sum(spiky) < 100  # a plain average would be off by 3x
    with pytest.raises(ValueError, match="no step was measured"):
        robust_throughput([], [])


def test_step_timer_measures_consecutive_steps_only() -> None:
    timer = StepTimer()
    for step, now in [(0, 0.0), (1, 1.0), (2, 3.0), (5, 10.0), (6, 10.5)]:
        timer.observe(step, 8, now)
    assert timer.durations == {0: 1.0, 1: 2.0, 5: 0.5}  # nothing for the gap 2 -> 5
    assert timer.throughput(1, 6) == pytest.approx(16 / 2.5)
    assert timer.durations == {}


# -- messages -------------------------------------------------------------------------------------
def test_switch_round_trip_and_validation() -> None:
    switch = Switch(trial=3, step=150, partition=4_000_000, credit=16_000_000, next_step=200)
    assert Switch.from_body(json.loads(json.dumps(switch.to_body()))) == switch
    final = Switch(4, 200, 1, 2, None)
    assert final.final and Switch.from_body(final.to_body()) == final
    good = switch.to_body()
    bad_bodies = [
        ([], "must be a JSON object"),
        ({k: v for k, v in good.items() if k != "credit"}, r"missing \['credit'\]"),
        ({**good, "pickle": "x"}, r"unknown \['pickle'\]"),
        ({**good, "partition": "4MB"}, "partition='4MB': expected an integer"),
        ({**good, "trial": True}, "trial=True: expected an integer"),
        ({**good, "credit": 0}, "credit=0: expected 1.."),
        ({**good, "step": -1}, "step=-1"),
        ({**good, "partition": 2**60}, "partition="),
        ({**good, "next_step": 150}, "next_step=150: expected 151.."),
        ({**good, "trial": None}, "trial=None"),
        ({**good, "batch": -1}, "batch=-1: expected 0.."),
        ({k: v for k, v in good.items() if k != "batch"}, r"missing \['batch'\]"),
    ]
    for body, message in bad_bodies:
        with pytest.raises(TuningProtocolError, match=message):
            Switch.from_body(body)
    applied = Applied(rank=1, trial=3, step=150, partition=4_000_000, credit=16_000_000)
    assert Applied.from_body(applied.to_body()).agrees_with(switch)
    assert not Applied(1, 3, 151, 4_000_000, 16_000_000).agrees_with(switch)
    batched = Switch.of(3, 150, SchedulingParams(4_000_000, 16_000_000, batch_bytes=250_000), 200)
    assert batched.params.batch_bytes == 250_000 and Switch.from_body(batched.to_body()) == batched
    assert not Applied.of(1, switch, 150).agrees_with(batched)  # a rank that did not batch diverged
    assert Applied.from_body(Applied.of(1, batched, 150).to_body()).agrees_with(batched)
    with pytest.raises(TuningProtocolError, match="rank"):
        Applied.from_body({**applied.to_body(), "rank": -2})


# -- the log --------------------------------------------------------------------------------------
def test_log_is_readable_csv_and_loads_the_best(tmp_path: Path) -> None:
    path = tmp_path / "tuning.csv"
    log = TuningLog(path)
    log.trial(0, SchedulingParams(4_000_000, 16_000_000), 1210.44, 1210.44, "configured")
    log.trial(1, SchedulingParams(2_828_427, 22_627_417), 1302.0, 1302.0, "bo")
    log.trial(2, SchedulingParams(500_000, 2_000_000), 310.0, 1302.0, "bo")
    log.best(SchedulingParams(2_828_427, 22_627_417, batch_bytes=176_777), 1302.0)
    log.close()
    rows = list(csv.reader(path.open()))
    assert tuple(rows[0]) == COLUMNS
    assert rows[1] == ["0", "4.000", "16.000", "0.000", "1210.4", "1210.4", "configured"]
    assert rows[-1] == ["best", "2.828", "22.627", "0.177", "1302.0", "1302.0", "final"]
    assert load_best(path) == SchedulingParams(2_828_000, 22_627_000, batch_bytes=177_000)


def test_loading_a_cut_short_log_takes_its_fastest_trial(tmp_path: Path) -> None:
    path = tmp_path / "cut.csv"
    path.write_text(",".join(COLUMNS) + "\n0,4.000,16.000,0.000,100.0,100.0,configured\n"
                    "1,8.000,32.000,0.500,150.5,150.5,bo\n2,1.000,4.000,0.000,90.0,150.5,bo\n")
    assert load_best(path) == SchedulingParams(8_000_000, 32_000_000, batch_bytes=500_000)


def test_a_log_without_the_batching_column_loads_as_no_batching(tmp_path: Path) -> None:
    path = tmp_path / "old.csv"
    path.write_text("trial,partition_mb,credit_mb,samples_per_s,best_samples_per_s,source\n"
                    "0,4.000,16.000,100.0,100.0,configured\n1,8.000,32.000,150.5,150.5,bo\n")
    assert load_best(path) == SchedulingParams(8_000_000, 32_000_000, batch_bytes=0)


@pytest.mark.parametrize("content, message", [
    ("", "not a tuning log"),
    ("a,b,c\n", "not a tuning log"),
    (",".join(COLUMNS) + "\n", "has no trials"),
    (",".join(COLUMNS) + "\n0,four,16,0,1,1,bo\n", "line 2"),
    (",".join(COLUMNS) + "\n0,4.000,16.000,100.0\n", "line 2: expected 7 columns"),
    (",".join(COLUMNS) + "\nbest,0.000,16.000,0.000,100.0,100.0,final\n", "line 2"),
    (",".join(COLUMNS) + "\nbest,1.000,16.000,-1.000,100.0,100.0,final\n", "line 2"),
])
def test_bad_logs_are_named(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "log.csv"
    path.write_text(content)
    with pytest.raises(ConfigError, match=f"BYTESCHED_TUNING_LOAD='{path}'.*{message}"):
        load_best(path)
    with pytest.raises(ConfigError, match="cannot be read"):
        load_best(tmp_path / "missing.csv")


# -- the Bayesian search --------------------------------------------------------------------------
def test_search_tries_suggestions_first_then_a_latin_hypercube_then_bo() -> None:
    search = BayesianSearch(PS, seed=1, suggested=[(6, 6), (2, 9), (6, 6)])
    sources = []
    for _ in range(6):
        point, source = search.ask()
        sources.append((point, source) if source == "suggested" else source)
        search.tell(point, bowl(point))
    assert sources[:2] == [((6, 6), "suggested"), ((2, 9), "suggested")]
    assert sources[2:] == ["initial"] * (MIN_INITIAL - 2) + ["bo"] * (6 - MIN_INITIAL)
    with pytest.raises(ValueError, match="not a point of the ps lattice"):
        search.tell((13, 0), 1.0)
    with pytest.raises(ValueError, match="must be positive"):
        search.tell((1, 1), 0.0)


def test_search_finds_the_peak_and_stops_on_its_own() -> None:
    search = BayesianSearch(PS, seed=0)
    while not search.should_stop():
        assert search.trials < 40, f"no stop after 40 trials; gains {search.gains}"
        point, _ = search.ask()
        search.tell(point, bowl(point))
    best, speed = search.best()
    assert bowl(best) >= 0.98 * 1000, (best, search.measured)
    assert search.trials >= search.min_trials
    assert all(g < search.min_gain for g in search.gains[-STOP_PATIENCE:])


# -- rank 0's schedule ----------------------------------------------------------------------------
def drive(tuner: Tuner, steps: int, step_time: Callable[[Switch, int], float],
          samples: float = 32.0) -> list[tuple[int, Switch]]:
    """Call the tuner at every step boundary of a virtual clock; a step's time depends on the
    sizes in force (trial 0's from step 0, then the last switch whose step has come) and on how
    many steps ago they came."""
    announced: list[tuple[int, Switch]] = []
    pending: list[Switch] = []
    opening = PS.params(tuner.opening)
    now, current = 0.0, Switch(0, 0, opening.partition_bytes, opening.credit_bytes, None)
    for step in range(steps):
        switch = tuner.on_step(step, samples, now)
        if switch is not None:
            announced.append((step, switch))
            pending.append(switch)
        while pending and pending[0].step <= step:
            current = pending.pop(0)
        now += step_time(current, step - current.step)
    return announced


def test_tuner_schedule_measures_the_window_and_stops_at_max_trials(tmp_path: Path) -> None:
    plan = TrialPlan(steps_per_trial=12, warmup=3)
    assert plan.lead == ANNOUNCE_LEAD == 3
    measured: dict[int, float] = {}

    def step_time(switch: Switch, since_switch: int) -> float:
        """32 samples at the landscape's speed, 5x slower while the pipeline refills."""
        point = PS.nearest(switch.params, 4_000_000)
        return 32.0 / bowl(point) * (5.0 if since_switch < plan.warmup else 1.0)

    log_path = tmp_path / "t.csv"
    tuner = Tuner(BayesianSearch(PS, seed=3), plan, opening=(6, 6), max_trials=4, tuning_log=TuningLog(log_path))
    announced = drive(tuner, 100, step_time)
    # trial t >= 1 is announced at step 12t - lead and applies at 12t; trial 0 (the opening) is
    # not announced: every rank applies it at its first step by itself
    assert [(at, s.trial, s.step, s.next_step) for at, s in announced] == [
        (9, 1, 12, 24), (21, 2, 24, 36), (33, 3, 36, 48), (45, 4, 48, None)]
    assert tuner.search.measured[0][0] == (6, 6)
    assert tuner.finished and announced[-1][1].final
    for point, speed in tuner.search.measured:
        measured[point] = speed
        assert speed == pytest.approx(bowl(point))  # the window's steps only: no slow warm-up step
    rows = list(csv.reader(log_path.open()))
    assert [r[0] for r in rows] == ["trial", "0", "1", "2", "3", "best"]
    assert rows[1][:3] == ["0", "4.000", "16.000"] and rows[1][-1] == "configured"
    best = PS.nearest(announced[-1][1].params, 4_000_000)
    assert measured[best] == max(measured.values())


def test_tuner_fails_loudly_when_a_decision_step_is_skipped() -> None:
    tuner = Tuner(BayesianSearch(PS, seed=0), TrialPlan(10, 2), opening=(6, 6), max_trials=3)
    for step in range(7):
        tuner.on_step(step, 1, float(step))
    with pytest.raises(TuningProtocolError, match="without a call at step 7"):
        tuner.on_step(10, 1, 10.0)


def test_fixed_choice_is_announced_once_as_final_for_a_later_step() -> None:
    choice = FixedChoice(SchedulingParams(3_000_000, 20_000_000))
    assert choice.on_step(5, 1, 0.0) == Switch(0, 5 + ANNOUNCE_LEAD, 3_000_000, 20_000_000, None)
    assert choice.on_step(6, 1, 1.0) is None


# -- configuration --------------------------------------------------------------------------------
def test_tuning_variables_parse_and_name_the_culprit() -> None:
    cfg = from_env({"BYTESCHED_TUNING": "1", "BYTESCHED_TUNING_MAX_TRIALS": "8",
                    "BYTESCHED_TUNING_STEPS_PER_TRIAL": "40", "BYTESCHED_TUNING_WARMUP_STEPS": "0",
                    "BYTESCHED_TUNING_SEED": "7", "BYTESCHED_TUNING_XI": "0.05",
                    "BYTESCHED_TUNING_LOG": "/tmp/t.csv", "BYTESCHED_TUNING_LOAD": "/tmp/old.csv"})
    assert (cfg.tuning, cfg.tuning_max_trials, cfg.tuning_steps_per_trial, cfg.tuning_warmup_steps,
            cfg.tuning_seed, cfg.tuning_xi, cfg.tuning_log, cfg.tuning_load) == \
        (True, 8, 40, 0, 7, 0.05, "/tmp/t.csv", "/tmp/old.csv")
    assert from_env({"BYTESCHED_TUNING": "off"}).tuning is False
    for name, value in [("BYTESCHED_TUNING", "maybe"), ("BYTESCHED_TUNING_MAX_TRIALS", "0"),
                        ("BYTESCHED_TUNING_STEPS_PER_TRIAL", "ten"), ("BYTESCHED_TUNING_WARMUP_STEPS", "-1"),
                        ("BYTESCHED_TUNING_SEED", "1.5"), ("BYTESCHED_TUNING_XI", "-0.1"),
                        ("BYTESCHED_TUNING_XI", "nan"), ("BYTESCHED_TUNING_LOG", " ")]:
        with pytest.raises(ConfigError, match=name):
            from_env({name: value})


def test_make_session_validates_at_start_up(tmp_path: Path) -> None:
    assert make_session(Config(), rank=0, world_size=2, channel=None, arch="ps") is None
    with pytest.raises(ConfigError, match="BYTESCHED_TUNING_STEPS_PER_TRIAL=10 leaves no room"):
        make_session(Config(tuning=True, tuning_steps_per_trial=10, tuning_warmup_steps=5),
                     rank=1, world_size=2, channel=None, arch="ps")
    with pytest.raises(ConfigError, match="architecture 'nccl'"):
        make_session(Config(tuning=True), rank=0, world_size=1, channel=None, arch="nccl")
    with pytest.raises(ConfigError, match="BYTESCHED_TUNING_LOAD=.*cannot be read"):
        make_session(Config(tuning_load=str(tmp_path / "none.csv")), rank=0, world_size=1, channel=None, arch="ps")
    with pytest.raises(ConfigError, match="set BYTESCHED_TUNING_BANDWIDTH too"):
        make_session(Config(tuning=True, tuning_profile="vgg16"), rank=0, world_size=1, channel=None, arch="ps")
    with pytest.raises(ConfigError, match="BYTESCHED_TUNING_PROFILE='nomodel'"):
        make_session(Config(tuning=True, tuning_profile="nomodel", tuning_bandwidth="10Gbps"),
                     rank=0, world_size=1, channel=None, arch="ps")
    with pytest.raises(ConfigError, match="BYTESCHED_TUNING_BANDWIDTH='fast'"):
        make_session(Config(tuning=True, tuning_profile="vgg16", tuning_bandwidth="fast"),
                     rank=0, world_size=1, channel=None, arch="ps")
    with pytest.raises(ValueError, match="needs the rank-0 channel"):
        make_session(Config(tuning=True), rank=0, world_size=2, channel=None, arch="ps")


def test_single_rank_session_tunes_then_keeps_the_best(tmp_path: Path) -> None:
    """One rank (no channel): the session applies each trial and finally the best, then idles."""
    cfg = Config(tuning=True, tuning_max_trials=5, tuning_steps_per_trial=8, tuning_warmup_steps=1,
                 tuning_log=str(tmp_path / "log.csv"))
    session = make_session(cfg, rank=0, world_size=1, channel=None, arch="ps")
    assert session is not None
    applied, now, current = [], 0.0, None
    for step in range(60):
        params = session.on_step(step, 32, now)
        if params is not None:
            applied.append(step)
            current = params
        now += 32.0 / bowl(PS.nearest(current, 4_000_000))
    assert applied == [0, 8, 16, 24, 32, 40] and session.done
    assert session.final == current
    assert load_best(tmp_path / "log.csv") == SchedulingParams(
        round(current.partition_bytes, -3), round(current.credit_bytes, -3))


def test_warm_start_predictions_are_tried_after_the_configured_point() -> None:
    """With a profile and a bandwidth, rank 0 simulates in the background; once the prediction is
    ready, the tuner tries its three best points (the simulator's best on the factor-2 grid)."""
    from bytesched.sim import load_profile, make_cluster
    from bytesched.tuning.session import background_predictions
    from bytesched.tuning.predicted_points import PREDICTED_POINTS, predicted_throughput

    space = space_for("allreduce")
    cfg = Config(tuning=True, tuning_profile="vgg16", tuning_bandwidth="25Gbps")
    poll = background_predictions(cfg, space, world_size=4)
    predicted = predicted_throughput(load_profile("vgg16"), make_cluster(arch="allreduce", workers=4,
                                                                          bandwidth="25Gbps"), space)
    expected = sorted(predicted, key=lambda point: -predicted[point])[:PREDICTED_POINTS]
    deadline = time.monotonic() + 60
    while (points := poll()) is None:
        assert time.monotonic() < deadline, "the background prediction did not finish in 60 s"
        time.sleep(0.05)
    assert list(points) == expected

    configured = space.nearest(SchedulingParams(None, 64_000_000), 4_000_000)
    tuner = Tuner(BayesianSearch(space, seed=0), TrialPlan(8, 1), opening=configured, max_trials=6,
                  predictions=lambda: points)
    switches = [tuner.on_step(step, 1, float(step)) for step in range(40)]
    tried = [space.nearest(s.params, 0) for s in switches if s is not None and not s.final]
    assert tuner.search.measured[0][0] == configured  # trial 0, not announced
    assert tried[:3] == [p for p in expected if p != configured][:3]


# -- the study ------------------------------------------------------------------------------------
def test_study_quick_run_reports_every_search(capsys: pytest.CaptureFixture[str]) -> None:
    """``python -m benchmarks tuning --quick --json``: one scenario, every search, sane numbers."""
    from benchmarks.cli import main

    assert main(["tuning", "--quick", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    (scenario,) = result["scenarios"]
    assert set(scenario["methods"]) == {"bo", "bo-warm", "random", "grid", "sgd"}
    values = np.array(scenario["iterations_per_s"])
    assert values.shape == (13, 13) and (values > 0).all()
    grid_best = scenario["grid_optimum"]["iterations_per_s"]
    assert grid_best == pytest.approx(values[::2, ::2].max())
    for name, summary in scenario["methods"].items():
        assert len(summary["trials"]) == 3
        assert all(t is None or 1 <= t <= result["settings"]["cap"] for t in summary["trials"]), name
    assert all(t <= 49 for t in scenario["methods"]["grid"]["trials"])  # grid search ends on the grid
    assert 1 <= scenario["stop_rule"]["trials"]["mean"] <= 15


def test_each_bo_trial_is_the_untried_point_of_largest_expected_improvement() -> None:
    """After the Latin hypercube every proposal maximises EI (with the search's ``xi``) over the
    untried lattice points, never a measured point nor a random stand-in for one."""
    from skopt.acquisition import gaussian_ei

    search = BayesianSearch(PS, seed=3)
    for _ in range(MIN_INITIAL):
        point, _ = search.ask()
        search.tell(point, bowl(point))
    for _ in range(15):
        model = search._model()
        tried = {p for p, _ in search.measured}
        untried = [p for p in PS.points() if p not in tried]
        transform = search._optimizer.space.transform
        best_mean = float(np.min(model.predict(transform([list(p) for p in tried]))))
        gain = gaussian_ei(transform([list(p) for p in untried]), model, y_opt=best_mean, xi=search.xi)
        point, source = search.ask()
        assert source == "bo" and point == untried[int(np.argmax(gain))]
        search.tell(point, bowl(point))


def test_the_study_writes_its_docs_section_from_the_run(capsys: pytest.CaptureFixture[str]) -> None:
    from benchmarks.cli import main
    from benchmarks.tuning_study import BEGIN, END, docs_section

    assert main(["tuning", "--quick", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    section = docs_section(result)
    assert section.startswith(BEGIN) and section.endswith(END)
    (scenario,) = result["scenarios"]
    bo = scenario["methods"]["bo"]
    assert f"{bo['mean']:.1f} ± {bo['sd']:.1f} [{bo['median']:g}]" in section
    assert result["meta"]["command"].startswith("python -m benchmarks tuning")
