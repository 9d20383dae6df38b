"""Run under ``torchrun``: ScheduledOptimizer over torch.distributed (Gloo) trains exactly like a
hand-written all-reduce of every gradient after backward.

Followers obey rank 0's order (c10d matches collectives by issue order). The native Core schedules
the policies it implements (the default on the CPU), the Python Core the others, and both cases
again on the Python Core. Two ranks, so sums are exact and results must be bit-identical: every
optimizer x every policy with partitions that split tensors (and every policy with its default
partition for SGD); tied
weights; backward_passes_per_step; training-loop habits and barrier mode; the script's own all-reduce
right after step(); checkpoint round trip;
the same loop habits once a start-up plan stays out and the buckets are all-reduced from backward's
hooks (and clipping without synchronize() then still fails with the way out); eval; then 50
seeded runs with randomly delayed backward passes (torch_deadlock). Prints one ``CASE`` line per
check (see torch_harness.Reporter).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from bytesched.core import SchedulingParams, get_core
from bytesched.core.config import POLICIES
from bytesched.plugins.torch import BarrierCrossingError
from bytesched.plugins.torch.task import GradientBatcher
from torch_deadlock import no_deadlock
from torch_harness import SPLIT, Reporter
from torch_suites import (DistributedFlavor, both_cores, checkpoint, evaluation, loop_habits, matrix,
                          native_setting, passing_through, run_baseline, run_scheduled, tied_weights)


def clip_while_passing(report: Reporter, flavor: DistributedFlavor) -> None:
    """Passing through, a gradient clipped while its all-reduce is in flight is named, as on the
    Core's path, instead of being averaged half-clipped."""
    def clip(model: torch.nn.Module, optimizer: Any) -> None:
        if optimizer.passes_through:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.01)
    try:
        run_scheduled(flavor, "cnn", "sgd", SPLIT, passing=True, between=clip)
    except BarrierCrossingError as error:
        report.result("pass/clip_without_synchronize",
                      "modified in place" in str(error) and "synchronize()" in str(error),
                      f"message={str(error)[:160]!r}")
    else:
        report.result("pass/clip_without_synchronize", False, "no BarrierCrossingError raised")


def own_collectives(report: Reporter, flavor: DistributedFlavor) -> None:
    """The script's own all-reduce on the default group right after every step() (no
    synchronize()), while gradients are still in flight: its sums are exact and training is
    unchanged (bytesched reduces in a group of its own)."""
    sums: list[torch.Tensor] = []

    def epoch_loss(model: torch.nn.Module, optimizer: Any) -> None:
        mine = torch.full((1000,), float(flavor.rank + 1) * (len(sums) + 1))
        dist.all_reduce(mine)
        sums.append(mine)

    name = "loop/all_reduce_after_step"
    report.same(name, run_baseline(flavor, "cnn", "sgd", after=epoch_loss),
                run_scheduled(flavor, "cnn", "sgd", SPLIT, after=epoch_loss))
    ranks = dist.get_world_size()
    expected = [torch.full((1000,), float(ranks * (ranks + 1) // 2 * (i + 1))) for i in range(len(sums))]
    report.result(f"{name}/sums", all(torch.equal(a, b) for a, b in zip(sums, expected)),
                  f"steps={len(sums)}")


BATCHED = SchedulingParams(partition_bytes=4000, credit_bytes=16000, batch_bytes=8000)
"""SPLIT's partitions, started two or more at a time as one all-reduce of up to 8,000 bytes
(batching while busy)."""


def batching(report: Reporter, flavor: DistributedFlavor) -> None:
    """Batching while busy: the same bits as the hand-written all-reduce (two ranks: each sum is
    one addition, whatever buffer it is done in), and batches did start, on the Python Core (its
    GradientBatcher) and on the native one (fewer collectives than pieces)."""
    sizes: list[int] = []
    start = GradientBatcher.start_batch

    def counting(self: GradientBatcher, batch: Any) -> None:
        sizes.append(len(batch))
        start(self, batch)
    GradientBatcher.start_batch = counting  # type: ignore[method-assign]
    try:
        for opt_name in ("sgd", "adam"):
            name = f"batch/{opt_name}"
            with native_setting("off"):
                report.run(name, lambda: report.same(name, run_baseline(flavor, "cnn", opt_name),
                                                     run_scheduled(flavor, "cnn", opt_name, BATCHED)))
    finally:
        GradientBatcher.start_batch = start  # type: ignore[method-assign]
    report.result("batch/started", bool(sizes), f"batches={len(sizes)} pieces={sum(sizes)}")
    started = [0, 0]
    for opt_name in ("sgd", "adam"):
        name = f"batch/native/{opt_name}"

        def native(name: str = name, opt_name: str = opt_name) -> None:
            report.same(name, run_baseline(flavor, "cnn", opt_name), run_scheduled(flavor, "cnn", opt_name, BATCHED))
            for i, count in enumerate(get_core().started()):  # type: ignore[attr-defined]
                started[i] += count
        report.run(name, native)
    report.result("batch/native/started", started[0] < started[1],
                  f"collectives={started[0]} pieces={started[1]}")


def main() -> None:
    flavor = DistributedFlavor()
    torch.set_num_threads(1)
    report = Reporter(flavor.rank)
    matrix(report, flavor, ["sgd", "adam", "adamw", "rmsprop"], POLICIES, 0.0)
    both_cores(report, flavor, ("sgd", "adam"))
    tied_weights(report, flavor, ("sgd", "adam"), 0.0)
    name = "dist/backward_passes_per_step=2"
    report.run(name, lambda: report.same(
        name, run_baseline(flavor, "cnn", "sgd", passes=2),
        run_scheduled(flavor, "cnn", "sgd", SPLIT, options=dict(backward_passes_per_step=2), passes=2)))
    loop_habits(report, flavor)
    report.run("loop/all_reduce_after_step", lambda: own_collectives(report, flavor))
    passing_through(report, flavor)
    report.run("pass/clip_without_synchronize", lambda: clip_while_passing(report, flavor))
    checkpoint(report, flavor)
    report.run("eval/after_step", lambda: evaluation(report, flavor))
    batching(report, flavor)
    no_deadlock(report, flavor, 50)
    report.finish()


if __name__ == "__main__":
    main()
