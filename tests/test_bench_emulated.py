"""``python -m benchmarks emulated``: the pieces (scaling, the matrix's order, pairwise statistics,
the emulated models, the docs section) and, end to end, the quick mode on a real emulated network."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Sequence

import pytest

from bytesched.core.config import from_env
from benchmarks.emulated import runner
from benchmarks.emulated.cells import FRAMEWORKS, groups, quick, rounds
from benchmarks.emulated.calibration import Calibration
from benchmarks.emulated.configs import CONFIGURATIONS, PROBES, PS_PROBES, configuration, probes
from benchmarks.emulated.prediction import (IDEAL_PARTITION, MAX_OVERHEAD, SIZE_GRID, as_measured, cluster_options,
                                                 fit_probes, fit_scheduled_latency, fit_scheduled_overhead,
                                                 ideal_credits, ideal_speedup, predict_group, refresh_ideals, resolve)
from benchmarks.emulated.protocol import parse, parse_runs, parse_worker_args, worker_argv, worker_parser
from benchmarks.emulated.report import BEGIN, END, _calibration, group_table, overview, summary, write_section
from benchmarks.emulated.results import families, merge, summarize
from benchmarks.emulated.scaling import Scale, balanced_time_scale, scaled_profile
from benchmarks.emulated.usage import Stopwatch
from bytesched.core.config import SchedulingParams
from bytesched.sim.predict import simulate
from bytesched.sim.profile import Layer, ModelProfile, Tensor, load_profile
from bytesched.sim.simulator import VANILLA
from conftest import require, require_shaping, run_job

GBIT = 10**9


# --------------------------------------------------------------------------- pieces


def test_scaled_profile_scales_sizes_and_times_separately() -> None:
    original = load_profile("vgg16")
    scaled = scaled_profile("vgg16", Scale(size=0.01, time=2.0))
    assert ([t.name for layer in scaled.layers for t in layer.tensors]
            == [t.name for layer in original.layers for t in layer.tensors])
    assert scaled.nbytes == pytest.approx(original.nbytes * 0.01, rel=1e-3)
    assert all(t.nbytes >= 4 and t.nbytes % 4 == 0 for layer in scaled.layers for t in layer.tensors)
    assert scaled.compute_time == pytest.approx(original.compute_time * 2.0)
    assert scaled.source["scale"] == {"size": 0.01, "time": 2.0}
    assert balanced_time_scale(original, original.compute_time * 3) == pytest.approx(3.0)
    with pytest.raises(ValueError, match="size"):
        Scale(size=0.0)


def test_each_configuration_gives_its_workers_the_bytesched_settings_it_names() -> None:
    """A worker's settings are the job's environment with the column's policy, sizes and plan;
    ``policy-off`` is what BYTESCHED_POLICY=off makes (scheduling off, no plan)."""
    base = from_env({"BYTESCHED_FUSION_BYTES": "2MB"})
    off = configuration("policy-off").settings(base)
    assert (off.scheduling, off.plan, off.policy, off.fusion_bytes) == (False, False, "fifo", 2_000_000)
    assert off == from_env({"BYTESCHED_FUSION_BYTES": "2MB", "BYTESCHED_POLICY": "off"})
    planned = configuration("plan").settings(base)
    assert (planned.scheduling, planned.plan, planned.policy) == (True, True, "bytescheduler")
    fixed = configuration("off").settings(base)  # the Core with unlimited sizes
    assert fixed.scheduling and not fixed.plan and fixed.params.partition_bytes == float("inf")
    # The path trial's columns: the plan, in jobs of their own whose environment asks to measure,
    # or to predict.
    for name, path in (("plan-measured", "measure"), ("plan-predicted", "predict")):
        chosen = configuration(name)
        assert dict(chosen.env) == {"BYTESCHED_STAY_OUT_PATH": path}
        assert chosen.settings(from_env(dict(chosen.env))).stay_out_path == path
        assert [f for f, framework in FRAMEWORKS.items() if name in framework.configurations] == \
            ["torch-horovod", "torch-distributed"]
    # The old 1 MB buckets beside the plan and scheduling off: the job fixes the fusion bound.
    for name, scheduling in (("plan-1mb", True), ("policy-off-1mb", False)):
        chosen = configuration(name)
        settings = chosen.settings(from_env(dict(chosen.env)))
        assert (settings.fusion_bytes, settings.fusion_fixed, settings.scheduling) == (1_000_000, True, scheduling)
        assert [f for f, framework in FRAMEWORKS.items() if name in framework.configurations] == \
            ["torch-horovod", "torch-distributed"]


def test_bytescheds_stay_out_bucket_bound_is_scaled_like_ddps(monkeypatch: pytest.MonkeyPatch) -> None:
    """The scaled Transformer (6.4 % of the real sizes) gives DDP 1.6 MB buckets, and bytesched's
    25 MB bound where it stays out scales alike; a bound the job fixed, or set, is its own."""
    from benchmarks.emulated.torch_worker import scaled_settings
    monkeypatch.delenv("BYTESCHED_STAY_OUT_FUSION_BYTES", raising=False)
    assert scaled_settings(from_env({}), 0.064).stay_out_fusion_bytes == 1_600_000
    fixed = from_env({"BYTESCHED_FUSION_BYTES": "1MB"})
    assert scaled_settings(fixed, 0.064) is fixed
    monkeypatch.setenv("BYTESCHED_STAY_OUT_FUSION_BYTES", "8MB")
    chosen = from_env()
    assert scaled_settings(chosen, 0.064).stay_out_fusion_bytes == 8_000_000
    # The columns of the unscaled bound set it in their jobs' environment, which keeps it.
    for name, scheduling in (("plan-25mb", True), ("policy-off-25mb", False)):
        column = configuration(name)
        monkeypatch.setenv("BYTESCHED_STAY_OUT_FUSION_BYTES", dict(column.env)["BYTESCHED_STAY_OUT_FUSION_BYTES"])
        settings = scaled_settings(column.settings(from_env()), 0.064)
        assert (settings.stay_out_fusion_bytes, settings.scheduling) == (25_000_000, scheduling)
        assert [f for f, framework in FRAMEWORKS.items() if name in framework.configurations] == \
            ["torch-horovod", "torch-distributed"]


def test_rounds_rotate_and_batch_configurations_into_jobs() -> None:
    [group], _ = groups(["torch-horovod"], ["vgg16"], [GBIT], [2], ["vanilla", "autotune", "fifo", "p3"])
    plan = list(rounds(group, 3))
    firsts = [jobs[0][0].name for _, jobs in plan]
    assert firsts == ["vanilla", "autotune", "fifo"]  # no configuration always runs first
    for _, jobs in plan:
        assert sorted(c.name for job in jobs for c in job) == ["autotune", "fifo", "p3", "vanilla"]
        for job in jobs:  # a job shares one environment: autotune (HOROVOD_AUTOTUNE=1) runs alone
            assert len({c.env for c in job}) == 1
    assert [[c.name for c in job] for job in plan[0][1]] == [["vanilla", "fifo", "p3"], ["autotune"]]
    [ps], skipped = groups(["mxnet-ps"], ["vgg16"], [GBIT], [2], ["autotune", "p3"])
    assert ("mxnet-ps", "autotune") in skipped and [c.name for c in ps.configurations] == ["vanilla", "p3"]
    assert all(len(job) == 1 for _, jobs in rounds(ps, 2) for job in jobs)  # a KVStore per process
    assert [c.name for c in quick(ps).configurations] == ["bytescheduler"]
    with pytest.raises(ValueError, match="'nope'"):
        groups(["nope"], ["vgg16"], [GBIT], [2], ["vanilla"])
    with pytest.raises(ValueError, match="'fast'"):
        groups(["torch-horovod"], ["vgg16"], [GBIT], [2], ["fast"])
    with pytest.raises(ValueError, match="'bytescheduler-sim' is sized by the simulator.*'mlp'"):
        groups(["torch-horovod"], ["vgg16", "mlp"], [GBIT], [2], ["bytescheduler-sim"])


def test_speedups_are_pairwise_per_round() -> None:
    group = {"configs": ["vanilla", "p3"], "runs": [
        {"config": "vanilla", "round": 0, "samples_per_second": 100.0},
        {"config": "p3", "round": 0, "samples_per_second": 150.0},
        {"config": "vanilla", "round": 1, "samples_per_second": 50.0},  # a loaded moment hits both
        {"config": "p3", "round": 1, "samples_per_second": 60.0},
        {"config": "p3", "round": 2, "samples_per_second": 999.0},  # no baseline in round 2
    ], "prediction": {"configs": {"p3": {"samples_per_second": 100.0, "speedup": 1.1}}}}
    vanilla, p3 = summarize(group)
    assert p3.speedup is not None and (p3.speedup.low, p3.speedup.high, p3.speedup.count) == (1.2, 1.5, 2)
    assert p3.throughput is not None and p3.throughput.median == 150.0 and p3.throughput.count == 3
    assert p3.error == pytest.approx(0.5) and vanilla.error is None


def test_stopwatch_counts_this_process_cpu_and_the_machines_busy_share() -> None:
    clock = Stopwatch()
    deadline = time.process_time() + 0.2
    while time.process_time() < deadline:
        pass
    busy = clock.stop()
    clock = Stopwatch()
    time.sleep(0.2)
    idle = clock.stop()
    assert busy.cpu_seconds >= 0.2 and busy.seconds >= busy.cpu_seconds * 0.9
    assert busy.machine_busy is not None and 0 < busy.machine_busy <= 1
    assert idle.cpu_seconds < 0.05 and idle.seconds >= 0.2


def test_cpu_columns_appear_for_runs_that_recorded_them() -> None:
    def group(**usage: float) -> dict[str, Any]:
        return {"framework": "torch-horovod", "model": "vgg16", "bits_per_second": GBIT, "ranks": 4,
                "configs": ["vanilla", "off"], "runs": [
                    {"config": c, "round": r, "samples_per_second": 10.0 + r, "steps": 10, **usage}
                    for c in ("vanilla", "off") for r in (0, 1, 2)]}

    recorded = group(cpu_seconds=0.5, machine_busy=0.97)
    vanilla, _ = summarize(recorded)
    assert vanilla.cpu_per_step is not None and vanilla.cpu_per_step.median == pytest.approx(0.05)
    assert vanilla.machine_busy is not None and vanilla.machine_busy.median == pytest.approx(0.97)
    table = group_table(recorded)
    assert table[2].endswith("| rank 0 CPU per step | machine busy |") and table[4].endswith("| 50 ms | 97% |")
    older = group_table(group())  # files that recorded no CPU use
    assert summarize(group())[0].cpu_per_step is None and older[2].endswith("| prediction error |")


def test_merge_keeps_every_cell_once_the_latest_run_and_refuses_differently_scaled_models() -> None:
    def part(scale: float, command: str, *frameworks: str, configs: tuple[str, ...] = ("vanilla", "off")) -> dict:
        return {"meta": {"command": command}, "workloads": {"vgg16": {"size_scale": scale}}, "not_run": [],
                "groups": [{"framework": f, "model": "vgg16", "bits_per_second": 1e9, "ranks": 2, "run": command,
                            "configs": list(configs)} for f in frameworks]}

    merged = merge([part(0.1, "first", "torch-horovod", "torch-distributed"), part(0.1, "second", "mxnet-ps"),
                    part(0.1, "policies", "torch-distributed", configs=("vanilla", "p3")),
                    part(0.1, "third", "torch-distributed", configs=("vanilla", "off", "fifo")),
                    part(0.1, "fourth", "torch-distributed", configs=("vanilla", "off", "fifo", "p3"))])
    assert [(g["framework"], g["run"]) for g in merged["groups"]] == [  # "third" did not cover the policies
        ("torch-horovod", "first"), ("torch-distributed", "fourth"), ("mxnet-ps", "second")]
    assert [(s["group"]["run"], s["by"]) for s in merged["superseded"]] == [
        ("first", "third"), ("third", "fourth"), ("policies", "fourth")]
    assert [m["command"] for m in merged["sources"]] == ["first", "second", "policies", "third", "fourth"]
    # A configuration measured again leaves the earlier group of its cell that had others too.
    def runs(*configs: str) -> list[dict]:
        return [{"config": c, "round": 0, "samples_per_second": 1.0} for c in configs]

    older = part(0.1, "quarter", "torch-distributed", configs=("vanilla", "policy-off", "policy-off-1mb"))
    older["groups"][0]["runs"] = runs("vanilla", "policy-off", "policy-off-1mb")
    newer = part(0.1, "scaled", "torch-distributed", configs=("vanilla", "plan", "policy-off"))
    newer["groups"][0]["runs"] = runs("vanilla", "plan", "policy-off")
    merged = merge([older, newer])
    assert [(g["run"], g["configs"], [r["config"] for r in g["runs"]]) for g in merged["groups"]] == [
        ("quarter", ["vanilla", "policy-off-1mb"], ["vanilla", "policy-off-1mb"]),
        ("scaled", ["vanilla", "plan", "policy-off"], ["vanilla", "plan", "policy-off"])]
    assert [(s["group"]["run"], s["by"], s.get("configs")) for s in merged["superseded"]] == [
        ("quarter", "scaled", ["policy-off"])]
    with pytest.raises(ValueError, match="'vgg16' was scaled differently"):
        merge([part(0.1, "first", "torch-horovod"), part(0.2, "second", "mxnet-ps")])
    # what can be reported together: the first file's scaling, in the order measured
    early, late, other = (dict(part(0.1, "early", "torch-horovod"), meta={"command": "early", "started": "1"}),
                          dict(part(0.1, "late", "mxnet-ps"), meta={"command": "late", "started": "3"}),
                          dict(part(0.2, "4 ranks", "mxnet-ps"), meta={"command": "4 ranks", "started": "2"}))
    assert families([late, other, early]) == [[early, late], [other]]


def test_worker_options_round_trip() -> None:
    argv = worker_argv("horovod", "vgg16", 0.25, 1.5, 7, 2, [("vanilla", 0), ("p3", 1)])
    args = worker_parser("test").parse_args(argv)
    assert (args.backend, args.model, args.size_scale, args.time_scale, args.steps, args.warmup) == \
        ("horovod", "vgg16", 0.25, 1.5, 7, 2)
    assert args.runs == [("vanilla", 0), ("p3", 1)]
    assert parse(['[rank 0] BENCH-RESULT {"config": "p3"}', "noise"]) == [{"config": "p3"}]
    with pytest.raises(Exception, match="CONFIG@ROUND"):
        parse_runs("vanilla")
    sized = parse_worker_args("test", worker_argv("torch", "vgg16", 1.0, 1.0, 3, 1, [("bytescheduler-sim", 0)],
                                                  sizes={"bytescheduler-sim": (524288, 2097152)}))
    config = configuration(sized.runs[0][0], sized.sizes)
    assert (config.params.partition_bytes, config.params.credit_bytes) == (524288, 2097152)
    with pytest.raises(ValueError, match="needs its partition and credit"):
        configuration("bytescheduler-sim")
    assert parse_worker_args("test", worker_argv("ps", "vgg16", 1.0, 1.0, 3, 1, calibrate=4096)).calibrate == 4096
    with pytest.raises(SystemExit):  # neither runs nor calibration
        parse_worker_args("test", worker_argv("ps", "vgg16", 1.0, 1.0, 3, 1))


@pytest.mark.parametrize("arch, workers", [("allreduce", 2), ("allreduce", 4), ("ps", 2)])
def test_calibration_reproduces_both_measurements_in_the_simulator(arch: str, workers: int) -> None:
    """The simulator, given the calibrated options, takes the measured time for one gradient of
    4 bytes and one of the large size: vanilla on a one-layer model without compute."""
    calibration = Calibration(fixed_seconds=0.003, large_seconds=0.25, large_bytes=24_000_000)
    options = calibration.simulator_options(arch, workers)
    for nbytes, measured in ((4, calibration.fixed_seconds), (24_000_000, calibration.large_seconds)):
        profile = ModelProfile("one", (Layer("only", 0.0, 0.0, (Tensor("w", nbytes),)),), batch_size=1)
        extra = {"servers": workers} if arch == "ps" else {}
        predicted = simulate(profile, policies=["fifo"], workers=workers, arch=arch, topology="full-duplex",
                             **extra, **options).predictions[0].vanilla.iteration_time
        assert predicted == pytest.approx(measured, rel=0.02), (nbytes, predicted, measured)
    with pytest.raises(ValueError, match="inconsistent"):
        Calibration(fixed_seconds=0.3, large_seconds=0.2, large_bytes=1000)


def test_the_simulated_compute_is_the_measured_one() -> None:
    """The prediction stretches every layer's times to the measured compute-only step and keeps
    the bytes; without a measurement (older results files) the profile stays as scaled."""
    profile = scaled_profile("vgg16", Scale(0.05, 0.5))
    measured = Calibration(fixed_seconds=0.003, large_seconds=0.25, large_bytes=24_000_000,
                           compute_seconds=1.2 * profile.compute_time)
    stretched = as_measured(profile, measured)
    assert stretched.compute_time == pytest.approx(measured.compute_seconds)
    assert [layer.tensors for layer in stretched.layers] == [layer.tensors for layer in profile.layers]
    assert all(s.backward == pytest.approx(1.2 * p.backward) for s, p in zip(stretched.layers, profile.layers))
    assert as_measured(profile, dataclasses.replace(measured, compute_seconds=None)) is profile
    assert as_measured(profile, None) is profile
    assert Calibration.from_record(measured.as_record()) == measured


SLOWER = 1.2
"""How much slower than the simulator the fitting tests' "measured" jobs run as a whole: the
simulator's own error on a job, which the fitted cost must not absorb."""


def plain_baseline(profile: ModelProfile, options: dict[str, Any]) -> tuple[float, float]:
    """The (simulated, "measured") plain step of the fitting tests."""
    plain = simulate(profile, policies=[VANILLA], **options).predictions[0].vanilla.iteration_time
    return plain, SLOWER * plain


def probe_seconds(profile: ModelProfile, options: dict[str, Any], names: Sequence[str],
                  **cost: float) -> tuple[float, ...]:
    """The fitting tests' "measured" step times under the probes ``names``, simulated with the
    cost of bytesched's path ``cost`` (an overhead or a latency)."""
    return tuple(SLOWER * simulate(profile, policies=["bytescheduler"], partition=p.partition_bytes,
                                   credit=p.credit_bytes, **{**options, **cost}).predictions[0]
                 .result("bytescheduler").iteration_time
                 for p in (CONFIGURATIONS[name].params for name in names))


@pytest.mark.parametrize("arch, theta", [("allreduce", 0.004), ("ps", 0.0015)])
def test_fitted_overhead_recovers_the_cost_that_produced_the_probe_times(arch: str, theta: float) -> None:
    """Probe times simulated at a known per-message cost give that cost back, also when the whole
    job, plain path included, runs slower than the simulator says."""
    [group], _ = groups(["torch-horovod" if arch == "allreduce" else "mxnet-ps"], ["vgg16"], [GBIT], [2], [])
    profile = scaled_profile("vgg16", Scale(size=0.015, time=0.2))
    options = cluster_options(group, "full-duplex", Calibration(0.002, 0.08, 8_000_000))
    measured = probe_seconds(profile, options, PROBES, overhead=theta)
    baseline = plain_baseline(profile, options)
    assert fit_scheduled_overhead(profile, options, *measured, baseline) == pytest.approx(theta, rel=0.06)
    if arch == "allreduce":  # slower than anything the grid explains: its largest cost
        assert fit_scheduled_overhead(profile, options, 100.0, 100.0, baseline) == pytest.approx(MAX_OVERHEAD,
                                                                                                  rel=0.1)


def test_fitted_overhead_is_never_below_the_plain_paths_cost() -> None:
    """Probe times of free messages give about the plain path's per-operation cost, never less:
    bytesched's partitions are the framework's own collectives."""
    [group], _ = groups(["torch-horovod"], ["vgg16"], [GBIT], [2], [])
    profile = scaled_profile("vgg16", Scale(size=0.015, time=0.2))
    options = cluster_options(group, "full-duplex", Calibration(0.002, 0.08, 8_000_000))
    measured = probe_seconds(profile, options, PROBES, overhead=0.0)
    assert options["overhead"] == 0.002
    theta = fit_scheduled_overhead(profile, options, *measured, plain_baseline(profile, options))
    assert 0.002 <= theta < 0.0025  # the coarse probe is not monotonic in θ: the grid's next point can fit best


def test_fitted_ps_latency_recovers_the_delay_that_produced_the_probe_times() -> None:
    """A PS's three probe times simulated with a known pipelined latency give that latency back,
    and the harness fits a latency (not an overhead) for a PS group."""
    [group], _ = groups(["mxnet-ps"], ["vgg16"], [GBIT], [2], [])
    profile = scaled_profile("vgg16", Scale(size=0.015, time=0.2))
    calibration = Calibration(0.002, 0.08, 8_000_000)
    options = cluster_options(group, "full-duplex", calibration)
    assert probes("ps") == PS_PROBES and len(PS_PROBES) == 3 and probes("allreduce") == PROBES
    measured = probe_seconds(profile, options, PS_PROBES, latency=0.003)
    baseline = plain_baseline(profile, options)
    assert fit_scheduled_latency(profile, options, measured, baseline) == pytest.approx(0.003, rel=0.08)
    with pytest.raises(ValueError, match="without the plain path"):
        fit_probes("ps", profile, options, dataclasses.replace(calibration, probe_seconds=measured))
    fitted = fit_probes("ps", profile, options, dataclasses.replace(calibration, probe_seconds=measured,
                                                                    probe_baseline_seconds=baseline[1]))
    assert fitted.scheduled_overhead is None and fitted.scheduled_latency == pytest.approx(0.003, rel=0.08)
    assert fitted.simulator_options("ps", 2, scheduled=True)["latency"] == fitted.scheduled_latency
    assert fitted.simulator_options("ps", 2)["latency"] == 0.0


def test_simulator_sized_configuration_gets_the_predicted_best_grid_sizes() -> None:
    [group], _ = groups(["torch-horovod"], ["vgg16"], [GBIT], [2], ["bytescheduler-sim", "fifo"])
    profile = scaled_profile("vgg16", Scale(size=0.04337, time=0.5084))
    options = cluster_options(group, "full-duplex", Calibration(0.0024, 0.23, 25_165_824))
    resolved = {c.name: c for c in resolve(group, profile, options)}
    chosen = resolved["bytescheduler-sim"].params
    assert chosen in SIZE_GRID and resolved["fifo"] == CONFIGURATIONS["fifo"]
    alternatives = [simulate(profile, policies=["bytescheduler"], partition=p.partition_bytes,
                             credit=p.credit_bytes, **options).predictions[0].result("bytescheduler").iteration_time
                    for p in SIZE_GRID]
    best = simulate(profile, policies=["bytescheduler"], partition=chosen.partition_bytes, credit=chosen.credit_bytes,
                    **options).predictions[0].result("bytescheduler").iteration_time
    assert best == min(alternatives)
    prediction = predict_group(dataclasses.replace(group, configurations=tuple(resolved.values())), profile,
                               "full-duplex", Calibration(0.0024, 0.23, 25_165_824))
    assert prediction["configs"]["bytescheduler-sim"]["partition_bytes"] == chosen.partition_bytes
    assert prediction["calibrated"]
    assert prediction["ideal_speedup"] >= prediction["configs"]["bytescheduler-sim"]["speedup"]


def test_the_ideal_is_at_its_best_credit_up_to_the_whole_model_and_the_report_recomputes_it() -> None:
    """The 4-worker PS needs many sub-tasks in flight: with credits of at most 1 MB its ideal fell
    below 1x (a hand sweep's grid), below what the auto-tuner's sizes measured."""
    assert ideal_credits(24_000_000)[-1] * IDEAL_PARTITION >= 24_000_000 and ideal_credits(1000) == (1,)
    [group], _ = groups(["mxnet-ps"], ["resnet50"], [GBIT], [4], ["vanilla"])
    calibration = Calibration(0.00075, 0.53, 23_999_932, compute_seconds=0.19)
    workload = {"size_scale": 0.23477, "time_scale": 1.9383}
    profile = as_measured(scaled_profile("resnet50", Scale(0.23477, 1.9383)), calibration)
    options = cluster_options(group, "full-duplex", calibration)
    ideal = ideal_speedup(profile, options)
    free = {**options, "overhead": 0.0, "latency": 0.0, "cycle_time": 0.0}
    one_megabyte = simulate(profile, policies=["bytescheduler"], partition=IDEAL_PARTITION,
                            credit=16 * IDEAL_PARTITION, **free).predictions[0]
    assert ideal > 1.2 > one_megabyte.vanilla.iteration_time / one_megabyte.result("bytescheduler").iteration_time
    results = {"workloads": {"resnet50": workload}, "groups": [
        {"framework": "mxnet-ps", "model": "resnet50", "bits_per_second": GBIT, "ranks": 4,
         "calibration": calibration.as_record(),
         "prediction": {"ideal_speedup": 0.97, "cluster": {"topology": "full-duplex"}}},
        {"framework": "mxnet-ps", "model": "resnet50", "bits_per_second": GBIT, "ranks": 4,  # uncalibrated: kept
         "prediction": {"ideal_speedup": 0.97, "cluster": {"topology": "full-duplex"}}}]}
    refresh_ideals(results)
    calibrated, kept = (group["prediction"] for group in results["groups"])
    assert calibrated == {"ideal_speedup": pytest.approx(ideal), "ideal_speedup_at_run": 0.97,
                          "cluster": {"topology": "full-duplex"}}
    assert kept == {"ideal_speedup": 0.97, "cluster": {"topology": "full-duplex"}}


def test_tuner_sized_configuration_runs_the_tuning_jobs_pair_or_is_left_out() -> None:
    [group], _ = groups(["mxnet-ps"], ["vgg16"], [GBIT], [2], ["bytescheduler-tuned", "bytescheduler-sim"])
    profile = scaled_profile("vgg16", Scale(size=0.04337, time=0.5084))
    options = cluster_options(group, "full-duplex", Calibration(0.0024, 0.23, 25_165_824))
    resolved = {c.name: c for c in resolve(group, profile, options, tuned=(500_000, 5_657_000))}
    assert resolved["bytescheduler-tuned"].params == SchedulingParams(partition_bytes=500_000, credit_bytes=5_657_000)
    assert resolved["bytescheduler-sim"].params in SIZE_GRID
    untuned = [c.name for c in resolve(group, profile, options)]
    assert untuned == ["vanilla", "bytescheduler-sim"]
    calibration = dataclasses.replace(Calibration(0.0024, 0.23, 25_165_824), tuned_sizes=(500_000, 5_657_000),
                                      tuning_trials=(("0", "4.000", "16.000", "3.1", "3.1", "configured"),
                                                     ("1", "0.500", "5.657", "3.8", "3.8", "initial"),
                                                     ("best", "0.500", "5.657", "3.8", "3.8", "final")),
                                      tuning_seconds=133.0)
    lines = "\n".join(_calibration({"framework": "mxnet-ps", "calibration": calibration.as_record()}))
    assert "133 s, 2 trials of 20 steps" in lines and "0.5 / 5.657 MB (3.8 steps/s)" in lines


def test_progress_total_drops_the_configuration_a_failed_tuning_job_left_out(monkeypatch: pytest.MonkeyPatch) -> None:
    """The cluster and the jobs are stand-ins here: what is checked is the runner's bookkeeping
    (the end-to-end runs are the quick-mode test below)."""
    [group], _ = groups(["torch-horovod"], ["vgg16"], [GBIT], [2], ["bytescheduler-tuned", "fifo"])
    monkeypatch.setattr(runner, "emulated_cluster", lambda *args, **kwargs: contextlib.nullcontext(
        SimpleNamespace(describe=lambda: "stand-in")))
    monkeypatch.setattr(runner, "run_calibration", lambda *args: Calibration(0.001, 0.2, 24_000_000))
    monkeypatch.setattr(runner, "run_job", lambda cluster, group, workload, configs, *rest: [
        {"config": c.name, "samples_per_second": 1.0} for c in configs])
    messages: list[str] = []
    workload = runner.Workload("vgg16", 0.04, 0.5, steps=3, warmup=1, gradient_bytes=24_000_000)
    runner.run_groups([group], {"vgg16": workload}, 2, "veth", 60.0,
                      prepare=lambda g, calibration: dataclasses.replace(
                          g, configurations=tuple(c for c in g.configurations if not c.sized_at_run_time)),
                      record=lambda g, run: None, failed=lambda *args: None, say=messages.append)
    assert "  torch-horovod vgg16 1 Gbit/s 2 ranks: left out bytescheduler-tuned (no sizes for it)" in messages
    progress = [m for m in messages if m.startswith("[")]
    assert progress[-1].startswith("[4/4 runs]")


@pytest.mark.parametrize("framework", ["torch-horovod", "mxnet-horovod"])
def test_calibration_runs_the_plain_path_with_the_probes(framework: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The probes' yardstick is measured in the same calibration: in one job around the probes
    (V A B B A V), or one job each where a process runs one configuration; the report says it.
    Stand-in jobs: what is checked is the bookkeeping."""
    [group], _ = groups([framework], ["vgg16"], [GBIT], [2], ["bytescheduler-sim"])
    step = {"vanilla": 0.30, "probe-coarse": 0.25, "probe-fine": 0.35}
    jobs: list[list[str]] = []

    def stand_in_job(cluster: Any, group: Any, workload: Any, configs: Any, *rest: Any) -> list[dict]:
        jobs.append([c.name for c in configs])
        return [{"config": c.name, "seconds": 10 * step[c.name], "steps": 10} for c in configs]
    monkeypatch.setattr(runner, "launch", lambda *args: None)
    monkeypatch.setattr(runner, "_finish", lambda *args, **kwargs: [
        {"calibration": Calibration(0.001, 0.2, 24_000_000).as_record()}])
    monkeypatch.setattr(runner, "run_job", stand_in_job)
    workload = runner.Workload("vgg16", 0.04, 0.5, steps=10, warmup=1, gradient_bytes=24_000_000)
    calibration = runner.run_calibration(None, group, workload, 60.0, lambda line: None)
    order = ["vanilla", "probe-coarse", "probe-fine"]
    assert jobs == ([[name] for name in order] if group.framework.one_run_per_job else [order + order[::-1]])
    assert calibration.probe_seconds == pytest.approx((0.25, 0.35))
    assert calibration.probe_baseline_seconds == pytest.approx(0.30)
    record = dataclasses.replace(calibration, scheduled_overhead=0.002).as_record()
    lines = "\n".join(_calibration({"framework": framework, "calibration": record}))
    assert "against 300 ms on the plain path" in lines


def test_write_section_replaces_only_its_markers(tmp_path: Path) -> None:
    docs = tmp_path / "benchmarks.md"
    docs.write_text("# Benchmarks\n\n## Core\n\nkept\n")
    write_section(docs, f"{BEGIN}\nfirst\n{END}")
    write_section(docs, f"{BEGIN}\nsecond\n{END}")
    text = docs.read_text()
    assert text.startswith("# Benchmarks\n\n## Core\n\nkept\n") and "first" not in text
    assert text.count(BEGIN) == 1 and "second" in text


def test_overview_shows_each_cell_once_and_counts_the_targets_met() -> None:
    def group(framework: str, bits: float, speedups: dict[str, float], ideal: float = 1.2,
              communication: float = 0.2) -> dict[str, Any]:
        runs = [{"config": "vanilla", "round": 0, "samples_per_second": 100.0}]
        runs += [{"config": name, "round": 0, "samples_per_second": 100.0 * value} for name, value in speedups.items()]
        return {"framework": framework, "model": "vgg16", "bits_per_second": bits, "ranks": 2,
                "configs": ["vanilla", *speedups], "runs": runs,
                "prediction": {"ideal_speedup": ideal, "compute_time": 0.2, "communication_time": communication,
                               "configs": {}}}

    results = {"groups": [
        group("torch-horovod", GBIT, {"off": 1.0, "bytescheduler": 1.05, "bytescheduler-sim": 1.2, "autotune": 1.1}),
        group("torch-horovod", GBIT, {"tictac": 1.25}),  # the policies, measured apart: same cell
        group("torch-horovod", 10 * GBIT, {"off": 0.95, "bytescheduler": 1.0}, ideal=1.0, communication=0.05),
        group("torch-horovod", 10 * GBIT, {"plan": 0.98, "policy-off": 1.0}, ideal=1.0, communication=0.05),
        group("mxnet-ps", GBIT, {"off": 1.3, "bytescheduler": 1.6, "plan": 1.8}, ideal=2.0)]}
    text = "\n".join(overview(results))
    assert "| ranks, bandwidth | torch-horovod | mxnet-ps |" in text  # the frameworks in their usual order
    assert "| 2, 1 Gbit/s | 1.00 / 1.05 / - / **1.20** sim / 1.20 | 1.30 / 1.60 / 1.80 / **1.60** defaults / 2.00 |" \
        in text
    assert "| 2, 10 Gbit/s | 0.95 / 1.00 / 0.98 / **1.00** defaults / 1.00 | not measured |" in text
    assert "- Scheduling off (the Core, unlimited sizes) >= 0.99x vanilla: met in 2 of 3 cells; missed in " \
           "torch-horovod vgg16 10 Gbit/s 2r 0.95x." in text
    assert "- No settings (the start-up plan) >= 0.99x vanilla: met in 1 of 2 cells; missed in torch-horovod vgg16 " \
           "10 Gbit/s 2r 0.98x." in text
    # 1.8 of 2.0
    assert "- No settings >= 90% of the ideal speedup (figure: the share of it): met in 2 of 2 cells." in text
    assert "- `BYTESCHED_POLICY=off` (the framework's own path) >= 0.99x vanilla: met in 1 of 1 cells." in text
    assert "speedup (figure: the share of it): met in 2 of 2 cells." in text  # the PS cell has its own target
    assert "defaults >= 90% of the ideal speedup (figure: the share of it): met in 1 of 2 cells; missed in " \
           "torch-horovod vgg16 1 Gbit/s 2r 0.88x." in text
    # where compute ~ communication, tictac (from the cell's other group) beats the sized configuration
    assert "included (figure: its speedup): met in 1 of 2 cells; missed in torch-horovod vgg16 1 Gbit/s 2r 1.20x." \
        in text
    assert "plain KVStore: met in 1 of 1 cells." in text


def test_runs_scaled_otherwise_get_a_glance_of_their_own(tmp_path: Path) -> None:
    def results(ranks: int, compute: float, speedup: float) -> dict[str, Any]:
        runs = [{"config": "vanilla", "round": 0, "samples_per_second": 100.0},
                {"config": "plan", "round": 0, "samples_per_second": 100.0 * speedup}]
        return {"sources": [{"command": f"{ranks} ranks"}], "workloads": {"vgg16": {"compute_seconds": compute}},
                "groups": [{"framework": "mxnet-ps", "model": "vgg16", "bits_per_second": GBIT, "ranks": ranks,
                            "configs": ["vanilla", "plan"], "runs": runs, "prediction": {}}]}

    text = summary(results(2, 0.192, 1.3), tmp_path / "details.md", tmp_path / "benchmarks.md",
                   [results(4, 0.288, 0.97)])
    main, other = text.split("### 4 ranks, compute per iteration: vgg16 288 ms")
    assert "| 2, 1 Gbit/s | - / - / 1.30 / - / - |" in main and "4, 1 Gbit/s" not in main
    assert "| 4, 1 Gbit/s | - / - / 0.97 / - / - |" in other
    assert "No settings (the start-up plan) >= 0.99x vanilla: met in 0 of 1 cells; missed in mxnet-ps vgg16 " \
           "1 Gbit/s 4r 0.97x." in other
    assert "from 2 result files" in other


def test_emulated_torch_model_gives_profile_gradients_in_backward_order() -> None:
    import torch

    from benchmarks.emulated.torch_compute import Workload
    profile = scaled_profile("resnet50", Scale(size=0.001, time=0.05))
    workload = Workload("resnet50", profile, profile.batch_size)
    order: list[str] = []
    names = {p: n for n, p in workload.model.named_parameters()}
    for param in workload.model.parameters():
        param.register_post_accumulate_grad_hook(lambda p: order.append(names[p]))
    started = time.perf_counter()
    workload.loss().backward()
    elapsed = time.perf_counter() - started
    assert elapsed >= sum(layer.forward + layer.backward for layer in profile.layers)  # the sleeps happened
    sizes = [p.numel() * 4 for p in workload.model.parameters()]
    assert sizes == [t.nbytes for layer in profile.layers for t in layer.tensors]
    layers = [int(name.split(".")[1]) for name in order]
    assert layers == sorted(layers, reverse=True) and len(order) == len(sizes)  # last layer's first
    assert all(isinstance(p.grad, torch.Tensor) and p.grad.shape == p.shape for p in workload.model.parameters())


def test_emulated_mxnet_model_takes_the_profile_time_and_gives_every_parameter_a_fresh_gradient() -> None:
    require("torch")
    mx = require("mxnet", "MXNet")
    from benchmarks.emulated.mxnet_compute import EmulatedModel
    profile = scaled_profile("vgg16", Scale(size=0.0005, time=0.05))
    model = EmulatedModel(profile)
    params = list(model.params.values())
    assert [p.shape[0] * 4 for p in params] == [t.nbytes for layer in profile.layers for t in layer.tensors]
    train = mx.gluon.Trainer(params, "sgd", {"learning_rate": 0.5}, kvstore=None)
    for p in params:
        p.grad()[:] = 2.0
    started = time.perf_counter()
    model.step()
    train.step(1)  # refuses a gradient that backward did not mark fresh
    mx.nd.waitall()
    assert time.perf_counter() - started >= profile.compute_time
    # the layers leave the values as they are: the update applied the gradient set above
    assert all(float(p.data().min().asscalar()) == float(p.data().max().asscalar()) == -1.0 for p in params)


def test_emulated_mxnet_layers_run_in_order_on_their_own_clock_without_an_engine_worker() -> None:
    """A layer starts after the one posted before it (a GPU stream), so layer i's gradients are
    ready no earlier than the forward pass plus the backward of the layers after i; and while
    the layers run, other engine operations (MXNet has one CPU worker) do not wait for them."""
    require("torch")
    mx = require("mxnet", "MXNet")
    from benchmarks.emulated.mxnet_compute import EmulatedModel
    profile = scaled_profile("vgg16", Scale(size=0.0005, time=0.3))
    model = EmulatedModel(profile)
    other = mx.nd.ones((4,))
    (other + 1).wait_to_read()  # creates the operator outside the timed part
    started = time.perf_counter()
    loss = model.step()
    (other + 1).wait_to_read()
    unrelated = time.perf_counter() - started
    loss.wait_to_read()
    forward = time.perf_counter() - started
    ready: list[tuple[float, float]] = []
    due = sum(layer.forward for layer in profile.layers)
    for layer, params in reversed(list(zip(profile.layers, _layers_of(model, profile)))):
        due += layer.backward
        for p in params:
            p.grad().wait_to_read()
        ready.append((time.perf_counter() - started, due))
    assert forward >= sum(layer.forward for layer in profile.layers)
    assert all(at >= due for at, due in ready), ready
    # a layer holding the worker would keep it for the whole forward pass: all its layers are
    # ready at once and were queued before the unrelated operation
    assert unrelated < forward / 2, (unrelated, forward)


def _layers_of(model: Any, profile: ModelProfile) -> list[list[Any]]:
    params = iter(model.params.values())
    return [[next(params) for _ in layer.tensors] for layer in profile.layers]


def test_emulated_device_without_its_library_says_how_to_build_it(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    require("torch")
    require("mxnet", "MXNet")
    from benchmarks.emulated import mxnet_compute
    monkeypatch.setattr(mxnet_compute, "LIBRARY", tmp_path / "libbytesched_emulated_device.so")
    mxnet_compute._library.cache_clear()
    try:
        with pytest.raises(mxnet_compute.EmulatedDeviceError, match=r"does not exist: build it with .*csrc/build.py"):
            mxnet_compute.EmulatedModel(scaled_profile("vgg16", Scale(size=0.0005, time=0.01))).step()
    finally:
        mxnet_compute._library.cache_clear()


# --------------------------------------------------------------------------- end to end


def _namespaces_of(pid: int) -> list[str]:
    listing = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return [line.split()[0] for line in listing.splitlines() if line.startswith(f"bytesched-{pid}-")]


@pytest.mark.multiproc
@pytest.mark.timeout(330)
def test_quick_mode_runs_every_framework_end_to_end_and_cleans_up(tmp_path: Path) -> None:
    require_shaping()
    for module, component in (("horovod.torch", "Horovod with PyTorch"), ("horovod.mxnet", "Horovod with MXNet")):
        require("torch")
        require(module, component)
    out, docs, img = tmp_path / "quick.json", tmp_path / "benchmarks.md", tmp_path / "img"
    details = tmp_path / "benchmarks-emulated.md"
    docs.write_text("# Benchmarks\n\n## Core\n\nuntouched\n")
    result = run_job([sys.executable, "-m", "benchmarks", "emulated", "--quick", "--json", out, "--docs",
                      "--docs-file", docs, "--details-file", details, "--img-dir", img], timeout=300)
    assert result.returncode == 0, result.stdout[-4000:]
    assert "network: 2 hosts, veth pairs shaped to 1 Gbit/s per direction" in result.stdout
    assert "network: 4 hosts, veth pairs shaped" in result.stdout  # PS servers on hosts of their own
    results = json.loads(out.read_text())
    assert {g["framework"] for g in results["groups"]} == set(FRAMEWORKS)
    for group in results["groups"]:
        measured = {run["config"] for run in group["runs"]}
        assert measured == set(group["configs"]), group
        assert ("bytescheduler" if FRAMEWORKS[group["framework"]].one_run_per_job else "bytescheduler-sim") in measured
        assert group["calibration"]["fixed_seconds"] > 0 and group["prediction"]["calibrated"], group
        # the emulated step was timed (never faster than its sleeps) and the simulator computed that long
        nominal = results["workloads"][group["model"]]["compute_seconds"]
        assert group["calibration"]["compute_seconds"] >= 0.99 * nominal, group["calibration"]
        assert group["prediction"]["compute_time"] == pytest.approx(group["calibration"]["compute_seconds"])
        assert all(run["samples_per_second"] > 0 and run["cpu_seconds"] > 0 and 0 < run["machine_busy"] <= 1
                   for run in group["runs"])
        assert set(group["prediction"]["configs"]) == set(group["configs"])
        assert group["failures"] == []
    assert _namespaces_of(results["meta"]["pid"]) == []  # the emulated network is gone
    summary = docs.read_text()
    assert summary.startswith("# Benchmarks\n\n## Core\n\nuntouched\n")
    assert "### The matrix at a glance" in summary and "[every emulated run](benchmarks-emulated.md)" in summary
    text = details.read_text()
    assert "**torch-horovod, vgg16, 1 Gbit/s, 2 ranks**" in text and "**mxnet-ps, vgg16, 1 Gbit/s, 2 ranks**" in text
    assert "python -m benchmarks emulated --quick" in text
    assert "![bench_emulated_torch-horovod_vgg16_2r](img/bench_emulated_torch-horovod_vgg16_2r.png)" in text
    assert "A training step of the emulated model without communication took" in text
    assert "| rank 0 CPU per step | machine busy |" in text
    assert len(list(img.glob("bench_emulated_*.png"))) == len(FRAMEWORKS)
