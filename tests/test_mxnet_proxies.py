"""The MXNet Dependency Proxies (csrc/) and ScheduledKVStore in one process, on a local store.

Real MXNet engine, real C++ library; the parameter-server and Horovod jobs are in
test_mxnet_ps.py and test_mxnet_horovod.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest

from conftest import REPO_ROOT, require

mx = require("mxnet")
proxies = require("bytesched.plugins.mxnet.proxies", "the MXNet Dependency Proxy library (python csrc/build.py)")
from bytesched import core as bcore  # noqa: E402 - once mxnet is known here
from bytesched.core import SchedulingParams  # noqa: E402 - once mxnet is known here
from bytesched.plugins.mxnet import ScheduledKVStore  # noqa: E402 - once mxnet is known here
from bytesched.ps_layout import ServerKeyTable, mxnet_server_of  # noqa: E402 - once mxnet is known here
from bytesched.plugins.mxnet.fusion import Bucket  # noqa: E402 - once mxnet is known here
from bytesched.plugins.mxnet.task import Avatars  # noqa: E402 - once mxnet is known here

HELD = 0.3  # seconds to wait before concluding that something did not happen


@pytest.fixture(autouse=True)
def fresh_core() -> Iterator[None]:
    """Each test's store starts the process's Core with its own settings; stop it afterwards."""
    yield
    bcore.shutdown()


@pytest.fixture
def events() -> proxies.ProxyEvents:
    """The process's proxy events, delivered by a running Core that waits on them (as the
    plugins' Cores do)."""
    events = proxies.events()
    bcore.init(bcore.Config()).wait_on(events)
    return events


class Recorder:
    """A proxy target that records the events delivered to it, and the threads they came on."""

    def __init__(self) -> None:
        self.ready = threading.Event()
        self.finished: list[int] = []
        self.changed = threading.Condition()
        self.threads: set[str] = set()

    def proxy_ready(self) -> None:
        self.threads.add(threading.current_thread().name)
        self.ready.set()

    def proxy_finished(self, index: int) -> None:
        self.threads.add(threading.current_thread().name)
        with self.changed:
            self.finished.append(index)
            self.changed.notify_all()

    def wait_finished(self, count: int, timeout: float = 5.0) -> bool:
        with self.changed:
            return self.changed.wait_for(lambda: len(self.finished) >= count, timeout)


def chain(events: proxies.ProxyEvents, tensor: mx.nd.NDArray, ranges: list[tuple[int, int]],
          target: Recorder, released_on_ready: bool = False) -> tuple[int, Avatars]:
    """Post the proxy chain around a stand-in communication that doubles each partition."""
    lib = events.library
    avatars = Avatars(lib, [tensor], ranges)
    token = events.register(target)
    lib.post_entry(token, avatars.chain, 0, released_on_ready)
    for (avatar,) in avatars.parts:
        avatar *= 2
    lib.post_exit(token, avatars.chain, 0)
    return token, avatars


def test_a_partition_moves_only_when_released_and_independently_of_the_others(events: proxies.ProxyEvents) -> None:
    grad = mx.nd.ones((8,))
    target = Recorder()
    token, avatars = chain(events, grad, [(0, 4), (4, 8)], target)

    assert target.ready.wait(5), "the ready proxies never ran although the tensor exists"
    assert not target.wait_finished(1, HELD), "a partition communicated before it was started"
    events.library.release(token, 1)  # the Core starts partition 1 only
    assert target.wait_finished(1) and target.finished == [1]
    # partition 1's avatar is readable while partition 0 is still held: separate engine variables
    assert avatars.parts[1][0].asnumpy().tolist() == [2.0] * 4
    events.library.release(token, 0)
    assert target.wait_finished(2)
    assert grad.asnumpy().tolist() == [2.0] * 8  # the framework sees the result after the exit fence
    assert target.threads == {"bytesched-core-0"}  # no thread of their own between engine and Core
    events.forget(token)


def test_a_core_waiting_on_engine_events_answers_other_threads_at_once(events: proxies.ProxyEvents) -> None:
    """The Core thread sleeps in the library's wait with no timeout (nothing is in flight, no
    policy timer): an event put on its queue from another thread must wake it, not wait for the
    engine's next event."""
    core = bcore.get_core()
    for _ in range(20):
        started = time.monotonic()
        assert core.query(lambda: "answered", timeout=5.0) == "answered"
        assert time.monotonic() - started < 1.0


def test_a_wake_before_the_wait_is_not_lost() -> None:
    """bs_wake sets a flag the next wait consumes: a put that lands between the Core's look at
    its queue and its wait still wakes it. Waits are in microseconds, not whole milliseconds."""
    library = proxies.events().library  # no Core runs: nothing else waits on the library here
    buffer = library.event_buffer(4)
    while buffer.next(0.0):  # what earlier tests' engine operations left queued
        pass
    library.wake()
    started = time.monotonic()
    assert buffer.next(5.0) == []
    assert time.monotonic() - started < 1.0, "a wake that came before the wait was lost"
    started = time.monotonic()
    assert buffer.next(0.0005) == []  # the flag was consumed: this one times out
    assert time.monotonic() - started < 0.5


def test_a_task_released_on_ready_moves_once_its_tensor_exists_with_ready_before_finish(
        events: proxies.ProxyEvents) -> None:
    grad = mx.nd.ones((8,))
    order: list[str] = []

    class Ordered(Recorder):
        def proxy_ready(self) -> None:
            order.append("ready")
            super().proxy_ready()

        def proxy_finished(self, index: int) -> None:
            order.append(f"finish {index}")
            super().proxy_finished(index)

    target = Ordered()
    token, _ = chain(events, grad, [(0, 4), (4, 8)], target, released_on_ready=True)

    assert target.wait_finished(2), "a task released on ready was held although nobody releases it"
    assert order[0] == "ready" and sorted(order[1:]) == ["finish 0", "finish 1"]
    assert grad.asnumpy().tolist() == [2.0] * 8
    with pytest.raises(proxies.ProxyLibraryError, match="no open proxy"):
        events.library.release(token, 0)  # nothing of it stays open in the library
    events.forget(token)


def test_ready_waits_for_the_operation_that_computes_the_tensor(events: proxies.ProxyEvents) -> None:
    grad = mx.nd.zeros((4,))
    producer = Recorder()  # a proxy that writes `grad` and is held: "backward still running"
    producer_token = events.register(producer)
    events.library.post_entry(producer_token, proxies.Chain([], [[grad]]), 0)
    assert producer.ready.wait(5)
    consumer = Recorder()
    token, _ = chain(events, grad, [(0, 4)], consumer)

    assert not consumer.ready.wait(HELD), "notify_ready came before the gradient was computed"
    events.library.release(producer_token, 0)
    assert consumer.ready.wait(5)
    events.library.release(token, 0)
    assert consumer.wait_finished(1)
    events.forget(token)
    events.forget(producer_token)


def test_a_one_partition_chain_waits_for_earlier_readers_and_holds_later_users(
        events: proxies.ProxyEvents) -> None:
    """A chain of one partition has no fences: its ready proxy must still wait for every earlier
    reader of the tensor (here the held ready proxies of a two-partition chain, which read it),
    and the tensor's next user must still wait for its finish."""
    grad = mx.nd.ones((8,))
    reader = Recorder()
    reader_token = events.register(reader)
    reading = Avatars(events.library, [grad], [(0, 4), (4, 8)])
    events.library.post_entry(reader_token, reading.chain, 0)  # two ready proxies read grad, held
    assert reader.ready.wait(5)
    target = Recorder()
    token, _ = chain(events, grad, [(0, 8)], target)
    assert not target.ready.wait(HELD), "a one-partition chain overtook an earlier reader of its tensor"
    events.library.release(reader_token, 0)
    events.library.release(reader_token, 1)
    assert target.ready.wait(5)
    read = threading.Event()
    threading.Thread(target=lambda: (grad.wait_to_read(), read.set()), daemon=True).start()
    assert not read.wait(HELD), "the tensor was readable before its partition was communicated"
    events.library.release(token, 0)
    assert target.wait_finished(1) and read.wait(5)
    assert grad.asnumpy().tolist() == [2.0] * 8
    events.forget(token)
    events.forget(reader_token)


def test_waiting_fusion_buckets_hold_no_shared_engine_resource(events: proxies.ProxyEvents) -> None:
    """Regression: buckets whose gradients do not exist yet must not stall unrelated work.

    Packing with ``concat`` and unpacking with ``identity`` took one of MXNet's shared temp-space
    variables each (``MXNET_CPU_TEMP_COPY``, handed out round-robin). A pack or unpack posted
    before its gradients existed held its variable. Every later operation that drew the same
    one waited behind it: later buckets, and the model's own layers. MXNet over Horovod then ran
    at 0.90x plain Horovod at 10 Gbit/s (docs/benchmarks.md). Here more buckets than there are
    temp-space variables wait for a held "backward". An ``identity`` posted after them must
    still run, and the buffers must hold the gradients end to end once backward finishes.
    """
    buckets = int(os.environ.get("MXNET_CPU_TEMP_COPY", "4")) + 2
    grads = [[mx.nd.zeros((3,)), mx.nd.zeros((2, 2))] for _ in range(buckets)]
    backward = events.register(Recorder())  # a held proxy that writes every gradient
    events.library.post_entry(backward, proxies.Chain([], [[g for pair in grads for g in pair]]), 0)
    fused = [Bucket([2 * i, 2 * i + 1], pair, events.library) for i, pair in enumerate(grads)]
    for bucket in fused:
        bucket.pack()
        bucket.unpack()
    source, target = mx.nd.ones((5,)), mx.nd.zeros((5,))
    mx.nd.identity(source, out=target)
    copied = threading.Event()
    threading.Thread(target=lambda: (target.wait_to_read(), copied.set()), daemon=True).start()

    assert copied.wait(5), "work posted after waiting buckets waited for their gradients"
    for i, pair in enumerate(grads):
        pair[0][:] = i
        pair[1][:] = -i
    events.library.release(backward, 0)
    events.forget(backward)
    for i, bucket in enumerate(fused):
        assert bucket.buffer.asnumpy().tolist() == [0.0] * 7  # packed before this step's writes
        bucket.pack()
        assert bucket.buffer.asnumpy().tolist() == [float(i)] * 3 + [float(-i)] * 4


def test_copies_refuse_pieces_of_different_sizes() -> None:
    library = proxies.events().library
    with pytest.raises(ValueError, match="bucket_pack: cannot copy 3 x float32 into 4 x float32"):
        proxies.Copies(library, [(mx.nd.zeros((3,)), mx.nd.zeros((4,)))], [], [], "bucket_pack")


def test_protocol_errors_name_the_problem() -> None:
    lib = proxies.events().library
    with pytest.raises(proxies.ProxyLibraryError, match="no open proxy"):
        lib.release(987654, 0)
    with pytest.raises(ValueError, match="needs values to push or outs to pull into"):
        proxies.StoreCall(mx.kv.create("local"), [3], [[]], [[]])


def test_a_missing_library_says_how_to_build_it(tmp_path: Path) -> None:
    with pytest.raises(proxies.ProxyLibraryError, match=r"does not exist: build it with .*csrc/build.py"):
        proxies.ProxyLibrary(tmp_path / "libbytesched_mxnet.so")


def test_build_names_a_missing_compiler_and_a_missing_mxnet(tmp_path: Path) -> None:
    build = REPO_ROOT / "csrc" / "build.py"
    no_compiler = subprocess.run([sys.executable, build, "--force"], capture_output=True, text=True,
                                 env={"PATH": str(tmp_path), "CXX": ""})
    assert no_compiler.returncode == 1
    assert "no C++ compiler found" in no_compiler.stderr
    # -S: no site-packages, so no mxnet
    no_mxnet = subprocess.run([sys.executable, "-S", build], capture_output=True, text=True)
    assert no_mxnet.returncode == 1
    assert "mxnet is not installed" in no_mxnet.stderr


# ----------------------------------------------------------------------------------------------
# Server-key layout


def test_layout_places_stripes_on_their_servers_under_every_partition_size() -> None:
    table = ServerKeyTable(num_servers=3, bigarray_bound=100)
    small = table.add("bias", (10,), "float32", 16)
    big = table.add("weight", (20, 25), "float32", 400)
    layouts = [(small, big)]
    for old_small, old_big in [tuple(new for _, new in table.repartition(size)) for size in (40, 1000)]:
        layouts.append((old_small, old_big))
    servers_of_elements = []
    for s, b in layouts:
        for layout in (s, b):
            assert all(b_ - a_ < 100 for a_, b_ in layout.ranges), "a partition reached MXNet's bound"
            ordered = sorted(layout.ranges)  # the ranges tile the tensor
            assert ordered[0][0] == 0 and ordered[-1][1] == layout.numel
            assert all(a[1] == b_[0] for a, b_ in zip(ordered, ordered[1:]))
        # the big tensor's stripes split into equally many partitions, listed round-robin, so
        # that consecutive partitions (which the Core starts one after another) use all servers
        servers = [mxnet_server_of(key, 3) for key in b.server_keys]
        assert servers == [0, 1, 2] * (len(servers) // 3), servers
        where = {}
        for key, (a, b_) in zip(b.server_keys, b.ranges):
            for element in range(a, b_):
                where[element] = mxnet_server_of(key, 3)
        servers_of_elements.append(where)
    assert all(w == servers_of_elements[0] for w in servers_of_elements), \
        "an element of the big tensor moved to another server when re-partitioned"
    assert set(servers_of_elements[0].values()) == {0, 1, 2}  # big: striped over all servers
    all_keys = [k for s, b in layouts for k in s.server_keys + b.server_keys]
    assert len(all_keys) == len(set(all_keys)), "server keys were reused across generations"


def test_layout_rejects_bad_keys() -> None:
    table = ServerKeyTable()
    table.add(0, (4,), "float32", 8)
    with pytest.raises(TypeError, match="do not mix int and str keys"):
        table.add("w", (4,), "float32", 8)
    with pytest.raises(ValueError, match="already initialised"):
        table.add(0, (4,), "float32", 8)
    with pytest.raises(KeyError, match="was not initialised"):
        table[1]


def test_reserved_keys_are_new_and_land_on_the_least_loaded_server() -> None:
    """The start-up plan's timed keys: never a key of a layout, old or new, and placed by
    MXNet's rule on the server with the fewest bytes."""
    table = ServerKeyTable(num_servers=2, bigarray_bound=1000)
    layout = table.add(0, (300,), "float32", 400)  # 1200 bytes on server 0
    reserved = table.reserve()
    assert mxnet_server_of(reserved, 2) == 1 and reserved not in layout.server_keys
    fresh = [new for _, new in table.repartition(100)][0]
    assert reserved not in fresh.server_keys and table.reserve() not in (reserved, *fresh.server_keys)


def test_the_servers_optimizer_leaves_timed_keys_alone() -> None:
    """A timed key is no parameter: it gets no optimizer state, and its stored value does not move."""
    from bytesched.plugins.mxnet.server_optimizer import Part, PartitionedOptimizer

    sgd = mx.optimizer.SGD(learning_rate=0.5, momentum=0.9)
    wrapper = PartitionedOptimizer(sgd, {7: Part(0, 0, 4, 0), 9: Part("bytesched.timing", 0, 4, 0, timing_only=True)},
                                   version=(0, 1), generation=0)
    updater = mx.optimizer.get_updater(wrapper)
    weights = {key: mx.nd.ones((4,)) for key in (7, 9)}
    for key, weight in weights.items():
        updater(key, mx.nd.ones((4,)), weight)
    assert weights[9].asnumpy().tolist() == [1.0] * 4
    assert weights[7].asnumpy().tolist() == [0.5] * 4
    assert wrapper.create_state_multi_precision(9, weights[9]) is None


# ----------------------------------------------------------------------------------------------
# ScheduledKVStore on a local store (the optimizer runs in the store, per partition)


def train(store: str, optimizer: str, repartition: int | None, on_store: bool = True) -> list[np.ndarray]:
    gluon, autograd = mx.gluon, mx.autograd
    mx.random.seed(11)
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Dense(16, activation="relu", in_units=8), gluon.nn.Dense(4, in_units=16))
    net.initialize(mx.init.Xavier())
    kv = mx.kv.create("local")
    if store == "scheduled":
        kv = ScheduledKVStore(kv)
    options = {"learning_rate": 0.01, "wd": 0.001}
    if optimizer == "sgd":
        options["momentum"] = 0.9
    trainer = gluon.Trainer(net.collect_params(), optimizer, options, kvstore=kv, update_on_kvstore=on_store)
    rng = np.random.RandomState(5)
    x, y = mx.nd.array(rng.rand(20, 8)), mx.nd.array(rng.rand(20, 4))
    for step in range(8):
        if step == repartition:
            kv.set_params(SchedulingParams(partition_bytes=40, credit_bytes=80))
        with autograd.record():
            loss = ((net(x) - y) ** 2).mean()
        loss.backward()
        trainer.step(1)
    if store == "scheduled":
        kv.close()
    return [p.data().asnumpy() for p in net.collect_params().values()]


@pytest.mark.parametrize(("optimizer", "on_store"), [("sgd", True), ("adam", True), ("sgd", False)])
def test_local_store_matches_plain_across_a_repartition(optimizer: str, on_store: bool,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Momentum and Adam's moments and step counts survive a change from 100- to 40-byte
    partitions at step 4: the weights equal the unpartitioned store's exactly (also when the
    Trainer updates itself and the store only sums gradients)."""
    monkeypatch.setenv("BYTESCHED_PARTITION_BYTES", "100")
    monkeypatch.setenv("BYTESCHED_CREDIT_BYTES", "200")
    plain = train("plain", optimizer, None, on_store)
    scheduled = train("scheduled", optimizer, 4, on_store)
    for a, b in zip(plain, scheduled):
        assert np.array_equal(a, b), f"max |diff| {np.abs(a - b).max()}"


def test_local_store_with_adam_and_a_credit_below_the_partitions_does_not_deadlock(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Regression: Adam's update, run by a local store inside each partition's push, takes one
    of MXNet's shared temp-space variables, so a partition held back for credit blocked a later
    one that had started (docs/plugins/mxnet.md, "A local store releases partitions as soon as
    they are ready"). Partitions of 84-88 bytes under an 80-byte credit hung within a few steps."""
    monkeypatch.setenv("BYTESCHED_PARTITION_BYTES", "100")
    monkeypatch.setenv("BYTESCHED_CREDIT_BYTES", "80")
    gluon, autograd = mx.gluon, mx.autograd
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Dense(16, activation="relu", in_units=8), gluon.nn.Dense(4, in_units=16))
    net.initialize(mx.init.Xavier())
    kv = ScheduledKVStore(mx.kv.create("local"))
    trainer = gluon.Trainer(net.collect_params(), "adam", {"learning_rate": 0.01}, kvstore=kv)
    x, y = mx.nd.ones((20, 8)), mx.nd.ones((20, 4))
    for _ in range(40):
        with autograd.record():
            loss = ((net(x) - y) ** 2).mean()
        loss.backward()
        trainer.step(1)
        kv.wait_idle(timeout=15)  # a TimeoutError instead of a hung test
    kv.close()


@pytest.mark.parametrize("path", ["core", "passing through"])
def test_a_pushpull_is_one_request_to_the_wrapped_store(path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A pushpull of a partitioned key reaches the wrapped store as one pushpull of every
    partition, made by the proxy library (inside the task's chain on the Core's path), with no
    call of the store's Python API, and not as a push and then a pull: a dist_sync server answers
    the fused request in one round trip (docs/benchmarks.md, "MXNet PS": 250 ms against 405 ms
    for 24 keys of 1 MB)."""
    if path == "passing through":
        monkeypatch.setenv("BYTESCHED_POLICY", "off")
    else:
        monkeypatch.setenv("BYTESCHED_PARTITION_BYTES", "8")
    plain = mx.kv.create("local")
    for name in ("push", "pull", "pushpull"):
        def refused(*args: Any, _name: str = name, **kwargs: Any) -> None:
            raise AssertionError(f"bytesched called the store's Python {_name}")
        monkeypatch.setattr(plain, name, refused)
    kv = ScheduledKVStore(plain)
    calls: list[tuple[str, list[int], list[int]]] = []
    for method in ("post_store", "post_store_chain"):
        post = getattr(kv.library, method)

        def recorded(*args: Any, _method: str = method, _post: Any = post) -> None:
            call = next(a for a in args if isinstance(a, proxies.StoreCall))
            _, n_vals, vkeys, _, n_outs, okeys, _ = call.arguments
            calls.append((_method, list(vkeys)[:n_vals], list(okeys)[:n_outs]))
            _post(*args)
        monkeypatch.setattr(kv.library, method, recorded)
    kv.init("w", mx.nd.zeros((6,)))
    grad, out = mx.nd.arange(6), mx.nd.zeros((6,))
    kv.pushpull("w", grad, out=out)
    kv.wait_idle(timeout=15)
    assert out.asnumpy().tolist() == list(range(6))  # summed alone
    assert len(calls) == 1  # one call: every partition pushed and pulled, by one key each
    (method, pushed, pulled), = calls
    passing = path == "passing through"  # with scheduling off the key is laid out whole
    assert method == ("post_store" if passing else "post_store_chain")
    assert pushed == pulled and len(set(pushed)) == (1 if passing else 3)  # else 3 partitions of 2
    kv.close()


def test_passing_through_a_wait_for_the_step_does_not_wait_for_the_next_backward_pass(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Passing through, ``wait_idle`` waits for the pushpull's pull, not for a later write of the
    pushed gradient: at a step boundary (where a plan trial drains each step) Gluon has already
    posted the next step's backward pass, which writes the gradients. Waiting for it held each
    step's pushes back until that backward pass had ended."""
    monkeypatch.setenv("BYTESCHED_POLICY", "off")
    kv = ScheduledKVStore(mx.kv.create("local"))
    events = proxies.events()  # the store's Core waits on them
    kv.init("w", mx.nd.zeros((4,)))
    grad, weight = mx.nd.ones((4,)), mx.nd.zeros((4,))
    kv.pushpull("w", grad, out=weight)
    backward = events.register(Recorder())  # the next step's backward pass, held: it writes the gradient
    events.library.post_entry(backward, proxies.Chain([], [[grad]]), 0)
    idle = threading.Event()
    threading.Thread(target=lambda: (kv.wait_idle(timeout=15), idle.set()), daemon=True).start()
    try:
        assert idle.wait(5), "the wait for the step waited for the next write of its pushed gradient"
        assert weight.asnumpy().tolist() == [1.0] * 4
    finally:
        events.library.release(backward, 0)
        grad.wait_to_read()
        events.forget(backward)
        kv.close()


def test_str_keys_lists_and_separate_push_pull(monkeypatch: pytest.MonkeyPatch) -> None:
    """The Module-style interface: string keys, lists of keys, push then pull."""
    monkeypatch.setenv("BYTESCHED_PARTITION_BYTES", "12")
    kv = ScheduledKVStore(mx.kv.create("local"))
    kv.init(["a", "b"], [mx.nd.zeros((5,)), mx.nd.zeros((2, 3))])
    kv.push(["a", "b"], [mx.nd.ones((5,)) * 3, [mx.nd.ones((2, 3)), mx.nd.ones((2, 3))]])
    out_a, out_b = mx.nd.zeros((5,)), mx.nd.zeros((2, 3))
    kv.pull(["a", "b"], out=[out_a, out_b])
    assert out_a.asnumpy().tolist() == [3.0] * 5
    assert out_b.asnumpy().tolist() == [[2.0] * 3] * 2  # two devices' values are summed
    with pytest.raises(KeyError, match="'c' was not initialised"):
        kv.pushpull("c", mx.nd.ones((5,)))
    with pytest.raises(ValueError, match=r"does not match the initialised \(5,\) float32"):
        kv.pushpull("a", mx.nd.ones((4,)))
    kv.close()


def test_arrays_are_checked_whenever_they_are_new() -> None:
    """A key's arrays are checked once, not every step; a new array for the key is checked again."""
    kv = ScheduledKVStore(mx.kv.create("local"))
    kv.init("w", mx.nd.zeros((4,)))
    grad, out = mx.nd.ones((4,)), mx.nd.zeros((4,))
    for _ in range(2):  # the second submission reuses the checked arrays
        kv.pushpull("w", grad, out=out)
    kv.wait_idle(timeout=15)
    with pytest.raises(ValueError, match=r"does not match the initialised \(4,\) float32"):
        kv.pushpull("w", mx.nd.ones((3,)), out=out)
    with pytest.raises(TypeError, match="key 'w': expected an NDArray, got list"):
        kv.pushpull("w", [[1.0] * 4], out=out)
    kv.close()


def test_a_chain_refuses_partitions_of_different_widths() -> None:
    a, b = mx.nd.zeros((2,)), mx.nd.zeros((2,))
    with pytest.raises(ValueError, match="same non-zero number of avatars"):
        proxies.Chain([], [[a, b], [a]])
    with pytest.raises(ValueError, match="at least one partition"):
        proxies.Chain([a], [])


def run_store_optimizer(store: str, keys: list) -> list[np.ndarray]:
    """Module-style use of a local store: the optimizer runs in the store, with per-key settings
    keyed by the caller's keys; four push/pull rounds."""
    kv = mx.kv.create("local")
    if store == "scheduled":
        kv = ScheduledKVStore(kv)
    optimizer = mx.optimizer.SGD(learning_rate=0.1, momentum=0.9, wd=0.01)
    optimizer.set_lr_mult({keys[1]: 0.5})
    optimizer.set_wd_mult({keys[1]: 0.0})
    kv.set_optimizer(optimizer)
    weights = [mx.nd.ones((5,)), mx.nd.ones((2, 3))]
    kv.init(keys, weights)
    rng = np.random.RandomState(0)
    for _ in range(4):
        kv.push(keys, [mx.nd.array(rng.rand(5)), mx.nd.array(rng.rand(2, 3))])
        kv.pull(keys, out=weights)
    if store == "scheduled":
        kv.close()
    return [w.asnumpy() for w in weights]


@pytest.mark.parametrize("keys", [["bias", "weight"], [0, 1]], ids=["str", "int"])
def test_per_key_optimizer_settings_follow_the_callers_keys(keys: list,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """A local store hands its optimizer the caller's key (a str key itself, as MXNet's local
    store does), so settings keyed by parameter name apply to every partition of that key."""
    monkeypatch.setenv("BYTESCHED_PARTITION_BYTES", "12")
    plain = run_store_optimizer("plain", keys)
    scheduled = run_store_optimizer("scheduled", keys)
    for a, b in zip(plain, scheduled):
        assert np.array_equal(a, b), f"max |diff| {np.abs(a - b).max()}"


def test_wraps_only_mxnet_stores() -> None:
    with pytest.raises(TypeError, match="wraps an MXNet KVStore"):
        ScheduledKVStore("dist_sync")  # type: ignore[arg-type]


def test_repartition_refuses_a_key_whose_server_value_is_unknown(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BYTESCHED_PARTITION_BYTES", "8")
    kv = ScheduledKVStore(mx.kv.create("local"))
    kv.init(0, mx.nd.zeros((4,)))
    kv.push(0, mx.nd.ones((4,)))
    kv.set_params(SchedulingParams(partition_bytes=4))
    with pytest.raises(RuntimeError, match=r"keys \['0'\] were pushed but not pulled since"):
        kv.push(0, mx.nd.ones((4,)))  # the next step begins: the re-partition is due
    kv.close()
