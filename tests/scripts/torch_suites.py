"""Checks shared by the Horovod and torch.distributed test scripts, written once over a Flavor.

A Flavor builds the two optimizers being compared for one backend: the baseline (plain
``hvd.DistributedOptimizer``, or a hand-written all-reduce of every gradient after backward) and
the ScheduledOptimizer over the same backend. Both train the same model from the same weights on
the same per-rank data (torch_harness.train); the final parameters are compared.
"""

from __future__ import annotations

import contextlib
import os
from abc import ABC, abstractmethod
from typing import Any, Callable, Iterator

import torch
import torch.distributed as dist

from bytesched.core import OFF, SchedulingParams
from bytesched.core.config import NATIVE_POLICIES
from bytesched.runtime import start_observer
from bytesched.plugins.torch import ScheduledOptimizer
from torch_harness import OPTIMIZERS, SPLIT, STEPS, Reporter, config, load, new_model, save, snapshot, train

DEFAULT = SchedulingParams()

# With 3 ranks the ring sums each element in an order that depends on where it sits in the
# (fused or partitioned) buffer, and Horovod's fusion varies from run to run. RMSprop divides each
# step by the root of the squared-gradient average: where the ranks' gradients nearly cancel, the
# last-bit difference of the sum is a large relative one and the step (about lr = 1e-3 in size)
# changes with it. Measured against the baseline: 1.6e-6 to 1.1e-5 after 30 steps; a missed or
# stale update would be about 1e-3.
LOOSER_ON_3_RANKS = {"rmsprop": 1e-4}


class Flavor(ABC):
    """One backend's baseline and scheduled optimizers."""

    rank: int

    @abstractmethod
    def baseline(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, **options: Any) -> Any:
        """The unscheduled distributed optimizer (the training loop's API: zero_grad, step,
        synchronize, skip_synchronize, state_dict, load_state_dict)."""

    @abstractmethod
    def scheduled(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, params: SchedulingParams,
                  policy: str, cross_barrier: bool, plan: bool = False, **options: Any) -> ScheduledOptimizer:
        """ScheduledOptimizer over this backend (``plan``: sized by the start-up plan)."""


class HorovodFlavor(Flavor):
    def __init__(self) -> None:
        import horovod.torch as hvd
        hvd.init()
        self.hvd = hvd
        self.rank = hvd.rank()

    def baseline(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, **options: Any) -> Any:
        return self.hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(), **options)

    def scheduled(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, params: SchedulingParams,
                  policy: str, cross_barrier: bool, plan: bool = False, **options: Any) -> ScheduledOptimizer:
        return ScheduledOptimizer(model, self.baseline(model, optimizer, **options), cross_barrier=cross_barrier,
                                  config=config(params, policy, plan))


class AllreduceThenStep:
    """The hand-written torch.distributed baseline: after backward, all-reduce every gradient
    (zeros for a missing one), divide by the world size, then step."""

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.optimizer = optimizer
        self._synchronized = False

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self.optimizer.param_groups

    def zero_grad(self) -> None:
        self.optimizer.zero_grad()

    def synchronize(self) -> None:
        size = dist.get_world_size()
        for group in self.optimizer.param_groups:
            for param in group["params"]:
                if param.grad is None:
                    param.grad = torch.zeros_like(param)
                dist.all_reduce(param.grad)
                param.grad.div_(size)
        self._synchronized = True

    @contextlib.contextmanager
    def skip_synchronize(self) -> Iterator[None]:
        yield

    def step(self) -> None:
        if not self._synchronized:
            self.synchronize()
        self.optimizer.step()
        self._synchronized = False

    def state_dict(self) -> dict[str, Any]:
        return self.optimizer.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state)


class DistributedFlavor(Flavor):
    def __init__(self) -> None:
        dist.init_process_group("gloo")
        self.rank = dist.get_rank()

    def baseline(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, **options: Any) -> Any:
        return AllreduceThenStep(optimizer)

    def scheduled(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, params: SchedulingParams,
                  policy: str, cross_barrier: bool, plan: bool = False, **options: Any) -> ScheduledOptimizer:
        return ScheduledOptimizer(model, optimizer, cross_barrier=cross_barrier, config=config(params, policy, plan),
                                  **options)


def _lr_target(optimizer: Any) -> torch.optim.Optimizer:
    return optimizer.optimizer if isinstance(optimizer, AllreduceThenStep) else optimizer


def run_baseline(flavor: Flavor, model_name: str, opt_name: str, options: dict | None = None,
                 scheduler: Callable | None = None, **train_kwargs: Any) -> list[torch.Tensor]:
    """Train with the baseline; the final parameters."""
    model = new_model(model_name)
    optimizer = flavor.baseline(model, OPTIMIZERS[opt_name](model.parameters()), **(options or {}))
    train(model, optimizer, model_name, flavor.rank,
          scheduler=scheduler(_lr_target(optimizer)) if scheduler else None, **train_kwargs)
    return snapshot(model)


def run_scheduled(flavor: Flavor, model_name: str, opt_name: str, params: SchedulingParams = DEFAULT,
                  policy: str = "bytescheduler", options: dict | None = None, cross_barrier: bool = True,
                  scheduler: Callable | None = None, passing: bool = False, **train_kwargs: Any) -> list[torch.Tensor]:
    """Train with ScheduledOptimizer; the final parameters (after synchronize()). ``passing``: the
    start-up plan stays out (its measurement fails) and the optimizer must pass through from its
    step on."""
    model = new_model(model_name)
    with plan_staying_out() if passing else contextlib.nullcontext():
        optimizer = flavor.scheduled(model, OPTIMIZERS[opt_name](model.parameters()), params, policy, cross_barrier,
                                     plan=passing, **(options or {}))
        if policy == OFF and not optimizer.passes_through:
            raise AssertionError("scheduling is off but the optimizer does not pass through from its construction")
        train(model, optimizer, model_name, flavor.rank, scheduler=scheduler(optimizer) if scheduler else None,
              **train_kwargs)
    if passing and not optimizer.passes_through:
        raise AssertionError(f"the plan stayed out but the optimizer does not pass through (plan: {optimizer.plan})")
    optimizer.synchronize()
    result = snapshot(model)
    optimizer.close()
    return result


def matrix(report: Reporter, flavor: Flavor, optimizers: list[str], policies: tuple[str, ...],
           tolerance: float, model_name: str = "cnn") -> None:
    """Every optimizer x policy with partitions that split tensors, against the baseline; and
    the first optimizer and policy with the default partition size (whole tensors here)."""
    for opt_name in optimizers:
        expected = run_baseline(flavor, model_name, opt_name)
        opt_tolerance = max(tolerance, LOOSER_ON_3_RANKS.get(opt_name, 0.0)) if tolerance else 0.0
        for policy in policies:
            whole = opt_name == optimizers[0] and policy == policies[0]
            variants = [("split", SPLIT)] + ([("default", DEFAULT)] if whole else [])
            for label, params in variants:
                name = f"{opt_name}/{policy}/{label}"
                report.run(name, lambda: report.same(
                    name, expected, run_scheduled(flavor, model_name, opt_name, params, policy), opt_tolerance))


def tied_weights(report: Reporter, flavor: Flavor, optimizers: tuple[str, ...], tolerance: float) -> None:
    """Tied weights, a container-owned parameter and a loss-only parameter train identically
    (whole tensors with the first optimizer, split with every one)."""
    for opt_name in optimizers:
        expected = run_baseline(flavor, "tied", opt_name)
        variants = [("default", DEFAULT)] if opt_name == optimizers[0] else []
        for label, params in variants + [("split", SPLIT)]:
            name = f"tied/{opt_name}/{label}"
            report.run(name, lambda: report.same(name, expected, run_scheduled(flavor, "tied", opt_name, params),
                                                 tolerance))


def loop_habits(report: Reporter, flavor: Flavor) -> None:
    """What training loops do gives what it gives unscheduled; barrier mode lets clipping and AMP
    run between backward and step without synchronize()."""
    clip = dict(synchronize=True, clip=0.5)
    amp = dict(synchronize=True, amp=True, clip=1.0)
    cases: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
        "loop/lr_scheduler": (dict(scheduler=lambda o: torch.optim.lr_scheduler.StepLR(o, 4, gamma=0.7)), {}),
        "loop/model.zero_grad": (dict(zero="model"), {}),
        "loop/synchronize_clip": (clip, {}),
        "loop/synchronize_amp_clip": (amp, {}),
        "mode/barrier": ({}, dict(cross_barrier=False)),
        "mode/barrier_clip_without_synchronize": (clip, dict(cross_barrier=False, synchronize=False)),
        "mode/barrier_amp_without_synchronize": (amp, dict(cross_barrier=False, synchronize=False)),
    }
    for name, (common, only_scheduled) in cases.items():
        report.run(name, lambda: report.same(
            name, run_baseline(flavor, "cnn", "sgd", **common),
            run_scheduled(flavor, "cnn", "sgd", SPLIT, **{**common, **only_scheduled})))
    report.run("opt/adagrad", lambda: report.same(
        "opt/adagrad", run_baseline(flavor, "cnn", "adagrad"), run_scheduled(flavor, "cnn", "adagrad", SPLIT)))


@contextlib.contextmanager
def plan_staying_out() -> Iterator[None]:
    """The start-up plan's measurement fails, so the plan stays out of the way at its step."""
    def failing(*args: Any) -> Any:
        raise RuntimeError("no measurement (the test wants the plan to stay out)")
    measure = start_observer.measure_network
    start_observer.measure_network = failing  # type: ignore[assignment]
    try:
        yield
    finally:
        start_observer.measure_network = measure  # type: ignore[assignment]


def passing_through(report: Reporter, flavor: Flavor) -> None:
    """Once a plan stays out, the library's own path trains what the baseline trains, under the
    same training-loop habits as the Core's path (plain step, synchronize() and clipping or AMP,
    gradient accumulation, an LR scheduler, model.zero_grad(), barrier mode without synchronize()).
    SPLIT's small fusion bound gives several buckets, which torch.distributed starts in order.
    ``off/*``: with scheduling off, the same path from the first step."""
    clip = dict(synchronize=True, clip=0.5)
    amp = dict(synchronize=True, amp=True, clip=1.0)
    passes = dict(options=dict(backward_passes_per_step=2), passes=2)
    cases: dict[str, tuple[str, dict[str, Any], dict[str, Any]]] = {
        "pass/sgd": ("sgd", {}, {}),
        "pass/adam": ("adam", {}, {}),
        "pass/lr_scheduler": ("sgd", dict(scheduler=lambda o: torch.optim.lr_scheduler.StepLR(o, 4, gamma=0.7)), {}),
        "pass/model.zero_grad": ("sgd", dict(zero="model"), {}),
        "pass/synchronize_clip": ("sgd", clip, {}),
        "pass/synchronize_amp_clip": ("sgd", amp, {}),
        "pass/backward_passes_per_step=2": ("sgd", passes, {}),
        "pass/barrier": ("sgd", {}, dict(cross_barrier=False)),
        "pass/barrier_clip_without_synchronize": ("sgd", clip, dict(cross_barrier=False, synchronize=False)),
        "pass/barrier_amp_without_synchronize": ("sgd", amp, dict(cross_barrier=False, synchronize=False)),
        "pass/barrier_backward_passes_per_step=2": ("sgd", passes, dict(cross_barrier=False)),
    }
    # BYTESCHED_POLICY=off: the same path from the first step, with no plan.
    runs = [(name, case, dict(passing=True)) for name, case in cases.items()] + \
        [(f"off/{name}", cases[f"pass/{name}"], dict(policy=OFF))
         for name in ("adam", "barrier_clip_without_synchronize")]
    for name, (opt_name, common, only_scheduled), how in runs:
        report.run(name, lambda: report.same(name, run_baseline(flavor, "cnn", opt_name, **common),
                                             run_scheduled(flavor, "cnn", opt_name, SPLIT, **how,
                                                           **{**common, **only_scheduled})))


def checkpoint(report: Reporter, flavor: Flavor) -> None:
    """Save in the middle of training, load into a fresh model and optimizer, continue: identical
    to uninterrupted training; and checkpoints are interchangeable with the unscheduled run's."""
    half = STEPS // 2
    for opt_name in ("sgd", "adam"):
        model = new_model("cnn")
        optimizer = flavor.baseline(model, OPTIMIZERS[opt_name](model.parameters()))
        train(model, optimizer, "cnn", flavor.rank, steps=half)
        plain = save((model.state_dict(), optimizer.state_dict()))
        train(model, optimizer, "cnn", flavor.rank, steps=STEPS - half, first_step=half)
        expected = snapshot(model)

        def fresh() -> tuple[torch.nn.Module, ScheduledOptimizer]:
            model = new_model("cnn")
            return model, flavor.scheduled(model, OPTIMIZERS[opt_name](model.parameters()), SPLIT,
                                           "bytescheduler", True)

        def resumed(source: str) -> list[torch.Tensor]:
            data = plain
            if source == "scheduled":
                model, optimizer = fresh()
                train(model, optimizer, "cnn", flavor.rank, steps=half)
                data = save((model.state_dict(), optimizer.state_dict()))  # no synchronize(): implicit
                report.result(f"checkpoint/{opt_name}/same_as_unscheduled", same_checkpoint(load(data), load(plain)))
                optimizer.close()
            model, optimizer = fresh()
            model_state, optimizer_state = load(data)
            model.load_state_dict(model_state)
            optimizer.load_state_dict(optimizer_state)
            train(model, optimizer, "cnn", flavor.rank, steps=STEPS - half, first_step=half)
            optimizer.synchronize()
            result = snapshot(model)
            optimizer.close()
            return result

        for source in ("scheduled", "unscheduled"):
            name = f"checkpoint/{opt_name}/resume_from_{source}"
            report.run(name, lambda: report.same(name, expected, resumed(source)))


def same_checkpoint(a: Any, b: Any) -> bool:
    """Equal nested checkpoints (tensors compared exactly)."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same_checkpoint(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(map(same_checkpoint, a, b))
    return a == b


def evaluation(report: Reporter, flavor: Flavor) -> None:
    """An eval forward right after step() (no synchronize) sees every update."""
    probe = torch.randn(4, 3, 16, 16, generator=torch.Generator().manual_seed(7))

    def evaluate(model: torch.nn.Module) -> list[torch.Tensor]:
        model.eval()
        with torch.no_grad():
            return [model(probe)]

    def after(make: Callable[[torch.nn.Module], Any]) -> list[torch.Tensor]:
        model = new_model("cnn")
        optimizer = make(model)
        train(model, optimizer, "cnn", flavor.rank, steps=10)
        result = evaluate(model)
        if isinstance(optimizer, ScheduledOptimizer):
            optimizer.close()
        return result

    expected = after(lambda m: flavor.baseline(m, OPTIMIZERS["sgd"](m.parameters())))
    got = after(lambda m: flavor.scheduled(m, OPTIMIZERS["sgd"](m.parameters()), SPLIT, "bytescheduler", True))
    report.same("eval/after_step", expected, got)


@contextlib.contextmanager
def native_setting(value: str) -> Iterator[None]:
    """``BYTESCHED_NATIVE=value`` for the configurations made inside (every rank alike)."""
    before = os.environ.get("BYTESCHED_NATIVE")
    os.environ["BYTESCHED_NATIVE"] = value
    try:
        yield
    finally:
        if before is None:
            del os.environ["BYTESCHED_NATIVE"]
        else:
            os.environ["BYTESCHED_NATIVE"] = before


def both_cores(report: Reporter, flavor: Flavor, optimizers: tuple[str, ...]) -> None:
    """Over torch.distributed on the CPU the native Core schedules the native policies by default
    (the matrix ran it); the Python Core (``BYTESCHED_NATIVE=off``) gives the same bits too. Each
    setting makes the Core it names."""
    for setting, kind in (("auto", "NativeCore"), ("off", "Core")):
        name = f"core/{setting}"

        def made(setting: str = setting, kind: str = kind, name: str = name) -> None:
            model = new_model("cnn")
            with native_setting(setting):
                optimizer = flavor.scheduled(model, OPTIMIZERS["sgd"](model.parameters()), SPLIT, "bytescheduler", True)
            made = type(optimizer.core).__name__
            optimizer.close()
            report.result(name, made == kind, f"core={made}")
        report.run(name, made)
    for opt_name in optimizers:
        expected = run_baseline(flavor, "cnn", opt_name)
        for policy in NATIVE_POLICIES:
            name = f"python/{opt_name}/{policy}/split"

            def python(opt_name: str = opt_name, policy: str = policy, name: str = name) -> None:
                with native_setting("off"):
                    report.same(name, expected, run_scheduled(flavor, "cnn", opt_name, SPLIT, policy))
            report.run(name, python)
