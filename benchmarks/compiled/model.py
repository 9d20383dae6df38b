"""An emulated model that ``torch.compile`` captures whole: each layer's compute is a custom operator
that sleeps for the layer's (scaled) forward or backward time.

The emulated layers of :mod:`benchmarks.emulated.torch_compute` sleep inside an autograd Function,
where Dynamo breaks the graph (it cannot trace ``time.sleep``). Here the sleeps are opaque custom
operators (``torch.library.custom_op``), which Dynamo and Inductor keep in one graph and call as
they are, so the compiled model has the graph structure of a real compiled model: one forward
graph, one backward node unless something splits it. Each parameter tensor is an argument of its
own operator call, as a convolution's weight is, so graph splitters that count parameter bytes
(DDP's compiler pass, bytesched's pieces) see them.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from torch import nn

from bytesched.sim.profile import Layer, ModelProfile

from ..emulated.scaling import layer_sizes


@torch.library.custom_op("bytesched_bench::emulated", mutates_args=())
def emulated(x: torch.Tensor, weight: torch.Tensor, forward_s: float, backward_s: float) -> torch.Tensor:
    """Sleep ``forward_s`` (a layer's forward compute) and pass ``x`` on."""
    time.sleep(forward_s)
    return x.clone()


@emulated.register_fake
def _emulated_shape(x: torch.Tensor, weight: torch.Tensor, forward_s: float, backward_s: float) -> torch.Tensor:
    return torch.empty_like(x)


@torch.library.custom_op("bytesched_bench::emulated_backward", mutates_args=())
def emulated_backward(weight: torch.Tensor, backward_s: float) -> torch.Tensor:
    """Sleep ``backward_s`` and give ``weight`` a gradient (zeros: their bytes matter, not values)."""
    time.sleep(backward_s)
    return torch.zeros_like(weight)


@emulated_backward.register_fake
def _emulated_backward_shape(weight: torch.Tensor, backward_s: float) -> torch.Tensor:
    return torch.empty_like(weight)


def _keep(ctx: Any, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
    _, weight, _, backward_s = inputs
    ctx.save_for_backward(weight)
    ctx.backward_s = backward_s


def _backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
    (weight,) = ctx.saved_tensors
    return grad, emulated_backward(weight, ctx.backward_s), None, None


emulated.register_autograd(_backward, setup_context=_keep)


class CompiledLayer(nn.Module):
    """One profile layer: its tensors as parameters; the first one's operator carries the layer's
    compute times, the others' none."""

    def __init__(self, layer: Layer) -> None:
        super().__init__()
        self.times = (layer.forward, layer.backward)
        self.weights = nn.ParameterList(nn.Parameter(torch.zeros(n)) for n in layer_sizes(layer))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for index, weight in enumerate(self.weights):
            forward_s, backward_s = self.times if index == 0 else (0.0, 0.0)
            x = emulated(x, weight, forward_s, backward_s)
        return x


class CompiledModel(nn.Module):
    """A chain of :class:`CompiledLayer`, one per profile layer, in forward order."""

    def __init__(self, profile: ModelProfile) -> None:
        super().__init__()
        self.layers = nn.Sequential(*(CompiledLayer(layer) for layer in profile.layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)
