"""Forward proxies: module hooks that hold the forward pass until the parameters it is about to
read have been updated (the paper's layer-wise out-of-engine dependencies, §3.4).

Until the first forward pass has been traced, a module waits for the parameters it owns before its
forward runs. After it (:meth:`ForwardProxies.settle`), each parameter is waited for at the hook
point just before its first read, and gets its priority from the order of first reads; a
parameter the trace never saw read keeps the owner rule. Modules with nothing to wait for then lose
their hooks, so they cost nothing. With ``BYTESCHED_TIMELINE`` set, every wait that really
blocked is reported to ``on_wait`` (a forward-wait span on the timeline).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Callable

from torch import nn
from torch.utils.hooks import RemovableHandle

from .pipeline import ParamSlot, UpdatePipeline
from .trace import ForwardTrace


class ForwardProxies:
    """Forward pre-hooks and forward hooks on every module of ``model``; ``on_wait(slot, begin,
    end)`` hears of each wait that blocked, ``on_settle(read, unread)`` of the slots by priority
    once the trace settled (None: nobody listens)."""

    def __init__(self, model: nn.Module, slots: list[ParamSlot], pipeline: UpdatePipeline,
                 trace: ForwardTrace, on_wait: Callable[[ParamSlot, float, float], None] | None = None,
                 on_settle: Callable[[list[ParamSlot], list[ParamSlot]], None] | None = None) -> None:
        self._slots = slots
        self._on_settle = on_settle
        self._on_wait = on_wait
        self._pipeline = pipeline
        self._trace = trace
        self._owners: dict[int, list[nn.Module]] = defaultdict(list)
        for module in model.modules():
            for param in module.parameters(recurse=False):
                self._owners[id(param)].append(module)
        self._before: dict[nn.Module, list[ParamSlot]] = defaultdict(list)
        self._after: dict[nn.Module, list[ParamSlot]] = defaultdict(list)
        for slot in slots:
            for owner in self._owners[id(slot.param)]:
                self._before[owner].append(slot)
        self._modules = list(model.modules())
        self._handles: dict[nn.Module, list[RemovableHandle]] = {}
        self._settled = False
        self.restore()

    def _pre(self, module: nn.Module, args: Any) -> None:
        self._trace.module_enter(module)
        slots = self._before.get(module)
        if slots:
            self._pipeline.wait_fresh(slots, self._on_wait)

    def _post(self, module: nn.Module, args: Any, output: Any) -> None:
        slots = self._after.get(module)
        if slots:
            self._pipeline.wait_fresh(slots, self._on_wait)
        self._trace.module_exit(module)

    def settle(self) -> None:
        """Once the first forward pass was traced, apply it: priorities and wait points. Call
        outside any forward pass (it removes hooks); does nothing before the trace or after."""
        if self._settled or self._trace.state != "done":
            return
        first_read = self._trace.first_read
        observed = sorted((s for s in self._slots if id(s.param) in first_read),
                          key=lambda s: first_read[id(s.param)][0])
        unobserved = [s for s in self._slots if id(s.param) not in first_read]
        before: dict[nn.Module, list[ParamSlot]] = defaultdict(list)
        after: dict[nn.Module, list[ParamSlot]] = defaultdict(list)
        for priority, slot in enumerate(observed + unobserved):
            slot.priority = priority
        for slot in observed:
            module, where = first_read[id(slot.param)][1]
            (before if where == "pre" else after)[module].append(slot)
        for slot in unobserved:
            for owner in self._owners[id(slot.param)]:
                before[owner].append(slot)
        self._before, self._after = before, after
        for module in [m for m in self._handles if m not in before and m not in after]:
            for handle in self._handles.pop(module):
                handle.remove()
        self._settled = True
        if self._on_settle is not None:
            self._on_settle(observed, unobserved)

    def remove(self) -> None:
        """Remove every hook (the optimizer was closed, or its gradients pass through)."""
        for handles in self._handles.values():
            for handle in handles:
                handle.remove()
        self._handles.clear()

    def restore(self) -> None:
        """Hook every module that has something to wait for: all of them until the trace
        settled, then those holding a wait point (the gradients come back to the Core's path)."""
        for module in self._modules:
            if module not in self._handles and (not self._settled or module in self._before or module in self._after):
                self._handles[module] = [module.register_forward_pre_hook(self._pre, prepend=True),
                                         module.register_forward_hook(self._post, prepend=True, always_call=True)]
