"""Parameter server: keys placed on servers, pushes aggregated, pulls after aggregation.

A sub-task's communication is a push of its bytes to the server(s) holding its key, then a pull
of the updated values. A server answers pulls of a key only once every worker's push of that key
has arrived and the update was applied (synchronous training), so a straggler's late push
delays everybody's pull of that key, and only of that key.

Costs: a message first pays the per-message overhead θ on its connection (serialisation, the
RPC), then moves its bytes, then arrives one ``latency`` later. The latency is pipelined: it
delays the message, not the connection. On the emulated network bytesched's PS path has such a
delay (the follower's wait for rank 0's order, ps-lite's and the engine's hand-offs), which
matters at fine partitions under a small credit; the benchmark fits it from a probe at
256 KB / 1 MB (docs/plan.md, "Figures behind the plan's margins").

Placement: the plain store's whole tensors go where MXNet puts a key (:class:`Assignment`);
bytesched's partitions go where the MXNet plugin puts them (:func:`plugin_layout`).
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

from ..core.task import SubTask
from ..ps_layout import ServerKeyTable, mxnet_server_of
from .network import PULL, PUSH, SPREAD, Fabric
from .engine import EventLoop
from .profile import ELEMENT_BYTES
from .worker import TensorPlan

Done = Callable[[], None]

_MXNET_KEY_HASH = 9973
"""MXNet's kvstore places a small key on server ``key * 9973 % num_servers``."""


class Assignment:
    """Maps a key (numbered in declaration order) to the server holding it.

    ``mxnet``: keys of at least ``bigarray_bound`` elements are sliced evenly over all servers
    (:data:`~bytesched.sim.network.SPREAD`), smaller ones hashed to one server.
    ``round-robin``: key ``k`` lives whole on server ``k mod S`` (TensorFlow's and BytePS's
    default placement; the "naive" assignment that the ByteScheduler paper blames for load
    imbalance with few large tensors).
    """

    def __init__(self, kind: str, num_servers: int, bigarray_bound: int) -> None:
        if kind not in ("mxnet", "round-robin"):
            raise ValueError(f"assignment {kind!r} is unknown: expected 'mxnet' or 'round-robin'")
        self.kind = kind
        self.num_servers = num_servers
        self.bigarray_bound = bigarray_bound

    def place(self, key: int, nbytes: int) -> int:
        """Server index for ``key`` of ``nbytes``, or SPREAD."""
        if self.num_servers == 1:
            return 0
        if self.kind == "round-robin":
            return key % self.num_servers
        if nbytes // ELEMENT_BYTES >= self.bigarray_bound:
            return SPREAD
        return key * _MXNET_KEY_HASH % self.num_servers


def plugin_layout(plans: Sequence[TensorPlan], num_servers: int, bigarray_bound: int,
                  partition_bytes: float) -> list[TensorPlan]:
    """``plans`` (in forward order, the order Gluon's Trainer initialises its keys) with the
    partitions and servers the MXNet plugin gives them, from the plugin's own table
    (:class:`~bytesched.ps_layout.ServerKeyTable`).

    A scheduled PS job does not place its partitions as MXNet places whole keys: a tensor below
    the big-array bound goes whole to the least-loaded server, a bigger one is cut into one
    stripe per server and its partitions alternate between them. Placed by MXNet's key rule
    instead (consecutive keys alternating servers, big partitions spread over all), the
    simulator queued the emulated VGG16's convolutions behind the fully-connected layers on one
    connection and predicted 442 ms per step for 4 MB partitions / 16 MB credit, where 343 ms
    were measured (360 ms with this layout; docs/benchmarks.md).
    """
    table = ServerKeyTable(num_servers, bigarray_bound)
    laid_out = []
    for index, plan in enumerate(plans):
        layout = table.add(index, (plan.nbytes // ELEMENT_BYTES,), "float32", partition_bytes)
        pieces = tuple((piece, mxnet_server_of(key, num_servers))
                       for piece, key in zip(layout.ranges, layout.server_keys))
        laid_out.append(dataclasses.replace(plan, pieces=pieces))
    return laid_out


class _Aggregation:
    """Pushes of one key received so far, and who waits to pull it."""

    __slots__ = ("count", "pullers")

    def __init__(self) -> None:
        self.count = 0
        self.pullers: list[tuple[int, Done]] = []


class ParameterServer:
    """The PS backend shared by every worker class of one simulation. ``asynchronous``: a server
    applies each class's push alone and answers that class's pull (``dist_async``); otherwise it
    waits for every class's push of the key (``dist_sync``)."""

    def __init__(self, loop: EventLoop, fabric: Fabric, assignment: Assignment, num_classes: int, *,
                 overhead: float, latency: float, asynchronous: bool = False) -> None:
        self.loop = loop
        self.fabric = fabric
        self.assignment = assignment
        self.asynchronous = asynchronous
        self.num_classes = 1 if asynchronous else num_classes
        self.overhead = overhead
        self.latency = latency
        self._aggregations: dict[tuple[object, ...], _Aggregation] = {}

    def start(self, klass: int, sub: SubTask, server: int, update: float, done: Done) -> None:
        """Push ``sub`` from every worker of ``klass`` to ``server`` (an index or SPREAD), then
        pull it; ``done`` after the pull. ``update`` is the server's time to apply the
        aggregated gradient before answering pulls.
        """
        self.fabric.send(klass, PUSH, server, sub.nbytes, self.overhead, self._after_latency,
                         self._pushed, klass, sub, server, update, done)

    def _after_latency(self, then: Callable[..., None], *args: object) -> None:
        """A message has left its connection; it arrives one hop later. The hop does not occupy
        the connection: the next message's bytes follow at once."""
        if self.latency > 0:
            self.loop.call_later(self.latency, then, *args)
        else:
            then(*args)

    def _pushed(self, klass: int, sub: SubTask, server: int, update: float, done: Done) -> None:
        key = (klass, *sub.key) if self.asynchronous else sub.key
        agg = self._aggregations.get(key)
        if agg is None:
            agg = self._aggregations[key] = _Aggregation()
        agg.count += 1
        agg.pullers.append((klass, done))
        if agg.count == self.num_classes:
            del self._aggregations[key]
            if update > 0:
                self.loop.call_later(update, self._answer_pulls, agg, sub.nbytes, server)
            else:
                self._answer_pulls(agg, sub.nbytes, server)

    def _answer_pulls(self, agg: _Aggregation, nbytes: int, server: int) -> None:
        for klass, done in agg.pullers:
            self.fabric.send(klass, PULL, server, nbytes, self.overhead, self._after_latency, done)
