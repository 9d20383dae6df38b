"""Make a model profile from a real torch model: by counting FLOPs, or by timing it here.

A *layer* is a module that owns parameters and is called in the forward pass: each parameter
belongs to the deepest called module containing it (so a ``MultiheadAttention`` whose output
projection is applied functionally owns that projection's weights too). Layers are ordered by
their first call, which is the forward order the simulator assumes.

Both ways read a "clock" with hooks and charge each layer what the clock advanced:

- forward: from the layer's first pre-forward hook to the next layer's (so parameter-free
  operations such as activations and pooling are charged to the layer before them);
- backward: up to the moment the last of the layer's gradients is accumulated
  (``register_post_accumulate_grad_hook``), which is exactly when the simulator lets the
  layer's communication start.

:func:`measure_profile` times the model on a real device. On the CPU it reads wall time. On a GPU
a hook runs when its kernels are *queued*, long before they finish, so it records a CUDA event on
the current stream instead (autograd's device thread runs the gradient hooks with the stream of
the gradient's kernels as the current one) and reads the events once the step has finished.
:func:`flops_profile` reads the running count of ``torch.utils.flop_counter`` on the ``meta``
device (nothing is computed, so VGG16 at batch 32 costs seconds) and converts FLOPs to time on a
named device at a stated efficiency.

Importing this module imports torch.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Protocol, Sequence

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from bytesched.sim.devices import get_device
from bytesched.sim.profile import Layer, ModelProfile, Tensor


@dataclass(frozen=True)
class _Owner:
    """A layer: the called module owning some parameters."""

    path: str
    module: nn.Module
    params: tuple[tuple[str, nn.Parameter], ...]


def find_layers(model: nn.Module, inputs: Sequence[torch.Tensor]) -> list[_Owner]:
    """The parameter-owning called modules of ``model``, in the order of their first call."""
    paths = {id(module): path for path, module in model.named_modules()}
    order: dict[str, int] = {}

    def record(module: nn.Module, _args: Any) -> None:
        path = paths.get(id(module))
        if path is not None and path not in order:
            order[path] = len(order)

    handle = nn.modules.module.register_module_forward_pre_hook(record)
    try:
        with torch.no_grad():
            model(*inputs)
    finally:
        handle.remove()
    owned: dict[str, list[tuple[str, nn.Parameter]]] = {}
    for name, param in model.named_parameters():
        parts = name.split(".")[:-1]
        for cut in range(len(parts), -1, -1):
            path = ".".join(parts[:cut])
            if path in order:
                owned.setdefault(path, []).append((name, param))
                break
        else:
            raise ValueError(f"parameter {name!r} belongs to no module called in the forward pass; "
                             "the profile would not know when its gradient is ready")
    modules = dict(model.named_modules())
    return [_Owner(path, modules[path], tuple(owned[path])) for path in sorted(owned, key=order.__getitem__)]


def _tensors(owner: _Owner) -> tuple[Tensor, ...]:
    return tuple(Tensor(name, param.numel() * 4) for name, param in owner.params)


def _layer_name(owner: _Owner, model: nn.Module) -> str:
    return owner.path or type(model).__name__


# -- clocks: what a hook reads, and how a reading becomes a number ------------------------------
class _Clock(Protocol):
    def read(self) -> Any:
        """A reading, taken from inside a hook (cheap: it may not be a number yet)."""

    def value(self, reading: Any) -> float:
        """The reading as a number, once the step has finished (:meth:`settle`)."""

    def settle(self) -> None:
        """Wait until every reading of the step can be turned into a number."""


class _WallClock:
    """Seconds of wall time (the CPU runs an operation within the call)."""

    def read(self) -> float:
        return time.perf_counter()

    def value(self, reading: float) -> float:
        return reading

    def settle(self) -> None:
        pass


class _CudaClock:
    """Seconds of GPU time since an origin event: each reading is a timing event recorded on the
    calling thread's current stream of ``device``."""

    def __init__(self, device: torch.device) -> None:
        self._device = device
        self._origin = self.read()

    def read(self) -> "torch.cuda.Event":
        event = torch.cuda.Event(enable_timing=True)
        event.record(torch.cuda.current_stream(self._device))
        return event

    def value(self, reading: "torch.cuda.Event") -> float:
        return self._origin.elapsed_time(reading) / 1e3

    def settle(self) -> None:
        torch.cuda.synchronize(self._device)


class _FlopClock:
    """The running FLOP count of ``counter``."""

    def __init__(self, counter: FlopCounterMode) -> None:
        self._counter = counter

    def read(self) -> float:
        return float(self._counter.get_total_flops())

    def value(self, reading: float) -> float:
        return reading

    def settle(self) -> None:
        pass


PRECISIONS = ("fp32", "tf32", "bf16", "fp16")


@contextlib.contextmanager
def _numerics(device: torch.device, precision: str) -> Iterator[Callable[[], contextlib.AbstractContextManager[Any]]]:
    """Set the matmul precision for the block; yields the context the forward pass runs in
    (autocast for bf16/fp16, as a mixed-precision training step would)."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision {precision!r} is unknown: expected one of {', '.join(PRECISIONS)}")
    if precision == "tf32" and device.type != "cuda":
        raise ValueError("precision tf32 needs a CUDA device (TF32 is a tensor-core format)")
    saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = precision == "tf32"
    try:
        if precision in ("bf16", "fp16"):
            dtype = torch.bfloat16 if precision == "bf16" else torch.float16
            yield lambda: torch.autocast(device.type, dtype=dtype)
        else:
            yield contextlib.nullcontext
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def resolve_device(name: str) -> torch.device:
    """``auto``: the current CUDA device when there is one, else the CPU; otherwise a torch device
    name, checked to exist."""
    if name == "auto":
        return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    try:
        device = torch.device(name)
    except RuntimeError as error:
        raise ValueError(f"device {name!r}: {error}") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device {name!r}: this torch build sees no CUDA device")
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        if device.index >= torch.cuda.device_count():
            raise ValueError(f"device {name!r}: only {torch.cuda.device_count()} CUDA device(s) present")
    elif device.type != "cpu":
        raise ValueError(f"device {name!r}: expected cpu, cuda or cuda:N")
    return device


# -- the two ways to read a clock per layer ---------------------------------------------------
def flops_profile(name: str, model: nn.Module, make_inputs: Callable[[int, str], Sequence[torch.Tensor]],
                  batch_size: int, *, device: str = "V100", precision: str = "fp32",
                  efficiency: float = 0.5, description: str = "") -> ModelProfile:
    """A profile whose compute times are FLOPs / (peak of ``device`` x ``efficiency``).

    The FLOPs are attributed to layers exactly as :func:`measure_profile` attributes time: the
    "clock" is the running count of ``torch.utils.flop_counter``, read by the same hooks. The
    model is moved to the ``meta`` device, so nothing is computed.
    """
    rate = get_device(device).flops_per_second(precision, efficiency)
    model = model.to("meta")
    inputs = make_inputs(batch_size, "meta")
    with FlopCounterMode(display=False) as counter:
        owners, steps = _trace(model, inputs, _FlopClock(counter), steps=1, warmup=0)
    forward, backward = steps[0]
    layers = tuple(Layer(_layer_name(o, model), f / rate, b / rate, _tensors(o))
                   for o, f, b in zip(owners, forward, backward))
    source = {"method": "flops", "device": get_device(device).name, "precision": precision,
              "efficiency": efficiency, "sustained_tflops": rate / 1e12,
              "forward_gflops": round(sum(forward) / 1e9, 3), "backward_gflops": round(sum(backward) / 1e9, 3)}
    return ModelProfile(name, layers, batch_size=batch_size, description=description, source=source)


def measure_profile(name: str, model: nn.Module, make_inputs: Callable[[int, str], Sequence[torch.Tensor]],
                    batch_size: int, *, repeat: int = 5, warmup: int = 2, device: str = "cpu",
                    precision: str = "fp32", description: str = "") -> ModelProfile:
    """A profile timed on ``device`` (``cpu``, ``cuda[:N]`` or ``auto``) at ``precision`` (fp32;
    tf32 on CUDA; bf16/fp16 autocast): per layer, the median of ``repeat`` training steps after
    ``warmup`` untimed ones (forward and backward; no optimizer step)."""
    if repeat < 1 or warmup < 0:
        raise ValueError(f"repeat={repeat} must be >= 1 and warmup={warmup} >= 0")
    where = resolve_device(device)
    with _numerics(where, precision) as forward_context:
        model = model.to(where)
        clock: _Clock = _CudaClock(where) if where.type == "cuda" else _WallClock()
        owners, steps = _trace(model, make_inputs(batch_size, str(where)), clock, steps=repeat, warmup=warmup,
                               forward_context=forward_context)
    forward = [statistics.median(step[0][i] for step in steps) for i in range(len(owners))]
    backward = [statistics.median(step[1][i] for step in steps) for i in range(len(owners))]
    layers = tuple(Layer(_layer_name(o, model), f, b, _tensors(o)) for o, f, b in zip(owners, forward, backward))
    if where.type == "cuda":
        on: dict[str, Any] = {"device": torch.cuda.get_device_name(where), "clock": "cuda events"}
    else:
        on = {"device": "cpu", "threads": torch.get_num_threads(), "clock": "wall"}
    source = {"method": "measured", **on, "precision": precision, "torch": torch.__version__,
              "repeat": repeat, "warmup": warmup}
    return ModelProfile(name, layers, batch_size=batch_size, description=description, source=source)


def _trace(model: nn.Module, inputs: Sequence[torch.Tensor], clock: _Clock, *, steps: int, warmup: int,
           forward_context: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext,
           ) -> tuple[list[_Owner], list[tuple[list[float], list[float]]]]:
    """Run ``warmup + steps`` forward/backward steps reading ``clock`` at every layer's first
    pre-forward hook and at every accumulated gradient; per step, each layer's forward and
    backward share of the clock. The forward pass runs inside ``forward_context()``."""
    owners = find_layers(model, inputs)
    index_of = {id(o.module): i for i, o in enumerate(owners)}
    n = len(owners)
    forward_at: list[Any] = [None] * n
    ready_at: list[list[Any]] = [[] for _ in range(n)]  # a layer is ready at its last gradient

    def pre_forward(module: nn.Module, _args: Any) -> None:
        i = index_of.get(id(module))
        if i is not None and forward_at[i] is None:
            forward_at[i] = clock.read()

    def grad_ready(layer: int) -> Callable[[torch.Tensor], None]:
        def hook(_param: torch.Tensor) -> None:
            ready_at[layer].append(clock.read())
        return hook

    handles = [nn.modules.module.register_module_forward_pre_hook(pre_forward)]
    handles += [param.register_post_accumulate_grad_hook(grad_ready(i))
                for i, o in enumerate(owners) for _, param in o.params]
    samples: list[tuple[list[float], list[float]]] = []
    try:
        for step in range(warmup + steps):
            model.zero_grad(set_to_none=True)
            forward_at[:] = [None] * n
            for readings in ready_at:
                readings.clear()
            start = clock.read()
            with forward_context():
                loss = _loss(model(*inputs))
            backward_start = clock.read()
            loss.backward()
            end = clock.read()
            if step >= warmup:
                clock.settle()
                value = clock.value
                samples.append(_durations(value(start), [value(r) for r in forward_at], value(backward_start),
                                          [max(map(value, r), default=0.0) for r in ready_at], value(end)))
    finally:
        for handle in handles:
            handle.remove()
    return owners, samples


def _durations(start: float, forward_at: list[float], backward_start: float, ready_at: list[float],
               end: float) -> tuple[list[float], list[float]]:
    """Per-layer forward and backward times of one step from the hook timestamps."""
    n = len(forward_at)
    starts = [start] + forward_at[1:] + [backward_start]
    forward = [max(0.0, starts[i + 1] - starts[i]) for i in range(n)]
    backward = [0.0] * n
    previous = backward_start
    for i in range(n - 1, -1, -1):  # gradients arrive last layer first; keep the chain monotone
        ready = max(ready_at[i], previous)
        backward[i] = ready - previous
        previous = ready
    backward[0] += max(0.0, end - previous)  # the tail after the last gradient
    return forward, backward


def _loss(output: Any) -> torch.Tensor:
    """A scalar to differentiate, whatever the model returns."""
    if isinstance(output, torch.Tensor):
        return output.float().sum()
    if isinstance(output, (tuple, list)):
        return sum(_loss(o) for o in output)  # type: ignore[return-value]  # 0 + tensors: a tensor
    if isinstance(output, dict):
        return sum(_loss(o) for o in output.values())  # type: ignore[return-value]  # as above
    raise TypeError(f"cannot make a loss from a model output of type {type(output).__name__}")
