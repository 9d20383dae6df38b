"""Processor-sharing network: links whose bandwidth is split equally among the flows crossing
them (the model of the ICPE'20 throughput-prediction paper, §3.1).

A *flow* is one message (a push or a pull of one key) from a class of identical workers. Each
worker has one connection per server and direction, and a connection is a FIFO byte stream: its
messages go one after another, each first paying its fixed cost (the caller's: the per-message
overhead θ, for an all-reduce step also its hops' latency; without using bandwidth), then moving
its bytes. Messages on different connections
share the links. A message for a key that the parameter server spreads over all servers
(MXNet's big arrays) goes over every connection at once, in lockstep, paced by the most loaded
server; such messages queue behind each other (a channel of their own), not behind the
single-server messages on the same connections (an approximation). A flow's rate is

    rate of one connection = min(share of its worker's link, share of its shared link)

where a link's share is its capacity over the flows on it, a flow of a class of ``m``
identical workers counting ``m`` times on a link the workers share (a server's NIC, a shared
medium) and once on its own worker's link. With identical workers every connection active on
a worker's link sees the same server share, so this is the max-min fair allocation; with
heterogeneous workers it is the common "bottleneck share" approximation (a flow held back by a
server does not hand its unused share to its siblings).

Every shared link keeps a virtual clock: the bytes one connection limited by that link has
received so far. A flow limited by the shared link ends when the clock reaches its mark, so
a flow joining or leaving a server that 64 workers push to updates one clock and one timer,
not 64 flows; only flows limited by their own worker's link are re-timed one by one. Each
shared link also keeps its load current as flows join and leave (a spread flow changes every
busy server's), so re-rating it is one division; the load is the same sum, in the same order,
that recomputing it from the per-server counts gives, so no result changes by a bit. Its next
completion is a :class:`~bytesched.sim.engine.Timer`: 64 flows joining one server in one
instant move it 64 times but put one entry on the event heap, in the same run order as
cancelling and re-scheduling it each time.

Two topologies, chosen per cluster:

* :class:`FullDuplexFabric`: each worker and each server has its own NIC, full duplex: pushes
  use the worker's uplink and the server's ingress, pulls the server's egress and the worker's
  downlink (a real cluster).
* :class:`SharedMediumFabric`: one medium for every host and both directions (a rate-shaped
  loopback on one machine, as the benchmark harness uses).
"""

from __future__ import annotations

import heapq
import math
from abc import ABC, abstractmethod
from collections import deque
from itertools import count
from typing import Any, Callable, Sequence

from .engine import EventLoop, Timer

PUSH = 0
PULL = 1
SPREAD = -1
"""Placement of a message that is sliced evenly over all servers."""

_NEW, _BOUND, _FREE, _DONE = 0, 1, 2, 3
"""A flow's state: not classified yet, limited by its shared link, limited by its worker's
link, arrived."""


class Link:
    """A worker's own link in one direction: ``capacity`` bytes/s split among its flows."""

    __slots__ = ("name", "capacity", "load", "flows")

    def __init__(self, name: str, capacity: float) -> None:
        if not capacity > 0:
            raise ValueError(f"link {name!r}: capacity must be > 0 bytes/s, got {capacity!r}")
        self.name = name
        self.capacity = capacity
        self.load = 0.0
        self.flows: dict[Flow, None] = {}  # an ordered set: iteration order is deterministic


class SharedLink:
    """A link many flows share (a server's NIC in one direction, or the medium), with the
    virtual clock of the flows it limits."""

    __slots__ = ("key", "capacity", "active", "load", "share", "clock", "clock_time", "bound", "free", "marks",
                 "timer", "due")

    def __init__(self, key: object, capacity: float, loop: EventLoop,
                 on_due: Callable[["SharedLink"], None]) -> None:
        self.key = key
        self.capacity = capacity
        self.active = 0  # flows crossing it (counted by topologies with several shared links)
        self.load = 0.0  # connections it divides its capacity among (kept current while flows cross it)
        self.share = 0.0  # bytes/s per connection, as of clock_time
        self.clock = 0.0  # bytes one limited connection received since the start
        self.clock_time = 0.0
        self.bound: dict[Flow, None] = {}  # flows this link limits (they follow the clock)
        self.free: dict[Flow, None] = {}  # flows on it that their worker's link limits
        self.marks: list[tuple[float, int, Flow]] = []  # (clock at which a bound flow ends, ...)
        self.timer = Timer(loop, on_due, self)  # completes its earliest flow(s), at ``due``
        self.due = math.inf

    def advance(self, now: float) -> None:
        self.clock += self.share * (now - self.clock_time)
        self.clock_time = now


class Flow:
    """One message on ``connection``: ``slices`` byte streams of ``remaining`` bytes each, with
    its fixed cost; ``on_done(*args)`` when it arrived."""

    __slots__ = ("connection", "server", "slices", "weight", "fixed", "on_done", "args", "seq",
                 "link", "shared", "state", "remaining", "rate", "t_last", "finish", "mark")

    def __init__(self, connection: "Connection", nbytes: float, fixed: float, on_done: Callable[..., None],
                 args: tuple[Any, ...], seq: int) -> None:
        self.connection = connection
        self.server = connection.server
        self.slices = slices = connection.slices
        self.weight = connection.weight
        self.fixed = fixed
        self.on_done = on_done
        self.args = args
        self.seq = seq
        self.link = connection.link
        self.shared = connection.shared
        self.state = _NEW
        self.remaining = nbytes / slices  # per connection; exact while NEW or FREE (at t_last)
        self.rate = 0.0
        self.t_last = 0.0
        self.finish = math.inf  # when FREE
        self.mark = math.inf  # when BOUND: the shared clock at which it ends


class Connection:
    """One worker class's FIFO byte stream to one server (or all, :data:`SPREAD`) in one
    direction: what its messages share (looked up once: the links they cross, their slices
    and weight) and the messages queued behind the one in flight."""

    __slots__ = ("direction", "server", "slices", "weight", "link", "shared", "busy", "queue")

    def __init__(self, direction: int, server: int, slices: int, weight: float, link: Link | None,
                 shared: SharedLink) -> None:
        self.direction = direction
        self.server = server
        self.slices = slices
        self.weight = weight  # the identical workers it stands for, on a link they share
        self.link = link
        self.shared = shared
        self.busy = False
        self.queue: deque[Flow] = deque()


class Fabric(ABC):
    """Moves messages over processor-shared links in virtual time."""

    def __init__(self, loop: EventLoop, num_servers: int, multiplicity: Sequence[int]) -> None:
        self.loop = loop
        self.num_servers = num_servers
        self.multiplicity = list(multiplicity)
        self._connections: dict[tuple[int, int, int], Connection] = {}  # (klass, direction, server) -> it
        self._seq = count()

    def send(self, klass: int, direction: int, server: int, nbytes: float, fixed: float,
             on_done: Callable[..., None], *args: Any) -> None:
        """Move ``nbytes`` from (PUSH) or to (PULL) every worker of ``klass`` and ``server``
        (or all servers if ``server`` is :data:`SPREAD`) after the messages already queued on
        that connection; ``fixed`` seconds of per-message cost come first; call
        ``on_done(*args)`` when it arrived."""
        connection = self._connections.get((klass, direction, server))
        if connection is None:
            connection = self._connections[klass, direction, server] = Connection(
                direction, server, self.num_servers if server == SPREAD else 1, self.multiplicity[klass],
                self._link_of(klass, direction), self._shared_of(direction, server))
        flow = Flow(connection, nbytes, fixed, on_done, args, next(self._seq))
        if connection.busy:
            connection.queue.append(flow)
        else:
            connection.busy = True
            self._prepare(flow)

    def _shared_link(self, key: object, capacity: float) -> SharedLink:
        """A shared link of this fabric, its completion timer on this fabric's loop."""
        return SharedLink(key, capacity, self.loop, self._due)

    # -- flow life cycle ----------------------------------------------------------------------
    def _prepare(self, flow: Flow) -> None:
        if flow.fixed > 0:
            self.loop.call_later(flow.fixed, self._begin, flow)
        else:
            self._begin(flow)

    def _begin(self, flow: Flow) -> None:
        if flow.remaining <= 0:
            self._finished([flow])
            return
        flow.t_last = self.loop.now
        link = flow.link
        if link is None:
            self._update(self._count(flow, +1), [flow])
            return
        link.load += flow.slices
        flows = link.flows
        flows[flow] = None
        groups = self._count(flow, +1)
        if len(flows) == 1 and len(groups) == 1:  # the common case: alone on its link, one shared link changed
            self._update_shared(groups[0], [flow], flow.t_last)
        else:
            self._update(groups, list(flows))

    def _due(self, shared: SharedLink) -> None:
        """The earliest flow(s) on ``shared`` completed."""
        shared.due = math.inf
        now = self.loop.now
        shared.advance(now)
        done: list[Flow] = []
        marks = shared.marks
        bound = shared.bound
        heappop = heapq.heappop
        limit = shared.clock + 1e-9 * (1.0 + shared.clock)  # the clock's float rounding, far above 1e-16 relative
        while marks:
            mark, _, flow = marks[0]
            if flow.state != _BOUND or flow.mark != mark:
                heappop(marks)  # stale: the flow was re-timed since (a link's heap holds only its flows)
            elif mark <= limit:
                heappop(marks)
                del bound[flow]
                flow.state = _DONE  # a second entry with the same mark (re-bound to it) is stale
                done.append(flow)
            else:
                break
        if shared.free:
            for flow in [f for f in shared.free if f.finish <= now]:
                del shared.free[flow]
                done.append(flow)
        groups: dict[SharedLink, None] = {shared: None}
        changed: list[Flow] = []
        count = self._count
        for flow in done:
            flow.state = _DONE
            flow.remaining = 0.0
            link = flow.link
            if link is not None:
                link.load -= flow.slices
                flows = link.flows
                del flows[flow]
                if flows:
                    changed += flows
            for group in count(flow, -1):
                groups[group] = None
        self._update(list(groups), [f for f in changed if f.state != _DONE])
        self._finished(done)

    def _finished(self, flows: list[Flow]) -> None:
        """Start the next message of each flow's connection, then report the flows done."""
        for flow in flows:
            connection = flow.connection
            if connection.queue:
                self._prepare(connection.queue.popleft())
            else:
                connection.busy = False
        for flow in flows:
            flow.on_done(*flow.args)

    # -- rates --------------------------------------------------------------------------------
    def _update(self, groups: list[SharedLink], flows: list[Flow]) -> None:
        """Shared links ``groups`` changed load and ``flows`` their own link's load: bring
        every affected shared link's clock, its flows' limits and its timer up to date."""
        now = self.loop.now
        if len(groups) == 1:  # the common case: one shared link, which every flow crosses
            shared = groups[0]
            for flow in flows:
                if flow.shared is not shared:
                    break
            else:
                self._update_shared(shared, flows, now)
                return
        touched: dict[SharedLink, list[Flow]] = {g: [] for g in groups}
        for flow in flows:
            touched.setdefault(flow.shared, []).append(flow)
        for shared, own in touched.items():
            self._update_shared(shared, own, now)

    def _update_shared(self, shared: SharedLink, own: list[Flow], now: float) -> None:
        """``shared``'s load changed (or that of the own links of ``own``, which cross it):
        advance its clock, re-limit the flows whose bottleneck may have moved, re-time it."""
        shared.clock += shared.share * (now - shared.clock_time)  # shared.advance(now), inlined: hot
        shared.clock_time = now
        old = shared.share
        load = shared.load
        shared.share = new = shared.capacity / load if load > 0 else 0.0
        check = own
        if new > old:  # flows it held back may now be held back by their worker's link
            check = own + [f for f in shared.bound if f.link is not None and f.link.capacity / f.link.load < new]
        elif new < old and shared.free:
            check = own + [f for f in shared.free if f.link.capacity / f.link.load > new]  # type: ignore[union-attr]  # free: linked
        for flow in check:
            self._classify(flow, shared, now)
        # re-time it: its earliest bound flow's mark (dropping stale marks) or free flow's finish
        marks = shared.marks
        while marks:
            mark, _, flow = marks[0]
            if flow.state == _BOUND and flow.mark == mark:
                due = now + (mark - shared.clock) / new
                break
            heapq.heappop(marks)  # stale: the flow was re-timed or left since
        else:
            due = math.inf
        for flow in shared.free:
            if flow.finish < due:
                due = flow.finish
        if due != shared.due:
            shared.due = due
            shared.timer.set(due if due >= now else now)

    def _classify(self, flow: Flow, shared: SharedLink, now: float) -> None:
        """Put ``flow`` under the limit of whichever of its links gives it less."""
        state = flow.state
        if state == _BOUND:
            remaining = flow.mark - shared.clock
        elif state == _FREE:
            remaining = flow.remaining - flow.rate * (now - flow.t_last)
        else:
            remaining = flow.remaining
        if remaining < 0.0:
            remaining = 0.0
        link = flow.link
        own = link.capacity / link.load if link is not None else math.inf
        if own >= shared.share:
            if state == _BOUND:
                return  # still following the clock; its mark stands
            if state == _FREE:
                del shared.free[flow]
            flow.state = _BOUND
            flow.mark = mark = shared.clock + remaining
            shared.bound[flow] = None
            heapq.heappush(shared.marks, (mark, flow.seq, flow))
        else:
            if state == _BOUND:
                del shared.bound[flow]  # its mark in the heap is now stale
            flow.state = _FREE
            flow.remaining = remaining
            flow.t_last = now
            flow.rate = own
            flow.finish = now + remaining / own
            shared.free[flow] = None

    # -- topology -----------------------------------------------------------------------------
    @abstractmethod
    def _link_of(self, klass: int, direction: int) -> Link | None:
        """The own link of ``klass``'s workers in ``direction``, if the topology has one."""

    @abstractmethod
    def _shared_of(self, direction: int, server: int) -> SharedLink:
        """The shared link a message to or from ``server`` crosses (a server's NIC, or the
        medium)."""

    @abstractmethod
    def _count(self, flow: Flow, sign: int) -> list[SharedLink]:
        """Count ``flow`` on its shared links (``sign`` +1, it joins) or stop counting it (-1,
        it leaves): bring the ``load`` of those links up to date and return those whose load
        changed."""

    @abstractmethod
    def allreduce_seconds(self, nbytes: float, workers: int) -> float:
        """Bandwidth time of a ring all-reduce of ``nbytes`` among ``workers`` workers."""

    @abstractmethod
    def tree_allreduce_seconds(self, nbytes: float, workers: int) -> float:
        """Bandwidth time of a tree all-reduce of ``nbytes`` among ``workers`` workers at the
        links' full speed (NCCL's double binary tree: half the bus bandwidth each way)."""

    @abstractmethod
    def ps_lower_bound(self, nbytes: float, workers: int) -> float:
        """Least time to push and pull ``nbytes`` per worker, servers perfectly balanced."""


class FullDuplexFabric(Fabric):
    """Every worker and server has its own full-duplex NIC.

    Servers are identical, so a server's load is the flows placed on that one server (``own``)
    plus the flows spread over all servers (``spread``). A spread flow moves in lockstep at the
    pace of the most loaded server.
    """

    def __init__(self, loop: EventLoop, worker_bandwidth: Sequence[float], multiplicity: Sequence[int],
                 num_servers: int, server_bandwidth: float) -> None:
        super().__init__(loop, num_servers, multiplicity)
        if not server_bandwidth > 0:
            raise ValueError(f"server bandwidth must be > 0 bytes/s, got {server_bandwidth!r}")
        self.worker_links = [(Link(f"worker{c}.up", bw), Link(f"worker{c}.down", bw))
                             for c, bw in enumerate(worker_bandwidth)]
        self.server_bandwidth = server_bandwidth
        self._slowest = min(worker_bandwidth)
        self._servers = tuple([self._shared_link((d, s), server_bandwidth) for s in range(num_servers)]
                              for d in (PUSH, PULL))
        self._spread_link = tuple(self._shared_link((d, SPREAD), server_bandwidth) for d in (PUSH, PULL))
        self._own = ([0.0] * num_servers, [0.0] * num_servers)  # per direction, per server
        self._spread = [0.0, 0.0]
        self._max_own = [0.0, 0.0]
        # per direction, the server links flows cross (an ordered set: the order they got busy)
        self._busy: tuple[dict[SharedLink, None], dict[SharedLink, None]] = ({}, {})

    def _link_of(self, klass: int, direction: int) -> Link:
        return self.worker_links[klass][direction]

    def _shared_of(self, direction: int, server: int) -> SharedLink:
        if server == SPREAD:
            return self._spread_link[direction]
        return self._servers[direction][server]

    def _count(self, flow: Flow, sign: int) -> list[SharedLink]:
        d = flow.connection.direction
        busy = self._busy[d]
        shared = flow.shared
        active = shared.active = shared.active + sign
        if active == sign:  # it was idle
            busy[shared] = None
        elif not active:
            del busy[shared]
        own = self._own[d]
        if flow.server == SPREAD:
            spread = self._spread[d] = max(0.0, self._spread[d] + sign * flow.weight)
            self._max_own[d] = top = max(own)
            shared.load = top + spread
            for link in busy:  # every server's load changed
                if link is not shared:
                    link.load = own[link.key[1]] + spread  # type: ignore[index]  # (side, server) keys
            return list(busy)
        load = own[flow.server] + sign * flow.weight
        own[flow.server] = load = load if load > 0.0 else 0.0  # max(0.0, load), without the call
        shared.load = load + self._spread[d]
        changed = [shared]
        spread_link = self._spread_link[d]
        if spread_link in busy:
            new_max = max(own)
            if new_max != self._max_own[d]:
                self._max_own[d] = new_max
                spread_link.load = new_max + self._spread[d]
                changed.append(spread_link)
        return changed

    def allreduce_seconds(self, nbytes: float, workers: int) -> float:
        return 2 * (workers - 1) / workers * nbytes / self._slowest  # the ring goes at its slowest link

    def tree_allreduce_seconds(self, nbytes: float, workers: int) -> float:
        return 2 * nbytes / self._slowest if workers > 1 else 0.0

    def ps_lower_bound(self, nbytes: float, workers: int) -> float:
        return max(nbytes / self._slowest, workers * nbytes / (self.num_servers * self.server_bandwidth))


class SharedMediumFabric(Fabric):
    """One medium for every host and both directions (e.g. a shaped loopback)."""

    def __init__(self, loop: EventLoop, bandwidth: float, multiplicity: Sequence[int], num_servers: int) -> None:
        super().__init__(loop, num_servers, multiplicity)
        if not bandwidth > 0:
            raise ValueError(f"medium capacity must be > 0 bytes/s, got {bandwidth!r}")
        self.medium = self._shared_link("medium", bandwidth)

    def _link_of(self, klass: int, direction: int) -> None:
        return None

    def _shared_of(self, direction: int, server: int) -> SharedLink:
        return self.medium

    def _count(self, flow: Flow, sign: int) -> list[SharedLink]:
        medium = self.medium
        if sign > 0:
            medium.load += flow.weight * flow.slices
        else:
            medium.load = max(0.0, medium.load - flow.weight * flow.slices)
        return [medium]

    def allreduce_seconds(self, nbytes: float, workers: int) -> float:
        # Each of the 2(n-1) ring steps moves nbytes/n from every worker over the one medium.
        return 2 * (workers - 1) * nbytes / self.medium.capacity

    def tree_allreduce_seconds(self, nbytes: float, workers: int) -> float:
        # Reducing up and broadcasting down the tree moves nbytes over each of its n-1 edges twice.
        return 2 * (workers - 1) * nbytes / self.medium.capacity

    def ps_lower_bound(self, nbytes: float, workers: int) -> float:
        return 2 * workers * nbytes / self.medium.capacity
