"""The benchmark matrix: frameworks x models x bandwidths x ranks x configurations, and the order
in which its runs happen (repeats interleaved, so baseline and candidates share the same load).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Iterator, Sequence

from .configs import BASELINE, CONFIGURATIONS, Configuration


REAL_MODELS = ("mlp",)
"""Models with real compute (one CPU thread per rank); any other model name is a simulator
profile run with emulated compute."""


@dataclass(frozen=True)
class Framework:
    """A training stack: which worker script, which backend flag, which launcher."""

    name: str
    worker: str
    """Module under benchmarks.emulated run as every rank."""
    backend: str
    launcher: str
    """Which launcher of the emulated cluster starts it: ``horovod`` (Horovod over Gloo),
    ``torchrun`` (torch.distributed's env:// rendezvous) or ``ps`` (ps-lite, one server per worker)."""
    arch: str
    """The simulator's architecture: ``allreduce`` or ``ps``."""
    one_run_per_job: bool
    """True for the MXNet stacks: a KVStore can be created only once per process, and the MXNet
    worker keeps to one configuration per process over Horovod too."""
    configurations: tuple[str, ...]
    """The configurations that make sense on this stack."""
    fuses: bool = False
    """bytesched's plugin on this stack fuses small tensors into buckets (``BYTESCHED_FUSION_BYTES``,
    the PyTorch plugin and MXNet over Horovod), which the simulator then models."""
    asynchronous: bool = False
    """Asynchronous SGD (a ``dist_async`` KVStore), which the simulator then models."""


_ALLREDUCE = ("vanilla", "bytescheduler", "plan", "plan-untried", "bytescheduler-fit", "bytescheduler-sim",
              "bytescheduler-tuned", "tuned", "off", "policy-off", "fifo", "p3", "prophet")
# The path trial and the bucket layout are the PyTorch plugin's.
_TORCH = (*_ALLREDUCE, "plan-measured", "plan-predicted", "plan-1mb", "policy-off-1mb", "plan-25mb",
          "policy-off-25mb")
FRAMEWORKS: dict[str, Framework] = {f.name: f for f in (
    Framework("torch-horovod", "torch_worker", "horovod", "horovod", "allreduce", False,
              ("vanilla", "autotune", *_TORCH[1:]), fuses=True),
    Framework("torch-distributed", "torch_worker", "torch", "torchrun", "allreduce", False, _TORCH, fuses=True),
    Framework("mxnet-ps", "mxnet_worker", "ps", "ps", "ps", True, _ALLREDUCE),
    Framework("mxnet-horovod", "mxnet_worker", "horovod", "horovod", "allreduce", True,
              ("vanilla", "autotune", *_ALLREDUCE[1:]), fuses=True),
    # dist_async: no start-up plan (it plans a dist_sync store's sizes), each worker on its own
    Framework("mxnet-ps-async", "mxnet_worker", "ps-async", "ps", "ps", True,
              ("vanilla", "bytescheduler", "fifo", "off"), asynchronous=True),
)}


@dataclass(frozen=True)
class Group:
    """The cells that share a framework, model, bandwidth and rank count: they are run together,
    round by round, and compared with this group's own baseline."""

    framework: Framework
    model: str
    bits_per_second: int
    ranks: int
    configurations: tuple[Configuration, ...]

    @property
    def key(self) -> tuple[str, str, int, int]:
        return (self.framework.name, self.model, self.bits_per_second, self.ranks)


def groups(frameworks: Sequence[str], models: Sequence[str], bandwidths: Sequence[int], ranks: Sequence[int],
           configurations: Sequence[str]) -> tuple[list[Group], list[tuple[str, str]]]:
    """Every group of the matrix, and the (framework, configuration) pairs skipped because the
    configuration does not exist on that framework (e.g. Horovod autotune on a KVStore)."""
    unknown = [name for name in frameworks if name not in FRAMEWORKS]
    if unknown:
        raise ValueError(f"framework {unknown[0]!r} is unknown: expected some of {', '.join(FRAMEWORKS)}")
    bad = [name for name in configurations if name not in CONFIGURATIONS]
    if bad:
        raise ValueError(f"configuration {bad[0]!r} is unknown: expected some of {', '.join(CONFIGURATIONS)}")
    sized = [c for c in configurations if CONFIGURATIONS[c].sized_at_run_time]
    real = [m for m in models if m in REAL_MODELS]
    if sized and real:
        raise ValueError(f"configuration {sized[0]!r} is sized by the {CONFIGURATIONS[sized[0]].sized_by} before the "
                         f"runs, which the harness does for emulated models only, not for the real model {real[0]!r}")
    out, skipped = [], []
    for name in frameworks:
        framework = FRAMEWORKS[name]
        chosen = [BASELINE] + [c for c in configurations if c != BASELINE and c in framework.configurations]
        skipped += [(name, c) for c in configurations if c not in framework.configurations]
        for model in models:
            for bandwidth in bandwidths:
                for count in ranks:
                    out.append(Group(framework, model, bandwidth, count,
                                     tuple(CONFIGURATIONS[c] for c in chosen)))
    return out, skipped


def rounds(group: Group, repeats: int) -> Iterator[tuple[int, list[list[Configuration]]]]:
    """For each round, the jobs to launch in order, each a list of configurations run by one job.

    Every round runs every configuration once; the order rotates from round to round so that no
    configuration always runs first (or right after a particular other one). Configurations that
    need the same job environment share a job (in their rotated order, the job placed where its
    first member comes), unless the framework runs one configuration per process: starting a job
    costs many seconds on a loaded machine.
    """
    configs = list(group.configurations)
    for number in range(repeats):
        shift = number % len(configs)
        order = configs[shift:] + configs[:shift]
        if group.framework.one_run_per_job:
            yield number, [[config] for config in order]
            continue
        jobs: dict[tuple[tuple[str, str], ...], list[Configuration]] = {}
        for config in order:
            jobs.setdefault(config.env, []).append(config)
        yield number, list(jobs.values())


def quick(group: Group) -> Group:
    """The smallest useful version of ``group``: the baseline and ``bytescheduler-sim`` (whose
    calibration runs both probes in the same job) where one process can run several
    configurations; ``bytescheduler`` alone where each configuration needs its own process
    (MXNet), which keeps that framework to its calibration job and one run."""
    keep = ("bytescheduler",) if group.framework.one_run_per_job else (BASELINE, "bytescheduler-sim")
    return dataclasses.replace(group, configurations=tuple(CONFIGURATIONS[name] for name in keep))
