"""Models that differ between ranks, trained through ScheduledOptimizer under Horovod (one rank each).

Cases (``--case``, run in the order given, each with a fresh model):

- ``order``: rank 1 registers the model's two branches in the opposite order *and* runs them in
  the opposite order in forward, so its priorities (first reads) and its gradients' ready order
  differ from rank 0's. The same model is then trained again with plain
  ``hvd.DistributedOptimizer`` from the same weights on the same data; prints ``ORDER rank=<r>
  scheduled=<sha256> plain=<sha256>``.
- ``extra``: rank 1's model has a parameter rank 0's lacks; ``shape``: a parameter of another
  shape. ScheduledOptimizer must refuse on every rank, naming the parameter: prints
  ``REFUSED case=<c> rank=<r> <error>``, or ``ACCEPTED case=<c> rank=<r>`` if it did not refuse.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import sys

import torch  # before any horovod import (horovod.mxnet segfaults otherwise)
import torch.nn.functional as F
from torch import nn

import horovod.torch as hvd

from bytesched.plugins.torch import ScheduledOptimizer

STEPS = 8


class Branches(nn.Module):
    """Two parallel branches summed into a head. ``mirrored`` (rank 1 in the ``order`` case)
    registers and runs branch ``b`` before branch ``a``; ``extra``/``shape`` change rank 1's
    structure."""

    def __init__(self, mirrored: bool = False, extra: bool = False, head_inputs: int = 32) -> None:
        super().__init__()
        first, second = ("b", "a") if mirrored else ("a", "b")
        setattr(self, first, nn.Linear(16, 32))
        setattr(self, second, nn.Linear(16, 32))
        self.head = nn.Linear(head_inputs, 4)
        self.mirrored = mirrored
        if extra:
            self.gate = nn.Parameter(torch.ones(32))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.mirrored:
            y = torch.tanh(self.b(x))
            y = torch.tanh(self.a(x)) + y
        else:
            y = torch.tanh(self.a(x))
            y = y + torch.tanh(self.b(x))
        if hasattr(self, "gate"):
            y = y * self.gate
        return self.head(y[:, :self.head.in_features])


def digest(model: nn.Module) -> str:
    """SHA-256 of the parameters' bytes in name order (registration order differs by rank)."""
    sha = hashlib.sha256()
    for _, param in sorted(model.named_parameters()):
        sha.update(param.detach().numpy().tobytes())
    return sha.hexdigest()


def train(model: nn.Module, scheduled: bool) -> nn.Module:
    """STEPS steps of SGD with momentum on this rank's own data."""
    inner = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                     named_parameters=model.named_parameters())
    optimizer = ScheduledOptimizer(model, inner) if scheduled else inner
    data = torch.Generator().manual_seed(hvd.rank())
    for _ in range(STEPS):
        optimizer.zero_grad()
        x = torch.randn(8, 16, generator=data)
        F.mse_loss(model(x), x[:, :4]).backward()
        optimizer.step()
    if scheduled:
        optimizer.synchronize()
        optimizer.close()
    return model


def order_case() -> None:
    torch.manual_seed(0)
    model = Branches(mirrored=hvd.rank() == 1)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)  # by name: rank 1 registered b first
    reference = copy.deepcopy(model)
    scheduled = digest(train(model, scheduled=True))
    plain = digest(train(reference, scheduled=False))
    print(f"ORDER rank={hvd.rank()} scheduled={scheduled} plain={plain}", flush=True)


def mismatch_case(case: str) -> None:
    odd = hvd.rank() == 1
    model = Branches(extra=odd and case == "extra", head_inputs=16 if odd and case == "shape" else 32)
    try:
        train(model, scheduled=True)
    except (ValueError, RuntimeError) as error:
        print(f"REFUSED case={case} rank={hvd.rank()} {type(error).__name__}: {error}", flush=True)
    else:
        print(f"ACCEPTED case={case} rank={hvd.rank()}", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--case", action="append", choices=("order", "extra", "shape"), required=True)
    args = parser.parse_args()
    hvd.init()
    for name in args.case:
        if name == "order":
            order_case()
        else:
            mismatch_case(name)
    sys.exit(0)
