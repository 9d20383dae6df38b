"""A small Horovod or torch.distributed training job with faults injected on request.

Used by tests/test_reliability_*.py and ``bytesched bench soak``: every rank trains the same
five-layer network under ScheduledOptimizer; options make one rank die (SIGKILL) or hang in the
middle of a backward pass, perturb one rank's weights (to check BYTESCHED_CHECK) or delay every
layer's backward by a random amount. At the end each rank prints ``DONE rank=<r> checksum=<x>``.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import sys
import time

import torch  # before any horovod import (horovod.mxnet segfaults otherwise)
import torch.nn.functional as F
from torch import nn


class LayeredNet(nn.Module):
    """Five dense layers; a backward hook per layer runs the injected behaviour."""

    def __init__(self, width: int = 64, layers: int = 5) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(layers))
        self.on_backward = lambda index: None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for index, layer in enumerate(self.layers):
            x = torch.tanh(layer(x))
            x.register_hook(lambda grad, index=index: self.on_backward(index))
        return x


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--backend", choices=("horovod", "dist"), default="horovod")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--kill-rank", type=int, default=-1, help="this rank SIGKILLs itself...")
    parser.add_argument("--stop-rank", type=int, default=-1, help="this rank SIGSTOPs itself (frozen)...")
    parser.add_argument("--hang-rank", type=int, default=-1, help="this rank's training loop sleeps...")
    parser.add_argument("--fault-step", type=int, default=5, help="...in the backward pass of this step")
    parser.add_argument("--perturb-rank", type=int, default=-1, help="add 1e-3 to a weight of this rank...")
    parser.add_argument("--perturb-step", type=int, default=5, help="...after this step")
    parser.add_argument("--delay-ms", type=float, default=0.0, help="random backward delay per layer, 0..this")
    parser.add_argument("--unscheduled", action="store_true", help="plain hvd.DistributedOptimizer")
    parser.add_argument("--step-sleep", type=float, default=0.0, help="seconds to sleep after each step")
    return parser.parse_args(argv)


def main() -> int:
    args = parse_args()
    if args.backend == "horovod":
        import horovod.torch as hvd
        hvd.init()
        rank = hvd.rank()
    else:
        import torch.distributed as dist
        dist.init_process_group("gloo")
        rank = dist.get_rank()
    from bytesched.plugins.torch import ScheduledOptimizer

    model = LayeredNet()
    inner = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    if args.backend == "horovod":
        inner = hvd.DistributedOptimizer(inner, named_parameters=model.named_parameters())
    optimizer = inner if args.unscheduled else ScheduledOptimizer(model, inner)
    rng = random.Random(rank)
    step = 0

    def on_backward(index: int) -> None:
        if args.delay_ms:
            time.sleep(rng.uniform(0.0, args.delay_ms / 1000))
        if step == args.fault_step and index == 2:
            if rank == args.kill_rank:
                print(f"FAULT rank={rank} killing itself at step {step}", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
            if rank == args.stop_rank:
                print(f"FAULT rank={rank} freezing (SIGSTOP) at step {step}", flush=True)
                os.kill(os.getpid(), signal.SIGSTOP)
            if rank == args.hang_rank:
                print(f"FAULT rank={rank} hanging at step {step}", flush=True)
                time.sleep(3600)

    model.on_backward = on_backward
    data = torch.Generator().manual_seed(rank)
    began = time.perf_counter()
    for step in range(args.steps):
        optimizer.zero_grad()
        x = torch.randn(32, 64, generator=data)
        F.mse_loss(model(x), torch.sin(x)).backward()
        optimizer.step()
        if step == args.perturb_step and rank == args.perturb_rank:
            optimizer.synchronize() if not args.unscheduled else None
            with torch.no_grad():
                model.layers[3].bias[7] += 1e-3
            print(f"FAULT rank={rank} perturbed layers.3.bias after step {step}", flush=True)
        if args.step_sleep:
            time.sleep(args.step_sleep)
    if not args.unscheduled:
        optimizer.synchronize()
    checksum = sum(float(p.detach().double().sum()) for p in model.parameters())
    print(f"DONE rank={rank} checksum={checksum!r} seconds={time.perf_counter() - began:.3f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
