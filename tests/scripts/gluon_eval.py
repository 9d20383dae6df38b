"""A worker of the MXNet evaluation tests: a Gluon CNN with batch norm trained the way published
scripts train it, with an evaluation pass after every epoch.

Run under ``bytesched launch``. ``gluon.Trainer`` gets ``net.collect_params()`` (a dict) and a
``dist_sync`` store; every epoch ends with forward passes outside ``autograd.record()`` over a
held-out set, as an accuracy metric would run them. Those inference passes let MXNet's MKLDNN
convolutions rewrite the weights into a blocked memory layout, which the next step's pull must
cope with. Every worker trains on its own deterministic data and saves its weights to
``OUT/worker{BYTESCHED_RANK}.npz``, then prints ``EVALUATED epochs=... accuracy=...``.

    --store plain|scheduled   the wrapped MXNet store alone (the reference) or ScheduledKVStore
                              (sizes, policy: BYTESCHED_* environment)
    --seed S                  the model's initial weights and the data
    --contexts N              CPU contexts per worker (the batch is split across them)
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon


def model(seed: int) -> gluon.nn.HybridSequential:
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Conv2D(16, 3, padding=1), gluon.nn.BatchNorm(), gluon.nn.Activation("relu"),
            gluon.nn.Conv2D(32, 3, padding=1, strides=2), gluon.nn.BatchNorm(), gluon.nn.Activation("relu"),
            gluon.nn.Conv2D(32, 3, padding=1), gluon.nn.BatchNorm(), gluon.nn.Activation("relu"),
            gluon.nn.GlobalAvgPool2D(), gluon.nn.Dense(10))
    mx.random.seed(seed)
    return net


def behind_the_engine(x: mx.nd.NDArray) -> mx.nd.NDArray:
    """``x`` unchanged, but only once the engine has done a few hundred milliseconds of matrix
    products (as a data augmentation posted to the engine would make it wait): the training
    thread then posts the step's forward, backward and pushes before the engine runs any of them,
    the order in which a large model's steps run. (0 times a finite sum adds exactly 0.)"""
    a = mx.nd.ones((600, 600)) / 600
    for _ in range(12):
        a = mx.nd.dot(a, a)
    return x + 0 * a.sum()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--store", choices=("plain", "scheduled"), required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--contexts", type=int, default=1)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=3, help="training steps per epoch")
    args = parser.parse_args()

    contexts = [mx.cpu(i) for i in range(args.contexts)]
    kv = mx.kv.create("dist_sync")
    if args.store == "scheduled":
        from bytesched.plugins.mxnet import ScheduledKVStore
        kv = ScheduledKVStore(kv)
    rank = int(os.environ["BYTESCHED_RANK"])
    net = model(args.seed)
    net.initialize(mx.init.Xavier(), ctx=contexts)
    trainer = gluon.Trainer(net.collect_params(), "adam", {"learning_rate": 0.01}, kvstore=kv)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    data = np.random.RandomState(1000 * args.seed + rank)
    batch = 4 * args.contexts
    held_out = mx.nd.array(data.rand(8, 3, 12, 12)), mx.nd.array(data.randint(0, 10, 8))

    accuracy = 0.0
    for _ in range(args.epochs):
        for _ in range(args.steps):
            x, y = mx.nd.array(data.rand(batch, 3, 12, 12)), mx.nd.array(data.randint(0, 10, batch))
            x = behind_the_engine(x)
            xs, ys = gluon.utils.split_and_load(x, contexts), gluon.utils.split_and_load(y, contexts)
            with autograd.record():
                losses = [loss_fn(net(xi), yi) for xi, yi in zip(xs, ys)]
            for loss in losses:
                loss.backward()
            trainer.step(batch)
        metric = mx.metric.Accuracy()
        metric.update([held_out[1]], [net(held_out[0].as_in_context(contexts[0]))])
        accuracy = metric.get()[1]
    args.out.mkdir(parents=True, exist_ok=True)
    # The trained parameters only: batch norm's running statistics are not communicated after the
    # Trainer's first step, where it broadcasts them from ps-lite's worker 0, whichever process
    # that is in a run (the same holds for MXNet's own store).
    trained = {name: p for name, p in net.collect_params().items() if p.grad_req != "null"}
    np.savez(args.out / f"worker{rank}.npz", **{name: p.data(contexts[0]).asnumpy() for name, p in trained.items()})
    print(f"EVALUATED epochs={args.epochs} accuracy={accuracy:.4f}", flush=True)


if __name__ == "__main__":
    main()
