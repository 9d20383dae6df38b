"""Each parameter's way from gradient to update: the state behind crossing the barrier.

A parameter's gradient of one iteration goes through four events:

1. *ready*: backward finished accumulating it (the ready proxy fires); once every gradient of
   its :class:`~.fusion.Bucket` is ready, the bucket's :class:`GradientTask` is enqueued to the
   Core, which partitions, orders and starts its all-reduce;
2. *reduced*: every partition finished and the backend finalised the gradients (on the update
   thread, so the Core thread never does tensor work);
3. *released*: the user called ``step()``: the group's hyperparameters are snapshotted, and the
   parameter becomes *stale* (its ``fresh`` event is cleared) until
4. *applied*: the update thread ran the user's optimizer on this parameter.

Reduced and released may come in either order; the second one queues the update (the
decisions of one bucket's cycle are the pure state machine :class:`~.cycle.UpdateCycle`). The update
thread takes every job queued so far at once and applies the due updates of one parameter group
in one optimizer call (at ``step()`` most gradients are usually reduced already). Forward proxies
wait for ``fresh`` before a module reads the parameter. A gradient modified in place while
bytesched owns it (e.g. clipped between backward and step) is caught by its version counter and
fails with :class:`BarrierCrossingError`, which names the ways out. Only the user's writes are
seen: the backend writes into the task's wire buffer, whose version counter is its own.

On CUDA every hand-over between threads is ordered on the streams by a mark (:mod:`.streams`): the
Core thread's collectives wait for the ready mark, finalising waits for the completion marks, the
training thread waits for the reduced mark (barrier mode, ``synchronize()``) and, before a module
reads a parameter, for the mark its update left.
"""

from __future__ import annotations

import logging
import math
import queue
import threading
import time
from typing import Any, Callable, Iterable

import torch

from bytesched.core import Core
from bytesched.core.channel import ChannelError

from . import streams
from .backend import Backend
from .fusion import Bucket, backward_order, merge_buckets
from .native import NativeCore, UpdateJobs
from .slots import (ESCAPE_HATCH, ZERO_GRAD_IN_FLIGHT, BarrierCrossingError, ParamSlot, clear_grad, computed_again,
                    dense_grad, modified_while_reducing)
from .task import GradientTask
from .updates import PartialStep

log = logging.getLogger("bytesched")


class UpdatePipeline:
    """Moves gradients from ready to applied; one update thread does all tensor work.

    Thread use: the ready proxy (autograd), the Core thread (``on_finish``), completion callbacks
    (failures), the update thread and the training thread all come here; every state change is
    made under one lock, and waits sleep on events or a condition.
    """

    def __init__(self, slots: list[ParamSlot], buckets: list[Bucket], fusion_bytes: float, backend: Backend,
                 core: Core, apply_update: PartialStep, backward_passes_per_step: int) -> None:
        self.slots = slots
        self.buckets = buckets
        self.fusion_bytes = fusion_bytes
        """The bound ``buckets`` were fused under."""
        self._unfused: tuple[list[list[ParamSlot]], float] | None = None  # the layout and bound before fuse()
        self._backend = backend
        self._core = core
        self._apply_update = apply_update
        self._passes_per_step = backward_passes_per_step
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._round: list[GradientTask] = []  # tasks created since the last step()
        self._round_open = False  # a backward pass happened since the last step()
        self._unreduced = 0
        self._unapplied = 0
        self._failure: BaseException | None = None
        # Bound once for every task: a bound method made per task lives as long as the task, and
        # Python's cyclic garbage collector counts what lives across a step (see GradientTask).
        self._on_communicated = self._communicated
        self._on_failed = self.fail
        # A job returns the tasks it made due for their update (the update thread applies them).
        # On the native Core the queue also carries its completed tasks (native.UpdateJobs).
        self._jobs: queue.SimpleQueue[Callable[[], list[GradientTask]] | None] | UpdateJobs = \
            core.update_jobs() if isinstance(core, NativeCore) else queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run_jobs, name="bytesched-updates", daemon=True)
        self._thread.start()

    def sequence(self) -> list[str]:
        """The buckets' task names in backward's order (:func:`~.fusion.backward_order`)."""
        return [bucket.name for bucket in backward_order(self.buckets)]

    def fuse(self, fusion_bytes: float) -> None:
        """Merge consecutive buckets into tasks filled to ``fusion_bytes`` (a plan's word, at a step
        boundary once every update has been applied: no bucket may have a task then)."""
        with self._lock:
            self._check_between_steps()
            if self._unfused is None:
                self._unfused = ([bucket.slots for bucket in self.buckets], self.fusion_bytes)
            self.buckets = merge_buckets(self.buckets, fusion_bytes)
            self.fusion_bytes = fusion_bytes

    @property
    def fused(self) -> bool:
        """:meth:`fuse` merged the buckets since they were laid out (or last unfused)."""
        return self._unfused is not None

    def unfuse(self) -> None:
        """The buckets and their bound as they were before the first :meth:`fuse` (a plan trial
        that kept its sizes, once its steps passing through had fused them; between steps, as
        :meth:`fuse`)."""
        with self._lock:
            self._check_between_steps()
            if self._unfused is None:
                raise RuntimeError("unfuse: the buckets were not fused")
            (layout, self.fusion_bytes), self._unfused = self._unfused, None
            self.buckets = [Bucket(slots) for slots in layout]

    def _check_between_steps(self) -> None:
        if self._round_open or any(bucket.task is not None for bucket in self.buckets):
            raise RuntimeError("buckets can only be fused again between steps, once every update was applied")

    # -- events from the framework --------------------------------------------------------------
    def gradient_ready(self, slot: ParamSlot) -> None:
        """The ready proxy: backward finished accumulating ``slot``'s gradient."""
        with self._lock:
            self._raise_failure()
            self._round_open = True
            slot.passes += 1
            if slot.passes < self._passes_per_step:
                return
            bucket = slot.bucket
            if bucket.task is not None or slot.passes > self._passes_per_step:
                raise computed_again(slot, self._passes_per_step)
            bucket.waiting -= 1
            if bucket.waiting:
                return
            task = self._new_task(bucket)
        self._core.enqueue(task, ready=True)

    def release(self, hparams: list[dict[str, Any]]) -> None:
        """``step()`` when crossing the barrier: every gradient of this iteration may be applied
        with these hyperparameters as soon as it is reduced. Returns without waiting for that."""
        tasks = self._complete_round()
        with self._lock:  # together with _finalize's check, exactly one of them applies a task
            due = []
            for task in tasks:
                task.hparams = hparams[task.bucket.group]
                for slot in task.bucket.slots:
                    slot.fresh.clear()
                self._unapplied += 1
                if task.cycle.release():
                    due.append(task)
            if due:
                self._jobs.put(lambda: due)

    def reduce_all(self) -> list[GradientTask]:
        """All-reduce every gradient of this iteration (missing ones as zeros, like Horovod) and
        wait until they are reduced; returns them, marked as safe for the user to modify."""
        tasks = self._complete_round(keep_open=True)
        with self._changed:
            while not all(t.cycle.reduced for t in tasks) and self._failure is None:
                self._changed.wait()
            self._raise_failure()
            for task in tasks:
                task.cycle.synchronize()
                streams.wait((task.reduced_mark,), task.device)
        return tasks

    def discard_round(self) -> None:
        """Forget this iteration's gradients without applying them (barrier mode applied them
        itself; or the user skipped step(), e.g. GradScaler found an overflow)."""
        with self._lock:
            if not all(t.cycle.reduced for t in self._round):
                raise RuntimeError(ZERO_GRAD_IN_FLIGHT)
            for task in self._round:
                task.bucket.task = None
            self._reset_round()

    @property
    def round_open(self) -> bool:
        """A backward pass accumulated gradients since the last ``step()``."""
        return self._round_open

    @property
    def round_started(self) -> bool:
        """This iteration's all-reduces have begun (the last accumulation pass ran)."""
        return bool(self._round)

    @property
    def round_synchronized(self) -> bool:
        """This iteration's gradients were reduced and handed to the user (:meth:`reduce_all`)."""
        round_ = self._round
        return bool(round_) and all(t.cycle.synchronized for t in round_)

    def zero_grad(self, set_to_none: bool) -> None:
        """``optimizer.zero_grad()``: a gradient whose update is pending is cleared after it."""
        self.raise_failure()
        if self._round_open:
            self.discard_round()
        with self._lock:
            for bucket in self.buckets:
                if bucket.task is not None:  # released, its update pending
                    bucket.task.cycle.zero_grad(set_to_none)
                else:
                    for slot in bucket.slots:
                        clear_grad(slot.param, set_to_none)

    # -- waiting ------------------------------------------------------------------------------
    def wait_fresh(self, slots: Iterable[ParamSlot],
                   on_wait: Callable[[ParamSlot, float, float], None] | None = None) -> None:
        """The forward proxy: return once every slot's pending update has been applied. Each
        time a slot really blocks, ``on_wait(slot, begin, end)`` is told (monotonic seconds)."""
        for slot in slots:
            if not slot.fresh.is_set():
                if on_wait is None:
                    slot.fresh.wait()
                else:
                    begin = time.monotonic()
                    slot.fresh.wait()
                    on_wait(slot, begin, time.monotonic())
            if slot.applied is not None:
                streams.wait((slot.applied,), slot.param.device)
        if self._failure is not None:
            with self._lock:
                self._raise_failure()

    def wait_applied(self, timeout: float | None = None) -> bool:
        """Wait until every released update has been applied, and order the calling thread's
        streams after them (False on timeout)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._changed:
            while self._unapplied and self._failure is None:
                remaining = math.inf if deadline is None else deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._changed.wait(None if deadline is None else remaining)
            self._raise_failure()
        for slot in self.slots:
            if slot.applied is not None:
                streams.wait((slot.applied,), slot.param.device)
        return True

    def wait_idle(self, timeout: float) -> bool:
        """Wait until no communication is in flight and, unless something failed, no update is
        pending (False on timeout). Communication drains even after a failure, as peers take
        part, except when it cannot: the Core failed or a peer was lost. Then this returns at
        once, naming the failure, instead of waiting out ``timeout`` at exit."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while self._unreduced or (self._unapplied and self._failure is None):
                stopped = self._communication_stopped()
                if stopped is not None:
                    log.warning("bytesched: not waiting for %d all-reduce(s) in flight: %s", self._unreduced, stopped)
                    return True
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._changed.wait(remaining)
        return True

    def _communication_stopped(self) -> BaseException | None:
        """Why in-flight communication will never complete, if it will not."""
        if self._core.failure is not None:
            return self._core.failure
        return self._failure if isinstance(self._failure, ChannelError) else None

    def close(self) -> None:
        """Stop the update thread (after :meth:`wait_idle`)."""
        self._jobs.put(None)
        self._thread.join(timeout=10.0)

    # -- failures -----------------------------------------------------------------------------
    def fail(self, error: BaseException) -> None:
        """Something failed off the training thread: remember the first error and wake waiters."""
        with self._lock:
            if self._failure is None:
                self._failure = error
                log.error("bytesched: %s", error)
            for slot in self.slots:
                slot.fresh.set()
            self._changed.notify_all()

    def raise_failure(self) -> None:
        """Raise the stored failure, if any, on the calling (training) thread."""
        with self._lock:
            self._raise_failure()

    def _raise_failure(self) -> None:
        failure = self._failure
        if failure is None:
            return
        if isinstance(failure, BarrierCrossingError):
            raise failure
        raise RuntimeError(f"bytesched: gradient communication or update failed: {failure}") from failure

    # -- internals ----------------------------------------------------------------------------
    def _new_task(self, bucket: Bucket) -> GradientTask:
        """Create ``bucket``'s task for this iteration (lock held)."""
        task = GradientTask(bucket, [dense_grad(slot) for slot in bucket.slots], self._backend,
                            self._on_communicated, self._on_failed)
        bucket.task = task
        self._round.append(task)
        self._unreduced += 1
        return task

    def _complete_round(self, keep_open: bool = False) -> list[GradientTask]:
        """Give every bucket without a task this iteration one (zeros for gradients that are
        missing) and return the round's tasks; the round ends unless ``keep_open``."""
        with self._lock:
            self._raise_failure()
            in_round = {id(t) for t in self._round}
            earlier = [s for b in self.buckets if b.task is not None and id(b.task) not in in_round
                       for s in b.slots]
        # A bucket left out of this round may still be applying last round's update (it was
        # not read by the forward pass): its task name must not be reused while in flight.
        self.wait_fresh(earlier)
        with self._lock:
            created = [self._new_task(b) for b in self.buckets if b.task is None]
            tasks = list(self._round)
            if not keep_open:
                self._reset_round()
        for task in created:
            self._core.enqueue(task, ready=True)
        return tasks

    def _reset_round(self) -> None:
        self._round = []
        self._round_open = False
        for slot in self.slots:
            slot.passes = 0
        for bucket in self.buckets:
            bucket.waiting = len(bucket.slots)

    def _communicated(self, task: GradientTask) -> None:
        """Core thread: every partition of ``task`` finished; finalise it on the update thread."""
        self._jobs.put(lambda: self._finalize(task))

    def _finalize(self, task: GradientTask) -> list[GradientTask]:
        """Update thread: ``task`` is reduced; it is due if ``step()`` released it already."""
        try:
            if self._failure is None:
                modified = task.modified()
                if modified is not None:
                    raise modified_while_reducing(modified)
                streams.wait(task.communicated, task.device)
                streams.keep_alive([task.wire, *task.grads], task.device)
                self._backend.finalize(task)
                task.versions = [grad._version for grad in task.grads]
                task.reduced_mark = streams.mark(task.device)
        except BaseException as error:
            self.fail(error)
        with self._changed:
            due = task.cycle.reduce() and self._failure is None
            self._unreduced -= 1
            self._changed.notify_all()
        return [task] if due else []

    def _apply(self, tasks: list[GradientTask]) -> None:
        """Update thread: apply ``tasks``' updates, one optimizer call per parameter group and
        step (tasks released by one ``step()`` share its hyperparameter dict), the group holding
        the most urgent parameter first."""
        batches: dict[int, list[GradientTask]] = {}
        for task in sorted(tasks, key=lambda t: t.priority):
            if self._failure is not None:
                return
            modified = None if task.cycle.synchronized else task.modified()
            if modified is not None:
                self.fail(BarrierCrossingError(
                    f"the gradient of {modified!r} was modified in place after it was reduced and "
                    f"before bytesched applied it (clipping or unscaling before step(), or zero_grad("
                    f"set_to_none=False) on the model after step()? use optimizer.zero_grad(), which "
                    f"waits for pending updates); to modify gradients, " + ESCAPE_HATCH))
                return
            batches.setdefault(id(task.hparams), []).append(task)
        for batch in batches.values():
            assert batch[0].hparams is not None
            try:
                self._apply_update([s.param for t in batch for s in t.bucket.slots],
                                   [g for t in batch for g in t.grads], batch[0].hparams)
            except BaseException as error:
                self.fail(error)
                return
            with self._changed:
                for task in batch:
                    task.bucket.task = None
                    self._unapplied -= 1
                    request = task.cycle.apply()  # a zero_grad that waited for this update
                    if request is not None:
                        for slot in task.bucket.slots:
                            clear_grad(slot.param, request == "none")
                    applied = streams.mark(task.device)  # after the update and any deferred clear
                    for slot in task.bucket.slots:
                        slot.applied = applied
                        slot.fresh.set()
                self._changed.notify_all()

    def _run_jobs(self) -> None:
        """Run jobs as they come; the updates of every job found queued are applied together."""
        jobs = self._jobs
        with torch.no_grad():
            while True:
                queued = [jobs.get()]
                while not jobs.empty():
                    queued.append(jobs.get_nowait())
                due: list[GradientTask] = []
                for job in queued:
                    if job is None:  # close(): the last job
                        break
                    due += job()
                if due:
                    self._apply(due)
                if job is None:
                    return
