"""Run under ``torchrun`` with ``BYTESCHED_TIMELINE`` set, as ``torch_timeline.py STEPS DELAY_STEP
DELAY_S``: a small MLP trained by ScheduledOptimizer over torch.distributed (Gloo) for STEPS steps,
where rank 1's backward pauses DELAY_S seconds before the first layer's gradient in step
DELAY_STEP, so rank 0's all-reduce of that gradient ends about that much later and the forward
pass of step DELAY_STEP + 1 on rank 0 waits for it. Prints ``DONE rank=r``."""

from __future__ import annotations

import sys
import time

import torch
import torch.distributed as dist
from torch import nn

from bytesched.plugins.torch import ScheduledOptimizer

class _SlowGradient(torch.autograd.Function):
    """Identity; its backward sleeps ``seconds`` first."""

    @staticmethod
    def forward(ctx: torch.autograd.function.FunctionCtx, x: torch.Tensor, seconds: float) -> torch.Tensor:
        ctx.seconds = seconds  # type: ignore[attr-defined]
        return x.view_as(x)

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        time.sleep(ctx.seconds)  # type: ignore[attr-defined]
        return grad, None


class SlowGradient(nn.Module):
    """Delays the gradient flowing to the layers before it by ``seconds`` (0: no delay)."""

    def __init__(self) -> None:
        super().__init__()
        self.seconds = 0.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _SlowGradient.apply(x, self.seconds) if self.seconds else x


def main(steps: int, delay_step: int, delay_s: float) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    slow = SlowGradient()
    model = nn.Sequential(nn.Linear(64, 256), slow, nn.Tanh(), nn.Linear(256, 256), nn.Tanh(), nn.Linear(256, 8))
    optimizer = ScheduledOptimizer(model, torch.optim.SGD(model.parameters(), lr=0.01))
    data = torch.randn(64, 64, generator=torch.Generator().manual_seed(rank))
    for step in range(steps):
        slow.seconds = delay_s if rank == 1 and step == delay_step else 0.0
        optimizer.zero_grad()
        model(data).square().mean().backward()
        optimizer.step()
    optimizer.close()
    print(f"DONE rank={rank}", flush=True)
    dist.destroy_process_group()
    sys.exit(0)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]))
