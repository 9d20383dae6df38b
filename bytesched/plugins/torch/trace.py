"""Watching the first forward pass: where, and in which order, it reads each parameter.

Two things are learnt once, from the first forward pass through the model:

- the *priority* of each parameter's gradient: the order in which the forward pass first reads the
  parameter (the first layer's gradient is needed first in the next iteration, though backward
  produces it last), not the order in which the parameters were registered;
- the *hook point* before which each parameter must be up to date in later iterations: the last
  module boundary (a module's forward pre-hook, or its forward hook on return) passed before the
  parameter's first read. A weight tied to a later layer, a parameter owned by a container and
  used between its children, or one used functionally in a parent's ``forward`` all get the
  boundary right before that read, not merely their owner's.

Reads are observed with a ``TorchFunctionMode`` (every torch function sees its tensor arguments)
that is active only during that first forward pass, from the first call into any of the model's
modules until that call returns. Inside a compiled module's call the mode is suspended (Dynamo
would trace it into the graph); the graph's own reads are reported instead, when the graph is
compiled (:mod:`.compiled`), with no hook point: the graph's pieces wait for them. Given a
:class:`~bytesched.core.forward.ForwardRecorder`, the trace also hands it every function's tensor
arguments and results: which functions use which results, the graph TicTac orders by (``tictac``).
"""

from __future__ import annotations

from typing import Any, Iterable, Iterator

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from bytesched.core.forward import ForwardRecorder

HookPoint = tuple[nn.Module, str]
"""A module boundary: ``(module, "pre")`` before its forward runs, ``(module, "post")`` after."""

IN_GRAPH = None
"""The hook point of a parameter first read inside a compiled graph, whose pieces wait for it."""


def _tensors(values: Iterable[Any]) -> Iterator[torch.Tensor]:
    """The tensors among ``values``, looking inside lists, tuples and dicts, in argument order."""
    for value in values:
        if isinstance(value, torch.Tensor):
            yield value
        elif isinstance(value, (list, tuple)):
            yield from _tensors(value)
        elif isinstance(value, dict):
            yield from _tensors(value.values())


class ForwardTrace(TorchFunctionMode):
    """Records, for each watched parameter, its first read: (order, last hook point before it).

    Driven by the forward proxies: :meth:`module_enter` from every module's forward pre-hook and
    :meth:`module_exit` from every module's forward hook. ``state`` goes ``armed`` -> ``tracing``
    (first module entered: the mode is pushed) -> ``done`` (that module returned: popped).
    """

    def __init__(self, params: Iterable[nn.Parameter], recorder: ForwardRecorder | None = None) -> None:
        super().__init__()
        self._watched = {id(p) for p in params}
        self.recorder = recorder
        self.first_read: dict[int, tuple[int, HookPoint | None]] = {}
        self.state = "armed"
        self._suspended = False
        self._last: HookPoint | None = None
        self._outermost: nn.Module | None = None

    def module_enter(self, module: nn.Module) -> None:
        """A module's forward is about to run."""
        if self.state == "armed":
            self.state = "tracing"
            self._outermost = module
            self.__enter__()
        if self.state == "tracing":
            self._last = (module, "pre")

    def module_exit(self, module: nn.Module) -> None:
        """A module's forward returned (or raised)."""
        if self.state != "tracing":
            return
        self._last = (module, "post")
        if module is self._outermost:
            self.__exit__(None, None, None)
            self.state = "done"

    def suspend(self) -> None:
        """A compiled module's call begins: take the mode off while it runs."""
        if self.state == "tracing" and not self._suspended:
            self._suspended = True
            self.__exit__(None, None, None)

    def resume(self) -> None:
        """The compiled module's call returned: watch again."""
        if self._suspended:
            self._suspended = False
            self.__enter__()

    def graph_reads(self, params: Iterable[torch.Tensor]) -> None:
        """A graph compiled during the first forward pass reads ``params`` in this order. One
        compiled before any module's hook ran eagerly (a training step compiled as a whole) is
        the first forward pass."""
        params = list(params)
        if self.state == "armed" and params:
            self.state = "done"
        elif self.state != "tracing":
            return
        for param in params:
            key = id(param)
            if key in self._watched and key not in self.first_read:
                self.first_read[key] = (len(self.first_read), IN_GRAPH)

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        for tensor in _tensors((args, kwargs)):
            key = id(tensor)
            if key in self._watched and key not in self.first_read:
                assert self._last is not None  # the trace starts at a module boundary
                self.first_read[key] = (len(self.first_read), self._last)
        result = func(*args, **kwargs)
        if self.recorder is not None:
            self.recorder.op(_tensors((args, kwargs)), _tensors((result,)))
        return result
