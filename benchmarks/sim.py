"""How fast the simulator is: ``python -m benchmarks.sim [--json] [--quick]``.

Measures the run time of simulations as the number of workers, layers and partitions grows
(the figures of docs/benchmarks.md, section "Simulator"). Each figure is the wall-clock and
the CPU time of this process, so a busy machine shows as wall > CPU.

``register(subparsers)`` also makes it a ``python -m benchmarks`` benchmark (``sim``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable

from bytesched.core.config import SIMULATED_POLICIES, SchedulingParams
from bytesched.sim.cluster import Cluster, WorkerSpec
from bytesched.sim.profile import Layer, ModelProfile, Tensor, load_profile
from bytesched.sim.simulator import VANILLA, run

GBPS = 1e9 / 8


@dataclass
class Measurement:
    """One timed case."""

    case: str
    value: Any
    wall_seconds: float
    cpu_seconds: float
    subtasks: float
    """Sub-tasks rank 0 started per simulated iteration (summed over the policies timed)."""


def _timed(case: str, value: Any, work: Callable[[], float]) -> Measurement:
    wall, cpu = time.perf_counter(), time.process_time()
    subtasks = work()
    return Measurement(case, value, time.perf_counter() - wall, time.process_time() - cpu, subtasks)


def _policies(profile: ModelProfile, cluster: Cluster, policies: tuple[str, ...], *,
              warmup: int = 0, iterations: int = 1) -> float:
    """Run ``policies`` and return the sub-tasks per iteration they started, summed."""
    return sum(run(profile, cluster, p, SchedulingParams(), warmup=warmup, iterations=iterations).subtasks_per_iteration
               for p in policies)


def chain(layers: int, total_bytes: int = 400_000_000) -> ModelProfile:
    """A synthetic chain of ``layers`` equal layers (0.4 s of compute, 400 MB in all)."""
    per_layer = 4 * (total_bytes // layers // 4)
    return ModelProfile(f"chain{layers}", tuple(
        Layer(f"l{i}", 0.1 / layers, 0.3 / layers, (Tensor(f"w{i}", per_layer),)) for i in range(layers)))


def heterogeneous(workers: int, arch: str) -> Cluster:
    """Every worker a different speed, so each is simulated on its own."""
    specs = tuple((r, WorkerSpec(compute=1 + r / (10 * workers))) for r in range(workers))
    return Cluster(workers=workers, arch=arch, bandwidth=25 * GBPS, worker_specs=specs)


def measure(quick: bool = False) -> list[Measurement]:
    """Every case of docs/benchmarks.md (``quick``: smaller sweeps, for a smoke run)."""
    vgg16 = load_profile("vgg16")
    every = (VANILLA, *SIMULATED_POLICIES)
    out: list[Measurement] = []
    for arch in ("allreduce", "ps"):
        identical = Cluster(workers=1024, arch=arch, bandwidth=25 * GBPS)
        out.append(_timed(f"vgg16, 1024 identical workers, {arch}, vanilla + 5 policies, 1 iteration",
                          1024, lambda c=identical: _policies(vgg16, c, every)))
        out.append(_timed(f"vgg16, 1024 identical workers, {arch}, vanilla + 5 policies, defaults (2 warm-up + 2)",
                          1024, lambda c=identical: _policies(vgg16, c, every, warmup=2, iterations=2)))
        hetero = heterogeneous(16 if quick else 64, arch)
        out.append(_timed(f"vgg16, {hetero.workers} heterogeneous workers, {arch}, vanilla + 5 policies, 1 iteration",
                          hetero.workers, lambda c=hetero: _policies(vgg16, c, every)))
        for policy in every:
            out.append(_timed(f"  of which {policy}", hetero.workers,
                              lambda c=hetero, p=policy: _policies(vgg16, c, (p,))))
    for arch in ("allreduce", "ps"):
        for workers in (1, 16, 1024) if quick else (1, 4, 16, 64, 256, 1024, 4096):
            c = Cluster(workers=workers, arch=arch, bandwidth=25 * GBPS)
            out.append(_timed(f"workers (identical), vgg16, {arch}, bytescheduler", workers,
                              lambda c=c: _policies(vgg16, c, ("bytescheduler",))))
        for workers in (4, 16) if quick else (4, 8, 16, 32, 64):
            c = heterogeneous(workers, arch)
            out.append(_timed(f"workers (heterogeneous), vgg16, {arch}, bytescheduler", workers,
                              lambda c=c: _policies(vgg16, c, ("bytescheduler",))))
        for layers in (16, 256) if quick else (16, 64, 256, 1024, 4096):
            c = Cluster(workers=16, arch=arch, bandwidth=25 * GBPS)
            model = chain(layers)
            out.append(_timed(f"layers (400 MB chain, 1 tensor per layer), {arch}, fifo", layers,
                              lambda c=c, m=model: _policies(m, c, ("fifo",))))
        for mb in (64, 4) if quick else (64, 16, 4, 1, 0.25, 0.0625):
            c = Cluster(workers=16, arch=arch, bandwidth=25 * GBPS)
            params = SchedulingParams(partition_bytes=int(mb * 1e6), credit_bytes=int(4 * mb * 1e6))
            out.append(_timed(f"partitions (vgg16, partition size MB, credit 4 partitions), {arch}, bytescheduler",
                              mb, lambda c=c, p=params: run(vgg16, c, "bytescheduler", p, warmup=0,
                                                             iterations=1).subtasks_per_iteration))
    return out


def _print(measurements: list[Measurement]) -> None:
    print(f"{'case':<92}{'value':>8}{'sub-tasks':>11}{'wall s':>9}{'cpu s':>8}")
    for m in measurements:
        print(f"{m.case:<92}{m.value!s:>8}{m.subtasks:>11.0f}{m.wall_seconds:>9.3f}{m.cpu_seconds:>8.3f}")


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``sim`` (as a ``python -m benchmarks`` benchmark)."""
    p = subparsers.add_parser("sim", help="how the simulator's run time grows with workers, layers, partitions",
                              description=__doc__.splitlines()[0])
    p.add_argument("--json", action="store_true", help="print the measurements as JSON")
    p.add_argument("--quick", action="store_true", help="smaller sweeps (a smoke run)")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    measurements = measure(quick=args.quick)
    if args.json:
        print(json.dumps([asdict(m) for m in measurements], indent=1))
    else:
        _print(measurements)
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m benchmarks.sim", description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the measurements as JSON")
    parser.add_argument("--quick", action="store_true", help="smaller sweeps (a smoke run)")
    sys.exit(main(parser.parse_args()))
