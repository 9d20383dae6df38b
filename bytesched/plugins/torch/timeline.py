"""The training loop's side of ``BYTESCHED_TIMELINE``: compute spans, step markers and forward
waits, written next to the Core's sub-task spans so that ``bytesched timeline`` measures the
computation time instead of asking for it.

Per optimizer step ``n`` (``step()`` calls, counted from 0), on the rank's trace:

- ``step``: from the first forward pass after step ``n - 1`` returned (or from that return, if no
  forward pass came) to the return of step ``n``;
- ``forward``: each call of the model, from its forward pre-hook to its forward hook, including
  the time its forward proxies blocked (none for a model compiled in place with
  ``module.compile()``, whose hooks run inside its compiled graph; ``torch.compile(module)``'s
  wrapper runs them outside);
- ``backward``: each backward pass, from its first ready gradient to its last (the gradient of the
  last layer takes some backward compute before the first one is ready: that part is not seen);
- ``forward wait``: each time a forward proxy blocked on a parameter whose update was still
  pending (its communication, or the update after it), naming the parameter.

With the timeline off none of this runs: the model gets no extra hooks, the ready proxy tests one
local variable, and a forward proxy looks at its ``on_wait`` only once it found a parameter stale.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from bytesched.core.timeline import ChromeTimeline

from .slots import ParamSlot


class StepTimeline:
    """Records one ScheduledOptimizer's training loop into ``sink``.

    Called from the training thread (forward hooks, waits, ``step()``) and from autograd's
    (gradients); no lock, since ``backward()`` blocks the training thread until autograd is done.
    """

    def __init__(self, sink: ChromeTimeline) -> None:
        self._sink = sink
        self._step = 0
        self._step_begin: float | None = None  # first forward of this step
        self._last_step_end = time.monotonic()
        self._forward_begin: float | None = None
        self._first_ready: float | None = None  # of the backward pass in progress
        self._last_ready = 0.0

    def hook(self, model: nn.Module) -> list[RemovableHandle]:
        """Watch ``model``'s forward passes. Call after the forward proxies hooked it: this
        pre-hook then runs first, so a forward span includes the proxies' waits, and the forward
        hook last, after the proxies' waits at the end of the model."""
        return [model.register_forward_pre_hook(self._forward_begin_hook, prepend=True),
                model.register_forward_hook(self._forward_end_hook, always_call=True)]

    def _forward_begin_hook(self, module: nn.Module, args: Any) -> None:
        if torch.compiler.is_compiling():  # a model compiled in place runs its hooks in its graph
            return
        now = time.monotonic()
        self._end_backward()
        if self._step_begin is None:
            self._step_begin = now
        if self._forward_begin is None:  # not a re-entrant call of the model
            self._forward_begin = now

    def _forward_end_hook(self, module: nn.Module, args: Any, output: Any) -> None:
        if not torch.compiler.is_compiling() and self._forward_begin is not None:
            self._sink.span("forward", self._forward_begin, time.monotonic(), self._step)
            self._forward_begin = None

    def gradient_ready(self) -> None:
        """The ready proxy saw a gradient: the backward pass is at least this far."""
        now = time.monotonic()
        if self._first_ready is None:
            self._first_ready = now
        self._last_ready = now

    def forward_wait(self, slot: ParamSlot, begin: float, end: float) -> None:
        """A forward proxy blocked from ``begin`` to ``end`` until ``slot`` was updated."""
        self._sink.span("forward wait", begin, end, self._step, tensor=slot.name)

    def step_end(self) -> None:
        """``step()`` is returning: close this step's marker and begin counting the next."""
        now = time.monotonic()
        self._end_backward()
        begin = self._last_step_end if self._step_begin is None else self._step_begin
        self._sink.span("step", begin, now, self._step)
        self._step += 1
        self._step_begin = None
        self._last_step_end = now

    def _end_backward(self) -> None:
        """A forward pass or ``step()`` came: the backward pass before it (if any) is over."""
        if self._first_ready is not None:
            self._sink.span("backward", self._first_ready, self._last_ready, self._step)
            self._first_ready = None
