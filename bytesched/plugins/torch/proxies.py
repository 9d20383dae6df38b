"""Forward proxies: module hooks that hold the forward pass until the parameters it is about to
read have been updated (the paper's layer-wise out-of-engine dependencies, §3.4).

Until the first forward pass has been traced, a module waits for the parameters it owns before its
forward runs. After it (:meth:`ForwardProxies.settle`), each parameter is waited for at the hook
point just before its first read, and gets its priority from the order of first reads; a
parameter the trace never saw read keeps the owner rule. Modules with nothing to wait for then lose
their hooks, so they cost nothing. With ``BYTESCHED_TIMELINE`` set, every wait that really
blocked is reported to ``on_wait`` (a forward-wait span on the timeline).

Compiled modules (``torch.compile``) run their hooks inside the graph Dynamo traces, where a hook
cannot wait: there the hooks do nothing, and the graph's pieces wait for the parameters they read
(:mod:`.compiled`). The hooks then stay on every module (Dynamo would compile again on any change
of them), and those that still run eagerly (a graph break, a call outside the compiled modules)
wait as above, a parameter first read inside a graph at its owners. A hook traced outside the
model's compiled modules (a training step compiled as a whole) means a forward pass compiled where
no proxy can hold it: ``on_hidden`` is called, once, while Dynamo traces it, and that graph too is
split into pieces.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Callable

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from .compiled import CompiledForwards, Pieces, compiled_modules, split_traced_graph
from .pipeline import UpdatePipeline
from .slots import ParamSlot
from .trace import IN_GRAPH, ForwardTrace


class ForwardProxies:
    """Forward pre-hooks and forward hooks on every module of ``model``; ``on_wait(slot, begin,
    end)`` hears of each wait that blocked, ``on_settle(read, unread)`` of the slots by priority
    once the trace settled (None: nobody listens); ``piece_bytes`` sizes the pieces of compiled
    graphs; ``on_hidden()`` hears of a forward pass compiled where it cannot wait."""

    def __init__(self, model: nn.Module, slots: list[ParamSlot], pipeline: UpdatePipeline,
                 trace: ForwardTrace, on_wait: Callable[[ParamSlot, float, float], None] | None = None,
                 on_settle: Callable[[list[ParamSlot], list[ParamSlot]], None] | None = None, *,
                 piece_bytes: float, on_hidden: Callable[[], None]) -> None:
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
        self._active = True
        self._compiled_calls = 0  # compiled modules' calls under way
        self._on_hidden: Callable[[], None] | None = on_hidden
        self._noted = torch.compiler.assume_constant_result(lambda: self._traced())  # run while Dynamo traces
        self._piece_bytes = piece_bytes
        self.pieces: list[Pieces] = []
        """The backends splitting the model's compiled graphs, one per compiled call."""
        self._compiled: CompiledForwards | None = None
        self._boundaries: set[nn.Module] = set()  # compiled modules whose own hooks run eagerly
        if compiled_modules(model):
            self._compiled = CompiledForwards(model, self._pieces, pipeline.wait_applied, self._enter_compiled,
                                              self._exit_compiled)
            self._boundaries = {m for m in self._compiled.modules if getattr(m, "_compiled_call_impl", None) is None}
        self.restore()

    def _pre(self, module: nn.Module, args: Any) -> None:
        if torch.compiler.is_compiling():
            self._noted()
            return
        self._enter(module)
        if module in self._boundaries:
            self._compiled_calls += 1
            self._trace.suspend()

    def _post(self, module: nn.Module, args: Any, output: Any) -> None:
        if torch.compiler.is_compiling():
            return
        if module in self._boundaries:
            self._compiled_calls -= 1
            self._trace.resume()
        self._exit(module)

    def _enter(self, module: nn.Module) -> None:
        if not self._active:
            return
        self._trace.module_enter(module)
        slots = self._before.get(module)
        if slots:
            self._pipeline.wait_fresh(slots, self._on_wait)

    def _exit(self, module: nn.Module) -> None:
        if not self._active:
            return
        slots = self._after.get(module)
        if slots:
            self._pipeline.wait_fresh(slots, self._on_wait)
        self._trace.module_exit(module)

    def _enter_compiled(self, module: nn.Module) -> None:
        """A module compiled in place is called (its own hooks run inside its compiled call)."""
        self._enter(module)
        self._compiled_calls += 1
        self._trace.suspend()

    def _exit_compiled(self, module: nn.Module) -> None:
        self._compiled_calls -= 1
        self._trace.resume()
        self._exit(module)

    def _pieces(self, backend: Callable[..., Any]) -> Pieces:
        """The pieces of the graphs ``backend`` compiles."""
        pieces = Pieces(backend, self._piece_bytes, {id(slot.param): slot for slot in self._slots},
                        self._wait_in_graph, self._graph_reads)
        self.pieces.append(pieces)
        return pieces

    def _wait_in_graph(self, slots: list[ParamSlot]) -> None:
        """A piece of a compiled graph is about to read ``slots``."""
        self._pipeline.wait_fresh(slots, self._on_wait)

    def _graph_reads(self, slots: list[ParamSlot]) -> None:
        self._trace.graph_reads(slot.param for slot in slots)

    def _traced(self) -> bool:
        """Dynamo traces a forward proxy into a graph: fine inside a compiled module's call (its
        pieces wait); otherwise the forward pass is compiled where no proxy can hold it. That
        graph is still split into pieces, so that its backward hands out gradients early."""
        if not self._compiled_calls:
            if self._on_hidden is not None:
                on_hidden, self._on_hidden = self._on_hidden, None
                on_hidden()
            split_traced_graph(self._pieces)
        return True

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
            point = first_read[id(slot.param)][1]
            if point is IN_GRAPH:  # the pieces wait; an owner that runs eagerly (a graph break) too
                for owner in self._owners[id(slot.param)]:
                    before[owner].append(slot)
            else:
                module, where = point
                (before if where == "pre" else after)[module].append(slot)
        for slot in unobserved:
            for owner in self._owners[id(slot.param)]:
                before[owner].append(slot)
        self._before, self._after = before, after
        if not self._keeps_hooks:
            for module in [m for m in self._handles if m not in before and m not in after]:
                for handle in self._handles.pop(module):
                    handle.remove()
        self._settled = True
        if self._on_settle is not None:
            self._on_settle(observed, unobserved)

    @property
    def _keeps_hooks(self) -> bool:
        """Dynamo traced the hooks into a graph (or will): taking any off would compile it again."""
        return self._compiled is not None or bool(self.pieces)

    def remove(self) -> None:
        """Stop waiting (the gradients pass through). Where Dynamo traced the hooks, they stay,
        doing nothing (:attr:`_keeps_hooks`)."""
        if self._keeps_hooks:
            self._active = False
            return
        self._unhook()

    def close(self) -> None:
        """Remove every hook, and give the compiled modules their own compiled call back."""
        self._unhook()
        if self._compiled is not None:
            self._compiled.remove()

    def _unhook(self) -> None:
        for handles in self._handles.values():
            for handle in handles:
                handle.remove()
        self._handles.clear()

    def restore(self) -> None:
        """Hook every module that has something to wait for: all of them until the trace
        settled, then those holding a wait point (the gradients come back to the Core's path)."""
        self._active = True
        for module in self._modules:
            if module not in self._handles and (not self._settled or self._keeps_hooks
                                                or module in self._before or module in self._after):
                self._handles[module] = [module.register_forward_pre_hook(self._pre, prepend=True),
                                         module.register_forward_hook(self._post, prepend=True, always_call=True)]
