"""Run under ``torchrun`` or ``horovodrun --gloo`` (``--backend torch|horovod``): a compiled model
(``torch.compile``) under ScheduledOptimizer trains exactly like the same compiled model with the
plain all-reduce (a hand-written one after backward, or hvd.DistributedOptimizer).

Two ranks, so sums are exact and results must be bit-identical. Every case compiles its models
afresh (``torch._dynamo.reset()``: the models of all runs share one ``forward``, whose compiled
code Dynamo would otherwise stop adding to after a few recompilations and run eagerly). Cases:
``torch.compile(model)`` with one piece per graph and split into pieces (priorities from the
graph's reads, in forward order), partitions and barrier mode; ``model.compile()``; tied weights
and a loss-only parameter; gradient accumulation; an evaluation pass compiled after ``step()``
while Adam's updates are pending; the plan staying out (passing through); and the training step
compiled as a whole, where the optimizer switches to barrier mode and splits that graph (the baseline's optimizer step
runs eagerly too, as bytesched's does: compiled by Dynamo it would round differently).
Prints one ``CASE`` line per check (see torch_harness.Reporter).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
from typing import Any, Callable

import torch
from torch import nn

from bytesched.core import SchedulingParams
from bytesched.plugins.torch import ScheduledOptimizer
from torch_harness import MODELS, OPTIMIZERS, SPLIT, Reporter, config, new_model, snapshot, train
from torch_suites import DistributedFlavor, Flavor, HorovodFlavor, plan_staying_out

STEPS = 12
PIECES = 2000
"""Bytes of parameters per piece that split the CNN's graph (c1; c2; fc1 and fc2) into 3 pieces."""
FORWARD_ORDER = ["c1.weight", "c1.bias", "c2.weight", "c2.bias", "fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]


def compiled(model: nn.Module, how: str) -> nn.Module:
    """``model`` compiled the way ``how`` says: ``torch.compile(model)`` or ``model.compile()``."""
    torch._dynamo.reset()
    if how == "in_place":
        model.compile()
        return model
    return torch.compile(model)


def run(flavor: Flavor, model_name: str, opt_name: str, scheduled: bool, *, how: str = "module",
        params: SchedulingParams = SchedulingParams(), piece_bytes: float | None = None,
        options: dict[str, Any] | None = None, cross_barrier: bool = True, passing: bool = False,
        check: Callable[[ScheduledOptimizer], None] | None = None, **train_kwargs: Any) -> list[torch.Tensor]:
    """Train ``model_name`` compiled, with the baseline or ScheduledOptimizer; the final parameters."""
    model = new_model(model_name)
    forward = compiled(model, how)
    inner = OPTIMIZERS[opt_name](model.parameters())
    if not scheduled:
        train(forward, flavor.baseline(forward, inner, **(options or {})), model_name, flavor.rank,
              steps=STEPS, **train_kwargs)
        return snapshot(model)
    settings = config(params, plan=passing)
    if piece_bytes is not None:
        settings = dataclasses.replace(settings, piece_bytes=piece_bytes)
    with plan_staying_out() if passing else contextlib.nullcontext():
        optimizer = scheduled_optimizer(flavor, forward, inner, settings, options or {}, cross_barrier)
        train(forward, optimizer, model_name, flavor.rank, steps=STEPS, **train_kwargs)
    optimizer.synchronize()
    if check is not None:
        check(optimizer)
    result = snapshot(model)
    optimizer.close()
    return result


def scheduled_optimizer(flavor: Flavor, model: nn.Module, inner: torch.optim.Optimizer, settings: Any,
                        options: dict[str, Any], cross_barrier: bool = True) -> ScheduledOptimizer:
    if isinstance(flavor, HorovodFlavor):
        return ScheduledOptimizer(model, flavor.baseline(model, inner, **options), cross_barrier=cross_barrier,
                                  config=settings)
    return ScheduledOptimizer(model, inner, cross_barrier=cross_barrier, config=settings, **options)


def expect(what: str, condition: bool) -> None:
    if not condition:
        raise AssertionError(what)


def split_in_forward_order(optimizer: ScheduledOptimizer) -> None:
    """The graph was split into pieces, and the priorities follow the graph's reads."""
    expect(f"graph pieces {optimizer.graph_pieces}", optimizer.graph_pieces[0] == 3)
    slots = sorted(optimizer._pipeline.slots, key=lambda s: s.priority)
    order = [slot.name.removeprefix("_orig_mod.") for slot in slots]
    expect(f"priorities {order}", order == FORWARD_ORDER)


def passes_through(optimizer: ScheduledOptimizer) -> None:
    expect("the optimizer does not pass through", optimizer.passes_through)


def model_cases(report: Reporter, flavor: Flavor) -> None:
    """A compiled model trains as with the plain all-reduce."""
    accumulate = dict(options=dict(backward_passes_per_step=2), passes=2)
    cases: dict[str, tuple[str, str, dict[str, Any], dict[str, Any]]] = {
        "compile/sgd/whole_graph": ("cnn", "sgd", {}, {}),
        "compile/adam/pieces": ("cnn", "adam", {}, dict(piece_bytes=PIECES, check=split_in_forward_order)),
        "compile/sgd/pieces_split": ("cnn", "sgd", {}, dict(piece_bytes=PIECES, params=SPLIT)),
        "compile/sgd/barrier": ("cnn", "sgd", {}, dict(piece_bytes=PIECES, cross_barrier=False)),
        "compile/sgd/in_place": ("cnn", "sgd", dict(how="in_place"), dict(piece_bytes=PIECES)),
        "compile/adam/tied": ("tied", "adam", {}, {}),
        "compile/sgd/backward_passes_per_step=2": ("cnn", "sgd", accumulate, dict(piece_bytes=PIECES)),
        "compile/adam/passing_through": ("cnn", "adam", {}, dict(piece_bytes=PIECES, passing=True,
                                                                 check=passes_through)),
    }
    for name, (model_name, opt_name, common, only_scheduled) in cases.items():
        options = common.pop("options", None)
        report.run(name, lambda: report.same(
            name, run(flavor, model_name, opt_name, False, options=options, **common),
            run(flavor, model_name, opt_name, True, options=options, **common, **only_scheduled)))


def evaluation_after_step(report: Reporter, flavor: Flavor, eager: bool) -> None:
    """An evaluation pass right after ``step()`` (no synchronize) while Adam's updates are pending
    sees every update, and training goes on as the baseline's: compiled anew by Dynamo (eval mode,
    no grad), or (``eager``) run by the original module, whose parameters the graph read first."""
    probe = torch.randn(4, 3, 16, 16, generator=torch.Generator().manual_seed(7))

    def evaluate(model: nn.Module, optimizer: Any) -> None:
        evaluated = getattr(model, "_orig_mod", model) if eager else model
        evaluated.eval()
        with torch.no_grad():
            outputs.append(evaluated(probe))
        evaluated.train()

    outputs: list[torch.Tensor] = []
    expected = run(flavor, "cnn", "adam", False, after=evaluate)
    expected_outputs, outputs = outputs, []
    got = run(flavor, "cnn", "adam", True, piece_bytes=PIECES, after=evaluate)
    name = "compile/adam/eager_eval_after_step" if eager else "compile/adam/eval_after_step"
    report.same(name, expected + expected_outputs, got + outputs)


def compiled_step(report: Reporter, flavor: Flavor) -> None:
    """The training step compiled as a whole: bytesched cannot hold that forward pass, and runs in
    barrier mode, its graph split into pieces; the baseline's bits (whose optimizer step runs
    eagerly too)."""
    def train_compiled(model: nn.Module, optimizer: Any) -> None:
        _, batch, loss_fn = MODELS["cnn"]

        @torch.compile
        def step(data: torch.Tensor, target: torch.Tensor) -> None:
            optimizer.zero_grad()
            loss_fn(model, model(data), target).backward()
            optimizer.step()

        torch._dynamo.reset()
        for index in range(STEPS):
            step(*batch(torch.Generator().manual_seed(10_000 * flavor.rank + 10 * index)))

    baseline = new_model("cnn")
    plain = EagerStep(flavor.baseline(baseline, OPTIMIZERS["sgd"](baseline.parameters())))
    train_compiled(baseline, plain)
    model = new_model("cnn")
    optimizer = scheduled_optimizer(flavor, model, OPTIMIZERS["sgd"](model.parameters()),
                                    dataclasses.replace(config(), piece_bytes=PIECES), {})
    train_compiled(model, optimizer)
    optimizer.synchronize()
    report.same("compile/sgd/training_step", snapshot(baseline), snapshot(model))
    report.result("compile/training_step_in_barrier_mode_in_pieces",
                  not optimizer._cross_barrier and 3 in optimizer.graph_pieces,
                  f"crossing={optimizer._cross_barrier} pieces={optimizer.graph_pieces}")
    optimizer.close()


class EagerStep:
    """The baseline optimizer with its step and zero_grad run eagerly inside a compiled function."""

    def __init__(self, optimizer: Any) -> None:
        self.optimizer = optimizer

    @torch.compiler.disable
    def zero_grad(self) -> None:
        self.optimizer.zero_grad()

    @torch.compiler.disable
    def step(self) -> None:
        self.optimizer.step()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("torch", "horovod"), required=True)
    args = parser.parse_args()
    flavor = DistributedFlavor() if args.backend == "torch" else HorovodFlavor()
    torch.set_num_threads(1)
    report = Reporter(flavor.rank)
    model_cases(report, flavor)
    report.run("compile/adam/eval_after_step", lambda: evaluation_after_step(report, flavor, eager=False))
    report.run("compile/adam/eager_eval_after_step", lambda: evaluation_after_step(report, flavor, eager=True))
    report.run("compile/sgd/training_step", lambda: compiled_step(report, flavor))
    report.finish()


if __name__ == "__main__":
    main()
