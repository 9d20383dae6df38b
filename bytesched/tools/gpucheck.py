"""Is bytesched right, and how fast is it, on the local GPU? Two ranks answer.

Run by ``bytesched check-gpu`` (or ``python -m bytesched.tools.check_gpu``). Two processes
join a torch.distributed group over loopback: Gloo with both ranks sharing one GPU (NCCL refuses
two ranks on one device), or NCCL with one GPU each when there are two or more. Then:

1. *Equivalence*: a small CNN trains for a few steps with a hand-written all-reduce of every
   gradient after backward, and again under ScheduledOptimizer, for SGD and Adam in barrier mode
   and crossing the barrier, under deterministic kernels: through the Core with partitions small
   enough to split every large gradient, and with no settings, where the start-up plan applies
   from the third step (for so small a model it stays out, and on a GPU times the Core's path
   against the framework's own before it keeps one, so the switches and both paths are checked
   too). Two-rank sums are exact, so the parameters must be bit-identical.
2. *Speed*: per model, milliseconds per iteration of DistributedDataParallel, of bytesched in
   barrier mode and of bytesched crossing the barrier, each on its own copy of the model, in
   interleaved rounds (every round runs each once, in a rotating order): the median over rounds
   of the mean over a round's iterations (a crossing iteration ends before its updates land, so
   single iterations cannot be timed; each round ends once they landed). Each bytesched round is
   a job with no settings of its own (a fresh Core, its start-up plan and path trial in the
   warm-up, which lasts until the optimizer settled).

On a CPU (``--device cpu``) the same runs on the CPU, where it is the check's own test.
"""

from __future__ import annotations

import copy
import dataclasses
import datetime
import functools
import json
import os
import statistics
import tempfile
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from bytesched.core import SchedulingParams, from_env, shutdown
from bytesched.launch.ports import free_port
from bytesched.plugins.torch import ScheduledOptimizer
from bytesched.runtime import TRIAL_STEPS, step_until_settled

from .model_names import CHECK_MODELS
from .models import BUILDERS

EQUIVALENCE_PARTITION_BYTES = 16384
WORLD_SIZE = 2


@dataclass(frozen=True)
class CheckOptions:
    """What to run (see ``bytesched check-gpu --help``)."""

    device: str = "auto"
    models: tuple[str, ...] = ()
    batch: int = 32
    steps: int = 10
    rounds: int = 3
    warmup: int = 3
    equivalence_steps: int = 10
    timeout_s: float = 600.0


class CheckError(RuntimeError):
    """The check could not run to the end (a rank failed or ran out of time)."""


def run_check(options: CheckOptions) -> dict[str, Any]:
    """Run both ranks; rank 0's report."""
    device = _device_type(options.device)
    if device == "cuda" and not torch.cuda.is_available():
        raise CheckError("--device cuda: this torch build sees no CUDA device")
    models = options.models or (("resnet50", "vgg16", "transformer") if device == "cuda" else ("cnn",))
    unknown = [m for m in models if m not in CHECK_MODELS]
    if unknown:
        raise CheckError(f"unknown model(s) {', '.join(unknown)}: expected {', '.join(CHECK_MODELS)}")
    options = dataclasses.replace(options, device=device, models=tuple(models))
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="bytesched-check-") as tmp:
        out = os.path.join(tmp, "report.json")
        context = mp.start_processes(_rank_main, args=(port, options, out), nprocs=WORLD_SIZE, join=False,
                                     start_method="spawn")
        deadline = time.monotonic() + options.timeout_s
        try:
            while not context.join(timeout=1.0):
                if time.monotonic() > deadline:
                    alive = [rank for rank, p in enumerate(context.processes) if p.is_alive()]
                    raise CheckError(f"rank(s) {alive} still running after {options.timeout_s:.0f} s (--timeout)")
        except mp.ProcessRaisedException as error:
            raise CheckError(f"a rank failed:\n{error}") from None
        except mp.ProcessExitedException as error:
            raise CheckError(f"rank {error.error_index} exited with code {error.exit_code}") from None
        finally:
            for process in context.processes:
                if process.is_alive():
                    process.terminate()
        with open(out) as f:
            return json.load(f)


def _device_type(name: str) -> str:
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name not in ("cpu", "cuda"):
        raise CheckError(f"--device {name!r}: expected auto, cpu or cuda")
    return name


# -- one rank -------------------------------------------------------------------------------------
def _rank_main(rank: int, port: int, options: CheckOptions, out: str) -> None:
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS; before CUDA starts
    os.environ.setdefault("BYTESCHED_JOB_TOKEN", f"check-gpu:{port}")  # this launcher's rendezvous names the job
    device, backend = _place(rank, options.device)
    if device.type == "cpu":
        torch.set_num_threads(max(1, (os.cpu_count() or 2) // WORLD_SIZE))
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD_SIZE,
                            timeout=datetime.timedelta(seconds=options.timeout_s))
    try:
        equivalence = _equivalence(device, options.equivalence_steps)
        timing = [_timing(name, device, options) for name in options.models]
        if rank == 0:
            report = {"device": _device_name(device), "backend": backend, "world_size": WORLD_SIZE,
                      "torch": torch.__version__, "equivalence": equivalence, "timing": timing}
            with open(out, "w") as f:
                json.dump(report, f)
    finally:
        shutdown()
        dist.destroy_process_group()


def _place(rank: int, device_type: str) -> tuple[torch.device, str]:
    """Each rank's device and the process group's backend."""
    if device_type == "cpu":
        return torch.device("cpu"), "gloo"
    if torch.cuda.device_count() >= WORLD_SIZE:
        device, backend = torch.device("cuda", rank), "nccl"
    else:
        device, backend = torch.device("cuda", 0), "gloo"
    torch.cuda.set_device(device)
    return device, backend


def _device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu ({os.cpu_count()} cores)"


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# -- 1. equivalence ---------------------------------------------------------------------------------
class _SmallCNN(nn.Sequential):
    """Convolutions and a classifier with deterministic CUDA backward (AvgPool2d, not adaptive)."""

    def __init__(self) -> None:
        super().__init__(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(),
                         nn.AvgPool2d(4), nn.Flatten(), nn.Linear(32 * 4 * 4, 64), nn.ReLU(), nn.Linear(64, 10))


_OPTIMIZERS: dict[str, Callable[[Any], torch.optim.Optimizer]] = {
    "sgd": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9),
    "adam": lambda p: torch.optim.Adam(p, lr=1e-3),
}


class _AllreduceThenStep:
    """The unscheduled baseline: every gradient summed over the ranks and divided by their
    number (DDP's average) after backward, then the optimizer's step."""

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.optimizer = optimizer

    def zero_grad(self) -> None:
        self.optimizer.zero_grad()

    def step(self) -> None:
        for group in self.optimizer.param_groups:
            for param in group["params"]:
                dist.all_reduce(param.grad)
                param.grad.div_(dist.get_world_size())
        self.optimizer.step()

    def synchronize(self) -> None:
        pass


EQUIVALENCE_MODES = (("barrier", False, False), ("cross", True, False),
                     ("barrier+plan", False, True), ("cross+plan", True, True))
"""(mode, crossing the barrier, start-up plan): without the plan, partitions small enough to split
every large gradient go through the Core; with it (no settings, as a user runs), the plan made in
the first steps applies from the third, where it usually stays out (and, on a GPU, runs its path
trial)."""
PLANNED_EQUIVALENCE_STEPS = 2 + 2 * TRIAL_STEPS + 2
"""Steps of a planned mode at least: the plan's two, both paths of the trial, two on the path kept."""


def _equivalence(device: torch.device, steps: int) -> list[dict[str, Any]]:
    """Final parameters of the baseline and of bytesched, per optimizer and mode, and the path
    bytesched's gradients took last."""
    torch.use_deterministic_algorithms(True)
    saved = (torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark)
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    split = dataclasses.replace(from_env(), params=SchedulingParams(partition_bytes=EQUIVALENCE_PARTITION_BYTES),
                                plan=False)
    results = []
    try:
        for name, make in _OPTIMIZERS.items():
            for mode, cross, planned in EQUIVALENCE_MODES:
                shutdown()  # a Core of this mode's own
                torch.manual_seed(0)
                base = _SmallCNN().to(device)
                reference, model = copy.deepcopy(base), copy.deepcopy(base)
                trained = max(steps, PLANNED_EQUIVALENCE_STEPS) if planned else steps
                _train(reference, _AllreduceThenStep(make(reference.parameters())), device, trained)
                optimizer = ScheduledOptimizer(model, make(model.parameters()), cross_barrier=cross,
                                               config=from_env() if planned else split)
                try:
                    _train(model, optimizer, device, trained)
                    path = _path(optimizer)
                finally:
                    optimizer.close()
                pairs = [(a.detach(), b.detach()) for a, b in zip(reference.parameters(), model.parameters())]
                results.append({"optimizer": name, "mode": mode, "steps": trained, "tensors": len(pairs),
                                "identical": sum(bool(torch.equal(a, b)) for a, b in pairs),
                                "max_abs_diff": max(float((a - b).abs().max()) for a, b in pairs), "path": path})
    finally:
        torch.use_deterministic_algorithms(False)
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = saved
        shutdown()
    return results


def _path(optimizer: ScheduledOptimizer) -> str:
    """Where the optimizer's gradients go now: its plan, and where the optimizer did otherwise."""
    if optimizer.plan is None:
        return "the Core, sizes as configured"
    path = optimizer.plan.describe()
    if optimizer.path_trial is not None:
        path += "; path trial: " + optimizer.path_trial.summary
    elif optimizer.plan.passes_through != optimizer.passes_through:
        path += "; this optimizer " + ("passes through" if optimizer.passes_through else "stays on the Core")
    return path


def _train(model: nn.Module, optimizer: Any, device: torch.device, steps: int) -> None:
    """``steps`` steps on this rank's own data (seeded by rank and step)."""
    for step in range(steps):
        gen = torch.Generator().manual_seed(1000 * dist.get_rank() + step)
        x = torch.randn(8, 3, 16, 16, generator=gen).to(device)
        y = torch.randint(0, 10, (8,), generator=gen).to(device)
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
    optimizer.synchronize()
    _sync(device)


# -- 2. speed ---------------------------------------------------------------------------------------
def _small_cnn_inputs(batch: int, device: "torch.device | str") -> tuple[torch.Tensor, ...]:
    return (torch.randn(batch, 3, 16, 16, device=device),)


def _build(name: str) -> tuple[nn.Module, Callable[[int, Any], tuple[torch.Tensor, ...]]]:
    if name == "cnn":
        return _SmallCNN(), _small_cnn_inputs
    return BUILDERS[name]()


CONFIGURATIONS = ("ddp", "barrier", "cross")


def _timing(name: str, device: torch.device, options: CheckOptions) -> dict[str, Any]:
    """Median ms per iteration of DDP, barrier mode and crossing the barrier on model ``name``,
    each on its own copy of the model, in interleaved rounds (a rotating order per round).

    Each round of a bytesched configuration is a job of its own, as a user's would be: a fresh
    Core, a ScheduledOptimizer that runs its start-up plan during the warm-up iterations, the
    timed iterations, and ``close()``. (Two optimizers sharing one Core would each follow the
    order rank 0 announces, where one alone passes through when its plan stays out.)"""
    torch.manual_seed(0)
    base, make_inputs = _build(name)
    base = base.to(device)
    inputs = make_inputs(options.batch, device)
    models = {config: copy.deepcopy(base) for config in CONFIGURATIONS}
    sgds = {config: torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9) for config, model in models.items()}
    ddp = nn.parallel.DistributedDataParallel(models["ddp"], device_ids=[device] if device.type == "cuda" else None)
    _iterations(ddp, sgds["ddp"], inputs, options.warmup)
    _sync(device)
    times: dict[str, list[float]] = {config: [] for config in CONFIGURATIONS}
    paths: dict[str, list[str]] = {"barrier": [], "cross": []}
    for round_ in range(options.rounds):
        for config in CONFIGURATIONS[round_ % 3:] + CONFIGURATIONS[:round_ % 3]:
            if config == "ddp":
                times[config].append(_timed_iterations(ddp, sgds[config], inputs, options.steps, device))
                continue
            shutdown()  # a fresh Core: this configuration's job of its own
            optimizer = ScheduledOptimizer(models[config], sgds[config], cross_barrier=config == "cross")
            try:
                _iterations(models[config], optimizer, inputs, options.warmup)
                # the timed iterations run on the path the job keeps
                step_until_settled(optimizer, functools.partial(_iterations, models[config], optimizer, inputs, 1))
                _landed(optimizer, device)
                times[config].append(_timed_iterations(models[config], optimizer, inputs, options.steps, device))
                paths[config].append(_path(optimizer))
            finally:
                optimizer.close()
    shutdown()
    result: dict[str, Any] = {"model": name, "batch": options.batch, "gradients": len(list(base.parameters())),
                              "gradient_bytes": sum(p.numel() * p.element_size() for p in base.parameters()),
                              **{f"{config}_ms": statistics.median(times[config]) for config in CONFIGURATIONS},
                              **{f"{config}_plan": paths[config][-1] for config in ("barrier", "cross")},
                              "rounds_ms": times, "rounds_path": paths}
    for config in ("barrier", "cross"):
        result[f"{config}_vs_ddp"] = result["ddp_ms"] / result[f"{config}_ms"]
    del ddp, models, sgds
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return result


def _timed_iterations(net: nn.Module, optimizer: Any, inputs: tuple[torch.Tensor, ...], steps: int,
                      device: torch.device) -> float:
    """Mean ms per iteration of ``steps`` iterations, started together on every rank and ended
    once their updates landed."""
    dist.barrier()
    start = time.perf_counter()
    _iterations(net, optimizer, inputs, steps)
    _landed(optimizer, device)
    return (time.perf_counter() - start) / steps * 1e3


def _iterations(net: nn.Module, optimizer: Any, inputs: tuple[torch.Tensor, ...], count: int) -> None:
    for _ in range(count):
        optimizer.zero_grad(set_to_none=True)
        net(*inputs).float().mean().backward()
        optimizer.step()


def _landed(optimizer: Any, device: torch.device) -> None:
    """Every update of the iterations so far has been applied (crossing the barrier, step()
    returns before that) and the device has run it."""
    if isinstance(optimizer, ScheduledOptimizer):
        optimizer.synchronize()
    _sync(device)


# -- report ---------------------------------------------------------------------------------------
def format_report(report: dict[str, Any]) -> str:
    """The two tables, as text."""
    lines = [f"bytesched GPU check: {report['world_size']} ranks on {report['device']} over {report['backend']}, "
             f"torch {report['torch']}", "",
             "Equivalence with an all-reduce after backward (deterministic kernels; without the plan, "
             f"{EQUIVALENCE_PARTITION_BYTES} B partitions):",
             f"{'optimizer':<10}{'mode':<14}{'identical tensors':>19}{'max |diff|':>12}  path at the end"]
    for row in report["equivalence"]:
        lines.append(f"{row['optimizer']:<10}{row['mode']:<14}{row['identical']:>11}/{row['tensors']:<7}"
                     f"{row['max_abs_diff']:>12.3g}  {row['path']}")
    lines += ["", "Milliseconds per iteration (median of rounds; ratio: DDP's time / bytesched's, >1 is faster;",
              "each bytesched round a job of its own, with no settings: its start-up plan and path trial run in the "
              "warm-up):",
              f"{'model':<13}{'batch':>6}{'grads':>7}{'DDP':>9}{'barrier':>9}{'ratio':>7}{'crossing':>10}{'ratio':>7}"]
    for row in report["timing"]:
        lines.append(f"{row['model']:<13}{row['batch']:>6}{row['gradients']:>7}{row['ddp_ms']:>9.1f}"
                     f"{row['barrier_ms']:>9.1f}{row['barrier_vs_ddp']:>6.2f}x{row['cross_ms']:>10.1f}"
                     f"{row['cross_vs_ddp']:>6.2f}x")
    lines += ["", "What the start-up plan chose (the last round):"]
    for row in report["timing"]:
        lines += [f"{row['model']:<13}barrier: {row['barrier_plan']}", f"{'':<13}crossing: {row['cross_plan']}"]
    return "\n".join(lines)


def all_identical(report: dict[str, Any]) -> bool:
    """Every equivalence case kept every tensor bit-identical."""
    return all(row["identical"] == row["tensors"] for row in report["equivalence"])
