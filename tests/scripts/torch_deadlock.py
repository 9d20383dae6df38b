"""No deadlock: seeded runs in which every rank's backward pass is randomly delayed per layer.

With Horovod, rank 0 orders and the other ranks start as soon as ready (Horovod's negotiation
makes rank 0's order global); with torch.distributed the other ranks obey rank 0's order over the
rank-0 channel. Either way gradients become ready in a different order and at different times on
each rank; partitions and credits vary per seed and the policy cycles through all of them. A run
that hangs trips a watchdog that dumps every thread's stack and exits non-zero. After each run the
ranks compare a checksum of their parameters, which must agree exactly.
"""

from __future__ import annotations

import faulthandler
import math
import random
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from bytesched.core import SchedulingParams
from bytesched.core.config import POLICIES
from torch_harness import Reporter
from torch_suites import Flavor, HorovodFlavor

SIZES = (4_000, 16_000, math.inf)  # a layer's weight is 16 kB
STEPS = 3
RUN_TIMEOUT_S = 30


class DelayedNet(nn.Module):
    """Five dense layers whose backward sleeps a random 0-3 ms per layer, drawn per rank."""

    def __init__(self, rng: random.Random) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layers = nn.ModuleList(nn.Linear(64, 64) for _ in range(5))
        self._rng = rng

    def _delay(self, grad: torch.Tensor) -> None:
        time.sleep(self._rng.uniform(0.0, 0.003))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = torch.tanh(layer(x))
            x.register_hook(self._delay)  # runs in backward, before this layer's gradients
        return x


def agree(flavor: Flavor, value: float) -> bool:
    """Every rank computed the same ``value``."""
    if isinstance(flavor, HorovodFlavor):
        values = flavor.hvd.allgather_object(value)
    else:
        values = [0.0] * dist.get_world_size()
        dist.all_gather_object(values, value)
    return all(v == values[0] for v in values)


def one_run(flavor: Flavor, seed: int) -> bool:
    rng = random.Random(1000 * seed + flavor.rank)
    choose = random.Random(seed)  # the same on every rank
    params = SchedulingParams(partition_bytes=choose.choice(SIZES), credit_bytes=choose.choice(SIZES))
    policy = POLICIES[seed % len(POLICIES)]
    model = DelayedNet(rng)
    optimizer = flavor.scheduled(model, torch.optim.SGD(model.parameters(), lr=0.1), params, policy, True)
    data = torch.Generator().manual_seed(flavor.rank)
    for _ in range(STEPS):
        optimizer.zero_grad()
        F.mse_loss(model(torch.randn(16, 64, generator=data)), torch.zeros(16, 64)).backward()
        optimizer.step()
    optimizer.synchronize()
    checksum = float(sum(p.detach().double().sum() for p in model.parameters()))
    optimizer.close()
    return agree(flavor, checksum)


def no_deadlock(report: Reporter, flavor: Flavor, runs: int) -> None:
    """``runs`` seeded runs, each under a watchdog."""
    for seed in range(runs):
        faulthandler.dump_traceback_later(RUN_TIMEOUT_S, exit=True)
        name = f"no_deadlock/seed={seed}"
        report.run(name, lambda: report.result(name, one_run(flavor, seed), "ranks agree"))
    faulthandler.cancel_dump_traceback_later()
