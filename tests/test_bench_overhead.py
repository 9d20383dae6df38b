"""``python -m benchmarks overhead`` runs its jobs end to end (timings are not asserted: they
belong in docs/benchmarks.md, measured on a quiet machine)."""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys

import pytest

from benchmarks.overhead import JobResult, Window, job_argv, register, summarize
from benchmarks.provenance import INHERITED_PREFIXES, command_line
from conftest import require, run_job


def test_summary_is_the_median_and_its_excess_over_plain_per_tensor() -> None:
    def jobs(*times: float) -> list[JobResult]:
        return [JobResult(ms, switches_per_step=8.0 * ms, threads=int(ms),
                          cpu_ms_by_thread={"MainThread": ms / 2, **({"bytesched-core-0": 1.0} if ms > 15 else {})},
                          gc_passes_per_step=ms / 10, gc_ms_per_step=ms / 100)
                for ms in times]

    result = summarize({"mxnet": {"plain": jobs(10.0, 12.0, 11.0), "unfused": jobs(20.0, 15.0, 30.0),
                                  "fused": jobs(9.0, 9.0, 9.0)}}, tensors=4)
    assert result["mxnet"]["plain"] == {"ms_per_step": 11.0, "min": 10.0, "max": 12.0, "us_per_tensor_over_plain": 0.0,
                                        "switches_per_tensor": 22.0, "threads": 12,  # 8 x 11 / 4; the most
                                        "passed_through": 0, "cpu_us_per_tensor_by_thread": {"MainThread": 1375.0},
                                        "gc_passes_per_step": 1.1, "gc_ms_per_step": 0.11}
    assert result["mxnet"]["unfused"]["us_per_tensor_over_plain"] == 2250.0  # (20 - 11) ms / 4
    assert result["mxnet"]["fused"]["us_per_tensor_over_plain"] == -500.0
    # Per thread, the median over jobs (0 where a job lacks the thread), busiest first.
    assert result["mxnet"]["unfused"]["cpu_us_per_tensor_by_thread"] == {"MainThread": 2500.0,
                                                                         "bytesched-core-0": 250.0}


def test_the_window_counts_the_garbage_collectors_passes_and_their_time() -> None:
    window = Window()
    window.start()
    gc.collect()
    gc.collect(0)
    window.stop()
    assert window.gc_passes == 2 and window.gc_seconds > 0
    gc.collect()  # after stop(): not counted
    assert window.gc_passes == 2


def _arguments(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    return parser.parse_args(["overhead", *argv])


def test_every_stack_runs_its_jobs_on_the_ranks_asked_for() -> None:
    args = _arguments("--ranks", "4")
    horovod = job_argv("mxnet", "off", args)
    assert horovod[horovod.index("-np") + 1] == "4" and "localhost:4" in horovod
    torchrun = job_argv("torch-distributed", "off", args)
    assert torchrun[torchrun.index("--nproc-per-node") + 1] == "4"
    ps = job_argv("mxnet-ps", "core", args)
    assert ps[ps.index("--servers") + 1] == ps[ps.index("--workers") + 1] == "4"
    assert _arguments().ranks == 2
    with pytest.raises(SystemExit, match="--ranks >= 2"):
        args = _arguments("--ranks", "1")
        args.func(args)


def test_the_command_names_the_settings_every_job_inherits(monkeypatch: pytest.MonkeyPatch) -> None:
    """A BYTESCHED_*, HOROVOD_* or MXNET_* variable set for the whole run changes what every job
    measures, so the recorded command starts with it; other variables are left out."""
    for name in [n for n in os.environ if n.startswith(INHERITED_PREFIXES)]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("BYTESCHED_FUSION_BYTES", "6MB")
    monkeypatch.setenv("HOROVOD_CYCLE_TIME", "2")
    monkeypatch.setenv("LANG", "C")
    monkeypatch.setattr(sys, "argv", ["/x/benchmarks/__main__.py", "emulated", "--models", "vgg16 resnet50"])
    assert command_line("emulated") == ("BYTESCHED_FUSION_BYTES=6MB HOROVOD_CYCLE_TIME=2 python -m benchmarks "
                                        "emulated --models 'vgg16 resnet50'")


@pytest.mark.multiproc
@pytest.mark.timeout(150)
@pytest.mark.parametrize("framework, modes", [
    ("mxnet", "unfused,fused"), ("torch-distributed", "core,off"), ("mxnet-ps", "core,off")])
def test_every_mode_runs_on_two_ranks(framework: str, modes: str) -> None:
    """Every mode on some stack: MXNet over Horovod (horovodrun) with no settings, unfused and
    fused; PyTorch over torch.distributed against DDP (torchrun) and the MXNet parameter server
    (bytesched launch) through the Core and with scheduling off (``--modes``; the plugins' own tests
    cover each path on every stack). ``plain`` always runs."""
    if framework == "mxnet":
        require("horovod.mxnet", "Horovod built with MXNet")
    if framework == "mxnet-ps":
        require("mxnet")
    result = run_job([sys.executable, "-m", "benchmarks", "overhead", "--frameworks", framework,
                      "--modes", modes, "--layers", "3", "--steps", "2", "--warmup", "1", "--rounds", "1", "--json"],
                     timeout=120, env={**os.environ, "BYTESCHED_STALL_WARNING_S": "600"})
    assert result.returncode == 0, result.stdout[-3000:]
    report = json.loads(result.stdout[result.stdout.index("{"):])
    assert report["tensors"] == 6 and report["command"].startswith("BYTESCHED_STALL_WARNING_S=600 ") \
        and " python -m benchmarks overhead --frameworks " in report["command"], report["command"]
    assert set(report["runs"][framework]) == {"plain", *modes.split(",")}
    for jobs in report["runs"][framework].values():
        [job] = jobs
        assert job["ms_per_step"] > 0 and job["switches_per_step"] >= 0 and job["threads"] >= 1, job
        assert job["cpu_ms_by_thread"]["MainThread"] > 0, job
    runs = report["runs"][framework]
    if "off" in runs:
        assert runs["off"][0]["passes_through"] and not runs["core"][0]["passes_through"]  # off: from the first step
