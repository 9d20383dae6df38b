"""ResNet-18 from MXNet's model zoo, trained as published Gluon scripts train it, with bytesched.

On a parameter server (each worker on two contexts), or over Horovod:

    bytesched launch --servers 2 --workers 2 -- python examples/mxnet_gluon_resnet.py --contexts 2
    horovodrun -np 2 -H localhost:2 --gloo python examples/mxnet_gluon_resnet.py --horovod

The idioms of published scripts: ``mxnet.gluon.model_zoo.vision.resnet18_v1`` (batch norm, its
input size inferred at the first forward pass), the Trainer given ``net.collect_params()``, each
batch split over the worker's contexts, a DataLoader, and an evaluation pass on held-out data
after every epoch. The data are synthetic CIFAR-10-like images (a fixed pattern per class plus
noise), each worker its own shard, and an epoch is ``--steps`` batches. bytesched adds two lines
(marked below), and ``--no-bytesched`` runs the same job without them; ``--save PATH`` writes
each worker's final weights to ``PATH.<rank>.npz``, to compare the two.
"""

from __future__ import annotations

import argparse

import numpy as np


def synthetic(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``n`` 3x32x32 images: the pattern of their class (fixed for all workers) plus noise."""
    patterns = np.random.RandomState(0).rand(10, 3, 32, 32).astype("float32")
    rng = np.random.RandomState(seed)
    labels = rng.randint(0, 10, size=n)
    return patterns[labels] + 0.5 * rng.randn(n, 3, 32, 32).astype("float32"), labels.astype("float32")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--horovod", action="store_true", help="all-reduce over Horovod instead of dist_sync")
    parser.add_argument("--contexts", type=int, default=1, help="CPU contexts per worker")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=20, help="batches per epoch")
    parser.add_argument("--batch-size", type=int, default=32, help="per worker")
    parser.add_argument("--save", help="write the final weights to SAVE.<rank>.npz")
    parser.add_argument("--bytesched", action=argparse.BooleanOptionalAction, default=True)
    args = parser.parse_args()
    if args.horovod and args.contexts != 1:
        parser.error("--horovod runs one context per rank, as Horovod does (start more ranks instead)")
    if args.horovod:
        import torch  # noqa: F401  -- import torch before horovod.mxnet: the other order crashes
        import horovod.mxnet as hvd
        hvd.init()
    import mxnet as mx
    from mxnet import autograd, gluon
    from mxnet.gluon.model_zoo import vision

    contexts = [mx.cpu(i) for i in range(args.contexts)]
    mx.random.seed(42)  # the same initial weights in every run
    np.random.seed(42)  # the same shuffling
    net = vision.resnet18_v1(classes=10)
    net.initialize(mx.init.Xavier(magnitude=2), ctx=contexts)
    sgd = {"learning_rate": 0.002, "momentum": 0.9, "wd": 1e-4}
    if args.horovod:
        rank, workers = hvd.rank(), hvd.size()
        hvd.broadcast_parameters(net.collect_params(), root_rank=0)
        # The Trainer's step(batch_size) sets rescale_grad on Horovod's optimizer, which does not
        # pass it on to the one it wraps: set it there.
        optimizer = hvd.DistributedOptimizer(mx.optimizer.create("sgd", rescale_grad=1 / args.batch_size, **sgd))
        if args.bytesched:
            from bytesched.plugins.mxnet import ScheduledOptimizer  # bytesched's first line
            optimizer = ScheduledOptimizer(optimizer)  # bytesched's second line
        trainer = gluon.Trainer(net.collect_params(), optimizer, kvstore=None)
    else:
        kv = mx.kv.create("dist_sync")
        if args.bytesched:
            from bytesched.plugins.mxnet import ScheduledKVStore  # bytesched's first line
            kv = ScheduledKVStore(kv)  # bytesched's second line
        rank, workers = kv.rank, kv.num_workers
        trainer = gluon.Trainer(net.collect_params(), "sgd", sgd, kvstore=kv)

    train_x, train_y = synthetic(args.steps * args.batch_size, seed=1 + rank)
    test_x, test_y = synthetic(4 * args.batch_size, seed=10_000)
    train_data = gluon.data.DataLoader(gluon.data.ArrayDataset(train_x, train_y), batch_size=args.batch_size,
                                       shuffle=True, last_batch="discard")
    test_data = gluon.data.DataLoader(gluon.data.ArrayDataset(test_x, test_y), batch_size=args.batch_size)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()

    def evaluate() -> float:
        metric = mx.metric.Accuracy()
        for data, label in test_data:
            outputs = [net(x) for x in gluon.utils.split_and_load(data, contexts)]
            metric.update(gluon.utils.split_and_load(label, contexts), outputs)
        return metric.get()[1]

    for epoch in range(args.epochs):
        for data, label in train_data:
            xs = gluon.utils.split_and_load(data, contexts)
            ys = gluon.utils.split_and_load(label, contexts)
            with autograd.record():
                losses = [loss_fn(net(x), y) for x, y in zip(xs, ys)]
            for loss in losses:
                loss.backward()
            trainer.step(args.batch_size * (1 if args.horovod else workers))
        print(f"worker {rank} epoch {epoch + 1}: test accuracy {evaluate():.1%}", flush=True)
    if args.save:
        np.savez(f"{args.save}.{rank}.npz", **{name: p.data(contexts[0]).asnumpy()
                                               for name, p in net.collect_params().items()})


if __name__ == "__main__":
    main()
