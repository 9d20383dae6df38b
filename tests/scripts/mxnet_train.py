"""A worker of the MXNet parameter-server tests: trains a small Gluon MLP through a KVStore.

Run under ``bytesched launch``. Every worker trains on its own deterministic data shard, so the
servers really sum different gradients; at the end each worker saves its weights to
``OUT/worker{BYTESCHED_RANK}.npz`` and prints ``TRAINED steps=... subtasks=...``.

    --store plain       the wrapped MXNet store alone (the reference)
    --store scheduled   through ScheduledKVStore (policy, sizes: BYTESCHED_* environment)
    --skew              worker 1 issues each step's pushpulls in reverse order, with pauses
                        (workers start pushes in different orders: rank-0 order must cope)
    --str-keys          the scheduled store is given parameter names as keys, as Module does,
                        instead of the Trainer's int indices
    --repartition-at S --repartition-bytes B   change the partition size at step S
    --snapshot-at N     also save the weights after N steps, to OUT/worker{R}_step{N}.npz
    --crash-at N        worker 1 dies (exit code 3) at step N, mid-training
    --plan forced       rank 0's start-up plan simulation always picks 1 KB partitions under a
                        2 KB credit (the real one runs first); ``--plan failed``: timing the
                        push+pull raises on every worker (tests/scripts/plan_cases.py)
    --blocks N          train N layers named layer2 ... layer(N+1) instead of the MLP; the
                        TRAINED line then ends with ``priority=`` the parameters' names in the
                        order of the store's priorities (``given`` where it kept the Trainer's)
    --trial keep        the sized plan's trial (BYTESCHED_PLAN_TRIAL) finds the sizes twice as
                        fast as staying out and keeps them; ``--trial leave``: half as fast, it
                        stays out (what rank 0 measured is replaced; its broadcast is real)

The TRAINED line ends with ``tuned=PARTITION,CREDIT`` (the sizes tuning kept, ``none`` without),
``repartitions=N`` (live re-partitions of the server keys), ``plan=PARTITION,CREDIT@STEP`` (the
start-up plan applied) and ``start_order=`` (how the Core starts tasks at the end).
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon

from bytesched.core import SchedulingParams
from plan_cases import PLANS, TRIALS, replace_plan, replace_trial


def model(blocks: int | None = None) -> gluon.nn.HybridSequential:
    """The small MLP; or ``blocks`` layers named layer2, layer3, ... (sorted by name, layer10 comes
    before layer2), their input sizes inferred at the first forward pass."""
    net = gluon.nn.HybridSequential()
    if blocks is None:
        net.add(gluon.nn.Dense(48, activation="relu", in_units=32),
                gluon.nn.Dense(24, activation="tanh", in_units=48),
                gluon.nn.Dense(10, in_units=24))
    else:
        net.add(*(gluon.nn.Dense(10 if i == blocks + 1 else 16, activation=None if i == blocks + 1 else "relu",
                                 prefix=f"layer{i}_") for i in range(2, blocks + 2)))
    mx.random.seed(7)
    net.initialize(mx.init.Xavier())
    return net


def save(net: gluon.nn.HybridSequential, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, **{name: p.data().asnumpy() for name, p in net.collect_params().items()})


def skewed(store_cls: type) -> type:
    """``store_cls`` whose worker 1 replays each step's pushpulls in reverse, with pauses."""

    class Skewed(store_cls):  # type: ignore[misc, valid-type]
        def __init__(self, *args: object, **kwargs: object) -> None:
            super().__init__(*args, **kwargs)
            self._held: list[tuple] = []
            self._count = 0

        def init(self, key, value):
            self._count += 1 if not isinstance(key, (list, tuple)) else len(key)
            super().init(key, value)

        def pushpull(self, key, value, out=None, priority=0):
            if os.environ["BYTESCHED_RANK"] != "1":
                return super().pushpull(key, value, out=out, priority=priority)
            self._held.append((key, value, out, priority))
            if len(self._held) == self._count:
                for args in reversed(self._held):
                    time.sleep(0.003)
                    super().pushpull(args[0], args[1], out=args[2], priority=args[3])
                self._held = []
            return None

    return Skewed


def str_keyed(store_cls: type) -> type:
    """``store_cls`` that receives str keys ("param<index>") where the Trainer passes ints."""

    def named(key):
        # a str key is already named: the store's broadcast calls init with it
        if isinstance(key, (list, tuple)):
            return [named(k) for k in key]
        return key if isinstance(key, str) else f"param{key}"

    class StrKeyed(store_cls):  # type: ignore[misc, valid-type]
        def init(self, key, value):
            super().init(named(key), value)

        def broadcast(self, key, value, out, priority=0):
            super().broadcast(named(key), value, out, priority=priority)

        def pushpull(self, key, value, out=None, priority=0):
            super().pushpull(named(key), value, out=out, priority=priority)

    return StrKeyed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--store", choices=("plain", "scheduled"), required=True)
    parser.add_argument("--kvstore", default="dist_sync")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--optimizer", default="sgd")
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--skew", action="store_true")
    parser.add_argument("--str-keys", action="store_true")
    parser.add_argument("--repartition-at", type=int, default=None)
    parser.add_argument("--repartition-bytes", type=int, default=None)
    parser.add_argument("--snapshot-at", type=int, default=None)
    parser.add_argument("--crash-at", type=int, default=None)
    parser.add_argument("--plan", choices=PLANS, default="measured")
    parser.add_argument("--trial", choices=TRIALS, default="measured")
    parser.add_argument("--blocks", type=int, default=None)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    replace_plan(args.plan, "push+pull")
    replace_trial(args.trial)
    rank = int(os.environ["BYTESCHED_RANK"])

    kv = mx.kv.create(args.kvstore)
    if args.store == "scheduled":
        from bytesched.plugins.mxnet import ScheduledKVStore
        cls = skewed(ScheduledKVStore) if args.skew else ScheduledKVStore
        kv = (str_keyed(cls) if args.str_keys else cls)(kv)
    net = model(args.blocks)
    options = {"learning_rate": 0.05, "wd": 0.001}
    if args.optimizer == "sgd":
        options["momentum"] = args.momentum
    trainer = gluon.Trainer(net.collect_params(), args.optimizer, options, kvstore=kv)
    rng = np.random.RandomState(100 + rank)  # drawn step by step: a shorter run is a prefix
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    for step in range(args.steps):
        if step == args.crash_at and rank == 1:
            print(f"CRASHING at step {step}", flush=True)
            os._exit(3)
        if args.repartition_at is not None and step == args.repartition_at:
            kv.set_params(SchedulingParams(partition_bytes=args.repartition_bytes,
                                           credit_bytes=kv.config.params.credit_bytes))
        x = mx.nd.array(rng.rand(16, 32))
        y = mx.nd.array(rng.randint(0, 10, size=16))
        with autograd.record():
            loss = loss_fn(net(x), y)
        loss.backward()
        trainer.step(16)
        if step + 1 == args.snapshot_at:
            save(net, args.out / f"worker{rank}_step{step + 1}.npz")
    save(net, args.out / f"worker{rank}.npz")
    subtasks, tuned, repartitions, plan = 0, None, 0, None
    if args.store == "scheduled":
        kv.wait_idle(60)
        subtasks = kv._core.take_stats().subtasks_started
        tuned, plan = kv.tuned_params, kv.plan
        repartitions = kv._table.generation
    kept = "none" if tuned is None else f"{tuned.partition_bytes:g},{tuned.credit_bytes:g}"
    planned = "none" if plan is None else f"{plan.params.partition_bytes:g},{plan.params.credit_bytes:g}@{plan.step}"
    print(f"TRAINED steps={args.steps} subtasks={subtasks} "
          f"partition_bytes={getattr(kv, 'partition_bytes', 'none')} order={getattr(kv, 'order', 'none')} "
          f"tuned={kept} repartitions={repartitions} plan={planned} "
          f"start_order={kv._core.start_order if args.store == 'scheduled' else 'none'} "
          f"passes_through={int(getattr(kv, 'passes_through', False))}"
          + ("" if args.blocks is None else f" priority={priority(trainer, kv)}"), flush=True)


def priority(trainer: gluon.Trainer, kv: object) -> str:
    """The parameters' names in the order of the store's priorities; ``given`` where it kept the
    Trainer's (or the plain store, which has its own)."""
    order = getattr(kv, "priority_order", None)
    return "given" if order is None else ",".join(trainer._params[key].name for key in order)


if __name__ == "__main__":
    main()
