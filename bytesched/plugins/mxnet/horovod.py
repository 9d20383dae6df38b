"""ScheduledOptimizer: MXNet/Gluon over Horovod, with the all-reduces scheduled (paper §5).

    import horovod.mxnet as hvd
    opt = hvd.DistributedOptimizer(mx.optimizer.create("sgd", learning_rate=0.1))
    opt = ScheduledOptimizer(opt)
    trainer = gluon.Trainer(net.collect_params(), opt, kvstore=None)

Launched with ``horovodrun``. Horovod's DistributedOptimizer all-reduces each gradient inside
``update`` and then updates; this wrapper replaces the all-reduce with a :class:`ProxiedTask`
(partitioned, released by the Core under the credit window, each partition an in-place
``horovod.mxnet.allreduce_`` on an avatar) and then runs the same inner update, which the engine
orders after the all-reduce. Small gradients of one update call are fused into buckets
(:mod:`.fusion`, ``BYTESCHED_FUSION_BYTES``). Ranks run the Core in ``immediate`` order: Horovod
starts a collective only once every rank submitted it, so rank 0's release order becomes the
global one. Everything else (learning rate, states) is Horovod's optimizer's, as with Horovod.

Priorities and buckets follow the order in which the first forward pass reads the parameters
(:mod:`.trace`: watched from this optimizer's creation to the first backward pass; the
parameters are the Trainer's ``param_dict``), not the Trainer's index, which for
``net.collect_params()`` is sorted-name order; parameters the pass did not read follow by index.
Fusion then joins neighbours in the forward order. Rank 0's order is broadcast at the first
update, so every rank fuses alike and Horovod sees the same names everywhere, even where a forward
pass reads differently per rank.
The order is logged once and recorded on the timeline; under ``tictac`` the traced pass is
TicTac's graph, ordered by TIC (:mod:`bytesched.runtime.forward_order`). Without a Trainer's
``param_dict``, or with nothing traced, the index stays the priority.

The Core, its timeline and the rank-0 channel come from :mod:`bytesched.runtime`, as for the
PyTorch plugin: the channel (rank 0 shares its free port with one Horovod broadcast) carries the
heartbeats that name a lost rank (``BYTESCHED_FAULT_TIMEOUT_S``) and tuning's switches.
Tuning (``BYTESCHED_TUNING`` / ``BYTESCHED_TUNING_LOAD``) runs a
:class:`~bytesched.tuning.TuningSession` over that channel; the session is made at the first update, where the Trainer's
parameters give the model's size that fits the tuner's lattice. A Trainer index updated again
begins a new step (Gluon updates each parameter once per step); there, once the last step's
weights are written, the session hears of the step and the sizes it returns apply from that
step's first all-reduce on every rank. With no sizes set, the start-up plan
(:mod:`bytesched.runtime.startup_plan`) is driven at the same boundaries, and its calibration all-reduces
run where the gradients live (the first weight's context). A plan that stays out of the way
*passes through*: from that step on each group of gradients Gluon would have handed Horovod's
optimizer is all-reduced with Horovod's own call (``DistributedOptimizer._do_allreduce``: its
names, its fusion, no CommTask, proxy or Core) just before that group's update, so the job runs
as plain Horovod does: staying out through the Core (every gradient whole, started the moment it
is ready) ran slower than plain Horovod, the Core's work per tensor with nothing to schedule
(docs/plan.md, "2 on"). A plan that chose sizes is first
tried against passing through (:mod:`bytesched.runtime.plan_trial`), at the same boundaries. With
``BYTESCHED_POLICY=off`` it passes through from the first update.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import horovod.mxnet as hvd
import mxnet as mx
import numpy as np

from bytesched import core as bcore
from bytesched.core import Config, SchedulingParams, fusion_runs, split_elements
from bytesched.core.config import SCHEDULING_OFF, configure_logging, from_env
from bytesched.core.policies import partition_size
from bytesched.core.forward import ForwardPass, forward_order
from bytesched.runtime import (Observer, Path, PathAdapter, Startup, StartupController, StartupPlan, TuningWarmStart,
                               announce, channel_of, order_by_graph, start_core, wants_plan, wants_trial,
                               wants_warm_start)
from bytesched.tuning import make_session

from .fusion import Bucket, task_name
from .proxies import events
from .task import Avatars, ProxiedTask
from .trace import ForwardWatch, handle_of


class ScheduledOptimizer(mx.optimizer.Optimizer, PathAdapter):
    """Wraps ``horovod.mxnet.DistributedOptimizer`` so its all-reduces are scheduled.

    Args:
        optimizer: the Horovod DistributedOptimizer to wrap.
        config: bytesched settings (default: from the ``BYTESCHED_*`` environment).
    """

    def __init__(self, optimizer: hvd.DistributedOptimizer, config: Config | None = None) -> None:
        # Optimizer.__init__ is not called: as with Horovod's wrapper, every attribute this class
        # does not define is the wrapped optimizer's (see __getattr__).
        if not isinstance(optimizer, hvd.DistributedOptimizer):
            raise TypeError("ScheduledOptimizer wraps horovod.mxnet.DistributedOptimizer(optimizer), "
                            f"got {type(optimizer).__name__}")
        self._hvd = optimizer
        self._config = config if config is not None else from_env()
        configure_logging(self._config)
        if self._config.order == "rank0":
            raise bcore.ConfigError("BYTESCHED_ORDER=rank0 is not needed with Horovod (it orders "
                                    "collectives itself): use auto or immediate")
        self._core = start_core(self._config, _HorovodRanks())
        self._events = events()
        self._core.wait_on(self._events)  # engine events wake the Core's thread directly
        self._partition_bytes = partition_size(self._config.policy, self._config.params)
        self._avatars: dict[str, Avatars] = {}
        self._buckets: dict[int, Bucket] = {}
        self._facts: dict[int, _Facts] = {}
        self._tuning_wanted = bool(self._config.tuning or self._config.tuning_load)
        self._plan_wanted = wants_plan(self._config, hvd.size())
        # Its plan or tuning session is made at the first update; scheduling off: Horovod's own path throughout.
        self._startup = Startup(self, StartupController(scheduling=self._config.scheduling, passes_whenever_out=True))
        self._step = -1
        self._seen: set[int] = set()  # Trainer indices updated in this step (tuning or plan only)
        self._written: list[mx.nd.NDArray] = []  # the weights this step's updates write (tuning or plan only)
        # Priorities (module doc): the first forward pass, watched until the first backward pass.
        self._watch = ForwardWatch() if self._config.scheduling else None
        self._ranks: dict[int, int] | None = None  # Trainer index -> rank in the forward order
        self._orders: dict[tuple[int, ...], list[int]] = {}  # an update call's indices -> positions by rank
        self._forward: ForwardPass | None = None  # kept under tictac, whose graph names the buckets
        self._leaves: dict[int, list[Any]] = {}
        self._task_of: dict[int, str] = {}  # under tictac: Trainer index -> its task's name, as last handed over

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or "_hvd" not in self.__dict__:
            raise AttributeError(name)
        return getattr(self._hvd, name)

    @property
    def aggregate_num(self) -> int:
        """Unbounded, so that Gluon's Updater passes every gradient of one dtype to one
        :meth:`update` call: fusion needs the neighbours of a gradient at hand. The wrapped
        optimizer still sees the groups it declared (:meth:`_update`)."""
        return sys.maxsize

    @property
    def priority_order(self) -> list[int] | None:
        """The Trainer's indices by priority, most urgent first, as rank 0's first forward pass
        read them (module doc); None before the first update, and where the index stays."""
        return None if self._ranks is None else sorted(self._ranks, key=self._ranks.__getitem__)

    def set_params(self, params: SchedulingParams) -> None:
        """New partition and credit sizes, from the next all-reduce on (call it at the same step
        on every rank: the partitions' names and shapes must match across ranks); this ends
        passing through, and a trial of the plan's sizes."""
        if not self._config.scheduling:
            raise bcore.ConfigError(f"set_params: {SCHEDULING_OFF}, so there are no sizes to set")
        self._startup.sizes_set()
        self._apply_sizes(params)

    # -- the start-up's adapter (PathAdapter's hooks) -----------------------------------------
    def _apply_sizes(self, params: SchedulingParams) -> None:
        """Run on ``params`` from the next all-reduce on (the plan's, its trial's or the user's)."""
        self._core.set_params(params)
        size = params.partition_bytes
        self._partition_bytes = size if size is not None else partition_size(self._config.policy, params)

    def _switch_path(self, path: Path, reason: str) -> None:
        """Each update reads :attr:`passes_through` (the controller's path) as it starts: nothing
        else holds the path."""

    # -- what Gluon's Trainer and MXNet's Updater call ---------------------------------------
    def create_state(self, index: int, weight: mx.nd.NDArray) -> Any:
        return self._hvd.create_state(index, weight)

    def create_state_multi_precision(self, index: int, weight: mx.nd.NDArray) -> Any:
        return self._hvd.create_state_multi_precision(index, weight)

    def update(self, index: Any, weight: Any, grad: Any, state: Any) -> None:
        self._update(index, weight, grad, state, multi_precision=False)

    def update_multi_precision(self, index: Any, weight: Any, grad: Any, state: Any) -> None:
        self._update(index, weight, grad, state, multi_precision=True)

    def set_learning_rate(self, lr: float) -> None:
        self._hvd.set_learning_rate(lr)

    def set_lr_mult(self, args_lr_mult: dict) -> None:
        self._hvd.set_lr_mult(args_lr_mult)

    def set_wd_mult(self, args_wd_mult: dict) -> None:
        self._hvd.set_wd_mult(args_wd_mult)

    def _update(self, index: Any, weight: Any, grad: Any, state: Any, multi_precision: bool) -> None:
        """All-reduce, then the wrapped optimizer's update, called with the groups Gluon's Updater
        would have given it (chunks of its ``aggregate_num``, or one index at a time), so the
        update arithmetic is plain Horovod's; passing through, each group is all-reduced by
        Horovod's own call just before its update, as Horovod's ``update`` does."""
        inner = self._hvd._optimizer
        apply = inner.update_multi_precision if multi_precision else inner.update
        single = not isinstance(index, (list, tuple))
        indices, weights, grads = ([index], [weight], [grad]) if single else (index, weight, grad)
        if self._watch is not None:
            self._settle_order()
        if self._tuning_wanted:
            self._tuning_wanted = False
            warm = self._observer(TuningWarmStart, weights, grads) \
                if wants_warm_start(self._config, hvd.size()) else None
            self._startup.tuning = make_session(self._config, rank=hvd.rank(), world_size=hvd.size(),
                                              channel=channel_of(self._core), arch="allreduce",
                                              model_bytes=self._model_bytes(grads), warm_start=warm)
            self._startup.planning = warm
        if self._plan_wanted:
            self._plan_wanted = False
            self._startup.planning = self._observer(StartupPlan, weights, grads,
                                                  tries_sizes=wants_trial(self._config, "allreduce"))
        if self._startup.active:
            self._step_boundary(indices, weights)
        passes_through = self.passes_through
        passing = passes_through and self._hvd._process_set.included()
        if not passes_through:
            self._allreduce(indices, grads)
        for group in _groups(index, weight, grad, state, inner.aggregate_num):
            if passing:  # plain Horovod's sequence: each group's all-reduces, then its update
                self._hvd._do_allreduce(group[0], group[2])
            apply(*group)

    def _settle_order(self) -> None:
        """At the first update: rank the Trainer's parameters by the traced forward pass, agree
        on rank 0's ranking, and say so once (module doc)."""
        assert self._watch is not None
        forward, self._watch = self._watch.stop(), None
        params = self.__dict__.get("param_dict") or {}
        self._leaves = {int(i): [handle_of(array) for array in (param._data or ())] for i, param in params.items()}
        read, unread = forward_order(sorted(self._leaves), self._leaves.__getitem__, forward)
        order = self._rank0s([*read, *unread] if read else [])
        names = {i: f"{i} ({params[i].name})" for i in self._leaves}
        if not order:
            why = "the Trainer gave no param_dict" if not params else \
                "no operator ran under autograd.record() between the optimizer's creation and its first update"
            announce(self._core, [], [names[i] for i in sorted(names)], traced=False, untraced_why=why)
            return
        self._ranks = {index: rank for rank, index in enumerate(order)}
        announce(self._core, [names[i] for i in order[:len(read)]], [names[i] for i in order[len(read):]],
                 traced=True)
        if self._config.policy == "tictac":
            self._forward = forward

    def _rank0s(self, order: list[int]) -> list[int]:
        """Rank 0's ``order`` of the Trainer's indices, on every rank (one broadcast; empty: rank 0
        traced nothing)."""
        process_set = self._hvd._process_set
        if process_set.size() == 1 or not process_set.included():
            return order
        size = len(self._leaves)
        local = mx.nd.array([len(order), *order, *[0] * (size - len(order))], dtype="int64")
        agreed = hvd.broadcast(local, root_rank=0, name="bytesched.forward_order",
                               process_set=process_set).asnumpy().tolist()
        return [int(i) for i in agreed[1:1 + int(agreed[0])]]

    def _observer(self, kind: type[Observer], weights: Sequence[mx.nd.NDArray],
                  grads: Sequence[mx.nd.NDArray], **options: Any) -> Observer:
        """A start-up plan or tuning warm start observing this optimizer's steps, timing
        Horovod's all-reduce where the weights live."""
        context = weights[0].context
        return kind(self._core, _HorovodRanks(), lambda nbytes: _allreduce_of(nbytes, context), arch="allreduce",
                    model_bytes=self._model_bytes(grads), drain=self._wait_written, **options)

    def _model_bytes(self, grads: Sequence[mx.nd.NDArray]) -> int:
        """The model's gradient bytes, the same on every rank: of the parameters Gluon's Trainer
        handed this optimizer (``param_dict``), else of the gradients of this first update."""
        params = self.__dict__.get("param_dict")
        if params:
            return sum(int(np.prod(p.shape)) * np.dtype(p.dtype).itemsize
                       for p in params.values() if p.grad_req != "null")
        return sum(g.size * np.dtype(g.dtype).itemsize for g in grads)

    def _step_boundary(self, indices: Sequence[Any], weights: Sequence[mx.nd.NDArray]) -> None:
        """Before an update of ``indices``: if one of them was already updated this step (or
        nothing was yet), a step begins; tell the plan or the tuning session, after the previous
        step's weights are written (the plan observes finished steps, and trials time them, not
        queued ones), and apply what they switch to."""
        if self._step < 0 or not self._seen.isdisjoint(indices):
            self._wait_written()
            self._step += 1
            self._seen.clear()
            self._written.clear()
            self._startup.on_step(self._step)
            if not self._startup.active:
                return
        self._seen.update(indices)
        self._written.extend(weights)

    def _wait_written(self) -> None:
        """Until the weights this step's updates write are written (its all-reduces done)."""
        for weight in self._written:
            weight.wait_to_read()

    # -- the scheduled all-reduce -------------------------------------------------------------
    def _allreduce(self, indices: Sequence[Any], grads: Sequence[mx.nd.NDArray]) -> None:
        process_set = self._hvd._process_set
        if process_set.size() == 1 or not process_set.included():
            return
        if self._ranks is not None:  # in the forward order, so that fusion joins neighbours there
            by_rank = self._in_forward_order(indices)
            indices, grads = [indices[j] for j in by_rank], [grads[j] for j in by_rank]
        facts = [self._facts_of(int(i), g) for i, g in zip(indices, grads)]
        runs = fusion_runs([f.size * f.itemsize for f in facts], self._config.fusion_bytes, [f.kind for f in facts])
        if self._forward is not None:
            self._name_tasks(indices, runs)
        for run in runs:
            members = [int(indices[j]) for j in run]
            if len(run) == 1:
                self._submit(task_name(members), members[0], grads[run[0]], facts[run[0]].size, facts[run[0]].itemsize)
                continue
            member_grads = [grads[j] for j in run]
            bucket = self._buckets.get(members[0])
            if bucket is None or not bucket.matches(members, member_grads):
                bucket = self._buckets[members[0]] = Bucket(members, member_grads, self._events.library)
            bucket.pack()
            self._submit(bucket.name, members[0], bucket.buffer, sum(facts[j].size for j in run),
                         facts[run[0]].itemsize)
            bucket.unpack()

    def _in_forward_order(self, indices: Sequence[Any]) -> list[int]:
        """Positions into ``indices`` by rank in the forward order (indices not ranked after,
        by index), worked out once per update call's indices."""
        key = tuple(indices)
        order = self._orders.get(key)
        if order is None:
            ranks = self._ranks
            assert ranks is not None
            order = self._orders[key] = sorted(range(len(key)),
                                               key=lambda j: ranks.get(int(key[j]), len(ranks) + int(key[j])))
        return order

    def _name_tasks(self, indices: Sequence[Any], runs: Sequence[Sequence[int]]) -> None:
        """Under ``tictac``: where this call's buckets name a task anew, hand the Core the
        traced pass with every parameter's task as TicTac's graph (module doc)."""
        assert self._forward is not None
        named = {int(indices[j]): "allreduce:" + task_name([int(indices[k]) for k in run])
                 for run in runs for j in run}
        if all(self._task_of.get(index) == name for index, name in named.items()):
            return
        self._task_of.update(named)
        order_by_graph(self._core, self._forward, {leaf: [name] for index, name in self._task_of.items()
                                                   for leaf in self._leaves.get(index, ())})

    def _facts_of(self, index: int, grad: mx.nd.NDArray) -> "_Facts":
        """What the all-reduce needs to know of ``grad``, read from MXNet when it is a new array:
        each read is a call into MXNet that lets the GIL go and has to win it back, and Gluon
        passes the same arrays every step (see "Posting cost" in :mod:`.kvstore`)."""
        facts = self._facts.get(index)
        if facts is None or facts.grad is not grad:
            dtype = np.dtype(grad.dtype)
            facts = self._facts[index] = _Facts(grad, grad.size, dtype.itemsize, (dtype.name, grad.context))
        return facts

    def _submit(self, name: str, index: int, grad: mx.nd.NDArray, size: int, itemsize: int) -> None:
        """All-reduce ``grad`` (a gradient, or a bucket's buffer) of ``size`` elements of
        ``itemsize`` bytes as one ProxiedTask at the priority of Trainer index ``index`` (its
        rank in the forward order; the bucket's first member, which the forward pass reads
        first)."""
        ranges = split_elements(size, itemsize, self._partition_bytes)
        avatars = self._avatars.get(name)
        if avatars is None or not avatars.matches([grad], ranges):
            avatars = self._avatars[name] = Avatars(self._events.library, [grad], ranges)
        # The avatars' ranges, not this call's equal ones: the task holds them until its
        # all-reduce finished, and objects alive that long count towards Python's next cyclic
        # garbage collection (docs/architecture.md, "Objects per gradient").
        ranks = self._ranks
        priority = index if ranks is None else ranks.get(index, len(ranks) + index)
        task = ProxiedTask(f"allreduce:{name}", priority, avatars.ranges, itemsize, self._events)
        self._core.enqueue(task)
        opt = self._hvd

        def communicate() -> None:
            for part, (tensor,) in enumerate(avatars.parts):
                hvd.allreduce_(tensor, average=not opt._average_in_framework,
                               name=f"bytesched.{name}.{part}", priority=-priority,
                               prescale_factor=1.0 / opt._gradient_predivide_factor,
                               postscale_factor=opt._postscale_factor, process_set=opt._process_set)

        task.post(avatars, -priority, communicate)


def _groups(index: Any, weight: Any, grad: Any, state: Any, aggregate_num: int) -> list[tuple[Any, Any, Any, Any]]:
    """The (index, weight, grad, state) groups Gluon's Updater would have handed an optimizer of
    this ``aggregate_num``: one index, or lists of at most ``aggregate_num`` (one at a time if it
    is not positive)."""
    if not isinstance(index, (list, tuple)):
        return [(index, weight, grad, state)]
    if aggregate_num <= 0:
        return list(zip(index, weight, grad, state))
    return [(list(index[i:i + aggregate_num]), list(weight[i:i + aggregate_num]), list(grad[i:i + aggregate_num]),
             list(state[i:i + aggregate_num])) for i in range(0, len(index), aggregate_num)]


@dataclass(frozen=True)
class _Facts:
    """A gradient array and what the all-reduce reads of it: element count, element size, and
    the (dtype, context) kind fusion groups by."""

    grad: mx.nd.NDArray
    size: int
    itemsize: int
    kind: tuple[str, Any]


class _HorovodRanks:
    """The job's ranks as :mod:`bytesched.runtime` needs them, over Horovod (which orders
    collectives itself: ``immediate``)."""

    order = "immediate"

    def __init__(self) -> None:
        self.rank = hvd.rank()
        self.size = hvd.size()

    def barrier(self) -> None:
        hvd.allreduce(mx.nd.zeros(1), name="bytesched.barrier").wait_to_read()

    def broadcast_int(self, value: int) -> int:
        """How rank 0 tells the others its channel's free port and its start-up plan."""
        shared = hvd.broadcast(mx.nd.array([value], dtype="int64"), root_rank=0, name="bytesched.broadcast_int")
        return int(shared.asnumpy()[0])


def _allreduce_of(nbytes: int, context: mx.Context) -> Callable[[], None]:
    """A blocking all-reduce of ``nbytes`` on ``context``, as a gradient's (the plan times it)."""
    buffer = mx.nd.zeros(max(nbytes // 4, 1), ctx=context, dtype="float32")

    def allreduce() -> None:
        hvd.allreduce_(buffer, average=False, name=f"bytesched.calibrate.{nbytes}")
        buffer.wait_to_read()
    return allreduce
