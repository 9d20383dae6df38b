"""A rank of the compiled-model benchmark: ``python -m benchmarks.compiled.worker``.

Started by the emulated cluster's torch.distributed launcher (also runs under ``torchrun`` by
hand). Runs the requested configurations one after another, each on a fresh model compiled anew,
and reports each run's samples/s from rank 0 (:mod:`benchmarks.emulated.protocol`). Configurations:

- ``ddp``: ``torch.compile(DistributedDataParallel(model))``, what PyTorch users run: DDP's
  compiler pass splits the graph at its buckets so that their all-reduces overlap backward;
- ``allreduce``: ``torch.compile(model)`` and every gradient all-reduced after backward;
- ``bytesched``: ``torch.compile(model)`` under ``ScheduledOptimizer`` with no settings (the
  start-up plan chooses; the timed steps come once it settled); ``bytesched-barrier`` the same
  in barrier mode; ``bytesched-step`` the plain model under ``ScheduledOptimizer``, called from a
  compiled function (a training step compiled as a whole: bytesched runs in barrier mode there).
  A suffix ``:SIZE`` sets the bytes of the graph's pieces for the real model (``:inf``: one piece
  per graph), else bytesched's default; scaled like DDP's bucket.

DDP's 25 MB bucket and bytesched's piece bound are scaled like the model's tensors (as in
:mod:`benchmarks.emulated.torch_worker`), so that the scaled model has as many buckets and pieces
as the real one would.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch import nn

import bytesched.core as core
from bytesched.core.config import PIECE_BYTES, parse_size
from bytesched.plugins.torch import ScheduledOptimizer
from bytesched.runtime import step_until_settled

from ..emulated.protocol import emit_run, parse_worker_args
from ..emulated.scaling import Scale, scaled_profile
from ..emulated.torch_worker import DDP_BUCKET_MB, plain_sgd, scaled_settings
from ..emulated.usage import Stopwatch, Usage
from .model import CompiledModel

CONFIGURATIONS = ("ddp", "allreduce", "bytesched", "bytesched-barrier", "bytesched-step")


def piece_bytes(name: str, size_scale: float) -> float:
    """The piece bound a ``bytesched[-barrier][:SIZE]`` configuration runs with."""
    _, _, size = name.partition(":")
    if size == "inf":
        return math.inf
    return (parse_size(size, name="piece size") if size else PIECE_BYTES) * size_scale


class AllreduceThenStep:
    """Every gradient all-reduced (summed, then averaged) after backward, then the step."""

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.optimizer = optimizer

    def zero_grad(self) -> None:
        self.optimizer.zero_grad()

    def step(self) -> None:
        size = dist.get_world_size()
        for group in self.optimizer.param_groups:
            for param in group["params"]:
                dist.all_reduce(param.grad)
                param.grad.div_(size)
        self.optimizer.step()


def prepare(name: str, model: nn.Module, size_scale: float) -> tuple[Callable[..., Any], Any]:
    """(the compiled module to call, the optimizer) of configuration ``name``."""
    base = name.partition(":")[0]
    if base not in CONFIGURATIONS:
        raise ValueError(f"configuration {name!r} is unknown: expected one of {', '.join(CONFIGURATIONS)}")
    if base == "ddp":
        ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=DDP_BUCKET_MB * size_scale)
        return torch.compile(ddp), plain_sgd(model)
    if base == "bytesched-step":
        compiled = torch.compile(lambda data: model(data))
    else:
        compiled = model = torch.compile(model)
    if base == "allreduce":
        return compiled, AllreduceThenStep(plain_sgd(model))
    settings = dataclasses.replace(scaled_settings(core.from_env(), size_scale),
                                   piece_bytes=piece_bytes(name, size_scale))
    optimizer = ScheduledOptimizer(model, plain_sgd(model), cross_barrier=base != "bytesched-barrier",
                                   config=settings)
    return compiled, optimizer


def measure(name: str, profile: Any, size_scale: float, steps: int, warmup: int) -> tuple[Usage, str | None]:
    """Time ``steps`` training steps of configuration ``name`` after ``warmup`` untimed ones (the
    first compiles)."""
    torch.manual_seed(0)
    model = CompiledModel(profile)
    forward, optimizer = prepare(name, model, size_scale)
    scheduled = isinstance(optimizer, ScheduledOptimizer)
    data = torch.zeros(1)

    def step() -> None:
        optimizer.zero_grad()
        forward(data).sum().backward()
        optimizer.step()

    try:
        for _ in range(warmup):
            step()
        if scheduled:
            step_until_settled(optimizer, step)
            optimizer.synchronize()
        dist.barrier()
        clock = Stopwatch()
        for _ in range(steps):
            step()
        if scheduled:
            optimizer.synchronize()
        usage = clock.stop()
        summary = None
        if scheduled:
            path = " (passing through)" if optimizer.passes_through else ""
            summary = (optimizer.plan.summary if optimizer.plan is not None else "no plan") + path + \
                f"; graph pieces {optimizer.graph_pieces}"
        return usage, summary
    finally:
        if scheduled:
            optimizer.close()
            core.shutdown()
        torch._dynamo.reset()


def main(argv: list[str] | None = None) -> int:
    args = parse_worker_args(__doc__.splitlines()[0], argv)
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    profile = scaled_profile(args.model, Scale(args.size_scale, args.time_scale))
    for name, round_number in args.runs:
        usage, summary = measure(name, profile, args.size_scale, args.steps, args.warmup)
        if dist.get_rank() == 0:
            emit_run(name, round_number, usage, args.steps, dist.get_world_size() * profile.batch_size, summary)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
