"""Running the matrix on emulated clusters: one cluster per bandwidth and rank count, one job per
batch of configurations, results streamed to a callback as each run ends."""

from __future__ import annotations

import csv
import dataclasses
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence, TypeVar

from bytesched.core.config import ConfigError, from_env
from ..emulation import Cluster, Job, emulated_cluster, format_rate
from bytesched.tuning.log import load_best
from .calibration import Calibration
from .cells import Group, rounds
from .configs import (BASELINE, CONFIGURATIONS, TUNING, TUNING_STEPS_PER_TRIAL, TUNING_WARMUP_STEPS,
                      Configuration, probes as probe_names)
from .protocol import MARKER, parse, worker_argv


@dataclass(frozen=True)
class Workload:
    """What every rank of a group trains, and for how long."""

    model: str
    size_scale: float
    time_scale: float
    steps: int
    warmup: int
    gradient_bytes: int = 0
    """Bytes of gradients per iteration (0 for a real model): the calibration's large operation."""


RETRIES = 1
"""How often a failed job is run again before its runs count as not measured."""
T = TypeVar("T")


class JobFailed(RuntimeError):
    """A benchmark job exited non-zero or reported fewer runs than it was given."""


def hosts_for(group: Group) -> int:
    """Emulated hosts a group needs: one per rank, and for a parameter server one more per
    server (each server on a host of its own, as the simulator's PS model assumes: with servers
    on the workers' hosts half of every push and pull never crosses a shaped link)."""
    return 2 * group.ranks if group.framework.launcher == "ps" else group.ranks


def launch(cluster: Cluster, group: Group, worker_args: Sequence[str], env: dict[str, str]) -> Job:
    """Start one job of ``group`` on ``cluster``, every rank running the group's worker with ``worker_args``."""
    framework = group.framework
    argv = [sys.executable, "-m", f"benchmarks.emulated.{framework.worker}", *worker_args]
    if framework.launcher == "horovod":
        return cluster.launch_horovod(argv, env=env, ranks=group.ranks)
    if framework.launcher == "torchrun":
        return cluster.launch_torch_distributed(argv, env=env, ranks=group.ranks)
    if framework.launcher == "ps":
        return cluster.launch_ps(argv, env=env, workers=group.ranks, servers=group.ranks)
    raise ValueError(f"framework {framework.name!r} has unknown launcher {framework.launcher!r}")


def _worker_args(workload: Workload, group: Group, **mode: Any) -> list[str]:
    return worker_argv(group.framework.backend, workload.model, workload.size_scale, workload.time_scale,
                       workload.steps, workload.warmup, **mode)


def run_calibration(cluster: Cluster, group: Group, workload: Workload, timeout: float,
                    on_line: Callable[[str], None]) -> Calibration:
    """Time the framework's small and whole-gradient operations on ``cluster``; where the group
    has simulator-sized configurations also the workload under the probe sizes and on the plain
    path, and where it has tuner-sized ones the tuning job (:mod:`.calibration`)."""
    job = launch(cluster, group, _worker_args(workload, group, calibrate=workload.gradient_bytes), {})
    records = _finish(job, timeout, expected=1, what="calibration")
    calibration = Calibration.from_record(records[0]["calibration"])
    if any(c.sized_by == "tuner" for c in group.configurations):
        calibration = run_tuning(cluster, group, workload, calibration, timeout)
    if not any(c.sized_by == "simulator" for c in group.configurations):
        return calibration
    names = probe_names(group.framework.arch)
    runs_of = [CONFIGURATIONS[name] for name in (BASELINE, *names)]
    # One process per run on MXNet; elsewhere one job in the order V A B B A V, so a drifting
    # load weighs on every run alike.
    jobs = [[config] for config in runs_of] if group.framework.one_run_per_job else [runs_of + runs_of[::-1]]
    runs = [run for configs in jobs for run in run_job(cluster, group, workload, configs, 0, timeout, on_line)]
    seconds = {config.name: statistics.mean(run["seconds"] / run["steps"] for run in runs
                                            if run["config"] == config.name)
               for config in runs_of}
    return dataclasses.replace(calibration, probe_seconds=tuple(seconds[name] for name in names),
                               probe_baseline_seconds=seconds[BASELINE])


def run_tuning(cluster: Cluster, group: Group, workload: Workload, calibration: Calibration,
               timeout: float) -> Calibration:
    """``calibration`` with the pair bytesched's auto-tuner keeps on ``workload``: one job runs the
    tuning configuration (:data:`.configs.TUNING`) with trials of :data:`.configs.TUNING_STEPS_PER_TRIAL`
    steps for as many steps as its most trials take (the environment's
    ``BYTESCHED_TUNING_MAX_TRIALS``, 15 unset), on the lattice the library fits to the model,
    writing the tuning log, whose kept pair is read as a user's next job reads it
    (``BYTESCHED_TUNING_LOAD``: the ``best`` row, or the fastest trial if the search had not
    ended). JobFailed if the job fails or its log holds no trial."""
    trials = from_env().tuning_max_trials
    steps = (trials + 1) * TUNING_STEPS_PER_TRIAL
    with tempfile.TemporaryDirectory(prefix="bytesched-bench-tuning-") as folder:
        log = Path(folder) / "tuning.csv"
        env = {**dict(CONFIGURATIONS[TUNING].env), "BYTESCHED_TUNING_LOG": str(log),
               "BYTESCHED_TUNING_STEPS_PER_TRIAL": str(TUNING_STEPS_PER_TRIAL),
               "BYTESCHED_TUNING_WARMUP_STEPS": str(TUNING_WARMUP_STEPS)}
        started = time.monotonic()
        job = launch(cluster, group, _worker_args(dataclasses.replace(workload, steps=steps, warmup=0), group,
                                                  runs=[(TUNING, 0)]), env)
        _finish(job, timeout, expected=1, what="tuning")
        seconds = time.monotonic() - started
        try:
            kept = load_best(log)
            with log.open(newline="") as f:
                rows = tuple(tuple(row) for row in csv.reader(f))[1:]
        except (ConfigError, OSError) as error:
            raise JobFailed(f"the tuning job left no usable log: {error}") from None
    return dataclasses.replace(calibration, tuned_sizes=(int(kept.partition_bytes), int(kept.credit_bytes)),
                               tuning_trials=rows, tuning_seconds=seconds)


def run_job(cluster: Cluster, group: Group, workload: Workload, configs: Sequence[Configuration], round_number: int,
            timeout: float, on_line: Callable[[str], None]) -> list[dict]:
    """Run ``configs`` in one job; their result records (JobFailed with the output's tail if not all came)."""
    runs = [(c.name, round_number) for c in configs]
    sizes = {c.name: (int(c.params.partition_bytes), int(c.params.credit_bytes))
             for c in configs if c.sized_at_run_time}
    job = launch(cluster, group, _worker_args(workload, group, runs=runs, sizes=sizes), dict(configs[0].env))
    watcher = _Echo(job, on_line)
    watcher.start()
    try:
        return _finish(job, timeout, expected=len(runs), what=", ".join(c.name for c in configs))
    finally:
        watcher.stop()


def _finish(job: Job, timeout: float, expected: int, what: str) -> list[dict]:
    """The result records of ``job`` once it ended (JobFailed with its output's tail unless it
    exited 0 with ``expected`` records)."""
    try:
        status = job.wait(timeout)
    except TimeoutError as error:
        raise JobFailed(f"{error}\n" + "\n".join(job.output[-30:])) from None
    records = parse(job.output)
    if status != 0 or len(records) != expected:
        raise JobFailed(f"job {what} exited with status {status} and reported {len(records)} of {expected} "
                        f"record(s); last output:\n" + "\n".join(job.output[-30:]))
    return records


class _Echo(threading.Thread):
    """Hands each new result line of a running job to ``on_line`` (progress while it runs)."""

    def __init__(self, job: Job, on_line: Callable[[str], None]) -> None:
        super().__init__(daemon=True, name=f"bench-echo-{job.name}")
        self.job, self.on_line = job, on_line
        self.seen = 0
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(0.5):
            self._drain()

    def _drain(self) -> None:
        lines = self.job.output
        while self.seen < len(lines):
            line = lines[self.seen]
            self.seen += 1
            if MARKER in line:
                self.on_line(line)

    def stop(self) -> None:
        self.done.set()
        self.join()
        self._drain()


def run_groups(groups: Sequence[Group], workloads: dict[str, Workload], repeats: int, topology: str,
               timeout: float, prepare: Callable[[Group, Calibration | None], Group],
               record: Callable[[Group, dict], None],
               failed: Callable[[Group, list[str], str, bool], None],
               say: Callable[[str], None]) -> None:
    """Run every group, ``repeats`` interleaved rounds each, on one cluster per (bandwidth, hosts).

    Before a group's rounds, a calibration job measures the framework's costs on that cluster
    (emulated models only) and ``prepare(group, calibration)`` returns the group to run (its
    simulator-sized configurations given their sizes); a failed calibration is reported through
    ``failed`` and ``prepare`` gets None. ``record(group, run)`` gets every measured run;
    ``failed(group, configs, reason, final)`` every job that failed. A failed job (calibration
    included) is retried once (``final`` is False for the first failure); the rest of the matrix
    runs either way.
    """
    by_network: dict[tuple[int, int], list[Group]] = {}
    for group in groups:
        by_network.setdefault((group.bits_per_second, hosts_for(group)), []).append(group)
    total = sum(len(g.configurations) for g in groups) * repeats
    done = 0

    def show_run(label: str, line: str) -> None:
        run = parse([line])[0]
        say(f"  {label}: {run['config']:<17} {run['samples_per_second']:9.1f} samples/s")

    def attempt(group: Group, label: str, what: list[str], work: Callable[[], T]) -> T | None:
        """``work()``, run again once if its job fails (a Gloo connection refused at start-up was
        seen on the loaded machine); None if it failed twice."""
        for number in range(1 + RETRIES):
            try:
                return work()
            except JobFailed as error:
                final = number == RETRIES
                failed(group, what, str(error), final)
                say(f"  {label}: FAILED {', '.join(what)} ({str(error).strip().splitlines()[0][:160]})"
                    + ("" if final else "; retrying once"))
        return None

    for (bits, hosts), members in by_network.items():
        with emulated_cluster(hosts, bits, topology=topology) as cluster:
            say(f"network: {cluster.describe()}")
            for group in members:
                title = f"{group.framework.name} {group.model} {format_rate(bits)} {group.ranks} ranks"
                workload = workloads[group.model]
                calibration = None
                if workload.gradient_bytes:
                    calibration = attempt(group, title, ["calibration"], lambda: run_calibration(
                        cluster, group, workload, timeout, lambda line: show_run(f"{title} calibration", line)))
                    if calibration is None:
                        say(f"  {title}: predicting with the simulator's defaults")
                    else:
                        say(f"  {title}: calibration: {calibration.fixed_seconds * 1e3:.2f} ms per operation, "
                            f"{calibration.large_bytes / 1e6:.1f} MB in {calibration.large_seconds * 1e3:.0f} ms")
                        if calibration.tuned_sizes is not None:
                            partition, credit = calibration.tuned_sizes
                            say(f"  {title}: the tuner kept {partition / 1e6:.3f} MB partitions / "
                                f"{credit / 1e6:.3f} MB credit after {len(calibration.tuning_trials or ())} log "
                                f"rows in {calibration.tuning_seconds:.0f} s")
                prepared = prepare(group, calibration)
                kept = {c.name for c in prepared.configurations}
                left_out = [c.name for c in group.configurations if c.name not in kept]
                if left_out:  # a tuner-sized configuration whose tuning job failed
                    total -= len(left_out) * repeats
                    say(f"  {title}: left out {', '.join(left_out)} (no sizes for it)")
                group = prepared
                for number, jobs in rounds(group, repeats):
                    for configs in jobs:
                        label = f"{title} round {number + 1}/{repeats}"
                        started = time.monotonic()
                        records = attempt(group, label, [c.name for c in configs], lambda: run_job(
                            cluster, group, workload, configs, number, timeout,
                            lambda line, label=label: show_run(label, line))) or []
                        for run in records:
                            record(group, run)
                        done += len(configs)
                        say(f"[{done}/{total} runs] job of {len(configs)} run(s) took "
                            f"{time.monotonic() - started:.0f} s")
