"""The first forward pass as a plugin watched it: which parameters it reads, in which order, and
which of its operations wait for which.

A plugin feeds a :class:`ForwardRecorder` every operator the forward pass runs (its input and
output values: tensors, NDArrays); it gets back a :class:`ForwardPass`, the pass reduced to what
scheduling needs:

- :attr:`ForwardPass.first_reads`: each *leaf* (a value the pass read but did not compute: a
  parameter, the input batch) and the position of its first read. The order in which the forward
  pass first reads the parameters is their priority: the first layer's gradient is needed first
  in the next iteration, whatever order the caller listed the parameters in.
- :meth:`ForwardPass.tictac_graph`: the pass as TicTac's DAG (:mod:`.policies.tictac`): one op
  per operator that reads a leaf or joins the results of two others, an edge wherever one uses
  what another computed, and a transfer (recv) per CommTask, feeding the ops that read its
  parameters. An operator that reads nothing new and uses one other's result only is folded into
  that one: it depends on exactly the same transfers, so TicTac's properties (and TIC's order)
  are the same without it, and the graph stays near one op per layer.

The recorder keeps every value it saw alive until :meth:`ForwardRecorder.finish`, so that an
identity (``id`` of a Python object, an NDArray's handle) cannot be reused by a later value
while it records: a plugin records one forward pass only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Hashable, Iterable, Mapping, Sequence, TypeVar

from .policies.tictac import Op, TicTacGraph


@dataclass(frozen=True)
class ForwardOp:
    """One op of the folded pass: the ops whose results it uses (indices of earlier ops) and the
    leaves it reads, in argument order."""

    after: tuple[int, ...]
    reads: tuple[Hashable, ...]


@dataclass(frozen=True)
class ForwardPass:
    """What a recorded forward pass tells the scheduler (see the module doc)."""

    first_reads: Mapping[Hashable, int]
    """Leaf -> position of its first read (0 first)."""
    ops: Sequence[ForwardOp]

    def tictac_graph(self, tasks_of: Mapping[Hashable, Sequence[str]]) -> TicTacGraph:
        """TicTac's DAG of this pass: ``tasks_of`` names the CommTasks that bring each leaf (a
        parameter's; leaves it does not name, like the input batch, have none). The graph lists
        the recvs in the order of their first read, which breaks TicTac's ties (the paper leaves
        them open) by the forward order. Ops carry no durations: order it by TIC."""
        names = [f"op:{i}" for i in range(len(self.ops))]
        recvs: dict[str, None] = {}
        edges: list[tuple[str, str]] = []
        for name, op in zip(names, self.ops):
            edges += [(names[j], name) for j in op.after]
            fed: dict[str, None] = {}
            for leaf in op.reads:
                for task in tasks_of.get(leaf, ()):
                    fed[task] = None
            recvs.update(fed)
            edges += [(task, name) for task in fed]
        return TicTacGraph([*(Op(name) for name in names), *(Op(task, recv=True) for task in recvs)], edges)


class ForwardRecorder:
    """Builds a :class:`ForwardPass` from the operators a plugin sees run, in program order.

    Args:
        key: a value's identity (default ``id``); two values alive at once never share one.
    """

    def __init__(self, key: Callable[[Any], Hashable] = id) -> None:
        self._key = key
        self._made_by: dict[Hashable, int | None] = {}  # computed value -> its op (None: from leaves only)
        self._first_reads: dict[Hashable, int] = {}
        self._ops: list[ForwardOp] = []
        self._alive: list[Any] = []

    def op(self, inputs: Iterable[Any], outputs: Iterable[Any]) -> None:
        """An operator ran: it read ``inputs`` and wrote ``outputs`` (in place too)."""
        after: dict[int, None] = {}
        reads: dict[Hashable, None] = {}
        for value in inputs:
            key = self._key(value)
            if key in self._made_by:
                producer = self._made_by[key]
                if producer is not None:
                    after[producer] = None
                continue
            if key not in self._first_reads:
                self._first_reads[key] = len(self._first_reads)
                self._alive.append(value)
            reads[key] = None
        if reads or len(after) > 1:
            self._ops.append(ForwardOp(tuple(after), tuple(reads)))
            made_by: int | None = len(self._ops) - 1
        else:  # folded into the one op it follows (module doc), or from no op at all
            made_by = next(iter(after), None)
        for value in outputs:
            self._made_by[self._key(value)] = made_by
            self._alive.append(value)

    def finish(self) -> ForwardPass:
        """The pass recorded so far; lets go of the values it kept alive."""
        self._alive = []
        self._made_by = {}
        return ForwardPass(dict(self._first_reads), tuple(self._ops))


Key = TypeVar("Key", bound=Hashable)


def forward_order(keys: Iterable[Key], leaves_of: Callable[[Key], Iterable[Hashable]],
                  forward: ForwardPass) -> tuple[list[Key], list[Key]]:
    """``keys`` (parameters, store keys) split into those the pass read, by their first read
    (of any of ``leaves_of(key)``: a parameter has one array per device), and the others, in the
    order given."""
    first = forward.first_reads
    read: list[tuple[int, Key]] = []
    unread: list[Key] = []
    for key in keys:
        positions = [first[leaf] for leaf in leaves_of(key) if leaf in first]
        if positions:
            read.append((min(positions), key))
        else:
            unread.append(key)
    return [key for _, key in sorted(read, key=lambda pair: pair[0])], unread
