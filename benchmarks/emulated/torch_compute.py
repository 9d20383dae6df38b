"""PyTorch models for the benchmark: emulated profile layers, and a real small CPU model.

An emulated layer owns real ``nn.Parameter`` tensors with the byte sizes of a profile layer, but
instead of computing it sleeps for the layer's (scaled) forward and backward time inside a custom
autograd Function. Its parameters receive real gradients from that Function's backward, so the
post-accumulate-grad hooks fire layer by layer in backward order, exactly when the profile says,
and the gradients travel through the real Horovod/Gloo or torch.distributed transfers; the CPU
meanwhile is free for communication, as a GPU-trained job's CPU would be.
"""

from __future__ import annotations

import time
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from bytesched.sim.profile import Layer, ModelProfile
from .cells import REAL_MODELS
from .scaling import layer_sizes


class _SleepingLayer(torch.autograd.Function):
    """Forward sleeps ``forward_s``, backward sleeps ``backward_s`` and gives every parameter a
    gradient (zeros: the values do not matter for throughput, their bytes do)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, forward_s: float, backward_s: float,
                *params: torch.Tensor) -> torch.Tensor:
        time.sleep(forward_s)
        ctx.backward_s = backward_s
        ctx.param_shapes = [p.shape for p in params]
        return x.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        time.sleep(ctx.backward_s)
        grads = tuple(torch.zeros(shape) for shape in ctx.param_shapes)
        return (grad, None, None, *grads)


class EmulatedLayer(nn.Module):
    """One profile layer: its tensors as parameters, its times as sleeps."""

    def __init__(self, layer: Layer) -> None:
        super().__init__()
        self.forward_s = layer.forward
        self.backward_s = layer.backward
        self.weights = nn.ParameterList(nn.Parameter(torch.zeros(n)) for n in layer_sizes(layer))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _SleepingLayer.apply(x, self.forward_s, self.backward_s, *self.weights)


class EmulatedModel(nn.Module):
    """A chain of :class:`EmulatedLayer`, one per profile layer, in forward order."""

    def __init__(self, profile: ModelProfile) -> None:
        super().__init__()
        self.profile = profile
        self.layers = nn.Sequential(*(EmulatedLayer(layer) for layer in profile.layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


class SmallMLP(nn.Module):
    """Real compute: a four-layer MLP on 256 features (about 1.2 M parameters, 4.7 MB)."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(256, 768), nn.ReLU(), nn.Linear(768, 768), nn.ReLU(),
                                  nn.Linear(768, 256), nn.ReLU(), nn.Linear(256, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


class Workload:
    """A model plus its batches and loss: what one training step needs."""

    def __init__(self, model_name: str, profile: ModelProfile | None, batch_size: int) -> None:
        torch.manual_seed(0)
        self.batch_size = batch_size
        if profile is not None:
            self.model: nn.Module = EmulatedModel(profile)
            self._input = torch.zeros(1, requires_grad=False)
        elif model_name == "mlp":
            self.model = SmallMLP()
            generator = torch.Generator().manual_seed(1)
            self._input = torch.randn(batch_size, 256, generator=generator)
            self._target = torch.randint(0, 10, (batch_size,), generator=generator)
        else:
            raise ValueError(f"model {model_name!r}: expected a profile name or one of {', '.join(REAL_MODELS)}")
        self.emulated = profile is not None

    def loss(self) -> torch.Tensor:
        out = self.model(self._input)
        return out.sum() if self.emulated else F.cross_entropy(out, self._target)
