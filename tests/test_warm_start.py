"""Tuning's warm start from the job's own step (bytesched.runtime.tuning_warm_start): what it measures on
every rank, what rank 0 predicts from it, and how the tuning session takes the points."""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any, Callable

import pytest

from bytesched.core import Config
from bytesched.runtime import PathAdapter, Startup, StartupController
from bytesched.runtime.tuning_warm_start import TuningWarmStart, wants_warm_start
from bytesched.tuning import make_session
from bytesched.tuning.space import space_for
from test_plan import BroadcastingRanks, RecordingCore, _observed_step, _timed, calibration_on_the_fake_clock  # noqa: F401 (an autouse fixture: the calibration runs on the fake clock)

TUNING = dataclasses.replace(Config(), tuning=True)


def _warm(rank: int, operation: Callable[[int], Callable[[], None]] | None = None,
          ) -> tuple[TuningWarmStart, RecordingCore, BroadcastingRanks]:
    core, ranks = RecordingCore(), BroadcastingRanks(rank)
    warm = TuningWarmStart(core, ranks, operation or _timed(0.0002, 0.004), arch="allreduce",
                           model_bytes=32_000_000, drain=lambda: None)
    return warm, core, ranks


def _wait_for(poll: Callable[[], Any], timeout: float = 60.0) -> Any:
    end = time.monotonic() + timeout
    while (answer := poll()) is None:
        assert time.monotonic() < end, "no predictions within the timeout"
        time.sleep(0.05)
    return answer


def test_it_measures_like_the_plan_but_switches_nothing_and_broadcasts_only_the_calibrations_verdict(
        caplog: pytest.LogCaptureFixture) -> None:
    """Steps 0 and 1 keep the tuner's sizes; at step 2 rank 0 has the observed step on the timed
    network, logs it, and predicts the best points of the tuner's own lattice from it."""
    warm, core, ranks = _warm(0)
    space = space_for("allreduce", model_bytes=32_000_000)
    poll = warm.predictions(space, "bytescheduler")
    with caplog.at_level(logging.INFO, logger="bytesched"):
        assert warm.on_step(0) is None and poll() is None
        assert warm.on_step(1) is None and core.observer is not None
        _observed_step(core)
        assert warm.on_step(2) is None
    assert warm.done and warm.outcome is None and core.switches[-1] is None and ranks.sent == [1]
    assert "bytesched tuning: warm start measured 8 gradients (32.0 MB" in caplog.text
    points = _wait_for(poll)
    assert len(points) == 3 and len(set(points)) == 3 and all(point in set(space.points()) for point in points)


def test_a_follower_times_the_backend_with_rank0_and_predicts_nothing() -> None:
    sizes: list[int] = []

    def operation(nbytes: int) -> Callable[[], None]:
        sizes.append(nbytes)
        return lambda: None
    warm, _, ranks = _warm(1, operation)
    for step in range(3):
        assert warm.on_step(step) is None
    assert warm.done and sizes and 4 in sizes and ranks.sent == [1]


def test_a_failed_timing_costs_the_warm_start_not_the_job(caplog: pytest.LogCaptureFixture) -> None:
    def failing(nbytes: int) -> Callable[[], None]:
        def call() -> None:
            raise RuntimeError("the all-reduce failed (injected by the test)")
        return call
    warm, core, _ = _warm(0, failing)
    poll = warm.predictions(space_for("allreduce", model_bytes=32_000_000), "bytescheduler")
    warm.on_step(0)
    warm.on_step(1)
    _observed_step(core)
    with caplog.at_level(logging.WARNING, logger="bytesched"):
        assert warm.on_step(2) is None
    assert "no warm start from the observed step: timing the backend's all-reduce failed" in caplog.text
    assert poll() == ()


def test_a_startup_runs_it_beside_the_tuning_session_without_a_plan() -> None:
    warm, core, _ = _warm(0)
    plugin = PathAdapter()  # every hook refuses: the warm start switches nothing
    plugin._startup = startup = Startup(plugin, StartupController(), planning=warm)
    startup.on_step(0)
    startup.on_step(1)
    _observed_step(core)
    startup.on_step(2)
    assert startup.planning is None and plugin.plan is None and not startup.active and plugin.settled


@pytest.mark.parametrize("changes, world_size, wanted", [
    ({}, 2, True),
    ({}, 1, False),
    ({"tuning": False}, 2, False),
    ({"plan": False, "tuning_load": "best.csv"}, 2, True),  # explicit sizes: only the opening trial's
    ({"tuning": False, "tuning_load": "best.csv"}, 2, False),
    ({"tuning_profile": "vgg16", "tuning_bandwidth": "10Gbps"}, 2, False),
])
def test_it_runs_for_tuned_multi_rank_jobs_without_a_stated_profile(changes: dict[str, Any], world_size: int,
                                                                   wanted: bool) -> None:
    assert wants_warm_start(dataclasses.replace(TUNING, **changes), world_size) is wanted


def test_rank0s_tuner_tries_the_predicted_points_after_its_opening_trial() -> None:
    """The session's tuner polls the warm start at its decisions: once the points are there, the
    search suggests them next, marked as predicted."""
    warm, core, _ = _warm(0)
    session = make_session(TUNING, rank=0, world_size=1, channel=None, arch="allreduce",
                           model_bytes=32_000_000, warm_start=warm)  # one rank: no channel to fake
    assert session is not None
    warm.on_step(0)
    warm.on_step(1)
    _observed_step(core)
    warm.on_step(2)
    tuner = session._decider  # type: ignore[attr-defined]
    _wait_for(lambda: tuner._predictions() if tuner._predictions is not None else ())
    tuner._take_predictions()
    assert [tuner.search.ask()[1] for _ in range(3)] == ["predicted"] * 3
