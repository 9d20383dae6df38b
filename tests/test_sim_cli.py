"""``bytesched simulate`` and its Python mirror :func:`bytesched.sim.simulate`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bytesched.cli import main as cli
from bytesched.core.config import SIMULATED_POLICIES, UNLIMITED, ConfigError, SchedulingParams
from bytesched.sim import (Cluster, Layer, ModelProfile, Tensor, WorkerSpec, load_profile, parse_bandwidth,
                           parse_duration, simulate)
from bytesched.sim.options import make_cluster
from bytesched.sim.plan import candidate_sizes, make_plan
from bytesched.sim.predict import tuning_grid
from bytesched.sim.simulator import run

from conftest import REPO_ROOT


def test_units() -> None:
    assert parse_bandwidth("10Gbps") == 1.25e9
    assert parse_bandwidth("25Gbit/s") == 3.125e9
    assert parse_bandwidth("1.25GB/s") == 1.25e9
    assert parse_bandwidth(5e8) == 5e8
    for bad in ("10Gb/s", "fast", "0Gbps", "-1"):
        with pytest.raises(ConfigError, match="bandwidth"):
            parse_bandwidth(bad)
    assert parse_duration("300us") == pytest.approx(3e-4)
    assert parse_duration("1.5ms") == pytest.approx(1.5e-3)
    with pytest.raises(ConfigError, match="not a duration"):
        parse_duration("3 parsecs")


def test_cluster_options_are_parsed_and_checked() -> None:
    c = make_cluster(arch="ps", workers="8", bandwidth="25Gbps", overhead="50us",
                     worker_specs=["3:compute=1.5,bandwidth=1Gbps"])
    assert (c.arch, c.workers, c.bandwidth, c.overhead) == ("ps", 8, 3.125e9, pytest.approx(5e-5))
    assert c.worker_specs == ((3, WorkerSpec(compute=1.5, bandwidth=1.25e8)),)
    assert [len(ranks) for _, ranks in c.worker_classes()] == [7, 1]
    assert c.num_servers == 8
    for options, message in (
        ({"arch": "ring"}, "arch='ring' is unknown"),
        ({"workers": 0}, "workers=0"),
        ({"worker_specs": ["9:compute=2"]}, "ranks are 0..3"),
        ({"worker_specs": ["1:speed=2"]}, "is not compute=FACTOR"),
        ({"colour": "red"}, "'colour' is not a cluster option"),
    ):
        with pytest.raises(ConfigError, match=message):
            make_cluster(Cluster(workers=4), **options)


def test_simulate_api_every_policy_against_vanilla() -> None:
    report = simulate("resnet50", arch="allreduce", workers=8, bandwidth="10Gbps", partition="8MB", credit="32MB")
    (prediction,) = report.predictions
    assert [r.policy for r in prediction.results] == ["vanilla", *SIMULATED_POLICIES, "plan"]
    vanilla = prediction.vanilla
    assert vanilla.speedup == 1.0
    for r in prediction.results:
        assert r.speedup == pytest.approx(vanilla.iteration_time / r.iteration_time)
        assert r.throughput == pytest.approx(8 * 32 / r.iteration_time)
        assert r.iteration_time >= prediction.ideal_time * (1 - 1e-9)  # nothing beats the lower bound
    assert prediction.result("bytescheduler").partition_bytes == 8e6
    assert prediction.result("bytescheduler").credit_bytes == 32e6
    assert prediction.result("p3").credit_bytes is None  # stop-and-wait has no credit window
    table = report.table()
    assert "resnet50 on 8 workers, allreduce" in table and "ideal = max(compute" in table


def test_overhead_is_paid_per_collective_and_per_push_and_pull() -> None:
    """``overhead`` (seconds, or a string such as "3ms") is a cost per message: one per
    all-reduce call, one per push and one per pull. A one-layer model under p3 communicates its
    24 slices of 160 KB one after another on the critical path, so θ adds 24θ to an all-reduce
    iteration and 48θ to a PS one; vanilla (one whole-tensor message, no fusion) adds θ and 2θ.
    (The tensor stays below MXNet's big-array bound, so the PS keeps it whole on one server.)"""
    model = ModelProfile("one", (Layer("l0", 0.01, 0.02, (Tensor("w", 3_840_000),)),), batch_size=1)
    theta = 3e-3
    for arch, per_subtask in (("allreduce", 1), ("ps", 2)):
        (free,), (paid,) = (simulate(model, policies="p3", arch=arch, workers=2, overhead=overhead, latency=0.0,
                                     fusion_threshold=0, cycle_time=0.0, warmup=1, iterations=1).predictions
                            for overhead in (0.0, "3ms"))
        added_p3 = paid.result("p3").iteration_time - free.result("p3").iteration_time
        added_vanilla = paid.vanilla.iteration_time - free.vanilla.iteration_time
        assert added_p3 == pytest.approx(24 * per_subtask * theta, rel=1e-9), arch
        assert added_vanilla == pytest.approx(per_subtask * theta, rel=1e-9), arch


def test_sweep_with_unit_on_the_last_value() -> None:
    report = simulate("vgg16", policies="bytescheduler", sweep="bandwidth=1,10,100Gbps")
    assert [p.cluster.bandwidth for p in report.predictions] == [1.25e8, 1.25e9, 1.25e10]
    assert report.predictions[0].vanilla.iteration_time > report.predictions[2].vanilla.iteration_time
    credits = simulate("vgg16", policies="bytescheduler", sweep=("credit", ["4MB", "64MB"])).predictions
    assert [p.result("bytescheduler").credit_bytes for p in credits] == [4e6, 64e6]
    with pytest.raises(ConfigError, match="cannot sweep 'colour'"):
        simulate("vgg16", sweep="colour=1,2")


def test_tuning_picks_the_best_of_the_grid() -> None:
    grid = [SchedulingParams(partition_bytes=4e6, credit_bytes=4e6),
            SchedulingParams(partition_bytes=8e6, credit_bytes=32e6)]
    tuned = simulate("vgg16", arch="ps", workers=4, policies="bytescheduler,p3", tune=grid).predictions[0]
    each = [simulate("vgg16", arch="ps", workers=4, policies="bytescheduler", partition=p.partition_bytes,
                     credit=p.credit_bytes).predictions[0].result("bytescheduler").iteration_time for p in grid]
    assert tuned.result("bytescheduler").iteration_time == min(each)
    assert tuned.result("p3").partition_bytes == 160_000  # no credit window: nothing to tune
    assert len(tuning_grid()) == 24
    with pytest.raises(ConfigError, match="do not also give"):
        simulate("vgg16", tune=True, partition="4MB")


@pytest.mark.parametrize("case", [
    dict(profile="vgg16", arch="ps", workers=16, bandwidth="10Gbps"),      # the defaults lose here (0.31x)
    dict(profile="transformer", arch="ps", workers=8, bandwidth="25Gbps"),
    dict(profile="resnet50", arch="allreduce", workers=64, bandwidth="25Gbps"),
    dict(profile="vgg16", arch="allreduce", workers=4, bandwidth="100Gbps"),  # communication hides anyway
])
def test_the_plan_is_the_fastest_candidate_and_stays_out_of_the_way_without_a_gain(case: dict[str, Any]) -> None:
    """The plan runs fifo unless a sized candidate is predicted more than 1 % faster, and then the
    fastest of them; its row in the report is that configuration's run."""
    profile = load_profile(case["profile"])
    cluster = make_cluster(None, **{k: v for k, v in case.items() if k != "profile"})
    chosen = make_plan(profile, cluster)
    def short(policy: str, params: SchedulingParams) -> float:
        return run(profile, cluster, policy, params, iterations=1, warmup=1).iteration_time
    fifo = short("fifo", SchedulingParams(partition_bytes=UNLIMITED, credit_bytes=UNLIMITED))
    best = min(short("bytescheduler", p) for p in candidate_sizes(profile, cluster))
    if best < 0.99 * fifo:
        assert chosen.policy == "bytescheduler" and chosen.search_iteration_time == best
    else:
        assert chosen.policy == "fifo" and chosen.params.partition_bytes == UNLIMITED
    prediction = simulate(case["profile"], policies="fifo,bytescheduler,plan", **{k: v for k, v in case.items()
                                                                                   if k != "profile"}).predictions[0]
    plan_row = prediction.result("plan")
    assert plan_row.iteration_time == run(profile, cluster, chosen.policy, chosen.params).iteration_time
    assert plan_row.iteration_time <= prediction.result("fifo").iteration_time


def test_simulate_command_table_json_and_plot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    png = tmp_path / "out.png"
    assert cli(["simulate", "--profile", "vgg16", "--arch", "ps", "--workers", "16", "--bandwidth", "10Gbps",
                "--servers", "4", "--policy", "fifo,bytescheduler", "--partition", "8MB", "--credit", "32MB",
                "--json", "--plot", str(png)]) == 0
    data = json.loads(capsys.readouterr().out)
    (prediction,) = data["predictions"]
    assert data["profile"]["name"] == "vgg16" and data["units"]["time"] == "s"
    assert prediction["cluster"]["servers"] == 4 and prediction["cluster"]["workers"] == 16
    assert [r["policy"] for r in prediction["results"]] == ["vanilla", "fifo", "bytescheduler"]
    assert prediction["results"][1]["credit_bytes"] is None
    assert prediction["ideal"]["iteration_time"] == max(prediction["compute_time"], prediction["communication_time"])
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_simulate_command_sweep_plot_and_heterogeneous_workers(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    png = tmp_path / "sweep.png"
    assert cli(["simulate", "--profile", "resnet50", "--workers", "8", "--policy", "bytescheduler",
                "--worker", "2:compute=2", "--sweep", "bandwidth=10,40Gbps", "--plot", str(png)]) == 0
    out = capsys.readouterr().out
    assert "[bandwidth = 10Gbps]" in out and "[bandwidth = 40Gbps]" in out and "rank 2: compute x2" in out
    assert png.stat().st_size > 10_000


def test_vanilla_buckets_fuse_the_frameworks_own_all_reduces() -> None:
    """``vanilla_bucket_bytes`` (DDP's buckets): vanilla all-reduces runs of consecutive tensors of
    at most that many bytes, each alone once its last gradient is ready; the scheduled path keeps
    its own ``bucket_bytes``."""
    profile = load_profile("resnet50")
    alone = make_cluster(None, workers=4, bandwidth="10Gbps", fusion_threshold=0)
    ddp = make_cluster(alone, vanilla_bucket_bytes="25MiB")
    per_tensor = run(profile, alone, "vanilla").subtasks_per_iteration
    bucketed = run(profile, ddp, "vanilla").subtasks_per_iteration
    assert per_tensor == profile.num_tensors and 1 < bucketed < 10
    params = SchedulingParams(partition_bytes=4_000_000, credit_bytes=16_000_000)
    assert run(profile, ddp, "bytescheduler", params).iteration_time == \
        run(profile, alone, "bytescheduler", params).iteration_time
    with pytest.raises(ConfigError, match="vanilla_bucket_bytes"):
        Cluster(vanilla_bucket_bytes=-1)


def test_simulate_command_over_torch_distributed(capsys: pytest.CaptureFixture[str]) -> None:
    """``--backend torch-distributed``: vanilla is DDP (25 MiB buckets, every collective alone),
    the scheduled path the plugin's 1 MB buckets, and the plan weighs batching while busy with
    every size; on ResNet50 at 25 Gbit/s it batches, and the table and JSON say so."""
    argv = ["simulate", "--profile", "resnet50", "--workers", "16", "--bandwidth", "25Gbps", "--policy", "plan"]
    assert cli([*argv, "--backend", "torch-distributed"]) == 0
    assert "(vanilla in 26.2144MB buckets)" in (table := capsys.readouterr().out) and "while busy" in table
    assert cli([*argv, "--backend", "torch-distributed", "--json"]) == 0
    (prediction,) = json.loads(capsys.readouterr().out)["predictions"]
    cluster, plan = prediction["cluster"], prediction["results"][1]
    assert (cluster["fusion_threshold"], cluster["bucket_bytes"], cluster["vanilla_bucket_bytes"]) == \
        (0, 1_000_000, 25 * 2**20)
    assert plan["batch_bytes"] > 0 and plan["speedup"] > 1.0
    assert cli([*argv, "--json"]) == 0  # over Horovod nothing batches
    (horovod,) = json.loads(capsys.readouterr().out)["predictions"]
    assert horovod["results"][1]["batch_bytes"] == 0 and horovod["cluster"]["vanilla_bucket_bytes"] == 0
    with pytest.raises(SystemExit):
        cli([*argv, "--backend", "nccl"])
    assert "invalid choice: 'nccl'" in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["--policy", "fastest"], "policy 'fastest' is unknown"),
    (["--bandwidth", "10Gb/s"], "is not a bandwidth"),
    (["--profile", "alexnet"], "no profile named 'alexnet'"),
    (["--worker", "1:compute=0"], "compute factor must be a positive number"),
    (["--partition", "4XB"], "is not a size"),
])
def test_simulate_command_errors(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli(["simulate", *argv]) == 2
    assert message in capsys.readouterr().err


def test_console_script_help() -> None:
    """The registered subcommands are reachable through ``python -m bytesched.cli``."""
    for command, option in (("simulate", "--sweep"), ("profile", "--measure")):
        done = subprocess.run([sys.executable, "-m", "bytesched.cli", command, "--help"], cwd=REPO_ROOT,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        assert option in done.stdout
