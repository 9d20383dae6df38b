"""Shared by the PyTorch plugin's multi-process test scripts: models, data, training loops, and a
``CASE`` report line per check that the pytest side parses.

Both the baseline (plain ``hvd.DistributedOptimizer``, or a hand-written all-reduce for
torch.distributed) and ScheduledOptimizer run in the same process from the same initial weights on
the same per-rank data, so the final parameters can be compared bit for bit.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import sys
import time
import traceback
from typing import Any, Callable, Iterable

import torch
import torch.nn.functional as F
from torch import nn

import bytesched.core as core
from bytesched.core import Config, SchedulingParams

STEPS = 30
SPLIT = SchedulingParams(partition_bytes=4000, credit_bytes=8000)  # splits c2, fc1, fc2 and body.0
# With SPLIT, small gradients are fused into buckets of at most this many bytes (the CNN's c1
# weight and bias share one, so do fc1.bias and fc2): fused, lone and partitioned tasks all occur.
# Any other sizes keep the default fusion (the test models then fit in one bucket).
SPLIT_FUSION_BYTES = 3000


class SmallCNN(nn.Module):
    """Two convolutions and two dense layers on 3x16x16 input (about 12 k parameters)."""

    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(3, 8, 3, padding=1)
        self.c2 = nn.Conv2d(8, 16, 3, padding=1)
        self.fc1 = nn.Linear(16 * 4 * 4, 40)
        self.fc2 = nn.Linear(40, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.c1(x)), 2)
        x = F.max_pool2d(F.relu(self.c2(x)), 2)
        return self.fc2(F.relu(self.fc1(torch.flatten(x, 1))))


class SmoothCNN(SmallCNN):
    """SmallCNN with tanh and average pooling: no ReLU or max-pool decision that a last-bit
    difference could flip. With 3 ranks the ring's order of addition depends on where a value sits
    in the (fused or partitioned) buffer, so results differ in the last bits; through a ReLU near
    zero that can become a visible difference (seen: 7e-5 after 30 steps), through tanh it cannot."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.avg_pool2d(torch.tanh(self.c1(x)), 2)
        x = F.avg_pool2d(torch.tanh(self.c2(x)), 2)
        return self.fc2(torch.tanh(self.fc1(torch.flatten(x, 1))))


class TiedNet(nn.Module):
    """Parameters read outside their own leaf module's forward:

    - ``body.0.weight`` is also ``body.2.weight`` (two modules share one Parameter);
    - ``embed.weight`` is read again, transposed, by the container's own forward (tied output);
    - ``scale`` is owned by the container and read between its children;
    - ``temperature`` is read only by the loss, outside any module.
    """

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(12, 32, bias=False)
        self.body = nn.Sequential(nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 32))
        self.body[2].weight = self.body[0].weight
        self.scale = nn.Parameter(torch.linspace(0.5, 1.5, 32))
        self.out_bias = nn.Parameter(torch.zeros(12))
        self.temperature = nn.Parameter(torch.tensor(1.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.body(self.embed(x))) * self.scale
        return F.linear(h, self.embed.weight.t(), self.out_bias)


def cnn_batch(gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(8, 3, 16, 16, generator=gen), torch.randint(0, 10, (8,), generator=gen)


def tied_batch(gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(8, 12, generator=gen), torch.randn(8, 12, generator=gen)


def cnn_loss(model: nn.Module, out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(out, target)


def tied_loss(model: nn.Module, out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.mse_loss(out / model.temperature, target)


class WideMLP(nn.Module):
    """A weight of 8.4 MB, most of the model: sizes the tuner or the start-up plan chooses split
    it (the tuner's lattice, fitted to the model, runs from about 140 KB to the whole model), so
    every switch changes what goes on the wire."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(32, 256), nn.Tanh(), nn.Linear(256, 8192), nn.Tanh(),
                                    nn.Linear(8192, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


class DeepMLP(nn.Module):
    """Sixteen 590 KB layers (9.5 MB): one bucket each under the default 1 MB fusion, four under
    the bound a plan that stays out fuses them to (a quarter of the model)."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.Sequential(*[module for _ in range(16) for module in (nn.Linear(384, 384), nn.Tanh())])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


def deep_batch(gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(8, 384, generator=gen), torch.randn(8, 384, generator=gen)


def wide_batch(gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(8, 32, generator=gen), torch.randn(8, 10, generator=gen)


def wide_loss(model: nn.Module, out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.mse_loss(out, target)




MODELS: dict[str, tuple[Callable[[], nn.Module], Callable, Callable]] = {
    "cnn": (SmallCNN, cnn_batch, cnn_loss),
    "smooth_cnn": (SmoothCNN, cnn_batch, cnn_loss),
    "tied": (TiedNet, tied_batch, tied_loss),
    "wide": (WideMLP, wide_batch, wide_loss),
    "deep": (DeepMLP, deep_batch, wide_loss),
}

OPTIMIZERS: dict[str, Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer]] = {
    "sgd": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-4),
    "adam": lambda p: torch.optim.Adam(p, lr=2e-3, weight_decay=1e-4),
    "adamw": lambda p: torch.optim.AdamW(p, lr=2e-3, weight_decay=1e-2),
    "rmsprop": lambda p: torch.optim.RMSprop(p, lr=1e-3, momentum=0.9),
    "adagrad": lambda p: torch.optim.Adagrad(p, lr=0.02),
}


def config(params: SchedulingParams = SchedulingParams(), policy: str = "bytescheduler", plan: bool = False) -> Config:
    """The environment's configuration (channel port, job token) with these scheduling settings;
    ``plan``: the start-up plan runs (it then sets the sizes); ``policy="off"``: no scheduling
    (what ``BYTESCHED_POLICY=off`` makes)."""
    # As BYTESCHED_FUSION_BYTES would: a plan that stays out keeps the bound (and SPLIT's buckets).
    fused = {"fusion_bytes": SPLIT_FUSION_BYTES, "fusion_fixed": True} if params == SPLIT else {}
    if policy == core.OFF:
        return dataclasses.replace(core.from_env(), policy="fifo", scheduling=False, plan=False, **fused)
    return dataclasses.replace(core.from_env(), params=params, policy=policy, plan=plan, **fused)


def new_model(name: str) -> nn.Module:
    torch.manual_seed(1234)  # the same initial weights on every rank and in every run
    return MODELS[name][0]()


def train(model: nn.Module, optimizer: Any, model_name: str, rank: int, steps: int = STEPS, *,
          first_step: int = 0, passes: int = 1, zero: str = "optimizer", scheduler: Any = None,
          synchronize: bool = False, clip: float | None = None, amp: bool = False,
          between: Callable[[nn.Module, Any], None] | None = None,
          after: Callable[[nn.Module, Any], None] | None = None) -> None:
    """``steps`` iterations on rank-specific data (batch i of rank r is the same in every run).

    ``zero``: "optimizer" or "model" (whose zero_grad); ``synchronize``: Horovod's idiom
    ``synchronize(); ...; with skip_synchronize(): step()``; ``clip``: clip_grad_norm_ between
    backward and step; ``amp``: a GradScaler scales the loss and unscales before clipping/stepping;
    ``between``: called after backward and before step (to provoke unsupported cases); ``after``:
    called after step (and the scheduler's step).
    """
    _, batch, loss_fn = MODELS[model_name]
    scaler = torch.amp.GradScaler("cpu", init_scale=16.0) if amp else None
    for step in range(first_step, first_step + steps):
        (model if zero == "model" else optimizer).zero_grad()
        for p in range(passes):
            gen = torch.Generator().manual_seed(10_000 * rank + 10 * step + p)
            data, target = batch(gen)
            loss = loss_fn(model, model(data), target)
            (loss if scaler is None else scaler.scale(loss)).backward()
        if between is not None:
            between(model, optimizer)
        if synchronize:
            optimizer.synchronize()
        if scaler is not None and clip is not None:
            scaler.unscale_(optimizer)
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        with optimizer.skip_synchronize() if synchronize else contextlib.nullcontext():
            if scaler is None:
                optimizer.step()
            else:
                scaler.step(optimizer)
                scaler.update()
        if scheduler is not None:
            scheduler.step()
        if after is not None:
            after(model, optimizer)


def snapshot(model: nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def max_difference(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return max((x - y).abs().max().item() for x, y in zip(a, b))


def save(obj: Any) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def load(data: bytes) -> Any:
    return torch.load(io.BytesIO(data), weights_only=False)


class Reporter:
    """Prints one ``CASE <name> OK|FAIL rank=<r> ...`` line per check; counts failures."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.failures = 0

    def result(self, name: str, ok: bool, detail: str = "") -> None:
        self.failures += not ok
        print(f"CASE {name} {'OK' if ok else 'FAIL'} rank={self.rank} {detail}", flush=True)

    def same(self, name: str, expected: list[torch.Tensor], got: list[torch.Tensor], tolerance: float = 0.0) -> None:
        diff = max_difference(expected, got)
        exact = all(torch.equal(x, y) for x, y in zip(expected, got))
        self.result(name, exact if tolerance == 0.0 else diff <= tolerance, f"max_abs_diff={diff:.3g}")

    def run(self, name: str, check: Callable[[], None]) -> None:
        """Run ``check``; an exception is a FAIL with its traceback, not a crash of the launch."""
        started = time.monotonic()
        try:
            check()
        except Exception:
            # On the CASE line itself (the launcher's report keeps one line per case): the
            # traceback's last frames and the exception, joined.
            self.result(name, False, "raised: " + " | ".join(traceback.format_exc().strip().splitlines()[-7:]))
        finally:
            core.shutdown()  # each case may use another configuration
            print(f"TIME {name} {time.monotonic() - started:.2f}s rank={self.rank}", flush=True)

    def finish(self) -> None:
        print(f"DONE rank={self.rank} failures={self.failures}", flush=True)
        sys.exit(1 if self.failures else 0)

