"""The configurations a cell compares: what the framework does alone, and bytesched's policies.

A configuration says whether gradients go through bytesched (and with which policy and sizes)
and which environment the whole job needs (``HOROVOD_AUTOTUNE``, ``BYTESCHED_TUNING``): those are
read once per process, so configurations with different ``env`` never share a job.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from bytesched.core.config import Config, SchedulingParams


@dataclass(frozen=True)
class Configuration:
    """One column of the matrix."""

    name: str
    description: str
    policy: str | None = None
    """bytesched's policy; None: the framework's own communication (the baseline)."""
    params: SchedulingParams = SchedulingParams()
    env: tuple[tuple[str, str], ...] = field(default=())
    simulated_as: str = "vanilla"
    """The simulator policy that models it (the simulator has no Horovod autotune)."""
    sized_by: str | None = None
    """Who chooses partition and credit per group, before its runs: ``"simulator"`` (on the
    calibrated cluster, :func:`.prediction.choose_sizes`) or ``"tuner"`` (bytesched's auto-tuner,
    in a tuning job on the same cluster, :func:`.runner.run_tuning`); the sizes are then handed
    to the workers. None: fixed sizes."""
    plan: bool = False
    """bytesched chooses the sizes itself at start-up (its default with no settings:
    :mod:`bytesched.runtime.startup_plan`); ``params`` are then only the two steps' before the plan."""
    scheduling: bool = True
    """False: bytesched with ``BYTESCHED_POLICY=off`` (the framework's own path from the first step)."""

    @property
    def scheduled(self) -> bool:
        return self.policy is not None

    def settings(self, base: Config) -> Config:
        """The worker's bytesched configuration: ``base`` (the job's environment) with this
        configuration's policy, sizes and plan, or with scheduling off."""
        if not self.scheduling:
            return dataclasses.replace(base, policy="fifo", scheduling=False, plan=False)
        return dataclasses.replace(base, policy=self.policy, params=self.params, plan=self.plan)

    @property
    def sized_at_run_time(self) -> bool:
        return self.sized_by is not None


UNLIMITED = SchedulingParams(partition_bytes=math.inf, credit_bytes=math.inf)
FITTED = SchedulingParams(partition_bytes=512 * 1024, credit_bytes=4096 * 1024)

CONFIGURATIONS: dict[str, Configuration] = {c.name: c for c in (
    Configuration("vanilla", "the framework alone (Horovod, DistributedDataParallel, or KVStore)"),
    Configuration("autotune", "plain Horovod with HOROVOD_AUTOTUNE=1", env=(("HOROVOD_AUTOTUNE", "1"),)),
    Configuration("bytescheduler", "bytesched, bytescheduler policy, fixed 4 MB partitions / 16 MB credit",
                  policy="bytescheduler", simulated_as="bytescheduler"),
    Configuration("plan", "bytesched with no settings: it stays out of the way for two steps, times the "
                  "backend's all-reduce, and rank 0 picks partition and credit by simulating the second step "
                  "(the start-up plan); on a parameter server, sizes it chose are then tried, six steps on them "
                  "and six passing through, and kept only if faster (over an all-reduce too in result files of "
                  "revisions 3e837b0 to caf6531; untried in files before them; over torch.distributed again from "
                  "the files of the tried sizes there on, where a tried plan needs a 1.05x prediction, an untried "
                  "one 1.25x); on the PyTorch stacks, where the plan "
                  "stays out, six steps through the Core and six passing through, and the faster path is kept "
                  "(from revision 0f4ca93 on; before it only on a GPU); the timed steps come after it; over "
                  "torch.distributed the buckets of a plan that stays out filled to DDP's bucket cap scaled like the "
                  "model from the files of the scaled bound on (a quarter of the model, each at most that, before)",
                  policy="bytescheduler", simulated_as="bytescheduler", plan=True),
    Configuration("plan-untried", "bytesched with no settings but BYTESCHED_PLAN_TRIAL=0: the start-up plan's "
                  "sizes are kept as predicted, untried", policy="bytescheduler", simulated_as="bytescheduler",
                  plan=True, env=(("BYTESCHED_PLAN_TRIAL", "0"),)),
    Configuration("plan-measured", "bytesched with no settings but BYTESCHED_STAY_OUT_PATH=measure (PyTorch "
                  "only; the default from revision 0f4ca93 on, where it runs as `plan` does): where the start-up "
                  "plan stays out, six steps through the Core and six passing through, and the faster path is "
                  "kept; the warm-up lasts until then",
                  policy="bytescheduler", simulated_as="bytescheduler", plan=True,
                  env=(("BYTESCHED_STAY_OUT_PATH", "measure"),)),
    Configuration("plan-predicted", "bytesched with no settings but BYTESCHED_STAY_OUT_PATH=predict (PyTorch "
                  "only; the default on the CPU before revision 0f4ca93): where the start-up plan stays out, it "
                  "passes through at once unless sizes were predicted to gain 2 %",
                  policy="bytescheduler", simulated_as="bytescheduler", plan=True,
                  env=(("BYTESCHED_STAY_OUT_PATH", "predict"),)),
    Configuration("plan-1mb", "bytesched with no settings but BYTESCHED_FUSION_BYTES=1MB (PyTorch only): where "
                  "the start-up plan stays out over torch.distributed, the 1 MB buckets it kept before revision "
                  "bfa5135 instead of a quarter of the model", policy="bytescheduler", simulated_as="bytescheduler",
                  plan=True, env=(("BYTESCHED_FUSION_BYTES", "1MB"),)),
    Configuration("plan-25mb", "bytesched with no settings but BYTESCHED_STAY_OUT_FUSION_BYTES=25MB (PyTorch "
                  "only): where the start-up plan stays out, buckets filled to 25 MB unscaled (on the 24 MB scaled "
                  "models, a quarter of the model) instead of DDP's bucket cap scaled like the model, which `plan` "
                  "gets from the files of the scaled bound on", policy="bytescheduler", simulated_as="bytescheduler",
                  plan=True, env=(("BYTESCHED_STAY_OUT_FUSION_BYTES", "25MB"),)),
    Configuration("bytescheduler-fit", "bytesched, bytescheduler policy, 512 KB partitions / 4 MB credit: the "
                  "best of eight sizes in a sweep of the MXNet PS VGG16 cell at 1 Gbit/s, one run each "
                  "(docs/benchmarks.md); the defaults suit 10-100 Gbit/s, and at 1 Gbit/s a 16 MB credit "
                  "holds about 130 ms of transfers, which the next forward pass waits behind",
                  policy="bytescheduler", params=FITTED, simulated_as="bytescheduler"),
    Configuration("bytescheduler-sim", "bytesched, bytescheduler policy, the partition and credit sizes the "
                  "simulator predicts best for the group's calibrated cluster (what `bytesched simulate --tune` "
                  "tells a user), chosen before the runs", policy="bytescheduler", simulated_as="bytescheduler",
                  sized_by="simulator"),
    Configuration("bytescheduler-tuned", "bytesched, bytescheduler policy, the partition and credit sizes "
                  "bytesched's auto-tuner kept in a tuning job of the same cell before the runs (BYTESCHED_TUNING=1, "
                  "trials of 20 steps, on the lattice fitted to the model, 375 KB to 24 MB partitions for the "
                  "24 MB models; in older result files, all-reduce from 256 KB / 1 MB with BYTESCHED_TUNING_FLOOR "
                  "and PS from 500 KB / 2 MB; then fixed, as a user's next job gets them with BYTESCHED_TUNING_LOAD)",
                  policy="bytescheduler", simulated_as="bytescheduler", sized_by="tuner"),
    Configuration("probe-coarse", "calibration: bytesched at 4 MB partitions / 16 MB credit", policy="bytescheduler",
                  params=SchedulingParams(partition_bytes=4 << 20, credit_bytes=16 << 20),
                  simulated_as="bytescheduler"),
    Configuration("probe-fine", "calibration: bytesched at 512 KB partitions / 2 MB credit", policy="bytescheduler",
                  params=SchedulingParams(partition_bytes=512 << 10, credit_bytes=2 << 20),
                  simulated_as="bytescheduler"),
    Configuration("probe-small", "calibration (PS): bytesched at 256 KB partitions / 1 MB credit",
                  policy="bytescheduler", params=SchedulingParams(partition_bytes=256 << 10, credit_bytes=1 << 20),
                  simulated_as="bytescheduler"),
    Configuration("tuned", "bytesched, bytescheduler policy, BYTESCHED_TUNING=1 from the job's start: the timed "
                  "steps fall in the tuner's first trial, the default sizes rounded onto its lattice ("
                  "fitted to the model: 4.2 MB / 17 MB for the 24 MB models; in older result files all-reduce "
                  "8 MB / 16 MB, the lattice's smallest partition, and PS 4 MB / 16 MB), so this shows what tuning "
                  "costs while it searches, not what it finds (that is `bytescheduler-tuned`)",
                  policy="bytescheduler", env=(("BYTESCHED_TUNING", "1"),), simulated_as="bytescheduler"),
    Configuration("off", "bytesched with scheduling effectively off (partition and credit unlimited)",
                  policy="bytescheduler", params=UNLIMITED, simulated_as="bytescheduler"),
    Configuration("policy-off", "bytesched with BYTESCHED_POLICY=off: every gradient on the framework's own "
                  "path from the first step (no plan, no Core in the way); over torch.distributed its buckets filled "
                  "to DDP's bucket cap scaled like the model from the files of the scaled bound on (a quarter of the "
                  "model, each at most that, before)", policy="fifo", scheduling=False),
    Configuration("policy-off-1mb", "bytesched with BYTESCHED_POLICY=off and BYTESCHED_FUSION_BYTES=1MB "
                  "(PyTorch only): over torch.distributed, the 1 MB buckets it passed through before revision "
                  "bfa5135 instead of a quarter of the model", policy="fifo", scheduling=False,
                  env=(("BYTESCHED_FUSION_BYTES", "1MB"),)),
    Configuration("policy-off-25mb", "bytesched with BYTESCHED_POLICY=off and BYTESCHED_STAY_OUT_FUSION_BYTES=25MB "
                  "(PyTorch only): over torch.distributed, buckets filled to 25 MB unscaled (a quarter of the "
                  "scaled model) instead of DDP's bucket cap scaled like the model", policy="fifo", scheduling=False,
                  env=(("BYTESCHED_STAY_OUT_FUSION_BYTES", "25MB"),)),
    Configuration("fifo", "bytesched, fifo policy", policy="fifo", simulated_as="fifo"),
    Configuration("p3", "bytesched, p3 policy (160 KB slices, one in flight)", policy="p3", simulated_as="p3"),
    Configuration("prophet", "bytesched, prophet policy", policy="prophet", simulated_as="prophet"),
    # Measured when a job could still choose tictac, without the graph only the simulator builds, so
    # it ordered like bytescheduler; kept so that those result files still report (no longer run).
    Configuration("tictac", "bytesched, tictac policy (run without its graph: bytescheduler's order)",
                  policy="bytescheduler", simulated_as="tictac"),
)}

BASELINE = "vanilla"
TUNING = "tuned"
"""The configuration a tuning job runs (its trial 0 is the default sizes, as in a user's job,
rounded onto the lattice)."""
TUNING_STEPS_PER_TRIAL = 20
TUNING_WARMUP_STEPS = 5
"""A tuning job's trials: shorter than the library's default of 50 steps (10 unmeasured) so that
a cell's tuning takes minutes; 12 steps are measured per trial (the last 3 are the lead)."""
PROBES = ("probe-coarse", "probe-fine")
"""The two partition sizes whose measured step times fit bytesched's per-message overhead."""
PS_PROBES = (*PROBES, "probe-small")
"""A PS's probes: also the grid's smallest partition and credit, whose step time shows the
pipelined per-message latency of bytesched's PS path (the other two hardly do)."""


def probes(arch: str) -> tuple[str, ...]:
    """The probe configurations the calibration runs for an ``allreduce`` or ``ps`` group."""
    return PS_PROBES if arch == "ps" else PROBES


def configuration(name: str, sizes: dict[str, tuple[int, int]] | None = None) -> Configuration:
    """The configuration called ``name`` (ValueError listing the known ones otherwise), with the
    partition and credit of ``sizes[name]`` if it is sized by the simulator (which it must be)."""
    try:
        config = CONFIGURATIONS[name]
    except KeyError:
        raise ValueError(f"configuration {name!r} is unknown: expected one of {', '.join(CONFIGURATIONS)}") from None
    if not config.sized_at_run_time:
        return config
    if not sizes or name not in sizes:
        raise ValueError(f"configuration {name!r} needs its partition and credit (--sizes {name}=PARTITION:CREDIT)")
    partition, credit = sizes[name]
    return with_sizes(config, partition, credit)


def with_sizes(config: Configuration, partition: int, credit: int) -> Configuration:
    """``config`` running with these partition and credit sizes (bytes)."""
    return dataclasses.replace(config, params=SchedulingParams(partition_bytes=partition, credit_bytes=credit))
