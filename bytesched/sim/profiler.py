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

:func:`measure_profile` reads wall time on this machine. :func:`flops_profile` reads the running
count of ``torch.utils.flop_counter`` on the ``meta`` device (nothing is computed, so VGG16 at
batch 32 costs seconds) and converts FLOPs to time on a named device at a stated efficiency.

Importing this module imports torch.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from .devices import get_device
from .profile import Layer, ModelProfile, Tensor


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
        owners, steps = _trace(model, inputs, lambda: float(counter.get_total_flops()), steps=1, warmup=0)
    forward, backward = steps[0]
    layers = tuple(Layer(_layer_name(o, model), f / rate, b / rate, _tensors(o))
                   for o, f, b in zip(owners, forward, backward))
    source = {"method": "flops", "device": get_device(device).name, "precision": precision,
              "efficiency": efficiency, "sustained_tflops": rate / 1e12,
              "forward_gflops": round(sum(forward) / 1e9, 3), "backward_gflops": round(sum(backward) / 1e9, 3)}
    return ModelProfile(name, layers, batch_size=batch_size, description=description, source=source)


def measure_profile(name: str, model: nn.Module, make_inputs: Callable[[int, str], Sequence[torch.Tensor]],
                    batch_size: int, *, repeat: int = 5, warmup: int = 2, description: str = "") -> ModelProfile:
    """A profile timed on this machine's CPU: per layer, the median of ``repeat`` training steps
    after ``warmup`` untimed ones (forward and backward; no optimizer step)."""
    if repeat < 1 or warmup < 0:
        raise ValueError(f"repeat={repeat} must be >= 1 and warmup={warmup} >= 0")
    owners, steps = _trace(model, make_inputs(batch_size, "cpu"), time.perf_counter, steps=repeat, warmup=warmup)
    forward = [statistics.median(step[0][i] for step in steps) for i in range(len(owners))]
    backward = [statistics.median(step[1][i] for step in steps) for i in range(len(owners))]
    layers = tuple(Layer(_layer_name(o, model), f, b, _tensors(o)) for o, f, b in zip(owners, forward, backward))
    source = {"method": "measured", "device": "cpu", "torch": torch.__version__,
              "threads": torch.get_num_threads(), "repeat": repeat, "warmup": warmup}
    return ModelProfile(name, layers, batch_size=batch_size, description=description, source=source)


def _trace(model: nn.Module, inputs: Sequence[torch.Tensor], clock: Callable[[], float], *, steps: int,
           warmup: int) -> tuple[list[_Owner], list[tuple[list[float], list[float]]]]:
    """Run ``warmup + steps`` forward/backward steps reading ``clock`` at every layer's first
    pre-forward hook and at every accumulated gradient; per step, each layer's forward and
    backward share of the clock."""
    owners = find_layers(model, inputs)
    index_of = {id(o.module): i for i, o in enumerate(owners)}
    n = len(owners)
    forward_at = [0.0] * n
    ready_at = [0.0] * n
    seen = [False] * n

    def pre_forward(module: nn.Module, _args: Any) -> None:
        i = index_of.get(id(module))
        if i is not None and not seen[i]:
            seen[i] = True
            forward_at[i] = clock()

    def grad_ready(layer: int) -> Callable[[torch.Tensor], None]:
        def hook(_param: torch.Tensor) -> None:
            ready_at[layer] = max(ready_at[layer], clock())
        return hook

    handles = [nn.modules.module.register_module_forward_pre_hook(pre_forward)]
    handles += [param.register_post_accumulate_grad_hook(grad_ready(i))
                for i, o in enumerate(owners) for _, param in o.params]
    samples: list[tuple[list[float], list[float]]] = []
    try:
        for step in range(warmup + steps):
            model.zero_grad(set_to_none=True)
            seen[:] = [False] * n
            ready_at[:] = [0.0] * n
            start = clock()
            loss = _loss(model(*inputs))
            backward_start = clock()
            loss.backward()
            end = clock()
            if step >= warmup:
                samples.append(_durations(start, forward_at, backward_start, ready_at, end))
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
        return sum(_loss(o) for o in output)  # type: ignore[return-value]
    if isinstance(output, dict):
        return sum(_loss(o) for o in output.values())  # type: ignore[return-value]
    raise TypeError(f"cannot make a loss from a model output of type {type(output).__name__}")
