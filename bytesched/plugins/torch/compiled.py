"""Compiled models (``torch.compile``): where their forward pass waits for updates, and when their
backward pass hands out gradients.

Dynamo traces a compiled model's forward pass into a graph, so module hooks inside it are traced,
not run: a module cannot wait there for its parameters. And AOTAutograd turns the graph's
backward into one autograd node, whose gradients all become ready when it ends, after the whole
backward pass (compiled DDP has the same problem, pytorch#109774). So, as DDP's own compiler pass
(``DDPOptimizer``) does, every graph Dynamo captures for a compiled module is split into *pieces*
at parameter boundaries, each holding about ``piece_bytes`` of parameters (counted in backward's
order), and each compiled by the module's own backend (Inductor, with the user's mode and
options). The backward pass of each piece ends on its own, handing its gradients to the ready
proxies while the pieces before it still compute; and before a piece runs, it waits for the
updates of the parameters it reads: the forward proxies of a compiled graph, at the graph's
boundaries instead of the modules' (prefetch-style). The order in which the graphs of the first
forward pass read the parameters gives their priorities, as the trace does for an eager model.

Splitting a graph only draws lines between its operations: each piece computes what the whole
graph computed, so the arithmetic is that of the unsplit graph (bit-identical on the CNN of the
tests); a parameter read by two pieces (tied weights) gets its gradient summed by autograd instead
of inside one graph.

The compiled modules are found among the model's modules (``torch.compile(module)``'s wrapper and
``module.compile()``); their compiled call is rebuilt once, on the same backend with these pieces,
when the ScheduledOptimizer is created (a module already run then compiles again). Before Dynamo
compiles a frame of such a call, the pending updates land: while it compiles,
``torch.compiler.is_compiling()`` is true in every thread, and the optimizers of ``torch.optim``
take their traced code paths then (Adam's bias correction in float32 tensors instead of Python
floats), which an update on the update thread must not.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator

import torch
from torch import fx, nn

from .slots import ParamSlot

Wait = Callable[[list[ParamSlot]], None]


def compiled_modules(model: nn.Module) -> list[nn.Module]:
    """The modules of ``model`` whose call runs compiled: ``torch.compile(module)``'s wrapper
    (an ``OptimizedModule``) and modules compiled in place with ``module.compile()``."""
    from torch._dynamo.eval_frame import OptimizedModule
    return [m for m in model.modules()
            if isinstance(m, OptimizedModule) or getattr(m, "_compiled_call_impl", None) is not None]


class Pieces:
    """A Dynamo backend: splits each graph into pieces of about ``piece_bytes`` of parameters,
    compiles each with ``backend``, and makes each wait (``wait``) for the watched parameters it
    reads before it runs; ``on_reads`` hears which parameters each graph reads, in order."""

    def __init__(self, backend: Callable[..., Any], piece_bytes: float, slots: dict[int, ParamSlot],
                 wait: Wait, on_reads: Callable[[list[ParamSlot]], None]) -> None:
        self._backend = backend
        self._piece_bytes = piece_bytes
        self._slots = slots
        self._wait = wait
        self._on_reads = on_reads
        self.pieces: list[int] = []
        """How many pieces each graph compiled so far was split into."""

    def __call__(self, gm: fx.GraphModule, example_inputs: list[Any], **kwargs: Any) -> Callable[..., Any]:
        from torch._dynamo.backends.distributed import DDPOptimizer
        inputs = [node for node in gm.graph.nodes if node.op == "placeholder"]
        by_node = {node: self._slots.get(id(value)) for node, value in zip(inputs, example_inputs)}
        reads = list(_first_reads(gm, by_node))
        # Parameters held as the graph's attributes (Dynamo without its inlining of nn.Modules)
        # are no inputs of the pieces: they are waited for before any piece runs.
        attributes = _attribute_reads(gm, self._slots)
        self._on_reads(reads + attributes)
        if not reads and not attributes:
            self.pieces.append(1)
            return self._backend(gm, example_inputs, **kwargs)
        cap = int(min(self._piece_bytes, 2 ** 62))  # an unbounded piece: the whole graph
        splitter = DDPOptimizer(cap, self._backend, first_bucket_cap=cap)
        compiled: Any = splitter.compile_fn(gm, example_inputs, **kwargs)
        split_inputs = [node for node in compiled.graph.nodes if node.op == "placeholder"] \
            if len(splitter.buckets) > 1 and not attributes else []
        if len(split_inputs) != len(inputs):
            self.pieces.append(len(splitter.buckets))
            return _waiting(compiled, reads + attributes, self._wait)
        split_by_node = dict(zip(split_inputs, (by_node[node] for node in inputs)))
        pieces = 0
        for node in compiled.graph.nodes:
            if node.op == "call_module":
                piece_reads = [split_by_node[n] for n in node.all_input_nodes if split_by_node.get(n) is not None]
                compiled.get_submodule(str(node.target)).register_forward_pre_hook(
                    lambda module, args, piece_reads=piece_reads: self._wait(piece_reads))
                pieces += 1
        self.pieces.append(pieces)
        return compiled


def _first_reads(gm: fx.GraphModule, by_node: dict[fx.Node, ParamSlot | None]) -> Iterator[ParamSlot]:
    """The watched parameters among ``gm``'s inputs, in the order its operations first read them."""
    seen: set[fx.Node] = set()
    for node in gm.graph.nodes:
        for value in node.all_input_nodes:
            slot = by_node.get(value)
            if slot is not None and value not in seen:
                seen.add(value)
                yield slot


def _attribute_reads(gm: fx.GraphModule, slots: dict[int, ParamSlot]) -> list[ParamSlot]:
    """Watched parameters ``gm`` holds as attributes (read with ``get_attr``)."""
    found: list[ParamSlot] = []
    for node in gm.graph.nodes:
        if node.op == "get_attr":
            slot = slots.get(id(getattr(gm, str(node.target), None)))
            if slot is not None and slot not in found:
                found.append(slot)
    return found


def _waiting(compiled: Callable[..., Any], reads: list[ParamSlot], wait: Wait) -> Callable[..., Any]:
    """``compiled``, waiting for ``reads`` before it runs."""
    def run(*args: Any) -> Any:
        wait(reads)
        return compiled(*args)
    return run


class _DrainFirst:
    """A Dynamo frame callback that lets the pending updates land (``drain``) before Dynamo looks
    at a frame that has no compiled code fitting it yet (it may compile it)."""

    def __init__(self, callback: Callable[..., Any], drain: Callable[[], Any]) -> None:
        self._callback = callback
        self._drain = drain
        self._torchdynamo_orig_backend = callback  # how Dynamo finds the backend inside a callback

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self._drain()
        return self._callback(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._callback, name)


class CompiledForwards:
    """The compiled modules of one model, their calls rebuilt to compile in pieces (``pieces(backend)``
    makes the :class:`Pieces` wrapping a module's own backend).

    ``enter(module)``/``exit(module)`` are called around the call of a module compiled in place
    (whose own hooks run inside its compiled call); ``drain()`` lets pending updates land.
    """

    def __init__(self, model: nn.Module, pieces: Callable[[Callable[..., Any]], Pieces], drain: Callable[[], Any],
                 enter: Callable[[nn.Module], None], exit: Callable[[nn.Module], None]) -> None:
        self._pieces = pieces
        self._drain = drain
        self._enter = enter
        self._exit = exit
        self._restore: list[Callable[[], None]] = []
        self.modules = compiled_modules(model)
        for module in self.modules:
            self._rebuild(module)

    def remove(self) -> None:
        """Give the compiled modules their own compiled call back (they compile again when next run)."""
        for restore in reversed(self._restore):
            restore()
        self._restore.clear()

    def _context(self, context: Any) -> Any:
        """A Dynamo context with ``context``'s backend and settings, compiling in :class:`Pieces`."""
        from torch._dynamo.eval_frame import innermost_backend
        fresh: Any = torch._dynamo.optimize(backend=self._pieces(innermost_backend(context.callback)),
                                            nopython=context.fullgraph, dynamic=getattr(context, "_dynamic", None))
        fresh.callback = _DrainFirst(fresh.callback, self._drain)
        return fresh

    def _rebuild(self, module: nn.Module) -> None:
        from torch._dynamo.eval_frame import OptimizedModule
        if isinstance(module, OptimizedModule):
            context, forward = module.dynamo_ctx, module.forward
            module.dynamo_ctx = self._context(context)
            module._initialize()

            def restore() -> None:
                module.dynamo_ctx, module.forward = context, forward
            self._restore.append(restore)
            return
        own: Any = module._compiled_call_impl
        compiled = self._context(_context_of(own))(module._call_impl)

        def call(*args: Any, **kwargs: Any) -> Any:
            self._enter(module)
            try:
                return compiled(*args, **kwargs)
            finally:
                self._exit(module)
        module._compiled_call_impl = call

        def restore_own() -> None:
            module._compiled_call_impl = own
        self._restore.append(restore_own)


def split_traced_graph(pieces: Callable[[Callable[..., Any]], Pieces]) -> None:
    """Make the graph Dynamo is tracing now compile in pieces (``pieces(backend)`` wraps its
    backend), where it is not made so already; nothing where Dynamo keeps its graph elsewhere."""
    from torch._dynamo.symbolic_convert import InstructionTranslator
    try:
        output: Any = InstructionTranslator.current_tx().output
    except AttributeError:  # no graph being traced in this thread
        return
    backend = getattr(output, "compiler_fn", None)
    if backend is not None and not isinstance(backend, Pieces):
        output.compiler_fn = pieces(backend)


def _context_of(compiled_call: Callable[..., Any]) -> Any:
    """The Dynamo context of a function ``torch.compile`` returned (``module.compile()``'s call)."""
    cells = dict(zip(compiled_call.__code__.co_freevars, compiled_call.__closure__ or ()))
    if "self" not in cells:
        raise RuntimeError("bytesched: cannot find the torch.compile settings of a module compiled with "
                           "module.compile() in this version of PyTorch; use torch.compile(module) instead")
    return cells["self"].cell_contents
