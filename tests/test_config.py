"""Configuration: every BYTESCHED_* value is validated and a bad one is named in the error."""

from __future__ import annotations

import pytest

from bytesched.core.config import (POLICIES, SIMULATED_POLICIES, UNLIMITED, Config, ConfigError, SchedulingParams,
                                   describe_variables, format_size, from_env, parse_size)
from bytesched.core.policies import make_policy
from bytesched.runtime.plan_trial import wants_trial


@pytest.mark.parametrize("text, expected", [
    ("4000000", 4_000_000), ("4MB", 4_000_000), ("4MiB", 4 * 2**20), ("512KB", 512_000),
    ("1.5GB", 1_500_000_000), ("160kib", 160 * 1024), (" 8 mb ", 8_000_000), ("inf", UNLIMITED),
])
def test_sizes(text: str, expected: float) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "-4MB", "0", "0.5", "4XB", "four", "4 MB MB", "1e3", "2000000TB"])
def test_bad_sizes_name_variable_and_form(text: str) -> None:
    with pytest.raises(ConfigError, match="BYTESCHED_CREDIT_BYTES") as err:
        from_env({"BYTESCHED_CREDIT_BYTES": text})
    assert "4MiB" in str(err.value) or "empty" in str(err.value)


def test_defaults_and_full_environment() -> None:
    assert from_env({}) == Config(plan=True)  # with no sizes set, the start-up plan chooses them
    cfg = from_env({
        "BYTESCHED_PARTITION_BYTES": "2MB", "BYTESCHED_CREDIT_BYTES": "inf", "BYTESCHED_POLICY": "P3",
        "BYTESCHED_ORDER": "rank0", "BYTESCHED_TIMELINE": "/tmp/t.json", "BYTESCHED_LOG_LEVEL": "debug",
        "BYTESCHED_CHANNEL_PORT": "4000", "BYTESCHED_STALL_WARNING_S": "2.5",
    })
    assert cfg.params == SchedulingParams(partition_bytes=2_000_000, credit_bytes=UNLIMITED)
    assert (cfg.policy, cfg.order, cfg.timeline, cfg.log_level) == ("p3", "rank0", "/tmp/t.json", "DEBUG")
    assert (cfg.channel_port, cfg.stall_warning_s) == (4000, 2.5)


@pytest.mark.parametrize("env, culprit", [
    ({"BYTESCHED_POLICY": "fastest"}, "BYTESCHED_POLICY"),
    ({"BYTESCHED_ORDER": "random"}, "BYTESCHED_ORDER"),
    ({"BYTESCHED_CHANNEL_PORT": "70000"}, "BYTESCHED_CHANNEL_PORT"),
    ({"BYTESCHED_CHANNEL_PORT": "http"}, "BYTESCHED_CHANNEL_PORT"),
    ({"BYTESCHED_STALL_WARNING_S": "-1"}, "BYTESCHED_STALL_WARNING_S"),
    ({"BYTESCHED_STALL_WARNING_S": "soon"}, "BYTESCHED_STALL_WARNING_S"),
    ({"BYTESCHED_TIMELINE": "  "}, "BYTESCHED_TIMELINE"),
    ({"BYTESCHED_LOG_LEVEL": "loud"}, "BYTESCHED_LOG_LEVEL"),
    ({"BYTESCHED_PARTITON_BYTES": "4MB"}, "BYTESCHED_PARTITON_BYTES"),  # a typo is not ignored
    ({"BYTESCHEDULER_PARTITION": "-3"}, "BYTESCHEDULER_PARTITION"),
])
def test_bad_values_name_the_culprit(env: dict[str, str], culprit: str) -> None:
    with pytest.raises(ConfigError, match=culprit):
        from_env(env)


def test_a_job_runs_every_policy_the_simulator_does_tictac_included() -> None:
    """TicTac orders by the graph the plugins trace from the first forward pass, so a job may
    choose it as the simulator does."""
    assert from_env({"BYTESCHED_POLICY": "TicTac"}).policy == "tictac"
    assert Config(policy="tictac").policy == "tictac"
    assert "tictac" in POLICIES and SIMULATED_POLICIES == POLICIES
    assert make_policy("tictac", SchedulingParams()).name == "tictac"


def test_legacy_element_counts_are_aliases_with_a_warning() -> None:
    with pytest.warns(DeprecationWarning, match="BYTESCHED_PARTITION_BYTES"):
        cfg = from_env({"BYTESCHEDULER_PARTITION": "1000000", "BYTESCHEDULER_CREDIT": "4000000"})
    assert cfg.params == SchedulingParams(partition_bytes=4_000_000, credit_bytes=16_000_000)
    with pytest.raises(ConfigError, match="keep only"):
        from_env({"BYTESCHEDULER_CREDIT": "1", "BYTESCHED_CREDIT_BYTES": "4"})


def test_every_variable_is_documented() -> None:
    rows = describe_variables()
    names = [r[0] for r in rows]
    assert len(names) == len(set(names))
    assert all(doc for _, _, doc in rows)
    assert "BYTESCHED_PARTITION_BYTES" in names and "BYTESCHEDULER_CREDIT" in names


def test_format_size() -> None:
    assert [format_size(x) for x in (UNLIMITED, 4_000_000, 1500, 12)] == ["inf", "4MB", "1.5KB", "12B"]


def test_policy_off_switches_scheduling_off_and_refuses_what_only_scheduling_reads() -> None:
    """BYTESCHED_POLICY=off: no scheduling, no plan, a fifo Core; sizes or tuning with it would be
    silently ignored, so they are refused naming both settings."""
    config = from_env({"BYTESCHED_POLICY": "off"})
    assert (config.scheduling, config.plan, config.policy) == (False, False, "fifo")
    assert from_env({}).scheduling
    for extra, culprit in [({"BYTESCHED_PARTITION_BYTES": "1MB"}, "BYTESCHED_PARTITION_BYTES"),
                           ({"BYTESCHED_CREDIT_BYTES": "1MB"}, "BYTESCHED_CREDIT_BYTES"),
                           ({"BYTESCHED_TUNING": "1"}, "BYTESCHED_TUNING")]:
        with pytest.raises(ConfigError, match=f"BYTESCHED_POLICY=off.*{culprit}"):
            from_env({"BYTESCHED_POLICY": "off", **extra})
    with pytest.raises(ConfigError, match="or off in BYTESCHED_POLICY, which sets scheduling=False"):
        Config(policy="off")


def test_stay_out_path_is_one_of_three_and_needs_a_plan() -> None:
    """BYTESCHED_STAY_OUT_PATH picks how a plan that stays out chooses its path; where the job has
    no plan it would be silently ignored, so it is refused naming the setting."""
    assert from_env({}).stay_out_path == "auto"
    assert from_env({"BYTESCHED_STAY_OUT_PATH": "Measure"}).stay_out_path == "measure"
    with pytest.raises(ConfigError, match="BYTESCHED_STAY_OUT_PATH='always' is not valid: expected one of "
                                          "auto, measure, predict"):
        from_env({"BYTESCHED_STAY_OUT_PATH": "always"})
    for extra in ({"BYTESCHED_PLAN": "0"}, {"BYTESCHED_PARTITION_BYTES": "1MB"}, {"BYTESCHED_POLICY": "off"}):
        with pytest.raises(ConfigError, match="BYTESCHED_STAY_OUT_PATH=predict chooses the path of a start-up plan"):
            from_env({"BYTESCHED_STAY_OUT_PATH": "predict", **extra})
    with pytest.raises(ConfigError, match="stay_out_path='never' is unknown"):
        Config(stay_out_path="never")


def test_stay_out_fusion_bytes_is_a_size_and_refused_beside_a_fixed_fusion_bound() -> None:
    """BYTESCHED_STAY_OUT_FUSION_BYTES bounds the buckets of a plugin that stays out (DDP's 25 MB
    unset); BYTESCHED_FUSION_BYTES keeps its bound on every path, where the other would be
    silently ignored, so the two together are refused naming both."""
    assert from_env({}).stay_out_fusion_bytes == 25_000_000
    assert from_env({"BYTESCHED_STAY_OUT_FUSION_BYTES": "1.6MB"}).stay_out_fusion_bytes == 1_600_000
    with pytest.raises(ConfigError, match="BYTESCHED_STAY_OUT_FUSION_BYTES='big' is not a size"):
        from_env({"BYTESCHED_STAY_OUT_FUSION_BYTES": "big"})
    with pytest.raises(ConfigError, match="BYTESCHED_FUSION_BYTES keeps one fusion bound on every path, so "
                                          "BYTESCHED_STAY_OUT_FUSION_BYTES"):
        from_env({"BYTESCHED_STAY_OUT_FUSION_BYTES": "8MB", "BYTESCHED_FUSION_BYTES": "1MB"})


def test_plan_trial_is_on_by_default_on_a_parameter_server_and_over_announced_cpu_all_reduces() -> None:
    """BYTESCHED_PLAN_TRIAL says whether a plan's sizes are timed against staying out (unset: on
    a parameter server and over an all-reduce that follows rank 0's announcements on the CPU, not
    over Horovod nor on a GPU); where the job has no plan it would be silently ignored, so it is
    refused naming the setting."""
    unset, on, off = (from_env(env) for env in ({}, {"BYTESCHED_PLAN_TRIAL": "1"}, {"BYTESCHED_PLAN_TRIAL": "0"}))
    assert [wants_trial(config, arch) for config in (unset, on, off) for arch in ("ps", "allreduce")] == \
        [True, False, True, True, False, False]
    assert [wants_trial(config, "allreduce", announced_on_cpu=True) for config in (unset, on, off)] == \
        [True, True, False]
    for extra in ({"BYTESCHED_PLAN": "0"}, {"BYTESCHED_CREDIT_BYTES": "4MB"}, {"BYTESCHED_POLICY": "off"}):
        with pytest.raises(ConfigError, match="BYTESCHED_PLAN_TRIAL=0 chooses whether a start-up plan's sizes"):
            from_env({"BYTESCHED_PLAN_TRIAL": "0", **extra})
