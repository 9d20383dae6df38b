"""A rank of a PyTorch benchmark job: ``python -m benchmarks.emulated.torch_worker``.

Started by the emulated cluster's Horovod (``--backend horovod``) or torch.distributed
(``--backend torch``) launcher; also runs under ``horovodrun``/``torchrun`` by hand. Runs the
requested configurations one after another in this process, each on a fresh model and optimizer,
and reports each run's samples/s from rank 0 (:mod:`.protocol`). One CPU thread per rank.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from typing import Any, Callable

import torch

import bytesched.core as core
from bytesched.core.config import STAY_OUT_FUSION_BYTES
from bytesched.plugins.torch import ScheduledOptimizer
from bytesched.runtime import step_until_settled

from .cells import REAL_MODELS
from .configs import Configuration, configuration
from .calibration import calibrate
from .protocol import emit, emit_run, parse_worker_args
from .scaling import Scale, scaled_profile
from .torch_compute import Workload
from .usage import Stopwatch, Usage

REAL_BATCH = 64
"""Batch per rank of the real (non-emulated) models."""
DDP_BUCKET_MB = 25.0
"""DistributedDataParallel's default bucket cap (``bucket_cap_mb``), before scaling."""


def scaled_settings(settings: core.Config, size_scale: float) -> core.Config:
    """``settings`` with the bound of the buckets bytesched fuses where it stays out of the way
    (DDP's 25 MB, ``BYTESCHED_STAY_OUT_FUSION_BYTES``) scaled like DDP's own, unless the job set
    it or fixed its fusion bound: on the scaled Transformer (373 MB, at 6.4 %) DDP's buckets hold
    1.6 MB, and bytesched's unscaled bound (there a quarter of the model, 6 MB) made a third as
    many buckets as the real model would get from either."""
    if settings.fusion_fixed or "BYTESCHED_STAY_OUT_FUSION_BYTES" in os.environ:
        return settings
    return dataclasses.replace(settings, stay_out_fusion_bytes=int(STAY_OUT_FUSION_BYTES * size_scale))


class Backend:
    """The communication library a job uses: Horovod or torch.distributed."""

    def __init__(self, name: str, size_scale: float = 1.0) -> None:
        self.name = name
        self.size_scale = size_scale
        if name == "horovod":
            import horovod.torch as hvd
            hvd.init()
            self.hvd = hvd
            self.rank, self.size = hvd.rank(), hvd.size()
        elif name == "torch":
            torch.distributed.init_process_group("gloo")
            self.rank, self.size = torch.distributed.get_rank(), torch.distributed.get_world_size()
        else:
            raise ValueError(f"--backend {name!r}: expected horovod or torch")

    def optimizer(self, workload: Workload, config: Configuration) -> Any:
        """The optimizer for ``config``. The torch.distributed baseline is what its users run,
        DistributedDataParallel (bucketed all-reduces started during backward); it replaces
        ``workload.model``. Its default 25 MB bucket is scaled like the model's tensors, so that
        the scaled model has as many buckets as the real one (unscaled, one bucket would hold
        the whole scaled gradient and nothing would overlap with backward), and so is bytesched's
        (:func:`scaled_settings`). Horovod's fusion threshold is left at its default: it may fuse
        a larger share of the scaled gradient into one operation than of the real one, fewer
        fixed costs for that baseline, not more."""
        model = workload.model
        sgd = plain_sgd(model)
        if self.name == "horovod":
            sgd = self.hvd.DistributedOptimizer(sgd, named_parameters=model.named_parameters())
        if config.scheduled:
            return ScheduledOptimizer(model, sgd, config=scaled_settings(config.settings(core.from_env()),
                                                                         self.size_scale))
        if self.name == "torch":
            workload.model = torch.nn.parallel.DistributedDataParallel(
                model, bucket_cap_mb=DDP_BUCKET_MB * self.size_scale)
        return sgd

    def barrier(self) -> None:
        if self.name == "horovod":
            self.hvd.allreduce(torch.zeros(1), name="bench.barrier")
        else:
            torch.distributed.barrier()

    def close(self) -> None:
        """Tear torch.distributed down before the interpreter does: a process that exits with
        Gloo's threads still running aborts ("terminate called without an active exception",
        status 134; seen once after a calibration job)."""
        if self.name == "torch":
            torch.distributed.barrier()
            torch.distributed.destroy_process_group()

    def operation(self, nbytes: int) -> Callable[[], None]:
        """A blocking all-reduce of ``nbytes`` (float32), what the baseline does per gradient."""
        tensor = torch.zeros(max(1, nbytes // 4))
        if self.name == "horovod":
            return lambda: self.hvd.allreduce_(tensor, name=f"bench.calibrate.{nbytes}")
        return lambda: torch.distributed.all_reduce(tensor)


def _train_step(optimizer: Any, workload: Workload) -> None:
    optimizer.zero_grad()
    workload.loss().backward()
    optimizer.step()


def measure(backend: Backend, workload: Workload, config: Configuration, steps: int,
            warmup: int) -> tuple[Usage, str | None]:
    """The time and CPU of ``steps`` training steps after ``warmup`` untimed ones (communication
    done), and the start-up plan's summary where bytesched made one."""
    optimizer = backend.optimizer(workload, config)
    try:
        clock = Stopwatch()
        for step in range(warmup + steps):
            if step == warmup:
                if config.scheduled:
                    optimizer.synchronize()
                backend.barrier()
                clock = Stopwatch()
            if step == warmup - 1 and config.scheduled:  # the timed steps run on the path the job keeps
                step_until_settled(optimizer, lambda: _train_step(optimizer, workload))
            _train_step(optimizer, workload)
        if config.scheduled:
            optimizer.synchronize()
        plan = getattr(optimizer, "plan", None)
        path = ""
        if config.scheduled and optimizer.plan_trial is not None:
            path = f" (plan trial: {optimizer.plan_trial.summary})"
        elif config.scheduled and optimizer.path_trial is not None:
            path = f" (path trial: {optimizer.path_trial.summary})"
        elif config.scheduled and optimizer.passes_through:
            path = " (passing through)"
        elif config.scheduled and optimizer.core.start_order == "sequence":
            path = " (tasks in the buckets' agreed order)"
        return clock.stop(), None if plan is None else plan.summary + path
    finally:
        if config.scheduled:
            optimizer.close()
            core.shutdown()


def plain_sgd(model: torch.nn.Module) -> torch.optim.Optimizer:
    """The optimizer every configuration wraps (the same hyperparameters everywhere)."""
    return torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)


def compute_step(workload: Workload) -> Callable[[], None]:
    """One training step of ``workload`` with a plain SGD and no communication (the compute the
    simulator is told about, as measured)."""
    sgd = plain_sgd(workload.model)

    def step() -> None:
        sgd.zero_grad()
        workload.loss().backward()
        sgd.step()
    return step


def main(argv: list[str] | None = None) -> int:
    args = parse_worker_args(__doc__.splitlines()[0], argv)
    torch.set_num_threads(1)
    backend = Backend(args.backend, args.size_scale)
    run(args, backend)
    backend.close()  # on success only: after a failure the other rank may never reach the barrier
    return 0


def run(args: argparse.Namespace, backend: Backend) -> None:
    """The calibration, or the runs, that ``args`` ask for."""
    profile = None if args.model in REAL_MODELS else scaled_profile(args.model, Scale(args.size_scale, args.time_scale))
    batch = profile.batch_size if profile is not None else REAL_BATCH
    if args.calibrate is not None:
        step = None if profile is None else compute_step(Workload(args.model, profile, batch))
        calibration = calibrate(backend.operation, args.calibrate, step)
        if backend.rank == 0:
            emit({"calibration": calibration.as_record()})
        return
    for name, round_number in args.runs:
        config = configuration(name, args.sizes)
        workload = Workload(args.model, profile, batch)
        usage, plan = measure(backend, workload, config, args.steps, args.warmup)
        if backend.rank == 0:
            emit_run(name, round_number, usage, args.steps, backend.size * batch, plan)


if __name__ == "__main__":
    sys.exit(main())
