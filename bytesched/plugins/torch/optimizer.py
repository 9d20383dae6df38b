"""ScheduledOptimizer: the two-line way to schedule a PyTorch job's gradient communication.

    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    optimizer = ScheduledOptimizer(model, optimizer)

Each gradient becomes a CommTask the moment backward finishes accumulating it; the Core
partitions it and releases the partitions by priority under the credit window. ``step()`` returns
at once (crossing the barrier): each parameter is updated by the user's own optimizer as soon as
its all-reduce completes, and a forward proxy holds a module's forward until the parameters it
reads are updated. The object keeps the ``torch.optim`` API, so LR schedulers, checkpoints and
``zero_grad`` work as before; ``cross_barrier=False`` keeps the scheduling but waits in ``step()``.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
import weakref
from typing import Any, Callable, Iterator

import torch
from torch import nn

from bytesched.core import Config, Core, SchedulingParams, from_env
from bytesched.core.config import SCHEDULING_OFF, configure_logging, format_size
from bytesched.core.forward import ForwardRecorder
from bytesched.core.timeline import ChromeTimeline
from bytesched.runtime import (PASS_THROUGH_MARGIN, Observer, Path, PathAdapter, StallWatch, Startup,
                               StartupController, StartupPlan, TuningWarmStart, announce, channel_of,
                               on_channel_failure, order_by_graph, start_core, stay_out_fusion, track, untrack,
                               wants_plan, wants_trial, wants_warm_start)
from bytesched.tuning import TuningSession, make_session

from .backend import Backend
from .backends import make_backend
from .consistency import check_same_parameters, make_check
from .fusion import agree_on_buckets
from .passthrough import PassThrough
from .pipeline import UpdatePipeline
from .proxies import ForwardProxies
from .slots import BARRIER_MODE, ESCAPE_HATCH, BarrierCrossingError, ParamSlot
from .timeline import StepTimeline
from .trace import ForwardTrace
from .updates import PartialStep, hyperparameters

log = logging.getLogger("bytesched")

_live: "weakref.WeakSet[ScheduledOptimizer]" = weakref.WeakSet()  # the open ones
_sized_cores: "weakref.WeakSet[Core]" = weakref.WeakSet()  # Cores whose sizes a plan or a tuning session drives
# The fusion bound a Core's start-up plan chose: every ScheduledOptimizer on that Core fuses its
# buckets up to it at its next step boundary (unless its job fixed the bound).
_planned_fusion: "weakref.WeakKeyDictionary[Core, float]" = weakref.WeakKeyDictionary()


class ScheduledOptimizer(torch.optim.Optimizer, PathAdapter):
    """Wraps ``optimizer`` so that ``model``'s gradient all-reduces are scheduled by bytesched.

    Args:
        model: the module whose forward pass reads the parameters (proxies hook its modules).
        optimizer: a ``hvd.DistributedOptimizer`` (Horovod backend; its op, compression,
            gradient_predivide_factor, backward_passes_per_step and process_set are honoured), or
            a plain ``torch.optim`` optimizer when torch.distributed is initialised (gradients are
            averaged over the process group, as DDP does).
        cross_barrier: True (default): ``step()`` returns at once and updates land per parameter.
            False (barrier mode): communication is still ordered and partitioned, but backward()
            returns only once it finished (as with DDP) and ``step()`` runs ``optimizer.step()``;
            for closures (LBFGS), and for clipping or AMP without ``synchronize()``.
        config: scheduling settings; default :func:`bytesched.core.from_env` (``BYTESCHED_*``).
        process_group: torch.distributed group to reduce over (default: the whole world).
        backward_passes_per_step: torch.distributed only: backward passes accumulated per step
            (Horovod's comes from its DistributedOptimizer).
        samples_per_step: samples one ``step()`` trains on (e.g. the global batch size); only
            read by tuning (``BYTESCHED_TUNING``), whose log then reads in samples/s instead of
            steps/s. Tuning compares trials of the same job, so any constant works.
    """

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, *, cross_barrier: bool = True,
                 config: Config | None = None, process_group: Any = None,
                 backward_passes_per_step: int | None = None, samples_per_step: float = 1.0) -> None:
        _check_arguments(model, optimizer, cross_barrier)
        if not 0 < samples_per_step < float("inf"):
            raise ValueError(f"ScheduledOptimizer: samples_per_step must be a positive number, "
                             f"got {samples_per_step!r}")
        backend = make_backend(optimizer, process_group)
        passes = _passes_per_step(backend, backward_passes_per_step)
        config = from_env() if config is None else config
        configure_logging(config)
        slots = _make_slots(model, optimizer)
        # Collectives: every rank creates its ScheduledOptimizers in the same order.
        check_same_parameters(backend, slots)
        buckets = agree_on_buckets(backend, slots, config.fusion_bytes)
        self._inner = optimizer
        self._backend = backend
        self._cross_barrier = cross_barrier
        self._plain_step = backend.step_function(optimizer)
        self._core = start_core(config, backend)
        self._stop_polling = self._core.poll_completions(backend.completions) \
            if backend.completions is not None else None
        _check_one_path(self._core, backend, passing=not config.scheduling)
        self._pipeline = UpdatePipeline(slots, buckets, config.fusion_bytes, backend, self._core,
                                        PartialStep(optimizer, self._plain_step), passes)
        sink = self._core.timeline
        self._timeline = StepTimeline(sink) if isinstance(sink, ChromeTimeline) else None
        # Under tictac the trace also records which functions use which results: TicTac's graph.
        self._recorder = ForwardRecorder() if config.policy == "tictac" else None
        self._proxies = ForwardProxies(model, slots, self._pipeline,
                                       ForwardTrace((slot.param for slot in slots), self._recorder),
                                       on_wait=None if self._timeline is None else self._timeline.forward_wait,
                                       on_settle=self._order_settled, piece_bytes=config.piece_bytes,
                                       on_hidden=self._forward_hidden)
        self._ready_hooks = [slot.param.register_post_accumulate_grad_hook(self._ready_proxy(slot))
                             for slot in slots]
        self._hooks = []
        if self._timeline is not None:
            self._hooks += self._timeline.hook(model)
        for module in model.modules():
            self._hooks.append(module.register_state_dict_pre_hook(self._flush_before_state_dict))
            self._hooks.append(module.register_load_state_dict_pre_hook(self._flush_before_load))
        self._stop_listening = on_channel_failure(self._pipeline.fail)
        self._check = make_check(config.check_every, backend, slots, self._pipeline.wait_applied)
        self._steps = 0  # step boundaries passed; the first is at construction, before step 0
        self._fusion_follows_plan = not config.fusion_fixed
        self._samples_per_step = samples_per_step
        self._passes_per_step = passes
        self._passing: PassThrough | None = None  # the library's own path, while the start-up takes it
        self._sequenced = False  # this optimizer switched its Core to its buckets' sequence
        model_bytes = sum(slot.param.numel() * slot.param.element_size() for slot in slots)
        device = slots[0].param.device
        warm = self._observer(TuningWarmStart, backend, model_bytes, device) \
            if wants_warm_start(config, backend.size) and self._core not in _sized_cores else None
        self._startup = Startup(self, StartupController(scheduling=config.scheduling,
                                                        measures_paths=_measures_paths(config)),
                                tuning=self._start_tuning(config, backend, model_bytes, warm),
                                planning=warm or self._start_plan(config, backend, model_bytes, device))
        self._step_boundary()  # the opening sizes, before any CommTask exists
        # Scheduling off: as a plan that stays out, passing through in the buckets it would fuse.
        self._startup.opening(None if backend.fuses_by_itself else
                              _stay_out_bound(config, device, backend, model_bytes))
        self._closed = False
        self._waiting_for_backward = False
        # Optimizer.__setstate__ is how the base class initialises its hook tables on an object
        # whose groups and state already exist (unpickling); ours are the wrapped optimizer's.
        torch.optim.Optimizer.__setstate__(self, {})
        _live.add(self)
        track(self)  # closed by bytesched.runtime.shutdown (at exit at the latest), before the Core stops

    # -- the torch.optim API ------------------------------------------------------------------
    @property
    def param_groups(self) -> list[dict[str, Any]]:
        """The wrapped optimizer's groups (an LR scheduler changes them there)."""
        return self._inner.param_groups

    @param_groups.setter
    def param_groups(self, groups: list[dict[str, Any]]) -> None:
        self._inner.param_groups = groups

    @property
    def state(self) -> Any:
        """The wrapped optimizer's per-parameter state."""
        return self._inner.state

    @state.setter
    def state(self, state: Any) -> None:
        self._inner.state = state

    @property
    def defaults(self) -> dict[str, Any]:
        """The wrapped optimizer's defaults."""
        return self._inner.defaults

    @defaults.setter
    def defaults(self, defaults: dict[str, Any]) -> None:
        self._inner.defaults = defaults

    @torch.compiler.disable
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """Crossing the barrier: release this iteration's updates and return at once (no closure).
        Barrier mode, or passing through: wait for every all-reduce, then run the wrapped
        optimizer's step."""
        self._check_open()
        result = self._scheduled_step(closure) if self._passing is None else self._passing.step(closure)
        if self._startup.active or self._fusion_due():
            self._step_boundary()
        if self._check is not None:
            self._check.after_step()
        if self._timeline is not None:
            self._timeline.step_end()
        return result

    @torch.compiler.disable
    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear gradients; one whose update is still pending is cleared right after the update."""
        self._check_open()
        if self._passing is None:
            self._pipeline.zero_grad(set_to_none)
        else:
            self._passing.zero_grad(set_to_none)

    @torch.compiler.disable
    def synchronize(self) -> None:
        """Wait until communication and updates have landed.

        After a backward pass and before ``step()`` (Horovod's rule for gradient clipping and AMP
        unscaling), this all-reduces every gradient and waits: the gradients may then be read and
        modified, and ``step()`` applies them as they are. At any other time it waits until every
        update released by ``step()`` has been applied, so parameters can be read directly.
        """
        self._check_open()
        if self._passing is not None:
            self._passing.synchronize()
            return
        if self._pipeline.round_open:
            self._pipeline.reduce_all()
        self._pipeline.wait_applied()

    @contextlib.contextmanager
    def skip_synchronize(self) -> Iterator[None]:
        """Horovod's idiom ``synchronize(); clip; with skip_synchronize(): step()`` keeps working:
        step() never re-synchronizes, so this context has nothing to switch off."""
        yield

    @torch.compiler.disable
    def state_dict(self) -> dict[str, Any]:
        """The wrapped optimizer's state dict, once every pending update has been applied (the
        same format as without bytesched, so checkpoints are interchangeable)."""
        self._pipeline.wait_applied()
        return self._inner.state_dict()

    @torch.compiler.disable
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load into the wrapped optimizer, once every pending update has been applied."""
        self._pipeline.wait_applied()
        self._inner.load_state_dict(state_dict)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Not supported after wrapping: the new parameters would have no proxies."""
        raise NotImplementedError("add parameter groups to the optimizer before wrapping it in "
                                  "ScheduledOptimizer (and hvd.DistributedOptimizer)")

    # -- bytesched's own (and PathAdapter's plan, passes_through, settled, ...) ------------------
    @property
    def graph_pieces(self) -> list[int]:
        """How many pieces each graph compiled so far for the model's forward pass was split into
        (:mod:`.compiled`; empty while the model was not compiled)."""
        return [count for pieces in self._proxies.pieces for count in pieces.pieces]

    @property
    def core(self) -> Core:
        """The bytesched Core scheduling this optimizer's communication."""
        return self._core

    @torch.compiler.disable
    def close(self, timeout: float = 60.0) -> None:
        """Let pending communication and updates land (up to ``timeout`` s), then remove the hooks
        and stop the threads. :func:`bytesched.runtime.shutdown` (at the end of a ``running()``
        block, or at interpreter exit) closes optimizers still open."""
        if self._closed:
            return
        if not self._pipeline.wait_idle(timeout):
            log.error("bytesched: updates still pending after %.0f s at close(); a peer may have "
                      "stopped (parameters may miss their last update)", timeout)
        self._closed = True
        if self._sequenced and self._core.running:
            self._core.restore_order()  # the sequence names this optimizer's buckets only
        self._stop_listening()
        if self._passing is not None:
            self._passing.close()
        for hook in self._ready_hooks + self._hooks:
            hook.remove()
        self._proxies.close()
        self._pipeline.close()
        if self._stop_polling is not None:
            self._stop_polling()
        _live.discard(self)
        untrack(self)

    # -- internals ----------------------------------------------------------------------------
    @property
    def _step_supports_amp_scaling(self) -> bool:
        """AMP's ``GradScaler.step()`` asks this before it unscales the gradients in place (an
        operation that leaves no other trace: it does not bump their version counters), so this
        is where AMP is refused while its gradients are still being all-reduced. False: the
        scaler then unscales and steps as usual."""
        pipeline = self._pipeline
        if self._passing is not None:
            in_flight = self._passing.in_flight
        else:
            in_flight = self._cross_barrier and pipeline.round_open and not pipeline.round_synchronized
        if in_flight:
            raise BarrierCrossingError("AMP's GradScaler unscales gradients between backward() and step(), "
                                       "while bytesched is still all-reducing them; " + ESCAPE_HATCH)
        return False

    def _start_tuning(self, config: Config, backend: Backend, model_bytes: int,
                      warm: TuningWarmStart | None) -> TuningSession | None:
        """The tuning session driving this Core's sizes (None when tuning is off), searching a
        lattice fitted to the ``model_bytes`` of gradients this optimizer reduces (and the
        batching threshold where the backend batches), its first points predicted from
        ``warm``'s measurements if given. Only the first optimizer on a Core tunes (a GAN's second
        one shares the Core, so it runs on the sizes the first one picks)."""
        if (config.tuning or config.tuning_load) and self._core in _sized_cores:
            log.info("bytesched tuning: another ScheduledOptimizer of this process already tunes the Core's "
                     "sizes; this one uses them")
            return None
        session = make_session(config, rank=backend.rank, world_size=backend.size, channel=channel_of(self._core),
                               arch="allreduce", model_bytes=model_bytes, warm_start=warm,
                               batches=backend.batches, fuses_submitted=backend.fuses_by_itself)
        if session is not None:
            _sized_cores.add(self._core)
        return session

    def _start_plan(self, config: Config, backend: Backend, model_bytes: int,
                    device: torch.device) -> StartupPlan | None:
        """The start-up plan of this Core's sizes (None when the job sets them, tunes them, or
        another optimizer of this process already plans them)."""
        if not wants_plan(config, backend.size) or self._core in _sized_cores:
            return None
        _sized_cores.add(self._core)
        announced_on_cpu = backend.order == "rank0" and device.type != "cuda"
        tries_sizes = wants_trial(config, "allreduce", announced_on_cpu) and \
            (backend.order != "rank0" or self._alone_on_core())
        return self._observer(StartupPlan, backend, model_bytes, device,
                              stay_out_bound=_stay_out_bound(config, device, backend, model_bytes),
                              weighs_fusion=_weighs_fusion(device), batches=backend.batches,
                              pass_through_margin=_pass_through_margin(config, device), tries_sizes=tries_sizes)

    def _observer(self, kind: type[Observer], backend: Backend, model_bytes: int, device: torch.device,
                  **options: Any) -> Observer:
        """A start-up plan or tuning warm start observing this optimizer's steps, timing the
        backend's all-reduce on ``device``."""
        return kind(self._core, backend, lambda nbytes: backend.operation(nbytes, device), arch="allreduce",
                    model_bytes=model_bytes, drain=self._pipeline.wait_applied,
                    fuses_submitted=backend.fuses_by_itself, **options)

    def _step_boundary(self) -> None:
        """Step ``self._steps`` is about to begin: apply what the start-up switches to now
        (:mod:`bytesched.runtime.path`), and fuse this optimizer's buckets if its Core's plan chose
        a bound they do not have yet.

        Called at the end of ``step()`` (and once at construction), when every CommTask of the
        step that ended has been enqueued (``release``/``reduce_all`` enqueue those backward
        left out) and none of the next step's has: its gradients become ready only in the next
        backward pass, and ``set_params`` is an event the Core handles in order with the
        enqueues. So the same step's tasks are partitioned alike on every rank, in crossing and
        in barrier mode. A follower waits here (bounded) for a switch that is late."""
        step = self._steps
        self._steps += 1
        self._startup.on_step(step, samples=self._samples_per_step, now=time.monotonic())
        if self._fusion_due():
            self._fuse_buckets(_planned_fusion[self._core])

    # -- the start-up's adapter (PathAdapter's hooks) -----------------------------------------
    def _apply_sizes(self, params: SchedulingParams) -> None:
        self._core.set_params(params)

    def _switch_path(self, path: Path, reason: str) -> None:
        if path is Path.PASS_THROUGH:
            self._pass_through(reason)
        elif self._passing is not None:
            self._return_to_core()

    def _may_pass_through(self) -> bool:
        """Over a backend that needs one collective order on every rank, only an optimizer alone on
        its Core (:meth:`_alone_on_core`)."""
        return self._backend.order != "rank0" or self._alone_on_core()

    def _sequences(self) -> bool:
        """Over torch.distributed, an optimizer alone on its Core: the merged buckets' sequence."""
        return self._core.order == "rank0" and self._alone_on_core()

    def _fuse(self, fusion_bytes: float, temporary: bool) -> None:
        if temporary:  # a plan trial's steps staying out, as a plan that stays out fuses
            if self._fusion_follows_plan:
                self._fuse_buckets(fusion_bytes)
            return
        _planned_fusion[self._core] = fusion_bytes
        if self._fusion_due():
            self._fuse_buckets(fusion_bytes)

    def _unfuse(self) -> None:
        if self._pipeline.fused:  # the sizes' own buckets, as they were before the trial fused them
            self._pipeline.unfuse()

    def _start_in_sequence(self) -> None:
        self._core.start_in_sequence(self._pipeline.sequence())
        self._sequenced = True

    def _gather_medians(self, medians: tuple[float, float]) -> list[list[float]]:
        """Every rank's pair of medians (ms), gathered as microseconds (the backend gathers
        integers). Called with nothing in flight: the trial decides while passing through, whose
        step() waits for every collective."""
        local = torch.tensor([round(value * 1e3) for value in medians], dtype=torch.int64)
        return [[value / 1e3 for value in row] for row in self._backend.all_gather(local).tolist()]

    def _return_to_core(self) -> None:
        """A trial kept the Core: drop the library's path, hook the Core's back on."""
        assert self._passing is not None
        self._passing.close()
        self._passing = None
        self._ready_hooks = [slot.param.register_post_accumulate_grad_hook(self._ready_proxy(slot))
                             for slot in self._pipeline.slots]
        self._proxies.restore()

    def _fusion_due(self) -> bool:
        """The Core's plan chose a fusion bound this optimizer's buckets do not have yet."""
        bound = self._pipeline.fusion_bytes
        return self._fusion_follows_plan and _planned_fusion.get(self._core, bound) != bound

    def _fuse_buckets(self, fusion_bytes: float) -> None:
        """Merge this optimizer's buckets into tasks filled to ``fusion_bytes``, once its updates have landed.
        Every rank does so at the same step: the plan's step for the optimizer that planned, the
        next one for others on the Core (every rank runs its optimizers' steps in the same order)."""
        self._pipeline.wait_applied()
        before = len(self._pipeline.buckets)
        self._pipeline.fuse(fusion_bytes)
        log.debug("bytesched: %d buckets fused into %d, each filled to %s", before, len(self._pipeline.buckets),
                  format_size(fusion_bytes))

    def _alone_on_core(self) -> bool:
        """No other open ScheduledOptimizer shares this one's Core. Staying out on a backend that
        needs one collective order on every rank (torch.distributed), this optimizer's buckets
        may then go in their backward order, as DDP's do, instead of rank 0's announced one:
        passing through, or through the Core in a sequence every rank knows (a sequence covers
        the tasks it knows; another optimizer's collectives could interleave differently on each
        rank)."""
        return not any(other is not self and other._core is self._core for other in _live)

    def _pass_through(self, reason: str) -> None:
        """The plan stayed out, or scheduling is off: once this step's updates landed, hand the
        gradients to the library's own path (:mod:`.passthrough`) and drop the hooks of the
        Core's path."""
        self._pipeline.wait_applied()
        for hook in self._ready_hooks:
            hook.remove()
        self._ready_hooks = []
        self._proxies.remove()
        self._passing = self._backend.pass_through(self._inner, self._pipeline.slots, self._pipeline.buckets,
                                                   self._plain_step, self._passes_per_step,
                                                   barrier=not self._cross_barrier,
                                                   watch=StallWatch(self._core.config, self._backend.rank),
                                                   first_step=self._steps - 1)
        log.info("bytesched: %s; from step %d on, gradients take %s's own path", reason, self._steps - 1,
                 self._backend.name)

    def _forward_hidden(self) -> None:
        """The model's forward pass runs inside a graph compiled outside any compiled module of the
        model (``torch.compile`` of the whole training step), where no forward proxy can hold it:
        from now on the barrier is not crossed (barrier mode), and the pending updates land
        before that graph runs (Dynamo is tracing it now)."""
        if self._cross_barrier:
            log.info("bytesched: the model's forward pass is compiled outside the model's modules (torch.compile "
                     "of the training step?), where it cannot wait for updates: barrier mode from now on "
                     "(compile the model itself, torch.compile(model), to cross the barrier)")
            self._cross_barrier = False
        self._pipeline.wait_applied()

    def _order_settled(self, read: list[ParamSlot], unread: list[ParamSlot]) -> None:
        """The first forward pass gave the priorities: say so once and, under ``tictac``, hand
        the Core the traced pass, each parameter brought by its bucket's task, as TicTac's
        graph (:mod:`bytesched.runtime.forward_order`)."""
        announce(self._core, [slot.name for slot in read], [slot.name for slot in unread], traced=True)
        if self._recorder is not None:
            forward, self._recorder = self._recorder.finish(), None
            order_by_graph(self._core, forward, {id(slot.param): [slot.bucket.name] for slot in self._pipeline.slots})

    def _ready_proxy(self, slot: ParamSlot) -> Callable[[torch.Tensor], None]:
        timeline = self._timeline

        def ready(param: torch.Tensor) -> None:
            if timeline is not None:
                timeline.gradient_ready()
            self._proxies.settle()  # before the first task: it needs its priority
            self._pipeline.gradient_ready(slot)
            if not self._cross_barrier and not self._waiting_for_backward:
                self._waiting_for_backward = True
                # Runs when this backward pass ends, like DDP's wait for its buckets (DDP and FSDP
                # use the same engine call).
                torch.autograd.Variable._execution_engine.queue_callback(self._end_of_backward)
        return ready

    def _end_of_backward(self) -> None:
        """Barrier mode: backward() returns with this iteration's gradients reduced, so code
        between backward and step (clipping, AMP unscaling) sees final gradients."""
        self._waiting_for_backward = False
        if self._pipeline.round_started:
            self._pipeline.reduce_all()

    def _scheduled_step(self, closure: Callable[[], Any] | None) -> Any:
        """step() on the Core's path."""
        self._proxies.settle()
        self._backend.check_idle()
        if not self._cross_barrier:
            return self._step_at_barrier(closure)
        if closure is not None:
            raise BarrierCrossingError("step(closure) re-evaluates the model inside step(), so step() "
                                       "cannot return before the gradients are reduced; " + BARRIER_MODE)
        self._pipeline.release(hyperparameters(self._inner))
        return None

    def _step_at_barrier(self, closure: Callable[[], Any] | None) -> Any:
        self._waiting_for_backward = False  # in case a backward pass raised before its callback ran
        if closure is None:
            self._pipeline.reduce_all()
            self._pipeline.discard_round()
            return self._plain_step(self._inner)

        def reduced_closure() -> Any:
            loss = closure()
            self._pipeline.reduce_all()
            self._pipeline.discard_round()
            return loss

        return self._plain_step(self._inner, reduced_closure)

    def _flush_before_state_dict(self, module: nn.Module, prefix: str, keep_vars: bool) -> None:
        self._pipeline.wait_applied()

    def _flush_before_load(self, module: nn.Module, *args: Any) -> None:
        self._pipeline.wait_applied()

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("this ScheduledOptimizer was closed")


def _check_arguments(model: nn.Module, optimizer: torch.optim.Optimizer, cross_barrier: bool) -> None:
    if not isinstance(model, nn.Module):
        raise TypeError(f"ScheduledOptimizer(model, optimizer): model must be a torch.nn.Module, "
                        f"got {type(model).__name__}")
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"ScheduledOptimizer(model, optimizer): optimizer must be a torch.optim.Optimizer, "
                        f"got {type(optimizer).__name__}")
    if isinstance(optimizer, ScheduledOptimizer):
        raise TypeError("the optimizer is already a ScheduledOptimizer")
    if isinstance(model, nn.parallel.DistributedDataParallel):
        raise TypeError("the model is wrapped in DistributedDataParallel, which all-reduces gradients "
                        "itself; pass the plain model to ScheduledOptimizer instead of DDP")
    if cross_barrier and isinstance(optimizer, torch.optim.LBFGS):
        raise BarrierCrossingError("LBFGS evaluates a closure inside step(), so its step cannot cross "
                                   "the barrier; " + BARRIER_MODE)


def _check_one_path(core: Core, backend: Backend, passing: bool) -> None:
    """Over a backend that needs one collective order on every rank, an optimizer that passes
    through issues its collectives in backward's order, one on the Core in rank 0's announced
    order: on one Core the two would interleave differently on each rank. Refuse a new optimizer
    whose path differs from one already open on ``core``."""
    if backend.order != "rank0":
        return
    if passing and any(other._core is core and not other.passes_through for other in _live):
        raise RuntimeError(f"{SCHEDULING_OFF} for this ScheduledOptimizer, but another one on its bytesched "
                           "Core sends its gradients through the Core in rank 0's order, which this one's "
                           "collectives would interleave with: give every optimizer the same policy")
    if not passing and any(other._core is core and other.passes_through for other in _live):
        raise RuntimeError("another ScheduledOptimizer on this bytesched Core passes its gradients to "
                           f"{backend.name} in its own order (its start-up plan stayed out of the way, or "
                           "scheduling is off for it), which this one's collectives would interleave with: "
                           "create every ScheduledOptimizer before the first step, close that one first, or set "
                           "BYTESCHED_PLAN=0")


def _stay_out_bound(config: Config, device: torch.device, backend: Backend, model_bytes: int) -> int | None:
    """The fusion bound this optimizer's buckets take where it stays out of the way, unless the job
    set one (None: they stay as they are): on a GPU, and wherever passing through all-reduces
    bytesched's buckets (torch.distributed), ``BYTESCHED_STAY_OUT_FUSION_BYTES``
    (:func:`bytesched.runtime.startup_plan.stay_out_fusion`). On a GPU bytesched's work per task
    competes with the training thread's kernel launches; over torch.distributed each bucket is
    one Gloo collective, whose CPU fewer buckets save; over Horovod on the CPU, which fuses by
    itself, the path trial kept the Core's 1 MB tasks. Figures: docs/plan.md, "2 on"."""
    if config.fusion_fixed or (device.type != "cuda" and backend.fuses_by_itself):
        return None
    return stay_out_fusion(model_bytes, config.fusion_bytes, config.stay_out_fusion_bytes)


def _weighs_fusion(device: torch.device) -> bool:
    """A plan that stays out fuses the buckets only where the simulator predicts the observed step
    no slower in the fused ones (:func:`bytesched.sim.plan.fusion_pays`): on the CPU, where larger
    buckets save Gloo's CPU per collective but start communicating later. On a GPU, always: there
    bytesched's work per task competes with the training thread's kernel launches, which the
    simulator does not model. Figures: docs/plan.md, "2 on"."""
    return device.type != "cuda"


def _measures_paths(config: Config) -> bool:
    """A plan that stays out times the Core's path against the library's own before it keeps one
    (:mod:`bytesched.runtime.path_trial`) unless the job asked to predict: neither path won
    everywhere it was measured, and the simulator models neither bytesched's work per gradient
    nor how the framework's own wait for its all-reduces spends the CPU (figures:
    docs/plugins/torch.md, "When the plan stays out"; docs/experiments/gpu.md,
    docs/experiments/pytorch-stay-out.md)."""
    return config.stay_out_path != "predict"


def _pass_through_margin(config: Config, device: torch.device) -> float:
    """How much the best sized plan must be predicted to gain for a plan that stays out to stay
    on bytesched's path without passing through, or, measuring, without timing both paths:
    measuring, never (the trial decides); predicting on a GPU, never: there staying out through
    the Core did not win back its work per gradient even where sizes were predicted to gain.
    Predicting where the CPU also computes, the Core's crossing of the barrier was measured to pay
    (:data:`~bytesched.sim.plan.PASS_THROUGH_MARGIN`; figures: docs/experiments/gpu.md)."""
    return math.inf if device.type == "cuda" or _measures_paths(config) else PASS_THROUGH_MARGIN


def _passes_per_step(backend: Backend, given: int | None) -> int:
    own = backend.passes_per_step
    if own is not None and given is not None:
        raise ValueError(f"backward_passes_per_step comes from the {backend.name} optimizer; do not pass it "
                         f"to ScheduledOptimizer too")
    passes = own if own is not None else (1 if given is None else given)
    if passes < 1:
        raise ValueError(f"backward_passes_per_step must be >= 1, got {passes}")
    return passes


def _make_slots(model: nn.Module, optimizer: torch.optim.Optimizer) -> list[ParamSlot]:
    """One slot per trainable parameter of the optimizer, named as in the model."""
    names = {id(p): name for name, p in model.named_parameters()}
    slots: list[ParamSlot] = []
    for index, group in enumerate(optimizer.param_groups):
        for param in group["params"]:
            if not param.requires_grad:
                continue
            if id(param) not in names:
                raise ValueError(f"a parameter of shape {tuple(param.shape)} in param_groups[{index}] is "
                                 f"not a parameter of the model given to ScheduledOptimizer")
            slots.append(ParamSlot(names[id(param)], param, index, priority=len(slots)))
    if not slots:
        raise ValueError("the optimizer has no trainable parameters (requires_grad=True)")
    return slots
