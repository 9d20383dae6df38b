"""MXNet's priorities from the first forward pass (bytesched.plugins.mxnet.trace), in one process:
a Gluon Trainer given ``net.collect_params()`` numbers its parameters by sorted name, and the
store ranks them by the order the forward pass reads them instead; the symbolic Module, which no
hook sees, keeps its own order. Over real dist_sync stores and Horovod: test_mxnet_ps.py and
test_mxnet_horovod.py."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest

from conftest import require

mx = require("mxnet")
require("bytesched.plugins.mxnet.proxies", "the MXNet Dependency Proxy library (python csrc/build.py)")
import mxnet.ndarray.register as register  # noqa: E402 - after require(), which skips the module without MXNet
from mxnet import autograd, gluon  # noqa: E402 - after require(), which skips the module without MXNet

from bytesched import core as bcore  # noqa: E402 - after require(), which skips the module without MXNet
from bytesched.core import Config, SchedulingParams  # noqa: E402 - after require(), which skips the module without MXNet
from bytesched.plugins.mxnet import ScheduledKVStore  # noqa: E402 - after require(), which skips the module without MXNet
from bytesched.plugins.mxnet.trace import ForwardWatch, handle_of  # noqa: E402 - after require(), which skips the module without MXNet

BLOCKS = range(2, 14)
"""Twelve layers named layer2 ... layer13: by name, layer10-layer13 come before layer2."""
FORWARD = [f"layer{i}_{kind}" for i in BLOCKS for kind in ("weight", "bias")]


@pytest.fixture(autouse=True)
def fresh_core() -> Iterator[None]:
    """Each test's store starts the process's Core with its own settings; stop it afterwards."""
    yield
    bcore.shutdown()


def deep(hybridize: bool = False, contexts: list | None = None) -> gluon.nn.HybridSequential:
    net = gluon.nn.HybridSequential()
    for i in BLOCKS:
        net.add(gluon.nn.Dense(6, activation="relu", prefix=f"layer{i}_"))  # in_units inferred: deferred
    mx.random.seed(5)
    net.initialize(mx.init.Xavier(), ctx=contexts)
    if hybridize:
        net.hybridize()
    return net


def first_reads(net: gluon.Block, watch: ForwardWatch) -> list[str]:
    """``net``'s parameters in the order the watched pass first read them (any context's array)."""
    forward = watch.stop()
    first = forward.first_reads
    positions = {name: min(first[handle_of(a)] for a in p.list_data() if handle_of(a) in first)
                 for name, p in net.collect_params().items()}
    return sorted(positions, key=positions.__getitem__)


@pytest.mark.parametrize("hybridize", [False, True])
def test_a_watch_sees_the_order_the_forward_pass_reads_the_parameters(hybridize: bool) -> None:
    """Imperative blocks (each operator) and a hybridized network (its cached graph's inputs):
    the first forward pass under autograd.record() reads the layers front to back, whatever
    their names; what runs outside record() (initialisation, here deferred to the first pass;
    an evaluation pass before training) is not recorded."""
    net = deep(hybridize)
    watch = ForwardWatch()
    net(mx.nd.ones((2, 4)))  # evaluation: not recorded (and it finishes the deferred init)
    assert not watch.stop().first_reads
    watch = ForwardWatch()
    with autograd.record():
        net(mx.nd.ones((2, 4))).sum()
    assert first_reads(net, watch) == FORWARD != sorted(FORWARD)


def test_the_watch_ends_at_the_first_backward_pass_and_unwraps_mxnet() -> None:
    invoke = register._imperative_invoke
    net = deep()
    watch = ForwardWatch()
    assert register._imperative_invoke is not invoke
    with autograd.record():
        loss = net(mx.nd.ones((2, 4))).sum()
    loss.backward()
    assert register._imperative_invoke is invoke and mx.nd.NDArray.backward.__name__ == "backward"
    recorded = len(watch.recorder.finish().ops)
    with autograd.record():
        net(mx.nd.ones((2, 4))).sum()
    assert len(watch.stop().ops) == recorded > 0


def train(net: gluon.Block, kv: object, contexts: list, steps: int = 3,
          shape: tuple[int, ...] = (3, 4)) -> list[np.ndarray]:
    """``steps`` steps of SGD on every context (batches of ``shape``), the Trainer given the
    dict; the weights after."""
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1, "momentum": 0.9}, kvstore=kv)
    rng = np.random.RandomState(0)
    for _ in range(steps):
        batches = [mx.nd.array(rng.rand(*shape), ctx=ctx) for ctx in contexts]
        with autograd.record():
            losses = [net(x).square().sum() for x in batches]
        for loss in losses:
            loss.backward()
        trainer.step(shape[0] * len(contexts))
    return [p.data(contexts[0]).asnumpy() for p in net.collect_params().values()]


def test_a_store_ranks_a_trainers_dict_by_the_forward_order_and_trains_as_the_plain_one(
        caplog: pytest.LogCaptureFixture, tmp_path: Path) -> None:
    """Two contexts, a Trainer given ``collect_params()`` (indices in sorted-name order): the
    store's priorities follow the forward pass, it says so once in the log and on the timeline,
    and the weights equal the plain local store's."""
    contexts = [mx.cpu(0), mx.cpu(1)]
    reference = train(deep(contexts=contexts), mx.kv.create("local"), contexts)
    net = deep(contexts=contexts)
    kv = ScheduledKVStore(mx.kv.create("local"), Config(params=SchedulingParams(partition_bytes=64, credit_bytes=128),
                                                       timeline=str(tmp_path / "tl.json")))
    with caplog.at_level(logging.INFO, logger="bytesched"):
        weights = train(net, kv, contexts)
    names = sorted(net.collect_params().keys())  # the Trainer's numbering
    assert [names[key] for key in kv.priority_order] == FORWARD
    for got, want in zip(weights, reference):
        assert np.array_equal(got, want)
    said = [r.getMessage() for r in caplog.records if "priorities from the first forward pass" in r.getMessage()]
    described = ", ".join(f"{names.index(name)} ({name})" for name in FORWARD)  # key (name)
    assert len(said) == 1 and said[0].endswith(f"(24 read): {described}"), said
    kv.close()
    bcore.shutdown()
    events = json.loads((tmp_path / "tl.json").read_text())
    (order,) = [e["args"] for e in events if e["name"] == "priority order"]
    assert order["source"] == "forward pass" and [o.split()[1][1:-1] for o in order["order"]] == FORWARD


class Inception(gluon.nn.HybridBlock):
    """A stem, three branches of one and two convolutions concatenated, a classifier."""

    def __init__(self) -> None:
        super().__init__(prefix="")
        with self.name_scope():
            self.stem = gluon.nn.Conv2D(8, 3, padding=1, prefix="stem_")
            self.a = gluon.nn.Conv2D(4, 1, prefix="a_")
            self.b1, self.b2 = gluon.nn.Conv2D(4, 1, prefix="b1_"), gluon.nn.Conv2D(4, 3, padding=1, prefix="b2_")
            self.c1, self.c2 = gluon.nn.Conv2D(4, 1, prefix="c1_"), gluon.nn.Conv2D(4, 5, padding=2, prefix="c2_")
            self.fc = gluon.nn.Dense(10, prefix="fc_")

    def hybrid_forward(self, F, x):  # Gluon's signature
        x = F.relu(self.stem(x))
        return self.fc(F.concat(self.a(x), self.b2(F.relu(self.b1(x))), self.c2(F.relu(self.c1(x))), dim=1))


def test_tictac_orders_a_branching_gluon_block_by_tic_not_by_its_layers(tmp_path: Path) -> None:
    """BYTESCHED_POLICY=tictac on a local store: the second convolution of a branch goes after
    the first convolution of every branch (TIC on the traced pass), unlike the forward order."""
    net = Inception()
    net.initialize(mx.init.Xavier())
    kv = ScheduledKVStore(mx.kv.create("local"), Config(policy="tictac", timeline=str(tmp_path / "tl.json")))
    train(net, kv, [mx.cpu()], steps=1, shape=(2, 3, 6, 6))
    names = sorted(net.collect_params().keys())
    layers = ["stem", "a", "b1", "b2", "c1", "c2", "fc"]
    assert [names[key] for key in kv.priority_order] == [f"{layer}_{kind}" for layer in layers
                                                         for kind in ("weight", "bias")]
    kv.close()
    bcore.shutdown()
    events = json.loads((tmp_path / "tl.json").read_text())
    (tictac,) = [e["args"]["order"] for e in events if e["name"] == "tictac order"]
    pushpulls = [names[int(task.split(":")[1])] for task in tictac if task.startswith("pushpull:")]
    tic = ["stem", "a", "b1", "c1", "b2", "c2", "fc"]
    assert pushpulls == [f"{layer}_{kind}" for layer in tic for kind in ("weight", "bias")]


def test_the_module_api_keeps_its_own_order_and_says_why(caplog: pytest.LogCaptureFixture) -> None:
    """Module runs its symbol's executors, which no hook sees: nothing is traced, the store keeps
    the priorities Module gives (its symbol's argument order), and logs why."""
    data = mx.sym.var("data")
    out = data
    for i in BLOCKS:
        out = mx.sym.FullyConnected(out, num_hidden=6, name=f"layer{i}")
    module = mx.mod.Module(mx.sym.LinearRegressionOutput(out, mx.sym.var("label")), label_names=["label"])
    kv = ScheduledKVStore(mx.kv.create("local"))
    with caplog.at_level(logging.INFO, logger="bytesched"):
        module.fit(mx.io.NDArrayIter(np.ones((6, 4)), np.zeros((6, 6)), batch_size=3, label_name="label"),
                   num_epoch=1, kvstore=kv, optimizer_params={"learning_rate": 0.01})
    assert kv.priority_order is None
    said = [r.getMessage() for r in caplog.records if "no forward pass was traced" in r.getMessage()]
    assert len(said) == 1 and "Module runs its symbol's executors" in said[0]
    assert said[0].endswith(", ".join(f"layer{i}_{kind}" for i in BLOCKS for kind in ("weight", "bias"))), said
