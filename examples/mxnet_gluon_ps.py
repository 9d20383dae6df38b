"""MXNet Gluon on a parameter server, gradients scheduled by bytesched's ScheduledKVStore.

Start the scheduler, servers and workers on the local host with bytesched's launcher:

    bytesched launch --servers 2 --workers 2 -- python examples/mxnet_gluon_ps.py

Each worker trains a small MLP on its own shard of a synthetic 10-class problem (points around
fixed class centres) and prints its test accuracy. ``--no-bytesched`` uses the plain KVStore.
"""

from __future__ import annotations

import argparse
import os

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon


def synthetic(n: int, seed: int) -> tuple[mx.nd.NDArray, mx.nd.NDArray]:
    """``n`` points of 32 features: the class centre (fixed) plus noise."""
    centres = np.random.RandomState(0).randn(10, 32)
    rng = np.random.RandomState(seed)
    labels = rng.randint(0, 10, size=n)
    return mx.nd.array(centres[labels] + 1.5 * rng.randn(n, 32)), mx.nd.array(labels)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--train-size", type=int, default=2000, help="points per worker")
    parser.add_argument("--bytesched", action=argparse.BooleanOptionalAction, default=True)
    args = parser.parse_args()
    rank = int(os.environ.get("BYTESCHED_RANK", "0"))

    kv = mx.kv.create("dist_sync")
    if args.bytesched:
        from bytesched.plugins.mxnet import ScheduledKVStore
        kv = ScheduledKVStore(kv)  # the line bytesched adds
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Dense(64, activation="relu"), gluon.nn.Dense(10))
    mx.random.seed(7)  # the same initial weights on every worker
    net.initialize(mx.init.Xavier())
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.05, "momentum": 0.9}, kvstore=kv)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    x, y = synthetic(args.train_size, seed=1 + rank)
    test_x, test_y = synthetic(1000, seed=10_000)
    batch = 32
    for epoch in range(args.epochs):
        for i in range(0, args.train_size, batch):
            with autograd.record():
                loss = loss_fn(net(x[i:i + batch]), y[i:i + batch])
            loss.backward()
            trainer.step(batch)
        accuracy = float((net(test_x).argmax(axis=1) == test_y).mean().asscalar())
        print(f"worker {rank} epoch {epoch + 1}: test accuracy {accuracy:.1%}", flush=True)


if __name__ == "__main__":
    main()
