"""A rank of the MXNet-over-Horovod test: the same Gluon training through plain
``horovod.mxnet.DistributedOptimizer`` and through ScheduledOptimizer, compared bit for bit.

Run under ``horovodrun -np 2 --gloo``. Each rank trains on its own data, once with SGD with
momentum (which MXNet updates four tensors per call) and once with Adam (one per call); prints
``HVD MXNET EQUAL rank=R subtasks=N`` when every pair of runs ends with identical weights, or
``HVD MXNET DIFFER ...``. With tuning switched on (``BYTESCHED_TUNING``), each scheduled run
also prints ``HVD MXNET KEPT rank=R optimizer=O partition=P credit=C`` (``none`` while the search
had not ended). With no sizes set (the start-up plan), each scheduled run prints ``HVD MXNET PLAN
rank=R optimizer=O step=S partition=P credit=C passes_through=B`` (``none`` if no plan was
applied) and ``HVD MXNET TRIAL rank=R optimizer=O core_ms=C own_ms=W passes_through=B``
(``none`` if the plan's sizes were not tried). ``--blocks N`` trains N layers named layer2 ...
layer(N+1) instead of the MLP, and each scheduled run prints ``HVD MXNET ORDER rank=R optimizer=O
NAMES``: the parameters in the order of its priorities (``given`` where it kept the Trainer's
index). ``--steps`` sets the training steps (12);
``--plan forced`` and ``--trial keep|leave`` replace rank 0's plan and the medians its trial
measures (``tests/scripts/plan_cases.py``).
"""

from __future__ import annotations

import argparse

import horovod.mxnet as hvd
import mxnet as mx
import numpy as np
from mxnet import autograd, gluon
from plan_cases import PLANS, TRIALS, replace_plan, replace_trial


OPTIMIZERS = {"sgd": {"learning_rate": 0.05, "momentum": 0.9, "wd": 1e-3},
              "adam": {"learning_rate": 0.01, "wd": 1e-3}}


def train(scheduled: bool, optimizer: str, steps: int, blocks: int | None) -> list[np.ndarray]:
    net = gluon.nn.HybridSequential()
    if blocks is None:
        net.add(gluon.nn.Dense(48, activation="relu", in_units=32), gluon.nn.Dense(10, in_units=48))
    else:  # layer2 ... layer(blocks+1): by name, layer10 comes before layer2
        net.add(*(gluon.nn.Dense(10 if i == blocks + 1 else 16, activation=None if i == blocks + 1 else "relu",
                                 in_units=32 if i == 2 else 16, prefix=f"layer{i}_") for i in range(2, blocks + 2)))
    mx.random.seed(3)
    net.initialize(mx.init.Xavier())
    params = net.collect_params()
    hvd.broadcast_parameters(params, root_rank=0)
    opt = hvd.DistributedOptimizer(mx.optimizer.create(optimizer, **OPTIMIZERS[optimizer]))
    if scheduled:
        from bytesched.plugins.mxnet import ScheduledOptimizer
        opt = ScheduledOptimizer(opt)
    trainer = gluon.Trainer(params, opt, kvstore=None)
    rng = np.random.RandomState(50 + hvd.rank())
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    for _ in range(steps):
        x = mx.nd.array(rng.rand(16, 32))
        y = mx.nd.array(rng.randint(0, 10, size=16))
        with autograd.record():
            loss = loss_fn(net(x), y)
        loss.backward()
        trainer.step(16)
    weights = [p.data().asnumpy() for p in params.values()]
    if scheduled and blocks is not None:
        order = opt.priority_order
        names = "given" if order is None else ",".join(trainer._params[index].name for index in order)
        print(f"HVD MXNET ORDER rank={hvd.rank()} optimizer={optimizer} {names}", flush=True)
    if scheduled and opt._config.plan:
        plan = opt.plan
        applied = "none" if plan is None else \
            f"step={plan.step} partition={plan.params.partition_bytes} credit={plan.params.credit_bytes} " \
            f"passes_through={opt.passes_through}"
        print(f"HVD MXNET PLAN rank={hvd.rank()} optimizer={optimizer} {applied}", flush=True)
        trial = opt.plan_trial
        tried = "none" if trial is None else \
            f"core_ms={trial.core_ms:g} own_ms={trial.own_ms:g} passes_through={trial.passes_through}"
        print(f"HVD MXNET TRIAL rank={hvd.rank()} optimizer={optimizer} {tried}", flush=True)
    if scheduled and opt._config.tuning:
        kept = opt.tuned_params
        sizes = "none" if kept is None else f"partition={kept.partition_bytes} credit={kept.credit_bytes}"
        print(f"HVD MXNET KEPT rank={hvd.rank()} optimizer={optimizer} {sizes}", flush=True)
    return weights


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--blocks", type=int, default=None)
    parser.add_argument("--plan", choices=PLANS, default="measured")
    parser.add_argument("--trial", choices=TRIALS, default="measured")
    args = parser.parse_args()
    steps = args.steps
    replace_plan(args.plan, "all-reduce")
    replace_trial(args.trial)
    hvd.init()
    pairs = [(a, b) for name in OPTIMIZERS
             for a, b in zip(train(scheduled=False, optimizer=name, steps=steps, blocks=args.blocks),
                             train(scheduled=True, optimizer=name, steps=steps, blocks=args.blocks))]
    from bytesched.core import get_core
    from bytesched.runtime import channel_of
    subtasks = get_core().take_stats().subtasks_started
    heartbeats = "on" if channel_of(get_core()) is not None else "off"
    worst = max(float(np.abs(a - b).max()) for a, b in pairs)
    verdict = "EQUAL" if all(np.array_equal(a, b) for a, b in pairs) else "DIFFER"
    print(f"HVD MXNET {verdict} rank={hvd.rank()} subtasks={subtasks} heartbeats={heartbeats} "
          f"max_abs_diff={worst}", flush=True)


if __name__ == "__main__":
    main()
