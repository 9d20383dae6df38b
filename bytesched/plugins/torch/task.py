"""GradientTask: one parameter's gradient all-reduce, as the Core's CommTask.

The gradient is flattened into the backend's *wire buffer* (the gradient itself when it is
contiguous and uncompressed, so nothing is copied) and partitioned into zero-copy 1-D views; the
backend all-reduces each view in place. Everything a task learns on the way (is it reduced, which
hyperparameters its update uses) lives here so that the pipeline and the backends share one record.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

import torch

from bytesched.core import CommTask, SubTask, split_elements

if TYPE_CHECKING:
    from .backend import Backend
    from .pipeline import ParamSlot


class GradientTask(CommTask):
    """The all-reduce of ``slot.param``'s gradient for one iteration.

    Attributes:
        slot: the parameter this gradient belongs to.
        grad: the gradient tensor (``param.grad`` when the task was created).
        wire: flat, contiguous buffer that is all-reduced in place (may alias ``grad``).
        context: what the backend needs to turn ``wire`` back into ``grad`` (compression).
        version: ``grad._version`` expected when the gradient is next looked at; a different value
            means someone modified the gradient in place behind our back.
        reduced: every partition finished and the backend finalised ``grad``.
        synchronized: the user waited for this gradient (``synchronize()``) and may edit it.
        hparams: the parameter group's hyperparameters as of ``step()``; None until released.
    """

    def __init__(self, slot: "ParamSlot", grad: torch.Tensor, backend: "Backend",
                 on_communicated: Callable[["GradientTask"], None],
                 on_failed: Callable[[BaseException], None]) -> None:
        wire, context = backend.wire(grad)
        super().__init__(slot.name, slot.priority, wire.numel() * wire.element_size())
        self.slot = slot
        self.grad = grad
        self.wire = wire
        self.context: Any = context
        self.version = grad._version
        self.reduced = False
        self.synchronized = False
        self.hparams: dict[str, Any] | None = None
        self._backend = backend
        self._on_communicated = on_communicated
        self._on_failed = on_failed

    def partition(self, size: float) -> list[tuple[torch.Tensor, int]]:
        wire = self.wire
        if size >= self.nbytes:  # one piece: the buffer itself (a slice costs a tensor view)
            return [(wire, self.nbytes)]
        itemsize = wire.element_size()
        return [(wire[a:b], (b - a) * itemsize) for a, b in split_elements(wire.numel(), itemsize, size)]

    def start(self, subtask: SubTask) -> None:
        try:
            self._backend.start(self, subtask)
        except Exception as error:  # the backend refused: the partition is over, badly
            self.fail(subtask, error)

    def on_finish(self) -> None:
        self._on_communicated(self)

    def on_error(self, error: BaseException) -> None:
        self._on_failed(error)

    def fail(self, subtask: SubTask, error: BaseException) -> None:
        """``subtask``'s communication failed: record the error, and still end the partition so
        that its credit returns and the task completes (the pipeline then discards it)."""
        self._on_failed(error)
        self.notify_finish(subtask)
