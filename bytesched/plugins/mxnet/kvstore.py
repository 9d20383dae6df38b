"""ScheduledKVStore: MXNet KVStore push/pull scheduled by the bytesched Core (paper §5).

    kv = ScheduledKVStore(mx.kv.create("dist_sync"))   # then used unchanged
    trainer = gluon.Trainer(net.collect_params(), "sgd", {...}, kvstore=kv)

Each ``push``/``pull``/``pushpull`` of a user key becomes one :class:`KVCommTask` whose
sub-tasks are the key's partitions, each stored under its own server key (see :mod:`bytesched.ps_layout`).
The call returns at once, as MXNet's does, having posted into MXNet's engine the wrapped store's
own push, pull or pushpull of every partition, on avatars, between Dependency Proxies
(:mod:`.task`). Partitions of one tensor move independently, so the answer to one overlaps the
push of the next and both directions of every link are busy.

Priorities. The priority MXNet hands the store is the Trainer's index of the parameter, and a
Trainer given ``net.collect_params()`` (a dict) numbers the parameters by sorted name: ``conv10``
before ``conv2``. The store therefore watches the first forward pass (from its creation to the
first backward pass, :mod:`.trace`) and, at its first push or pull, ranks the keys by the order in which that pass
first read their arrays (the arrays ``init``/``broadcast`` gave it: the Trainer's are the
parameters' own); keys the pass did not read follow in the order they were initialised, and a key
initialised later after them. That order is the same on every worker for the same model; with
``dist_sync`` only rank 0's counts anyway (rank 0 decides the starts, "Cross-worker order"
below). Where nothing was traced (MXNet's Module runs executors) the caller's priorities stay.
The order is logged once and recorded on the timeline; under ``tictac`` the traced pass is
TicTac's graph, ordered by TIC (:mod:`bytesched.runtime.forward_order`).

Push and pull. A ``pushpull`` partition is one request to its server, the wrapped store's own
``pushpull``: a ``dist_sync`` server answers it with the updated value once every worker pushed.
A push followed by a separate pull costs a second request and, in the engine, a pull that waits
for the push's answer (docs/plugins/mxnet.md, "Dependency Proxies and avatars").

Cross-worker order. A ``dist_sync`` server answers a push only after every worker pushed that
key. Workers that started their pushes in different orders under a credit limit would each wait
for a push the other holds back: a deadlock. With ``dist_sync`` the store therefore runs the
Core in ``rank0`` order mode: rank 0 alone applies the policy and credit, and announces every
start over the rank-0 channel; the others start exactly that sequence, each partition as soon
as it is ready locally, without credit. Every worker then pushes the keys in one global order,
and a push that rank 0 started is eventually started by everyone, so no cycle of waits can form.
A policy that never holds a ready partition back (``fifo``, or unlimited credit without tuning)
has no schedule to share, and its workers run in ``immediate`` order: each starts a partition
once it is ready, without the channel round trip (:func:`~bytesched.core.policies.ps_order`).
``dist_async`` servers answer each push alone and ``local`` has one worker: they use
``immediate`` order (no channel).

A store without a network (``local``, ``device``) releases every partition as soon as it is
ready, with no credit. Its push runs the optimizer inline, so the optimizer's engine operations
sit behind the partition's ready proxy, and MXNet hands shared resources to them (temp space is
a few engine variables handed out round-robin: ``adam_update`` takes one). An operation posted
later that draws the same resource waits for the held partition. Under a credit the Core could
start that later partition and hold back the earlier one until it finishes: a cycle, which hung
MXNet's ``WaitForVar``. Released on readiness, a partition is not held at all
(:meth:`.task.ProxiedTask.post`), so the engine runs everything in posting order. Dist stores
keep the credit: their gated operations (ps-lite push/pull on per-key buffers, copies) take no
shared resource.

Posting cost. Gluon's Trainer calls ``pushpull`` once per parameter from the training thread,
and every call into MXNet from Python lets go of the GIL and has to win it back from the Core's
threads and MXNet's custom operators. A submission therefore checks a key's arrays only when
they are new (an NDArray object keeps its shape, type and storage), reuses the key's avatars
and their handle arrays, and posts the proxy chain with calls that keep the GIL
(:class:`.proxies.Chain`), which more than halved the posting's time (docs/plugins/mxnet.md,
"Dependency Proxies and avatars"). The whole chain is one such call, in which the library also
makes the store's own push or pull (:class:`.proxies.StoreCall`, prepared once per key and
arrays): no call of MXNet's Python API per key, which converts its arguments every time and
lets go of the GIL.

Re-partitioning. :meth:`ScheduledKVStore.set_params` with a new partition size takes effect at a
step boundary: the store waits for its communication to finish, initialises fresh server keys at
the new size with the values the workers last pulled (a collective MXNet init), and re-sends
the optimizer wrapper, which carries optimizer states over on the servers
(:mod:`.server_optimizer`). No checkpoint, no restart.

Start-up plan (no ``BYTESCHED_*_BYTES`` set, ``dist_sync``; :mod:`bytesched.runtime.startup_plan`). The
keys are laid out whole, and until step 2 every worker's Core starts a key the moment it is
ready, announcing nothing (:meth:`~bytesched.core.Core.start_on_ready`): with nothing held back
the servers need no common order (see "Cross-worker order"), and the ready proxies release
themselves. At the boundary of step 2 every worker times a push+pull on keys of its own (which
the servers' optimizer leaves alone), rank 0 simulates step 1 on that network and sends its
choice over the rank-0 channel (:class:`~bytesched.runtime.channel_ranks.ChannelRanks`), and every
worker applies it before anything of step 2 is posted. A sized plan re-partitions the keys
(below) and restores rank 0's order; it is then tried against staying out
(:mod:`bytesched.runtime.plan_trial`): after its steps, the keys are laid out whole again and
the store passes through, and only if the sizes ran faster are they laid out again and kept
(each step of the trial waits for the previous one's communication, as under tuning). A plan
that stays out *passes through*: from then on each push, pull or pushpull is the wrapped
store's own operation, posted from the caller's thread with no CommTask, proxy or Core in
between, through MXNet's C API as the Core's path posts it (:class:`.proxies.StoreCall`); a
pushpull repeating its previous call's objects (Gluon's Trainer, every step) reuses that call's
arguments. A key on one server key goes on a plain view of its arrays (:class:`.task.Views`,
which shares the arrays' engine variables), after an entry fence that brings the arrays back to
MXNet's default memory layout (an evaluation pass may have left a weight in MKLDNN's blocked
one, docs/plugins/mxnet.md, "Evaluation passes and MKLDNN layouts"). A key laid out in several
server keys (one above MXNet's big-array bound, striped over the servers) goes on avatars between
two fences (:class:`.task.FencedAvatars`), so its pieces travel at once, as the Core would start
them: on views they went one after another, several times slower
(docs/experiments/start-up-plan.md). The layout is the one the plan simulated as staying out, so
the choice and what runs agree. What passing through costs per key: docs/benchmarks.md,
"Per-tensor cost". :meth:`set_params` ends it. The outcome is :attr:`ScheduledKVStore.plan`.
The Core runs in ``rank0`` mode (and opens the channel) from the start, as under tuning, since a
sized plan sets a credit. With ``BYTESCHED_POLICY=off`` the keys are laid out as the plan lays
them out and every operation passes through from the first.

Tuning (``BYTESCHED_TUNING`` / ``BYTESCHED_TUNING_LOAD``). Every worker drives a
:class:`~bytesched.tuning.TuningSession` over the rank-0 channel: at each step boundary (see
:meth:`ScheduledKVStore._next_step_if`), before anything of the new step is posted, it calls
``on_step`` and applies the sizes it returns with the re-partitioning above, so every worker
switches partition size at the same step. While tuning, the step boundary first waits for the
previous step's communication: MXNet's Python thread otherwise runs ahead of the engine, and the
tuner would time the posting of operations instead of the training. The session is made at the
first push or pull, when every key is initialised, because the keys' bytes fit its lattice to the
model. The kept sizes are :attr:`ScheduledKVStore.tuned_params`.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import mxnet as mx
import numpy as np
from mxnet.kvstore import KVStoreBase

from bytesched import core as bcore
from bytesched.core import Config, SchedulingParams
from bytesched.core.config import SCHEDULING_OFF, UNLIMITED, configure_logging, from_env
from bytesched.core.policies import ImmediatePolicy, Policy, make_policy, order_mode, partition_size
from bytesched.runtime import (STAY_OUT, ChannelRanks, Observer, Path, PathAdapter, Startup, StartupController,
                               StartupPlan, TuningWarmStart, announce, channel_of, on_channel_failure, order_by_graph,
                               start_core, track, untrack, wants_plan, wants_trial, wants_warm_start)
from bytesched.tuning import make_session

from bytesched.core.forward import forward_order
from bytesched.ps_layout import KeyLayout, ServerKeyTable, UserKey
from .proxies import ProxyLibrary, StoreCall, events
from .server_optimizer import NOT_ELEMENTWISE, Part, PartitionedOptimizer
from .task import Arrays, Avatars, FencedAvatars, ProxiedTask, Views, unique_arrays
from .trace import ForwardWatch, handle_of

log = logging.getLogger("bytesched")

# Stores created in this process, in order: with the count of optimizers a store was given, it
# names an optimizer identically on every worker (workers create their stores alike).
_STORES = itertools.count()


@dataclass(frozen=True)
class _Passed:
    """An operation passed through (module doc, "Start-up plan"): the wrapped store's own push,
    pull or pushpull (one request per partition: see "Push and pull" in the module doc), which
    the proxy library makes, posted the way its views need (:meth:`.task.Views.pass_through`)."""

    views: Views
    call: StoreCall
    library: ProxyLibrary

    def post(self, priority: int) -> None:
        self.views.pass_through(priority, lambda: self.library.post_store(self.call, priority))


class KVCommTask(ProxiedTask):
    """One user key's push, pull or push+pull; its sub-tasks are the key's server-key partitions."""

    def __init__(self, store: "ScheduledKVStore", kind: str, layout: KeyLayout, priority: int) -> None:
        super().__init__(f"{kind}:{layout.user_key}", priority, layout.ranges, layout.itemsize, store.events)
        self.store = store
        self.layout = layout

    def on_finish(self) -> None:
        super().on_finish()
        self.store._forget(self)

    def on_error(self, error: BaseException) -> None:
        super().on_error(error)
        self.store._failed(self, error)


def _launch_rank(kv: mx.kv.KVStore) -> tuple[int, int]:
    """This worker's rank and the number of workers.

    ``bytesched launch`` sets BYTESCHED_RANK / BYTESCHED_WORLD_SIZE (deterministic, so rank 0 and
    the channel's host are known in advance); otherwise ps-lite's numbering is used.
    """
    rank, size = os.environ.get("BYTESCHED_RANK"), os.environ.get("BYTESCHED_WORLD_SIZE")
    if rank is None or size is None:
        return kv.rank, kv.num_workers
    if not (rank.isdigit() and size.isdigit() and int(rank) < int(size)):
        raise bcore.ConfigError(f"BYTESCHED_RANK={rank!r} / BYTESCHED_WORLD_SIZE={size!r}: expected "
                                "integers with 0 <= rank < world size")
    if int(size) != kv.num_workers:
        raise bcore.ConfigError(f"BYTESCHED_WORLD_SIZE={size} but the KVStore has {kv.num_workers} workers")
    return int(rank), int(size)


def _placement(kv_type: str) -> tuple[int, int]:
    """Server count and big-array bound, read where MXNet reads them (ps-lite's DMLC_NUM_SERVER,
    MXNet's MXNET_KVSTORE_BIGARRAY_BOUND), so keys are placed by MXNet's own rules."""
    if "dist" not in kv_type:
        return 1, 1_000_000
    servers = os.environ.get("DMLC_NUM_SERVER", "")
    bound = os.environ.get("MXNET_KVSTORE_BIGARRAY_BOUND", "1000000")
    if not servers.isdigit() or not bound.isdigit():
        raise bcore.ConfigError(f"DMLC_NUM_SERVER={servers!r} / MXNET_KVSTORE_BIGARRAY_BOUND={bound!r}: "
                                "expected integers (a dist KVStore needs DMLC_NUM_SERVER)")
    return int(servers), int(bound)


def _synchronous(kv_type: str) -> bool:
    """A ``dist_sync`` store: its servers answer a key once every worker pushed it."""
    return "dist" in kv_type and "async" not in kv_type


def _need(kv_type: str) -> str:
    """What a store of ``kv_type`` needs of the cross-worker order (module doc, "Cross-worker order")."""
    return "ps" if _synchronous(kv_type) else "immediate"


def _order_for(kv_type: str, config: Config, world_size: int, resized: bool) -> str:
    """``BYTESCHED_ORDER``, or for ``auto`` the rule of "Cross-worker order" (module doc);
    ``resized``: tuning or the start-up plan may set a credit later."""
    return order_mode(make_policy(config.policy, config.params), need=_need(kv_type), setting=config.order,
                      world_size=world_size, tuning=resized)


@dataclass
class _StoreWorkers:
    """The workers as the runtime sees them (:class:`~bytesched.runtime.Workers`): workers of a
    parameter server share no collectives, so the channel listens on its configured port."""

    rank: int
    size: int
    order: str
    barrier: Callable[[], None]


def _policy_for(kv_type: str, config: Config) -> Policy | None:
    """The configured policy (None: the Core makes it), or for a store without a network its
    partitioning with release on readiness (see "A store without a network" in the module doc)."""
    if "dist" in kv_type:
        return None
    return ImmediatePolicy(make_policy(config.policy, config.params))


class ScheduledKVStore(KVStoreBase, PathAdapter):
    """An MXNet KVStore whose communication the bytesched Core schedules (see the module doc).

    Args:
        kvstore: the store to wrap, from ``mx.kv.create("dist_sync" | "dist_async" | "local")``.
        config: bytesched settings (default: from the ``BYTESCHED_*`` environment).
    """

    def __init__(self, kvstore: mx.kv.KVStore, config: Config | None = None) -> None:
        if isinstance(kvstore, ScheduledKVStore) or not isinstance(kvstore, mx.kv.KVStore):
            raise TypeError("ScheduledKVStore wraps an MXNet KVStore from mx.kv.create(...), "
                            f"got {type(kvstore).__name__}")
        self._kv = kvstore
        self.config = config if config is not None else from_env()
        configure_logging(self.config)
        self.events = events()
        self.library = self.events.library
        self._table = ServerKeyTable(*_placement(kvstore.type),
                                     str_index_is_name="dist" not in kvstore.type)
        self.core_rank, self.world_size = _launch_rank(kvstore)
        tuning = bool(self.config.tuning or self.config.tuning_load)
        self._plan_wanted = _synchronous(kvstore.type) and wants_plan(self.config, self.world_size)
        # Planned: keys are laid out whole, as the steps before the plan send them (module doc).
        self._partition_bytes = (UNLIMITED if self._plan_wanted or not self.config.scheduling
                                 else partition_size(self.config.policy, self.config.params))
        self._resized = tuning or self._plan_wanted
        self._core = start_core(self.config, _StoreWorkers(self.core_rank, self.world_size, _need(kvstore.type),
                                                         kvstore._barrier),
                                policy=_policy_for(kvstore.type, self.config), resized=self._resized)
        self._core.wait_on(self.events)  # engine events wake the Core's thread directly
        self.order = self._core.order
        self._channel = channel_of(self._core)
        if self._plan_wanted:
            self._core.set_params(STAY_OUT)
            if self.order == "rank0":  # staying out holds nothing back: no order to share (module doc)
                self._core.start_on_ready()
        self._lock = threading.Condition()
        self._tasks: dict[int, KVCommTask] = {}
        self._error: BaseException | None = None
        self._avatars: dict[tuple[str, UserKey], Views] = {}  # Avatars; passing through, Views or FencedAvatars
        self._optimizer: mx.optimizer.Optimizer | None = None
        self._optimizer_version = (next(_STORES), 0)
        self._installed: PartitionedOptimizer | None = None
        self._installed_for: tuple[tuple[int, int], int, int] | None = None  # (version, generation, keys)
        self._previous_parts: dict[int, Part] = {}
        # Per key, the array that last received the key's server value (init, pull): what a
        # re-partition initialises the new server keys with, unless the key was pushed since.
        # (Pulling the old keys instead is not safe: MXNet's dist store pulls into the buffer of the
        # last push, on the CPU the gradient itself, which by then holds the next step's gradient.)
        self._last_value: dict[UserKey, mx.nd.NDArray] = {}
        self._pushed_since_pull: set[UserKey] = set()
        self.step = 0
        self._seen: set[tuple[str, UserKey]] = set()
        self._pending: tuple[SchedulingParams, int | None] | None = None
        self._tuning_wanted = tuning
        # Its plan or tuning session is made at the first push or pull.
        self._startup = Startup(self, StartupController(scheduling=self.config.scheduling, passes_whenever_out=True))
        self._switched_step = -1  # the last step the plan or tuning session was told about
        self._timing_parts: dict[int, Part] = {}  # the start-up plan's timed keys
        # The plan stayed out, or scheduling is off: operations go to the wrapped store directly.
        self._passthrough = False
        self._passed: dict[tuple[str, UserKey], Arrays] = {}  # meanwhile, what each key's last operation writes
        self._calls: dict[tuple[str, UserKey], tuple[Any, StoreCall]] = {}  # _store_call's
        self._repeats: dict[UserKey, tuple[Any, Any, _Passed]] = {}  # a pushpull's objects and operation
        # Priorities (module doc): the first forward pass, watched until the first backward pass
        # (or the first push or pull, if that comes first).
        self._watch = ForwardWatch() if self.config.scheduling else None
        self._leaves: dict[UserKey, list[Any]] = {}  # each key's arrays (handles), from init/broadcast
        self._ranks: dict[UserKey, int] | None = None  # None: the caller's priorities
        self._closed = False
        self._stop_listening = on_channel_failure(self._lost)
        self._startup.opening()
        track(self)  # closed by bytesched.runtime.shutdown (at exit at the latest), before the Core stops

    # -- the KVStore interface ----------------------------------------------------------------
    @property
    def type(self) -> str:
        return self._kv.type

    @property
    def rank(self) -> int:
        """The wrapped store's (ps-lite) rank; the Core's rank is :attr:`core_rank`."""
        return self._kv.rank

    @property
    def num_workers(self) -> int:
        return self._kv.num_workers

    @property
    def priority_order(self) -> list[UserKey] | None:
        """The keys by priority, most urgent first, as learnt from the first forward pass (module
        doc, "Priorities"); None before the first push or pull, and where the caller's stay."""
        return None if self._ranks is None else sorted(self._ranks, key=self._ranks.__getitem__)

    @property
    def partition_bytes(self) -> float:
        """The partition size of the current server-key layout."""
        return self._partition_bytes

    def is_capable(self, capability: str) -> bool:
        return self._kv.is_capable(capability)

    def init(self, key: Any, value: Any) -> None:
        """Lay out each key's server keys and initialise them with zero-copy slices of ``value``."""
        keys: list[int] = []
        values = []
        for user_key, arrays in self._pairs(key, value):
            if len(arrays) != 1:
                raise ValueError(f"init of key {user_key!r}: give one array per key, got {len(arrays)}")
            array = arrays[0]
            self._check_dense(user_key, array)
            self.library.to_default_layout([array])
            layout = self._table.add(user_key, array.shape, array.dtype, self._partition_bytes)
            self._leaves[user_key] = [handle_of(array)]
            flat = array.reshape(-1)
            self._last_value[user_key] = array
            keys += layout.server_keys
            values += [flat[a:b] for a, b in layout.ranges]
        self._kv.init(keys, values)

    def broadcast(self, key: Any, value: Any, out: Any, priority: int = 0) -> None:
        """Initialise from rank 0's ``value`` and pull the result into ``out`` (as MXNet does)."""
        self.init(key, value)
        keys: list[int] = []
        outs = []
        for user_key, arrays in self._pairs(key, out):
            layout = self._table[user_key]
            self._leaves[user_key] += map(handle_of, arrays)
            self._last_value[user_key] = arrays[0]
            self.library.to_default_layout(arrays)
            flats = [a.reshape(-1) for a in arrays]
            keys += layout.server_keys
            outs += [[f[a:b] for f in flats] for a, b in layout.ranges]
        self._kv.pull(keys, out=outs, priority=priority)

    def push(self, key: Any, value: Any, priority: int = 0) -> None:
        """Scheduled push; a partition counts as finished once the store has taken its data."""
        for user_key, arrays in self._pairs(key, value):
            self._submit("push", user_key, arrays, [], priority)

    def pull(self, key: Any, out: Any = None, priority: int = 0, ignore_sparse: bool = True) -> None:
        """Scheduled pull into ``out``."""
        if out is None:
            raise ValueError("pull needs `out`")
        for user_key, arrays in self._pairs(key, out):
            self._submit("pull", user_key, [], arrays, priority)

    def pushpull(self, key: Any, value: Any, out: Any = None, priority: int = 0) -> None:
        """Scheduled push of ``value`` and pull into ``out`` (``value`` itself if omitted)."""
        if self._passthrough and self._repeat_pushpull(key, value, out, priority):
            return
        pushes = self._pairs(key, value)
        pulls = pushes if out is None else self._pairs(key, out)
        passed = None
        for (user_key, values), (_, outs) in zip(pushes, pulls):
            passed = self._submit("pushpull", user_key, values, outs, priority)
        if passed is not None and not isinstance(key, (list, tuple)):
            self._repeats[key] = (value, out, passed)

    def _repeat_pushpull(self, key: Any, value: Any, out: Any, priority: int) -> bool:
        """Passing through, a pushpull of one key with the very objects of its previous one (what
        Gluon's Trainer does every step) is the wrapped store's call with the arguments worked out
        then: the arrays were checked then, and the bookkeeping of a pushpull leaves nothing to
        change. False if this call is not such a repeat."""
        if isinstance(key, (list, tuple)):
            return False
        repeat = self._repeats.get(key)
        if repeat is None or repeat[0] is not value or repeat[1] is not out:
            return False
        if self._startup.active and ("pushpull", key) in self._seen:
            return False  # a step boundary, where a plan trial may end passing through: _submit crosses it
        self._check_healthy()
        self._next_step_if("pushpull", key)
        self._install_optimizer()
        repeat[2].post(self._priority(key, priority))
        return True

    def row_sparse_pull(self, key: Any, out: Any = None, priority: int = 0, row_ids: Any = None) -> None:
        raise NotImplementedError("ScheduledKVStore schedules dense tensors only; row_sparse_pull "
                                  "is not supported (use the wrapped store for sparse parameters)")

    def set_optimizer(self, optimizer: mx.optimizer.Optimizer) -> None:
        """Run ``optimizer`` in the store, per partition as if per parameter.

        Sent to the store before the next push, once the keys it applies to are laid out.
        """
        name = type(optimizer).__name__.lower()
        if name in NOT_ELEMENTWISE:
            log.warning("optimizer %s is not elementwise: partitioned updates differ from "
                        "whole-tensor ones (use partition size inf to avoid partitioning)", name)
        self._optimizer = optimizer
        self._optimizer_version = (self._optimizer_version[0], self._optimizer_version[1] + 1)

    def set_gradient_compression(self, compression_params: dict) -> None:
        self._kv.set_gradient_compression(compression_params)

    def save_optimizer_states(self, fname: str, dump_optimizer: bool = False) -> None:
        self._kv.save_optimizer_states(fname, dump_optimizer)

    def load_optimizer_states(self, fname: str) -> None:
        self._kv.load_optimizer_states(fname)

    def __getattr__(self, name: str) -> Any:
        # Anything else (e.g. _barrier, _send_command_to_servers) is the wrapped store's.
        if name.startswith("__") or "_kv" not in self.__dict__:
            raise AttributeError(name)
        return getattr(self._kv, name)

    # -- re-partitioning ----------------------------------------------------------------------
    def set_params(self, params: SchedulingParams, at_step: int | None = None) -> None:
        """New partition and credit sizes. The credit applies now; a new partition size
        re-partitions the server keys at step ``at_step`` (default: the next step), which every
        worker must be given alike (a step is one round of push/pull over the keys). This ends
        passing through, and a trial of the plan's sizes."""
        if not self.config.scheduling:
            raise bcore.ConfigError(f"set_params: {SCHEDULING_OFF}, so there are no sizes to set")
        if at_step is not None and at_step <= self.step:
            raise ValueError(f"at_step={at_step} has passed (this worker is at step {self.step})")
        self._startup.sizes_set()
        self._apply_sizes(params, at_step)

    # -- the start-up's adapter (PathAdapter's hooks) -----------------------------------------
    def _switch_path(self, path: Path, reason: str) -> None:
        """Passing through, operations go to the wrapped store (module doc, "Start-up plan"); on
        the Core, starts follow rank 0's order again (sizes that may hold pushes back need it)."""
        if path is Path.PASS_THROUGH:
            self._passthrough = True
            self._avatars.clear()
            return
        if self._passthrough or self._core.start_order != self.order:
            self.wait_idle()  # nothing in flight while the Core changes how it starts tasks
            self._passthrough = False
            self._passed.clear()
            self._avatars.clear()
            self._repeats.clear()
            self._core.restore_order()

    def _apply_sizes(self, params: SchedulingParams, at_step: int | None = None) -> None:
        """Run on ``params`` (the plan's, its trial's, the tuning session's or the user's),
        re-partitioning at ``at_step`` (default: the next step)."""
        if _order_for(self.type, self.config.with_params(params), self.world_size, self._resized) != self.order:
            log.warning("bytesched: this store's workers run in %s order, chosen at its creation for sizes "
                        "that hold nothing back; the new credit (%s) holds back rank 0's pushes only (set "
                        "BYTESCHED_ORDER=rank0 for every worker to follow rank 0's schedule)",
                        self.order, params.credit_bytes)
        self._core.set_params(params)
        self._pending = (params, at_step)

    def _maybe_repartition(self) -> None:
        if self._pending is None:
            return
        params, at_step = self._pending
        if at_step is not None and self.step < at_step:
            return
        self._pending = None
        size = params.partition_bytes
        if size is None:
            size = partition_size(self.config.policy, params)
        if size == self._partition_bytes:
            return
        self.wait_idle()
        layouts = self._table.layouts()
        if self._pushed_since_pull:
            raise RuntimeError(f"cannot re-partition: keys {sorted(map(str, self._pushed_since_pull))} were "
                               "pushed but not pulled since, so this worker does not know their server "
                               "values (re-partition after a pull, or use pushpull)")
        self._previous_parts = self._parts(layouts)
        pairs = self._table.repartition(size)
        self.library.to_default_layout([self._last_value[new.user_key] for _, new in pairs])
        new_keys: list[int] = []
        values = []
        for _, new in pairs:
            flat = self._last_value[new.user_key].reshape(-1)
            new_keys += new.server_keys
            values += [flat[a:b] for a, b in new.ranges]
        self._kv.init(new_keys, values)
        self._partition_bytes = size
        self._avatars.clear()
        log.info("re-partitioned %d keys at %s bytes (step %d)", len(pairs), size, self.step)

    # -- submission -------------------------------------------------------------------------
    def _submit(self, kind: str, user_key: UserKey, values: Arrays, outs: Arrays, priority: int) -> _Passed | None:
        """Hand one key's operation to the Core, or while passing through post it (returned)."""
        self._check_healthy()
        if self._watch is not None:
            self._settle_order()
        priority = self._priority(user_key, priority)
        self._next_step_if(kind, user_key)
        self._install_optimizer()
        layout = self._table[user_key]
        for array in values + outs:
            self._check_type(user_key, array)
        arrays = unique_arrays(values + outs)
        views = self._avatars.get((kind, user_key))
        if views is None or not views.matches(arrays, layout.ranges):
            # Checked once per array: the same NDArray object keeps its shape, type and storage,
            # and each of these reads is a call into MXNet (see "Posting cost" in the module doc).
            for array in arrays:
                self._check_layout(user_key, layout, array)
            views = self._avatars[(kind, user_key)] = self._views(arrays, layout)
        if values:
            self._pushed_since_pull.add(user_key)
        if outs:
            self._last_value[user_key] = outs[0]
            self._pushed_since_pull.discard(user_key)
        call = self._store_call(kind, user_key, layout, views, values, outs)
        if self._passthrough:  # module doc, "Start-up plan": the wrapped store's own operation
            passed = _Passed(views, call, self.library)
            if outs:  # what wait_idle waits for
                self._passed[(kind, user_key)] = unique_arrays(outs)
            passed.post(priority)
            return passed
        task = KVCommTask(self, kind, layout, -priority)
        with self._lock:
            self._tasks[task.token] = task
        self._core.enqueue(task)
        task.post_store_call(views, call, priority)  # type: ignore[arg-type]  # the Core's path: Avatars
        return None

    def _settle_order(self) -> None:
        """At the first push or pull: rank the keys by the traced forward pass (module doc,
        "Priorities"), say so once, and hand a ``tictac`` Core the pass as its graph."""
        assert self._watch is not None
        forward, self._watch = self._watch.stop(), None
        read, unread = forward_order([layout.user_key for layout in self._table.layouts()],
                                     lambda key: self._leaves.get(key, ()), forward)
        if not read:
            why = ("MXNet's Module runs its symbol's executors, which bytesched does not watch"
                   if any(isinstance(key, str) for key in unread) else
                   "no operator ran under autograd.record() between the store's creation and its first push or pull")
            announce(self._core, [], [self._described(key) for key in unread], traced=False, untraced_why=why)
            return
        self._ranks = {key: rank for rank, key in enumerate([*read, *unread])}
        announce(self._core, [self._described(key) for key in read], [self._described(key) for key in unread],
                 traced=True)
        if self.config.policy == "tictac":
            order_by_graph(self._core, forward, {leaf: [f"{kind}:{key}" for kind in ("push", "pull", "pushpull")]
                                                 for key in read for leaf in self._leaves[key]})

    def _described(self, key: UserKey) -> str:
        """``key``, with its parameter's name where the Trainer's optimizer tells it."""
        params = getattr(self._optimizer, "param_dict", None) or {}
        param = params.get(key)
        return str(key) if param is None else f"{key} ({param.name})"

    def _priority(self, user_key: UserKey, given: int) -> int:
        """MXNet's priority (larger goes first) of ``user_key``: minus its rank in the forward
        order, or ``given`` where the caller's priorities stay (module doc, "Priorities")."""
        ranks = self._ranks
        if ranks is None:
            return given
        rank = ranks.get(user_key)
        if rank is None:  # initialised after the order was learnt: after every other key
            rank = ranks[user_key] = len(ranks)
        return -rank

    def _store_call(self, kind: str, user_key: UserKey, layout: KeyLayout, views: Views, values: Arrays,
                    outs: Arrays) -> StoreCall:
        """The wrapped store's operation on ``views`` of ``values`` and ``outs``, worked out once per
        key and arrays (the views are the same objects while the arrays are: :meth:`Views.matches`)."""
        roles = (views, tuple(map(id, values)), tuple(map(id, outs)))
        prepared = self._calls.get((kind, user_key))
        if prepared is None or prepared[0] != roles:
            prepared = self._calls[(kind, user_key)] = (
                roles, StoreCall(self._kv, layout.server_keys, views.of(values), views.of(outs)))
        return prepared[1]

    def _views(self, arrays: Arrays, layout: KeyLayout) -> Views:
        """What a key's operations are posted on: avatars the Core's proxies gate; while passing
        through, plain views of a key on one server key, fenced avatars of a partitioned one
        (:class:`.task.FencedAvatars` says why not views)."""
        if not self._passthrough:
            return Avatars(self.library, arrays, layout.ranges)
        if len(layout.server_keys) == 1:
            return Views(self.library, arrays, layout.ranges)
        return FencedAvatars(self.library, arrays, layout.ranges)

    def _next_step_if(self, kind: str, user_key: UserKey) -> None:
        """A key communicated again starts a new step (Trainer and Module touch each key once
        per step); tuning switches and due re-partitions happen there, before anything of the
        new step is posted (the first submission is the boundary of step 0)."""
        if (kind, user_key) in self._seen:
            self.step += 1
            self._seen.clear()
        if self._tuning_wanted or self._plan_wanted:  # every key was initialised: the model's size is known
            self._make_switches()
        if self._startup.active and self.step > self._switched_step:
            self._switch_step()
        if not self._seen:
            self._maybe_repartition()
        self._seen.add((kind, user_key))

    def _make_switches(self) -> None:
        model_bytes = sum(layout.nbytes for layout in self._table.layouts())
        if self._tuning_wanted:
            warm = self._observer(TuningWarmStart, model_bytes) \
                if wants_warm_start(self.config, self.world_size) else None
            self._startup.tuning = make_session(self.config, rank=self.core_rank, world_size=self.world_size,
                                              channel=self._channel, arch="ps", model_bytes=model_bytes,
                                              warm_start=warm)
            self._startup.planning = warm
        if self._plan_wanted:
            self._startup.planning = self._observer(StartupPlan, model_bytes,
                                                  tries_sizes=wants_trial(self.config, "ps"))
        self._tuning_wanted = self._plan_wanted = False

    def _observer(self, kind: Callable[..., Observer], model_bytes: int, **options: Any) -> Observer:
        """A start-up plan or tuning warm start observing this store's steps, timing a push+pull
        on keys of its own; rank 0's choice travels over the rank-0 channel."""
        ranks = ChannelRanks(self.core_rank, self.world_size, "ps", self._channel,  # type: ignore[arg-type]  # ps: set
                             self._kv._barrier, self.config.channel_timeout_s)
        return kind(self._core, ranks, self._timed_pushpull, arch="ps", model_bytes=model_bytes,
                    drain=self.wait_idle, servers=self._table.num_servers, bigarray_bound=self._table.bigarray_bound,
                    **options)

    def _switch_step(self) -> None:
        """Tell the plan, its trial or the tuning session that :attr:`step` begins; apply the sizes
        it switches to."""
        if self._startup.times_steps:
            self.wait_idle()  # time finished steps, not posted ones (module doc, "Tuning")
        self._startup.on_step(self.step)
        self._switched_step = self.step

    def _timed_pushpull(self, nbytes: int) -> Callable[[], None]:
        """A blocking pushpull of ``nbytes`` on a server key of its own, which the servers'
        optimizer leaves alone: the operation the start-up plan times (every worker calls this
        alike, with nothing else in flight)."""
        key = self._table.reserve()
        value = mx.nd.zeros((nbytes // 4,), dtype="float32")
        self._kv.init(key, value)
        self._timing_parts[key] = Part("bytesched.timing", 0, value.size, self._table.generation, timing_only=True)
        self._install_optimizer()

        def pushpull() -> None:
            self._kv.pushpull(key, value, out=value)
            value.wait_to_read()
        return pushpull

    def _install_optimizer(self) -> None:
        """Send the optimizer wrapper when the optimizer or the key layout changed."""
        if self._optimizer is None:
            return
        wanted = (self._optimizer_version, self._table.generation, len(self._table) + len(self._timing_parts))
        if wanted == self._installed_for:
            return
        parts = {**self._previous_parts, **self._parts(self._table.layouts()), **self._timing_parts}
        wrapper = PartitionedOptimizer(self._optimizer, parts, version=self._optimizer_version,
                                       generation=self._table.generation)
        if self._installed is not None:
            wrapper.adopt(self._installed)
        self._kv.set_optimizer(wrapper)
        self._installed, self._installed_for = wrapper, wanted

    @staticmethod
    def _parts(layouts: Sequence[KeyLayout]) -> dict[int, Part]:
        return {key: Part(lay.plain_index, a, b, lay.generation)
                for lay in layouts for key, (a, b) in zip(lay.server_keys, lay.ranges)}

    # -- task completion ----------------------------------------------------------------------
    def _forget(self, task: KVCommTask) -> None:
        with self._lock:
            self._tasks.pop(task.token, None)
            self._lock.notify_all()

    def _failed(self, task: KVCommTask, error: BaseException) -> None:
        log.error("communication of %r failed: %s", task, error)
        with self._lock:
            self._tasks.pop(task.token, None)
            self._lost(error)  # under the same hold of the lock: no waiter sees the task gone but no error

    def _check_healthy(self) -> None:
        if self._closed:
            raise RuntimeError("this ScheduledKVStore was closed")
        if self._error is not None:
            raise RuntimeError(f"bytesched communication failed earlier: {self._error}") from self._error

    def wait_idle(self, timeout: float | None = None) -> None:
        """Block until every submitted push/pull has finished (a TimeoutError after ``timeout``;
        not while passing through, where the engine's own wait has no bound, and where a push
        alone is not waited for: it only reads its arrays).

        Passing through, it waits for the writes pending on each key's last pull destinations (a
        pushpull repeated with the same objects writes the same arrays, so they stay listed), not
        on the pushed gradients: at a step boundary the next step's backward pass, already posted,
        writes those, and waiting for it held each step's pushes back until that backward pass
        had ended, so that a plan trial timed its steps passing through too long and kept sizes
        that then lost to the plain store (docs/experiments/plan-trial.md). A pushpull in place
        (no ``out``, as where the servers do not update) pulls into the gradients themselves, so
        there the wait still lasts that long."""
        for arrays in self._passed.values():  # passing through: the engine knows what is pending
            for array in arrays:
                array.wait_to_read()
        with self._lock:
            if not self._lock.wait_for(lambda: not self._tasks or self._error is not None, timeout):
                raise TimeoutError(f"{len(self._tasks)} bytesched KVStore tasks still unfinished after {timeout} s")
        self._check_healthy()

    def close(self, timeout: float = 30.0) -> None:
        """Finish outstanding communication (idempotent). :func:`bytesched.runtime.shutdown` (at
        the end of a ``running()`` block, or at interpreter exit) closes a store still open,
        then releases the proxies, stops the Core and closes the rank-0 channel."""
        if self._closed:
            return
        try:
            if self._core.running and self._error is None:
                self.wait_idle(timeout)
        except (TimeoutError, RuntimeError) as error:
            log.error("closing the ScheduledKVStore: %s", error)
        finally:
            self._closed = True
            if self._watch is not None:
                self._watch.stop()
            self._stop_listening()
            untrack(self)

    def _lost(self, error: BaseException) -> None:
        """Communication failed (a task's, or the rank-0 channel lost a worker): the next push, pull
        or wait raises ``error``."""
        with self._lock:
            self._error = self._error or error
            self._lock.notify_all()

    # -- argument handling --------------------------------------------------------------------
    @staticmethod
    def _pairs(key: Any, value: Any) -> list[tuple[UserKey, Arrays]]:
        """MXNet's key/value forms as (key, [array per device]) pairs."""
        if isinstance(key, (list, tuple)):
            if not isinstance(value, (list, tuple)) or len(value) != len(key):
                raise ValueError(f"{len(key)} keys need a list of {len(key)} values")
            return [(k, [v] if isinstance(v, mx.nd.NDArray) else list(v)) for k, v in zip(key, value)]
        return [(key, [value] if isinstance(value, mx.nd.NDArray) else list(value))]

    @classmethod
    def _check_layout(cls, user_key: UserKey, layout: KeyLayout, array: mx.nd.NDArray) -> None:
        cls._check_dense(user_key, array)
        if array.size != layout.numel or np.dtype(array.dtype).name != layout.dtype:
            raise ValueError(f"key {user_key!r}: array of shape {array.shape} and type "
                             f"{np.dtype(array.dtype).name} does not match the initialised "
                             f"{layout.shape} {layout.dtype}")

    @staticmethod
    def _check_type(user_key: UserKey, array: mx.nd.NDArray) -> None:
        if not isinstance(array, mx.nd.NDArray):
            raise TypeError(f"key {user_key!r}: expected an NDArray, got {type(array).__name__}")

    @classmethod
    def _check_dense(cls, user_key: UserKey, array: mx.nd.NDArray) -> None:
        cls._check_type(user_key, array)
        if array.stype != "default":
            raise NotImplementedError(f"key {user_key!r}: {array.stype} arrays are not supported by "
                                      "ScheduledKVStore (dense tensors only)")
