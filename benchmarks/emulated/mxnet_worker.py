"""A worker of an MXNet benchmark job: ``python -m benchmarks.emulated.mxnet_worker``.

``--backend ps``: a ``dist_sync`` KVStore worker under ``bytesched launch`` (the baseline is the
plain store, bytesched wraps it in ScheduledKVStore); ``--backend ps-async``: the same with a
``dist_async`` store (asynchronous SGD); ``--backend horovod``: a rank under
``horovodrun`` (Horovod's DistributedOptimizer, or bytesched's ScheduledOptimizer around it).
A KVStore cannot be created twice in one process, so a job runs exactly one configuration.
Emulated compute only (a profile name as ``--model``).

The loop reads each step's loss, as a training loop that logs it or updates a metric does, so
Python runs at most a step ahead of the engine. Without it the loop posted all its steps in the
first second, and the posting overlapped the first timed steps.
"""

from __future__ import annotations

import sys
from typing import Any, Callable

import mxnet as mx
from mxnet import gluon

from bytesched.core import from_env
from bytesched.runtime import step_until_settled
from bytesched.sim.profile import ModelProfile

from .configs import Configuration, configuration
from .mxnet_compute import EmulatedModel
from .calibration import calibrate
from .protocol import emit, emit_run, parse_worker_args
from .scaling import Scale, scaled_profile
from .usage import Stopwatch


SGD = {"learning_rate": 1e-3, "momentum": 0.9}
STORES = {"ps": "dist_sync", "ps-async": "dist_async"}
"""The KVStore each parameter-server backend creates."""


def forward_order(model: EmulatedModel) -> list[gluon.Parameter]:
    """``model``'s parameters in the order its layers were added, the forward order, for the Trainer
    (baseline and bytesched alike): the Trainer's index is the priority MXNet hands to the plain
    store and to plain Horovod, and from a dict it numbers by name, ``layer10`` before ``layer2``;
    bytesched ranks by the forward pass whatever the Trainer is given (docs/plugins/mxnet.md,
    "Priorities from the forward pass")."""
    return list(model.params.values())


def trainer(backend: str, model: EmulatedModel, config: Configuration) -> tuple[gluon.Trainer, Any, int, int]:
    """The Gluon trainer for ``config``; the store (drained at the end) or bytesched's optimizer,
    asked for its start-up plan; rank (on a parameter server, bytesched's rank where it runs,
    else ps-lite's); world size."""
    settings = config.settings(from_env()) if config.scheduled else None
    if backend in STORES:
        store: Any = mx.kv.create(STORES[backend])
        rank, size = store.rank, store.num_workers
        if settings is not None:
            from bytesched.plugins.mxnet import ScheduledKVStore
            store = ScheduledKVStore(store, config=settings)
            rank = store.core_rank  # the worker that plans: its run record carries the plan's own line
        return gluon.Trainer(forward_order(model), "sgd", SGD, kvstore=store), store, rank, size
    if backend == "horovod":
        import torch  # noqa: F401  (before horovod.mxnet, else that import segfaults; not needed for ps)
        import horovod.mxnet as hvd
        hvd.init()
        hvd.broadcast_parameters(model.params, root_rank=0)
        optimizer: Any = hvd.DistributedOptimizer(mx.optimizer.create("sgd", **SGD))
        scheduled = None
        if settings is not None:
            from bytesched.plugins.mxnet import ScheduledOptimizer
            optimizer = scheduled = ScheduledOptimizer(optimizer, config=settings)
        return gluon.Trainer(forward_order(model), optimizer, kvstore=None), scheduled, hvd.rank(), hvd.size()
    raise ValueError(f"--backend {backend!r}: expected ps, ps-async or horovod")


def operation(backend: str) -> tuple[Callable[[int], Callable[[], None]], int]:
    """What the baseline does per gradient, as a blocking call for ``nbytes`` (the Trainer's
    fused pushpull of one key on the backend's store, or a Horovod all-reduce), and this
    process's rank."""
    if backend in STORES:
        store = mx.kv.create(STORES[backend])
        if backend == "ps-async":  # an asynchronous server applies each push with an updater: it needs one
            store.set_optimizer(mx.optimizer.create("sgd", learning_rate=0.0))

        def pushpull(nbytes: int) -> Callable[[], None]:
            key = f"bench.calibrate.{nbytes}"
            array = mx.nd.zeros((max(1, nbytes // 4),))
            store.init(key, array)

            def run() -> None:
                store.pushpull(key, array, out=array)
                array.wait_to_read()
            return run
        return pushpull, store.rank
    if backend == "horovod":
        import torch  # noqa: F401  (before horovod.mxnet, as in trainer())
        import horovod.mxnet as hvd
        hvd.init()

        def allreduce(nbytes: int) -> Callable[[], None]:
            array = mx.nd.zeros((max(1, nbytes // 4),))

            def run() -> None:
                hvd.allreduce_(array, name=f"bench.calibrate.{nbytes}")
                array.wait_to_read()
            return run
        return allreduce, hvd.rank()
    raise ValueError(f"--backend {backend!r}: expected ps, ps-async or horovod")


def train_step(model: EmulatedModel, train: gluon.Trainer, batch_size: int) -> None:
    """One training step of an emulated model."""
    loss = model.step()
    train.step(batch_size)
    loss.wait_to_read()


def compute_step(profile: ModelProfile) -> Callable[[], None]:
    """One training step of the emulated ``profile`` with a local SGD and no communication (the
    compute the simulator is told about, as measured)."""
    model = EmulatedModel(profile)
    train = gluon.Trainer(forward_order(model), "sgd", SGD, kvstore=None)

    def step() -> None:
        train_step(model, train, profile.batch_size)
        mx.nd.waitall()
    return step


def main(argv: list[str] | None = None) -> int:
    args = parse_worker_args(__doc__.splitlines()[0], argv)
    if args.calibrate is not None:
        make_operation, rank = operation(args.backend)
        calibration = calibrate(make_operation, args.calibrate,
                                compute_step(scaled_profile(args.model, Scale(args.size_scale, args.time_scale))))
        if rank == 0:
            emit({"calibration": calibration.as_record()})
        return 0
    if len(args.runs) != 1:
        raise SystemExit(f"mxnet_worker runs one configuration per job, got --runs with {len(args.runs)}")
    name, round_number = args.runs[0]
    config = configuration(name, args.sizes)
    profile = scaled_profile(args.model, Scale(args.size_scale, args.time_scale))
    model = EmulatedModel(profile)
    train, store, rank, size = trainer(args.backend, model, config)
    clock = Stopwatch()
    for step in range(args.warmup + args.steps):
        if step == args.warmup:
            mx.nd.waitall()
            clock = Stopwatch()
        if step == args.warmup - 1 and hasattr(store, "settled"):  # time the path and sizes the job keeps
            step_until_settled(store, lambda: train_step(model, train, profile.batch_size))
        train_step(model, train, profile.batch_size)
    mx.nd.waitall()
    if hasattr(store, "wait_idle"):
        store.wait_idle(120)
    usage = clock.stop()
    if rank == 0:
        plan = getattr(store, "plan", None)
        trial = getattr(store, "plan_trial", None)
        emit_run(name, round_number, usage, args.steps, size * profile.batch_size,
                 None if plan is None else plan.summary + ("" if trial is None else f" (plan trial: {trial.summary})"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
