"""A worker of an MXNet benchmark job: ``python -m bytesched.bench.emulated.mxnet_worker``.

``--backend ps``: a ``dist_sync`` KVStore worker under ``bytesched launch`` (the baseline is the
plain store, bytesched wraps it in ScheduledKVStore); ``--backend horovod``: a rank under
``horovodrun`` (Horovod's DistributedOptimizer, or bytesched's ScheduledOptimizer around it).
A KVStore cannot be created twice in one process, so a job runs exactly one configuration.
Emulated compute only (a profile name as ``--model``).
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from typing import Any

import mxnet as mx
from mxnet import autograd, gluon

from bytesched.core import from_env

from .configs import Configuration, configuration
from .mxnet_compute import emulated_model
from .protocol import emit, worker_parser
from .scaling import Scale, scaled_profile


def trainer(backend: str, net: gluon.Block, config: Configuration) -> tuple[gluon.Trainer, Any, int, int]:
    """The Gluon trainer for ``config``, the object to drain at the end, rank and world size."""
    settings = dataclasses.replace(from_env(), policy=config.policy, params=config.params) if config.scheduled else None
    sgd = {"learning_rate": 1e-3, "momentum": 0.9}
    if backend == "ps":
        store: Any = mx.kv.create("dist_sync")
        rank, size = store.rank, store.num_workers
        if settings is not None:
            from bytesched.plugins.mxnet import ScheduledKVStore
            store = ScheduledKVStore(store, config=settings)
        return gluon.Trainer(net.collect_params(), "sgd", sgd, kvstore=store), store, rank, size
    if backend == "horovod":
        import torch  # noqa: F401  (before horovod.mxnet, else that import segfaults; not needed for ps)
        import horovod.mxnet as hvd
        hvd.init()
        hvd.broadcast_parameters(net.collect_params(), root_rank=0)
        optimizer: Any = hvd.DistributedOptimizer(mx.optimizer.create("sgd", **sgd))
        if settings is not None:
            from bytesched.plugins.mxnet import ScheduledOptimizer
            optimizer = ScheduledOptimizer(optimizer, config=settings)
        return gluon.Trainer(net.collect_params(), optimizer, kvstore=None), None, hvd.rank(), hvd.size()
    raise ValueError(f"--backend {backend!r}: expected ps or horovod")


def main(argv: list[str] | None = None) -> int:
    args = worker_parser(__doc__.splitlines()[0]).parse_args(argv)
    if len(args.runs) != 1:
        raise SystemExit(f"mxnet_worker runs one configuration per job, got --runs with {len(args.runs)}")
    name, round_number = args.runs[0]
    config = configuration(name)
    profile = scaled_profile(args.model, Scale(args.size_scale, args.time_scale))
    net = emulated_model(profile)
    train, store, rank, size = trainer(args.backend, net, config)
    x = mx.nd.zeros((1,))
    started = 0.0
    for step in range(args.warmup + args.steps):
        if step == args.warmup:
            mx.nd.waitall()
            started = time.perf_counter()
        with autograd.record():
            loss = net(x).sum()
        loss.backward()
        train.step(profile.batch_size)
    mx.nd.waitall()
    if hasattr(store, "wait_idle"):
        store.wait_idle(120)
    seconds = time.perf_counter() - started
    if rank == 0:
        emit({"config": name, "round": round_number, "seconds": seconds, "steps": args.steps,
              "samples_per_second": size * profile.batch_size * args.steps / seconds, "pid": os.getpid()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
