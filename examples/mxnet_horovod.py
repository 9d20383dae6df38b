"""MXNet Gluon over Horovod all-reduce, gradients scheduled by bytesched's ScheduledOptimizer.

    horovodrun -np 2 -H localhost:2 --gloo python examples/mxnet_horovod.py

Each rank trains a small MLP on its own shard of a synthetic 10-class problem; rank 0 prints the
test accuracy. ``--no-bytesched`` uses Horovod's DistributedOptimizer alone.
"""

from __future__ import annotations

import argparse

import torch  # noqa: F401  -- import torch before horovod.mxnet: the other order crashes
import horovod.mxnet as hvd
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
    parser.add_argument("--train-size", type=int, default=2000, help="points per rank")
    parser.add_argument("--lr", type=float, default=0.01, help="SGD learning rate")
    parser.add_argument("--bytesched", action=argparse.BooleanOptionalAction, default=True)
    args = parser.parse_args()
    hvd.init()
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Dense(64, activation="relu", in_units=32), gluon.nn.Dense(10, in_units=64))
    net.initialize(mx.init.Xavier())
    params = net.collect_params()
    hvd.broadcast_parameters(params, root_rank=0)
    opt = hvd.DistributedOptimizer(mx.optimizer.create("sgd", learning_rate=args.lr, momentum=0.9))
    if args.bytesched:
        from bytesched.plugins.mxnet import ScheduledOptimizer
        opt = ScheduledOptimizer(opt)  # the line bytesched adds
    trainer = gluon.Trainer(params, opt, kvstore=None)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    x, y = synthetic(args.train_size, seed=1 + hvd.rank())
    test_x, test_y = synthetic(1000, seed=10_000)
    batch = 32
    for epoch in range(args.epochs):
        for i in range(0, args.train_size, batch):
            with autograd.record():
                loss = loss_fn(net(x[i:i + batch]), y[i:i + batch])
            loss.backward()
            trainer.step(batch)
        accuracy = float((net(test_x).argmax(axis=1) == test_y).mean().asscalar())
        if hvd.rank() == 0:
            print(f"epoch {epoch + 1}: test accuracy {accuracy:.1%}", flush=True)


if __name__ == "__main__":
    main()
