"""Parameter server: keys placed on servers, pushes aggregated, pulls after aggregation.

A sub-task's communication is a push of its bytes to the server(s) holding its key, then a pull
of the updated values. A server answers pulls of a key only once every worker's push of that key
has arrived and the update was applied (synchronous training), so a straggler's late push
delays everybody's pull of that key, and only of that key.
"""

from __future__ import annotations

from typing import Callable

from ..core.task import SubTask
from .network import PULL, PUSH, SPREAD, Fabric
from .engine import EventLoop
from .profile import ELEMENT_BYTES

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


class _Aggregation:
    """Pushes of one key received so far, and who waits to pull it."""

    __slots__ = ("count", "pullers")

    def __init__(self) -> None:
        self.count = 0
        self.pullers: list[tuple[int, Done]] = []


class ParameterServer:
    """The PS backend shared by every worker class of one simulation."""

    def __init__(self, loop: EventLoop, fabric: Fabric, assignment: Assignment, num_classes: int, *,
                 overhead: float, latency: float) -> None:
        self.loop = loop
        self.fabric = fabric
        self.assignment = assignment
        self.num_classes = num_classes
        self.fixed = overhead + latency
        self._aggregations: dict[tuple[str, int, int], _Aggregation] = {}

    def start(self, klass: int, sub: SubTask, key: int, update: float, done: Done) -> None:
        """Push ``sub`` from every worker of ``klass``, then pull it; ``done`` after the pull.

        ``key`` numbers the sub-task's key in declaration order (for placement); ``update`` is
        the server's time to apply the aggregated gradient before answering pulls.
        """
        server = self.assignment.place(key, sub.nbytes)
        self.fabric.send(klass, PUSH, server, sub.nbytes, self.fixed, self._pushed, klass, sub, server, update, done)

    def _pushed(self, klass: int, sub: SubTask, server: int, update: float, done: Done) -> None:
        agg = self._aggregations.get(sub.key)
        if agg is None:
            agg = self._aggregations[sub.key] = _Aggregation()
        agg.count += 1
        agg.pullers.append((klass, done))
        if agg.count == self.num_classes:
            del self._aggregations[sub.key]
            if update > 0:
                self.loop.call_later(update, self._answer_pulls, agg, sub.nbytes, server)
            else:
                self._answer_pulls(agg, sub.nbytes, server)

    def _answer_pulls(self, agg: _Aggregation, nbytes: int, server: int) -> None:
        for klass, done in agg.pullers:
            self.fabric.send(klass, PULL, server, nbytes, self.fixed, done)
