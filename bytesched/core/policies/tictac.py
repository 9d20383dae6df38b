"""``tictac``: TicTac's communication order (Hashemi et al., SysML'19, §4) under the credit window.

TicTac orders the transfers ("recv ops") of one iteration from the computation DAG that waits for
them: a transfer that unblocks more computation sooner goes first. This module computes that order
offline from a :class:`TicTacGraph`, as the paper's "ordering wizard" does, and the policy enforces
it as the priority of each CommTask, under the same credit window as ``bytescheduler``.

How to use it (a plugin, the simulator)::

    from bytesched.core.policies.tictac import Layer, TicTacGraph, TicTacPolicy

    policy = TicTacPolicy(params, variant="tac")   # or make_policy("tictac", params): TAC
    policy.set_graph(TicTacGraph.layer_chain([
        Layer(forward=0.004, backward=0.008, comms={"conv1.weight": 0.010}),
        Layer(forward=0.002, backward=0.004, comms={"fc.weight": 0.030, "fc.bias": 0.0001}),
    ]))

or any DAG: ``TicTacGraph(ops=[Op("w1", 0.01, recv=True), Op("f1", 0.004), ...],
edges=[("w1", "f1"), ...])``. A recv op's name is the name of the CommTask it stands for; the
durations are the time oracle (seconds; only their ratios matter) - TIC ignores them.

- ``variant="tac"`` (the default, also what ``make_policy("tictac", ...)`` builds): TAC, Algorithm 3,
  needs the durations. ``variant="tic"``: TIC, Algorithm 2, uses the DAG alone.
- Without a graph, or for a task the graph does not name, the order is the task's own priority
  (layer order); tasks the graph names run before those it does not.
- ``set_graph`` may be called at any time; it re-orders sub-tasks already waiting. With the
  runtime Core, call :meth:`~bytesched.core.Core.set_graph` (the scheduler state belongs to the
  Core thread). The ranks are computed in ``set_graph``: TAC re-computes the properties after
  every pick, about a second for a thousand-op graph, so do it once.
- At run time the plugins trace the first forward pass (:mod:`bytesched.core.forward`): which
  parameters each operator reads and which operators use which results, with no durations; they
  hand the Core that graph, ordered by TIC.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass, field
from typing import ClassVar, Collection, Mapping, Sequence

import numpy as np

from ..config import ConfigError, SchedulingParams
from ..task import CommTask
from .base import CreditPolicy
from .bytescheduler import ByteSchedulerPolicy

VARIANTS = ("tic", "tac")


@dataclass(frozen=True)
class Op:
    """One op of the DAG: ``recv`` marks a transfer (the CommTask called ``name``)."""

    name: str
    duration: float = 0.0
    recv: bool = False


@dataclass(frozen=True)
class Layer:
    """One layer of a sequential model, for :meth:`TicTacGraph.layer_chain`.

    ``comms`` maps the name of each CommTask of this layer's tensors to its transfer time.
    """

    forward: float
    backward: float
    comms: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class TicTacGraph:
    """The worker's DAG of one iteration: ops with durations and ``(before, after)`` edges.

    Validated on construction: unique op names, known edge ends, finite non-negative durations,
    no cycle.
    """

    ops: Sequence[Op]
    edges: Sequence[tuple[str, str]] = ()

    def __post_init__(self) -> None:
        seen: set[str] = set()
        for op in self.ops:
            if not op.name:
                raise ValueError("TicTacGraph: every op needs a non-empty name")
            if op.name in seen:
                raise ValueError(f"TicTacGraph: op name {op.name!r} is used twice")
            if not (op.duration >= 0 and math.isfinite(op.duration)):
                raise ValueError(f"TicTacGraph: op {op.name!r} has duration {op.duration!r}; "
                                 "expected a finite number of seconds >= 0")
            seen.add(op.name)
        for before, after in self.edges:
            for end in (before, after):
                if end not in seen:
                    raise ValueError(f"TicTacGraph: edge ({before!r}, {after!r}) names unknown op {end!r}")
        self.topological_order()  # raises on a cycle

    @classmethod
    def layer_chain(cls, layers: Sequence[Layer]) -> "TicTacGraph":
        """The DAG TicTac sees for a sequential model, layers in forward order.

        The next forward pass of layer i waits for layer i's transfers and for layer i-1's
        forward; backward runs from the last layer to the first after the forward. The op
        producing a gradient is left out on purpose: it belongs to the previous iteration, and
        TicTac's properties only follow edges out of the transfers.
        """
        forwards = [f"forward[{i}]" for i in range(len(layers))]
        backwards = [f"backward[{i}]" for i in range(len(layers))]
        chain = forwards + backwards[::-1]
        ops = [Op(forwards[i], layer.forward) for i, layer in enumerate(layers)]
        ops += [Op(backwards[i], layer.backward) for i, layer in enumerate(layers)]
        edges = list(zip(chain, chain[1:]))
        for i, layer in enumerate(layers):
            ops += [Op(name, seconds, recv=True) for name, seconds in layer.comms.items()]
            edges += [(name, forwards[i]) for name in layer.comms]
        return cls(ops, edges)

    def topological_order(self) -> list[int]:
        """Op indices, every op after all its predecessors (Kahn's algorithm)."""
        index = {op.name: i for i, op in enumerate(self.ops)}
        successors: list[list[int]] = [[] for _ in self.ops]
        indegree = [0] * len(self.ops)
        for before, after in self.edges:
            successors[index[before]].append(index[after])
            indegree[index[after]] += 1
        queue = deque(i for i, d in enumerate(indegree) if d == 0)
        order: list[int] = []
        while queue:
            i = queue.popleft()
            order.append(i)
            for j in successors[i]:
                indegree[j] -= 1
                if indegree[j] == 0:
                    queue.append(j)
        if len(order) < len(self.ops):
            stuck = next(op.name for i, op in enumerate(self.ops) if indegree[i] > 0)
            raise ValueError(f"TicTacGraph: the edges contain a cycle (through op {stuck!r})")
        return order


class _Dependencies:
    """``op.dep`` of every op (the recvs it depends on, directly or not) as a boolean matrix."""

    def __init__(self, graph: TicTacGraph) -> None:
        ops = graph.ops
        self.names = [op.name for op in ops]
        self.recv_rows = np.array([i for i, op in enumerate(ops) if op.recv], dtype=np.intp)
        self.recv_names = [ops[i].name for i in self.recv_rows]
        self.durations = np.array([op.duration for op in ops], dtype=float)
        self.unit_time = np.array([1.0 if op.recv else 0.0 for op in ops])  # TIC's oracle, its Eq. 1
        column = {row: j for j, row in enumerate(self.recv_rows.tolist())}
        index = {name: i for i, name in enumerate(self.names)}
        predecessors: list[list[int]] = [[] for _ in ops]
        for before, after in graph.edges:
            predecessors[index[after]].append(index[before])
        dep = np.zeros((len(ops), len(self.recv_rows)), dtype=bool)
        for i in graph.topological_order():
            if predecessors[i]:
                dep[i] = dep[predecessors[i]].any(axis=0)
            if i in column:
                dep[i, column[i]] = True  # a recv's M is its own transfer time
        self.dep = dep
        self.dep_by_recv = np.ascontiguousarray(dep.T)  # row j: the ops that depend on recv j


class _Outstanding:
    """Algorithm 1 for a set R of outstanding recvs that only shrinks (TAC removes one per pick).

    ``M`` and the number of outstanding dependencies of each op are kept up to date as recvs
    leave R; ``P`` and ``M+`` are computed on demand over the ops still waiting for some recv.
    """

    def __init__(self, deps: _Dependencies, time: np.ndarray, outstanding: np.ndarray) -> None:
        self.deps = deps
        self.time = time
        self.outstanding = outstanding.copy()
        self.recv_time = time[deps.recv_rows]
        self.M = deps.dep @ (self.recv_time * outstanding)
        self.count = deps.dep[:, outstanding].sum(axis=1)
        self.rest = np.ones(len(deps.names), dtype=bool)  # G - R
        self.rest[deps.recv_rows[outstanding]] = False

    def remove(self, j: int) -> None:
        """Recv ``j`` (a column) completed: it leaves R."""
        users = self.deps.dep_by_recv[j]
        self.M -= users * self.recv_time[j]
        self.count -= users
        self.rest[self.deps.recv_rows[j]] = True
        self.outstanding[j] = False

    def recv_properties(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(columns of R, P, M+)``, P and M+ in the order of the columns."""
        cols = np.flatnonzero(self.outstanding)
        rows = np.flatnonzero(self.rest & (self.count > 0))  # ops of G - R still waiting
        waiting = self.deps.dep[np.ix_(rows, cols)]
        count = self.count[rows]
        only = count == 1
        P = self.time[rows[only]] @ waiting[only]
        shared = ~only
        M_plus = np.where(waiting[shared], self.M[rows[shared], None], np.inf).min(axis=0, initial=np.inf)
        return cols, P, M_plus


@dataclass(frozen=True)
class Properties:
    """TicTac's op properties (its Algorithm 1) for one set of outstanding recvs R."""

    M: dict[str, float]
    """Communication time of every op: total time of the outstanding recvs it depends on."""
    P: dict[str, float]
    """Per outstanding recv: total time of the ops whose only outstanding dependency it is."""
    M_plus: dict[str, float]
    """Per outstanding recv: least M of an op that depends on it and on another outstanding recv."""


def properties(graph: TicTacGraph, outstanding: Collection[str] | None = None, *,
               timing: str = "oracle") -> Properties:
    """TicTac's Algorithm 1 for ``graph`` with the recvs in ``outstanding`` (default: all).

    ``timing="oracle"`` uses the ops' durations (TAC), ``"general"`` TIC's oracle: 1 per recv,
    0 per other op.
    """
    deps = _Dependencies(graph)
    if outstanding is None:
        outstanding = deps.recv_names
    unknown = set(outstanding) - set(deps.recv_names)
    if unknown:
        raise ValueError(f"outstanding names ops that are not recvs of the graph: {sorted(unknown)}")
    mask = np.array([name in outstanding for name in deps.recv_names], dtype=bool)
    state = _Outstanding(deps, _oracle(deps, timing), mask)
    cols, P, M_plus = state.recv_properties()
    names = [deps.recv_names[j] for j in cols]
    return Properties(dict(zip(deps.names, state.M.tolist())), dict(zip(names, P.tolist())),
                      dict(zip(names, M_plus.tolist())))


def _oracle(deps: _Dependencies, timing: str) -> np.ndarray:
    if timing == "oracle":
        return deps.durations
    if timing == "general":
        return deps.unit_time
    raise ValueError(f"timing={timing!r}: expected 'oracle' or 'general'")


def tic_order(graph: TicTacGraph) -> list[str]:
    """TIC (Algorithm 2): recvs by ascending ``M+`` under the general oracle; equal ``M+`` keep
    the order in which the graph lists the recvs (the paper leaves such ties open)."""
    deps = _Dependencies(graph)
    state = _Outstanding(deps, deps.unit_time, np.ones(len(deps.recv_names), dtype=bool))
    _, _, M_plus = state.recv_properties()
    keys = M_plus.tolist()
    return [deps.recv_names[j] for j in sorted(range(len(keys)), key=lambda j: (keys[j], j))]


def tac_order(graph: TicTacGraph) -> list[str]:
    """TAC (Algorithm 3): repeatedly re-compute the properties for the outstanding recvs and take
    the least by the comparator of its Eq. 2 (A before B iff ``min(P_B, M_A) < min(P_A, M_B)``,
    then smaller ``M+``; remaining ties keep the graph's listing order)."""
    deps = _Dependencies(graph)
    state = _Outstanding(deps, deps.durations, np.ones(len(deps.recv_names), dtype=bool))
    own = state.recv_time.tolist()  # a recv's M is its own transfer time
    order: list[str] = []
    while state.outstanding.any():
        cols, P, M_plus = state.recv_properties()
        js, p, m_plus = cols.tolist(), P.tolist(), M_plus.tolist()
        best = 0
        for a in range(1, len(js)):
            left, right = min(p[best], own[js[a]]), min(p[a], own[js[best]])
            if left < right or (left == right and m_plus[a] < m_plus[best]):
                best = a
        state.remove(js[best])
        order.append(deps.recv_names[js[best]])
    return order


class TicTacPolicy(CreditPolicy):
    """Sub-tasks in TicTac's order (TIC or TAC, from the graph), released under the credit window.

    TicTac itself only enforces the order (its transfers queue in gRPC in that order); here the
    credit window bounds what is in flight, as in ``bytescheduler``, and an unlimited credit gives
    TicTac's pure ordering. Partition and credit defaults are bytescheduler's, so a comparison of
    the two isolates the order.
    """

    name = "tictac"
    default_partition_bytes: ClassVar[float] = ByteSchedulerPolicy.default_partition_bytes

    def __init__(self, params: SchedulingParams, variant: str = "tac") -> None:
        super().__init__(params)
        if variant not in VARIANTS:
            raise ConfigError(f"tictac variant={variant!r} is unknown: expected one of {', '.join(VARIANTS)}")
        self.variant = variant
        self._ranks: dict[str, int] = {}

    def set_graph(self, graph: TicTacGraph, variant: str | None = None) -> None:
        """Order the recvs of ``graph`` by ``variant`` (default: this policy's) and re-order what
        is waiting. A graph traced at run time has no durations, which TAC needs: plugins order
        it by ``"tic"``."""
        if not isinstance(graph, TicTacGraph):
            raise TypeError(f"TicTacPolicy.set_graph expects a TicTacGraph, got {type(graph).__name__}")
        variant = self.variant if variant is None else variant
        if variant not in VARIANTS:
            raise ValueError(f"tictac variant={variant!r} is unknown: expected one of {', '.join(VARIANTS)}")
        order = tac_order(graph) if variant == "tac" else tic_order(graph)
        self._ranks = {name: rank for rank, name in enumerate(order)}
        self._heap = [[self.rank_of(pieces[0].task), seq, piece, pieces] for _, seq, piece, pieces in self._heap]
        heapq.heapify(self._heap)

    @property
    def ranks(self) -> Mapping[str, int]:
        """Task name -> position in TicTac's order (0 runs first); empty without a graph."""
        return self._ranks

    def rank_of(self, task: CommTask) -> int:
        rank = self._ranks.get(task.name)
        return len(self._ranks) + task.priority if rank is None else rank
