"""Train a small CNN on CIFAR-like synthetic images with bytesched, and print its accuracy.

The same script runs under Horovod or under torchrun (torch.distributed with Gloo); it finds out
which launched it from the environment:

    horovodrun -np 2 -H localhost:2 --gloo python examples/pytorch_train_cnn.py
    torchrun --nproc-per-node 2 examples/pytorch_train_cnn.py

The data are 32x32 RGB images of 10 classes, each class a fixed random pattern plus noise, so the
network has something real to learn without a download. Every rank trains on its own shard;
rank 0 evaluates on held-out images at the end of each epoch. ``--no-bytesched`` runs the plain
data-parallel job for comparison: the accuracy should be the same, bytesched changes only when
gradients travel.
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.nn.functional as F
from torch import nn

NUM_CLASSES = 10


class SmallCNN(nn.Module):
    """Two convolutions and two dense layers for 32x32 RGB input."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.fc1 = nn.Linear(32 * 8 * 8, 128)
        self.fc2 = nn.Linear(128, NUM_CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc2(F.relu(self.fc1(torch.flatten(x, 1))))


def cifar_like(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` images: each class's pattern (the same for every seed) plus per-image noise."""
    patterns = torch.randn(NUM_CLASSES, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    gen = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, NUM_CLASSES, (n,), generator=gen)
    images = patterns[labels] + 2.0 * torch.randn(n, 3, 32, 32, generator=gen)
    return images, labels


class Launcher:
    """Rank and gradient averaging of whichever launcher started this process."""

    def __init__(self) -> None:
        self.horovod = "HOROVOD_RANK" in os.environ or "OMPI_COMM_WORLD_RANK" in os.environ
        if self.horovod:
            import horovod.torch as hvd
            hvd.init()
            self.hvd, self.rank = hvd, hvd.rank()
        else:
            torch.distributed.init_process_group("gloo")
            self.rank = torch.distributed.get_rank()

    def prepare(self, model: nn.Module, lr: float, scheduled: bool) -> tuple[nn.Module, torch.optim.Optimizer]:
        """(the module to call, SGD whose gradients are averaged over the ranks), with every rank
        starting from rank 0's weights; bytesched schedules the averaging if ``scheduled``."""
        optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
        if self.horovod:
            self.hvd.broadcast_parameters(model.state_dict(), root_rank=0)
            optimizer = self.hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
        elif not scheduled:  # plain torch.distributed: DistributedDataParallel averages (and broadcasts)
            return nn.parallel.DistributedDataParallel(model), optimizer
        else:
            for tensor in model.state_dict().values():
                torch.distributed.broadcast(tensor, src=0)
        if scheduled:
            from bytesched.plugins.torch import ScheduledOptimizer
            optimizer = ScheduledOptimizer(model, optimizer)  # the line bytesched adds
        return model, optimizer


def accuracy(model: nn.Module, images: torch.Tensor, labels: torch.Tensor) -> float:
    with torch.no_grad():
        return float((model(images).argmax(1) == labels).float().mean())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--train-size", type=int, default=2048, help="images per rank")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--bytesched", action=argparse.BooleanOptionalAction, default=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    launcher = Launcher()
    torch.manual_seed(42)
    model = SmallCNN()
    forward, optimizer = launcher.prepare(model, args.lr, args.bytesched)
    images, labels = cifar_like(args.train_size, seed=1 + launcher.rank)
    test_images, test_labels = cifar_like(1000, seed=10_000)
    for epoch in range(args.epochs):
        for i in range(0, len(images), args.batch_size):
            optimizer.zero_grad()
            loss = F.cross_entropy(forward(images[i:i + args.batch_size]), labels[i:i + args.batch_size])
            loss.backward()
            optimizer.step()
        if args.bytesched:
            optimizer.synchronize()  # the last step's updates land before evaluating
        if launcher.rank == 0:
            print(f"epoch {epoch + 1}: loss {loss.item():.3f}, test accuracy "
                  f"{accuracy(model, test_images, test_labels):.1%}", flush=True)


if __name__ == "__main__":
    main()
