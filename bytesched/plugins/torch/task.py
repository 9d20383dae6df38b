"""GradientTask: one bucket's gradient all-reduce, as the Core's CommTask.

The bucket's gradients are packed into the backend's *wire buffer* (the gradient itself when the
bucket holds one contiguous, uncompressed gradient, so nothing is copied) and partitioned into
zero-copy 1-D views; the backend all-reduces each view in place. Everything a task learns on the
way (is it reduced, which hyperparameters its update uses) lives here so that the pipeline and the
backends share one record, including the stream marks that order its tensor work across threads on
CUDA (see :mod:`.streams`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Sequence, cast

import torch

from bytesched.core import CommTask, SubTask, split_elements

from . import streams
from .cycle import UpdateCycle
from .fusion import pack

if TYPE_CHECKING:
    from .backend import Backend
    from .fusion import Bucket


class GradientTask(CommTask):
    """The all-reduce of ``bucket``'s gradients for one iteration.

    A task lives from its gradients' readiness to their update, across the rest of backward
    and, crossing the barrier, into the next forward pass. What it and its partitions allocate
    for that span is what Python's cyclic garbage collector counts towards its next pass: past
    700 objects alive at once it runs a pass, and what survives two passes is promoted to the
    generation only a full collection (every object of a process that imported torch) visits.
    So a task allocates no more than it needs (see ``docs/architecture.md``, "Objects per
    gradient").

    Attributes:
        bucket: the parameters whose gradients this task carries.
        grads: their gradient tensors (each ``param.grad`` when the task was created).
        wire: contiguous buffer that is all-reduced in place: flat, or a lone gradient's memory
            in its shape.
        context: what the backend needs to turn ``wire`` back into ``grads`` (compression).
        device: where the wire buffer lives.
        versions: each gradient's ``_version`` expected when it is next looked at; a different
            value means the user modified that gradient in place (bytesched's and the backend's
            own writes go through ``wire``, which has a version counter of its own).
        ready: where the producing thread's stream stood once ``wire`` was packed: the Core
            thread's collectives wait for it.
        communicated: one mark per finished partition, on the stream its completion was
            reported on: finalising waits for all of them (CUDA; elsewhere there is nothing to
            mark, and no list is made).
        reduced_mark: where the update thread's stream stood once ``grads`` held the average.
        cycle: where the bucket's update stands (reduced, released, synchronized, applied, a
            deferred ``zero_grad``): :class:`~.cycle.UpdateCycle`.
        hparams: the parameter group's hyperparameters as of ``step()``; None until released.
    """

    def __init__(self, bucket: "Bucket", grads: list[torch.Tensor], backend: "Backend",
                 on_communicated: Callable[["GradientTask"], None],
                 on_failed: Callable[[BaseException], None]) -> None:
        wire, context = backend.wire(pack(grads))
        super().__init__(bucket.name, bucket.priority, wire.numel() * wire.element_size())
        self.batcher = backend.batcher_for(wire)
        self.bucket = bucket
        self.grads = grads
        self.wire = wire
        self.context: Any = context
        self.device = wire.device
        self.versions = [grad._version for grad in grads]
        self.ready = streams.mark(self.device)
        self.communicated: list[streams.Mark] | tuple[()] = [] if self.ready is not None else ()
        self.reduced_mark: streams.Mark = None
        self.cycle = UpdateCycle()
        self.hparams: dict[str, Any] | None = None
        self._backend = backend
        self._on_communicated = on_communicated
        self._on_failed = on_failed

    def modified(self) -> str | None:
        """The name of a gradient modified in place since ``versions`` was taken, if any."""
        for slot, grad, version in zip(self.bucket.slots, self.grads, self.versions):
            if grad._version != version:
                return slot.name
        return None

    def partition(self, size: float) -> list[tuple[torch.Tensor, int]]:
        wire = self.wire
        if size >= self.nbytes:  # one piece: the buffer itself (a slice costs a tensor view)
            return [(wire, self.nbytes)]
        wire = wire.view(-1)  # a lone gradient's buffer keeps its shape (see fusion.pack)
        itemsize = wire.element_size()
        return [(wire[a:b], (b - a) * itemsize) for a, b in split_elements(wire.numel(), itemsize, size)]

    def start(self, subtask: SubTask) -> None:
        """Core thread: start ``subtask``'s all-reduce on the communication stream, after the
        gradients it carries have been computed."""
        try:
            if self.ready is None:  # nothing to order (CPU)
                self._backend.start(self, subtask)
            else:
                with streams.comm_stream(self.device):
                    streams.wait((self.ready,), self.device)
                    self._backend.start(self, subtask)
        except Exception as error:  # the backend refused: the partition is over, badly
            self.fail(subtask, error)

    def finish(self, subtask: SubTask) -> None:
        """The backend's completion callback: ``subtask``'s payload holds its reduced values on
        the calling thread's current stream (c10d runs future callbacks on streams that waited
        for the collective; Horovod reports a handle once its work is done)."""
        if self.ready is not None:  # CUDA: ``communicated`` is a list
            self.communicated.append(streams.mark(self.device))  # type: ignore[union-attr]  # CUDA: a list
        self.notify_finish(subtask)

    def on_finish(self) -> None:
        self._on_communicated(self)

    def on_error(self, error: BaseException) -> None:
        self._on_failed(error)

    def fail(self, subtask: SubTask, error: BaseException) -> None:
        """``subtask``'s communication failed: record the error, and still end the partition so
        that its credit returns and the task completes (the pipeline then discards it)."""
        self._on_failed(error)
        self.notify_finish(subtask)


class GradientBatcher:
    """Starts a batch of partitions, of one or several tasks whose wire buffers share a device and
    a type, as one all-reduce (batching while busy, :mod:`bytesched.core.scheduler`): the pieces
    are copied into one buffer, the backend sums it, and its completion copies each piece's sum
    back before the piece's task hears of it. Every rank starts the same batches (rank 0's
    announced order), so the sums are those of the pieces' own all-reduces, element by element."""

    def __init__(self, all_reduce_async: Callable[[torch.Tensor], Any]) -> None:
        self._all_reduce_async = all_reduce_async

    def start_batch(self, batch: Sequence[SubTask]) -> None:
        """Core thread: on CUDA after every task's gradients were computed, on the communication
        stream (as :meth:`GradientTask.start`)."""
        owners = [cast(GradientTask, sub.task) for sub in batch]  # a batcher of GradientTasks only
        device = owners[0].device
        try:
            with streams.comm_stream(device):
                streams.wait({id(task): task.ready for task in owners}.values(), device)
                self._start(batch, owners)
        except Exception as error:  # the backend refused: every partition is over, badly
            for sub, task in zip(batch, owners):
                task.fail(sub, error)

    def _start(self, batch: Sequence[SubTask], owners: list[GradientTask]) -> None:
        pieces = [sub.payload.view(-1) for sub in batch]
        flat = torch.cat(pieces)
        work = self._all_reduce_async(flat)

        def done(future: torch.futures.Future) -> None:
            try:
                future.value()  # raises the collective's error, if any
                for piece, summed in zip(pieces, flat.split([piece.numel() for piece in pieces])):
                    piece.copy_(summed)
            except BaseException as error:
                for sub, task in zip(batch, owners):
                    task.fail(sub, error)
            else:
                for sub, task in zip(batch, owners):
                    task.finish(sub)

        work.get_future().then(done)
