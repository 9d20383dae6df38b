"""Run under ``horovodrun --gloo``: ScheduledOptimizer trains exactly like hvd.DistributedOptimizer.

``--suite full`` (2 ranks: two-rank sums are exact, so results must be bit-identical): every
optimizer x every policy with partitions that split tensors (and every policy with its default
partition for SGD) on a small CNN; tied weights; Horovod's settings (backward_passes_per_step, fp16
compression, gradient pre-divide, Sum); training-loop habits and barrier mode; checkpoint round
trip; eval; the unsupported cases and their error; LBFGS in barrier mode; the same loop habits and
LBFGS once a start-up plan stays out and Horovod's own path runs; then ``--deadlock-runs``
seeded runs with randomly delayed backward passes (torch_deadlock).
``--suite ranks3`` (3 ranks): the optimizers (on SmoothCNN, see torch_harness) and tied weights,
within ``--tolerance``.
Prints one ``CASE`` line per check (see torch_harness.Reporter).
"""

from __future__ import annotations

import argparse
import contextlib
from typing import Any

import horovod.torch as hvd
import torch
import torch.nn.functional as F

import bytesched.core as core
from bytesched.core.config import POLICIES
from bytesched.plugins.torch import BarrierCrossingError, ScheduledOptimizer
from torch_deadlock import no_deadlock
from torch_harness import OPTIMIZERS, SPLIT, Reporter, config, new_model, snapshot, train
from torch_suites import (HorovodFlavor, checkpoint, evaluation, loop_habits, matrix, passing_through,
                          plan_staying_out, run_baseline, run_scheduled, tied_weights)


def horovod_settings(report: Reporter, flavor: HorovodFlavor) -> None:
    """Each hvd.DistributedOptimizer setting gives what it gives unscheduled."""
    cases: dict[str, dict[str, Any]] = {
        "hvd/backward_passes_per_step=2": dict(options=dict(backward_passes_per_step=2), passes=2),
        "hvd/fp16_compression": dict(options=dict(compression=hvd.Compression.fp16)),
        "hvd/gradient_predivide_factor=2": dict(options=dict(gradient_predivide_factor=2.0)),
        "hvd/op=Sum": dict(options=dict(op=hvd.Sum)),
    }
    for name, kwargs in cases.items():
        report.run(name, lambda: report.same(name, run_baseline(flavor, "cnn", "sgd", **kwargs),
                                             run_scheduled(flavor, "cnn", "sgd", SPLIT, **kwargs)))


def expect_error(report: Reporter, name: str, action: Any, *needles: str) -> None:
    """``action`` must raise BarrierCrossingError whose message names each of ``needles``."""
    try:
        action()
    except BarrierCrossingError as error:
        missing = [n for n in needles if n not in str(error)]
        report.result(name, not missing, f"message={str(error)[:160]!r} missing={missing}")
    except Exception as error:
        report.result(name, False, f"raised {type(error).__name__}: {error}")
    else:
        report.result(name, False, "no BarrierCrossingError raised")
    finally:
        core.shutdown()


def unsupported(report: Reporter) -> None:
    """What cannot cross the barrier fails with an error naming the escape hatch."""
    def lbfgs() -> None:
        model = new_model("cnn")
        ScheduledOptimizer(model, hvd.DistributedOptimizer(torch.optim.LBFGS(model.parameters()),
                                                           named_parameters=model.named_parameters()))

    def scheduled_sgd(model: torch.nn.Module) -> ScheduledOptimizer:
        return ScheduledOptimizer(model, hvd.DistributedOptimizer(
            OPTIMIZERS["sgd"](model.parameters()), named_parameters=model.named_parameters()), config=config(SPLIT))

    def closure() -> None:
        model = new_model("cnn")
        optimizer = scheduled_sgd(model)
        try:
            optimizer.step(lambda: 0.0)
        finally:
            optimizer.close()

    def clip_between(model: torch.nn.Module, optimizer: Any) -> None:
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.01)

    def crossing(**train_kwargs: Any) -> Any:
        def run() -> None:
            model = new_model("cnn")
            optimizer = scheduled_sgd(model)
            try:
                train(model, optimizer, "cnn", hvd.rank(), steps=3, **train_kwargs)
                optimizer.synchronize()
            finally:
                optimizer.close(timeout=20.0)
        return run

    hatch = "cross_barrier=False"
    expect_error(report, "unsupported/lbfgs", lbfgs, hatch)
    expect_error(report, "unsupported/step_closure", closure, hatch)
    expect_error(report, "unsupported/clip_between_backward_and_step", crossing(between=clip_between),
                 "synchronize()", hatch)
    expect_error(report, "unsupported/amp_between_backward_and_step", crossing(amp=True), "synchronize()", hatch)
    report.run("unsupported/lbfgs_in_barrier_mode", lambda: lbfgs_barrier(report, "unsupported/lbfgs_in_barrier_mode"))


def lbfgs_barrier(report: Reporter, name: str, passing: bool = False) -> None:
    """Barrier mode runs LBFGS's closure and reduces each evaluation's gradients: every rank ends
    where LBFGS on the mean loss of all ranks' batches ends in one process (``passing``: from the
    step at which the start-up plan stays out, on Horovod's own path)."""
    size = hvd.size()
    batches = [(torch.randn(8, 12, generator=torch.Generator().manual_seed(r)),
                torch.randn(8, 12, generator=torch.Generator().manual_seed(100 + r))) for r in range(size)]

    def run(model: torch.nn.Module, optimizer: torch.optim.Optimizer, data: list) -> list[torch.Tensor]:
        def closure() -> torch.Tensor:
            optimizer.zero_grad()
            loss = sum(F.mse_loss(model(x), y) for x, y in data) / len(data)
            loss.backward()
            return loss
        for _ in range(4):
            optimizer.step(closure)
        return snapshot(model)

    reference_model = new_model("tied")
    expected = run(reference_model, torch.optim.LBFGS(reference_model.parameters(), max_iter=5), batches)
    model = new_model("tied")
    lbfgs = hvd.DistributedOptimizer(torch.optim.LBFGS(model.parameters(), max_iter=5),
                                     named_parameters=model.named_parameters())
    with plan_staying_out() if passing else contextlib.nullcontext():
        optimizer = ScheduledOptimizer(model, lbfgs, cross_barrier=False,
                                       config=config(plan=True) if passing else config(SPLIT))
        got = run(model, optimizer, [batches[hvd.rank()]])
    if optimizer.passes_through != passing:
        raise AssertionError(f"passes_through is {optimizer.passes_through}")
    optimizer.close()
    report.same(name, expected, got, tolerance=1e-5)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suite", choices=("full", "ranks3"), required=True)
    parser.add_argument("--tolerance", type=float, default=0.0)
    parser.add_argument("--deadlock-runs", type=int, default=50)
    args = parser.parse_args()
    flavor = HorovodFlavor()
    torch.set_num_threads(1)
    report = Reporter(flavor.rank)
    optimizers = ["sgd", "adam", "adamw", "rmsprop"]
    if args.suite == "full":
        matrix(report, flavor, optimizers, POLICIES, args.tolerance)
        tied_weights(report, flavor, ("sgd", "adam"), args.tolerance)
        horovod_settings(report, flavor)
        loop_habits(report, flavor)
        checkpoint(report, flavor)
        report.run("eval/after_step", lambda: evaluation(report, flavor))
        unsupported(report)
        passing_through(report, flavor)
        report.run("pass/lbfgs_in_barrier_mode", lambda: lbfgs_barrier(report, "pass/lbfgs_in_barrier_mode", True))
        no_deadlock(report, flavor, args.deadlock_runs)
    else:
        matrix(report, flavor, optimizers, ("bytescheduler",), args.tolerance, model_name="smooth_cnn")
        tied_weights(report, flavor, ("sgd",), args.tolerance)
    report.finish()


if __name__ == "__main__":
    main()
