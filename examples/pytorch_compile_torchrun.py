"""A compiled model trained with torchrun: the usual PyTorch 2 script, and bytesched's two lines.

    torchrun --nproc-per-node 2 examples/pytorch_compile_torchrun.py
    torchrun --nproc-per-node 2 examples/pytorch_compile_torchrun.py --no-bytesched   # plain DDP

The script is written as distributed PyTorch scripts usually are: the process group set up from
the variables torchrun exports, ``torch.compile(model)``, a ``DistributedSampler`` that reshuffles
every epoch, gradient accumulation over ``--accumulate`` micro-batches (DDP's ``no_sync()`` on all
but the last), AdamW with a cosine learning-rate schedule, and an evaluation pass after every
epoch whose counts are summed over the ranks. Without bytesched, DistributedDataParallel averages
the gradients; with it, ``ScheduledOptimizer`` does instead (the two lines in ``distribute``), and
the accumulation is its ``backward_passes_per_step``. The printed losses and accuracies are the
same both ways: bytesched changes only when gradients travel. (Like Horovod, bytesched leaves each
rank its own batch-norm statistics; DDP is told to as well, ``broadcast_buffers=False``, where by
default it would copy rank 0's to every rank before each forward pass.)

The data are synthetic 32x32 images of 10 classes (each class a fixed pattern plus noise), so the
script needs no download; ``--steps-per-epoch`` bounds the work.
"""

from __future__ import annotations

import argparse
import contextlib

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from pytorch_train_cnn import NUM_CLASSES, cifar_like  # the synthetic images, from the example beside this one

class Net(nn.Module):
    """Three convolutions with batch norm and a classifier, for 32x32 RGB input."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 32, 3, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1, bias=False), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(64, 64, 3, padding=1, bias=False), nn.BatchNorm2d(64), nn.ReLU(), nn.AdaptiveAvgPool2d(4))
        self.classifier = nn.Sequential(nn.Flatten(), nn.Linear(64 * 4 * 4, 128), nn.ReLU(),
                                        nn.Linear(128, NUM_CLASSES))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


def distribute(model: nn.Module, optimizer: torch.optim.Optimizer, args: argparse.Namespace) \
        -> tuple[nn.Module, torch.optim.Optimizer]:
    """Data parallelism: DDP, or bytesched's two lines in its place."""
    if args.bytesched:
        from bytesched.plugins.torch import ScheduledOptimizer
        return model, ScheduledOptimizer(model, optimizer, backward_passes_per_step=args.accumulate)
    return DistributedDataParallel(model, broadcast_buffers=False), optimizer


def evaluate(model: nn.Module, loader: DataLoader) -> float:
    """Accuracy over every rank's share of the held-out set."""
    model.eval()
    counts = torch.zeros(2)
    with torch.no_grad():
        for images, labels in loader:
            counts += torch.tensor([(model(images).argmax(1) == labels).sum().item(), len(labels)])
    dist.all_reduce(counts)
    model.train()
    return float(counts[0] / counts[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--steps-per-epoch", type=int, default=50, help="optimizer steps per epoch")
    parser.add_argument("--batch-size", type=int, default=32, help="per rank and micro-batch")
    parser.add_argument("--accumulate", type=int, default=2, help="micro-batches per optimizer step")
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--bytesched", action=argparse.BooleanOptionalAction, default=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(42)  # the same initial weights on every rank
    # Compiled before the process group exists: with PyTorch 2.13, importing TorchDynamo (which
    # torch.compile does) once the default group exists keeps that group alive past
    # destroy_process_group(), and its Gloo threads can then abort the process at exit
    # (docs/troubleshooting.md, "A torchrun job aborts at exit").
    model = torch.compile(Net())
    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()

    samples = args.steps_per_epoch * args.accumulate * args.batch_size * world
    train_set, test_set = TensorDataset(*cifar_like(samples, seed=1)), TensorDataset(*cifar_like(1000, seed=2))
    sampler = DistributedSampler(train_set, num_replicas=world, rank=rank, seed=3)
    loader = DataLoader(train_set, batch_size=args.batch_size, sampler=sampler, drop_last=True)
    test_loader = DataLoader(test_set, batch_size=200,
                             sampler=DistributedSampler(test_set, num_replicas=world, rank=rank, shuffle=False))

    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.05)
    model, optimizer = distribute(model, optimizer, args)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.epochs * args.steps_per_epoch)

    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        total = 0.0
        for index, (images, labels) in enumerate(loader):
            last = (index + 1) % args.accumulate == 0
            syncing = model.no_sync() if isinstance(model, DistributedDataParallel) and not last \
                else contextlib.nullcontext()
            with syncing:
                loss = F.cross_entropy(model(images), labels) / args.accumulate
                loss.backward()
            total += loss.item()
            if last:
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
        accuracy = evaluate(model, test_loader)
        if rank == 0:
            print(f"epoch {epoch + 1}: loss {total / args.steps_per_epoch:.6f}, test accuracy {accuracy:.2%}",
                  flush=True)
    # The model and optimizer go first: DDP holds the process group, and destroy_process_group()
    # stops the group's threads only once nothing holds it (see the comment on torch.compile).
    del model, optimizer, scheduler
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
