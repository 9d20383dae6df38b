"""Data-parallel training throughput on synthetic data, after Horovod's synthetic benchmark.

Run with Horovod on CPU, without and with bytesched:

    horovodrun -np 2 -H localhost:2 --gloo python examples/pytorch_synthetic_benchmark.py
    horovodrun -np 2 -H localhost:2 --gloo python examples/pytorch_synthetic_benchmark.py --bytesched

Every rank trains the same model on a fixed random batch (so input loading costs nothing) and
Horovod all-reduces the gradients; ``--bytesched`` adds the two lines that schedule them
(``ScheduledOptimizer``). Rank 0 prints the images per second of each timed iteration, then the
mean +- 1.96 std per rank and in total, like Horovod's benchmark. Each rank uses one intra-op
thread so that ranks do not fight over the few cores of a development machine.
"""

from __future__ import annotations

import argparse
import timeit

import horovod.torch as hvd
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

NUM_CLASSES = 10


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The benchmark's options (names follow Horovod's pytorch_synthetic_benchmark.py)."""
    parser = argparse.ArgumentParser(
        description="PyTorch synthetic benchmark (Horovod, CPU)",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--model", choices=sorted(MODELS), default="cnn", help="model to train")
    parser.add_argument("--batch-size", type=int, default=32, help="input batch size per rank")
    parser.add_argument("--num-warmup", "--num-warmup-batches", dest="num_warmup", type=int,
                        default=10, help="number of warm-up batches, not timed")
    parser.add_argument("--num-batches-per-iter", type=int, default=10,
                        help="number of batches per timed iteration")
    parser.add_argument("--num-iters", type=int, default=10, help="number of timed iterations")
    parser.add_argument("--lr", type=float, default=0.01, help="SGD learning rate")
    parser.add_argument("--bytesched", action=argparse.BooleanOptionalAction, default=False,
                        help="schedule gradient communication with bytesched's ScheduledOptimizer")
    parser.add_argument("--cross-barrier", action=argparse.BooleanOptionalAction, default=True,
                        help="with --bytesched: step() returns before communication ends "
                             "(--no-cross-barrier: barrier mode, backward() waits for it)")
    args = parser.parse_args(argv)
    for name in ("batch_size", "num_batches_per_iter", "num_iters"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.num_warmup < 0:
        parser.error("--num-warmup must be >= 0")
    return args


class MLP(nn.Module):
    """Three dense layers on flattened 32x32 RGB input (about 3.7 M parameters)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(3 * 32 * 32, 1024)
        self.fc2 = nn.Linear(1024, 512)
        self.fc3 = nn.Linear(512, NUM_CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.flatten(x, 1)
        return self.fc3(F.relu(self.fc2(F.relu(self.fc1(x)))))


class CNN(nn.Module):
    """A small VGG-like network for 32x32 RGB input (about 1.1 M parameters in 10 tensors).

    Backward produces the dense layers' gradients first and conv1's last, while the next
    forward pass needs conv1 first: the mismatch that communication scheduling works on.
    """

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 32, 3, padding=1)
        self.conv2 = nn.Conv2d(32, 64, 3, padding=1)
        self.conv3 = nn.Conv2d(64, 128, 3, padding=1)
        self.fc1 = nn.Linear(128 * 4 * 4, 512)
        self.fc2 = nn.Linear(512, NUM_CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = F.max_pool2d(F.relu(self.conv3(x)), 2)
        return self.fc2(F.relu(self.fc1(torch.flatten(x, 1))))


class VGG(nn.Module):
    """VGG16's shape in miniature (about 5.3 M parameters, 21 MB of gradients per step).

    Four convolutions do most of the computing with 1% of the parameters; three dense layers hold
    the rest. As in VGG16, the big dense gradients are ready first in backward but needed last in
    the next forward pass, and the small convolution gradients the other way round: the case in
    which the paper's scheduler gains most (§6).
    """

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.conv3 = nn.Conv2d(32, 64, 3, padding=1)
        self.conv4 = nn.Conv2d(64, 64, 3, padding=1)
        self.fc1 = nn.Linear(64 * 8 * 8, 1024)
        self.fc2 = nn.Linear(1024, 1024)
        self.fc3 = nn.Linear(1024, NUM_CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.conv1(x))
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = F.max_pool2d(F.relu(self.conv3(x)), 2)
        x = F.relu(self.conv4(x))
        return self.fc3(F.relu(self.fc2(F.relu(self.fc1(torch.flatten(x, 1))))))


MODELS: dict[str, type[nn.Module]] = {"mlp": MLP, "cnn": CNN, "vgg": VGG}


def make_optimizer(model: nn.Module, args: argparse.Namespace) -> torch.optim.Optimizer:
    """SGD scaled by the number of ranks, wrapped so that gradients are all-reduced; with
    ``--bytesched`` also wrapped so that the all-reduces are scheduled (the two added lines)."""
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * hvd.size(), momentum=0.9)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    if args.bytesched:
        from bytesched.plugins.torch import ScheduledOptimizer
        optimizer = ScheduledOptimizer(model, optimizer, cross_barrier=args.cross_barrier)
    return optimizer


def synthetic_batch(batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A fixed random batch of 32x32 RGB images and labels."""
    data = torch.randn(batch_size, 3, 32, 32)
    target = torch.randint(0, NUM_CLASSES, (batch_size,))
    return data, target


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer,
               data: torch.Tensor, target: torch.Tensor) -> None:
    """One forward, backward (gradients all-reduced by the optimizer) and update."""
    optimizer.zero_grad()
    loss = F.cross_entropy(model(data), target)
    loss.backward()
    optimizer.step()


def log(message: str) -> None:
    """Print on rank 0 only, so the output is one report rather than one per rank."""
    if hvd.rank() == 0:
        print(message, flush=True)


def run_benchmark(args: argparse.Namespace) -> list[float]:
    """Warm up, then time ``num_iters`` iterations; returns images/s per rank for each."""
    model = MODELS[args.model]()
    optimizer = make_optimizer(model, args)
    # Start every rank from rank 0's weights, as a real job would.
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    data, target = synthetic_batch(args.batch_size)

    def timed_batches() -> None:
        for _ in range(args.num_batches_per_iter):
            train_step(model, optimizer, data, target)
        if args.bytesched:
            # step() returned before the last updates landed: count their time in this iteration.
            optimizer.synchronize()

    n_params = sum(p.numel() for p in model.parameters())
    log(f"Model: {args.model} ({n_params / 1e6:.2f} M parameters, {4 * n_params / 1e6:.1f} MB of gradients)")
    log(f"Batch size: {args.batch_size}")
    log(f"Number of CPU ranks: {hvd.size()}")
    log(f"bytesched: {('on' + ('' if args.cross_barrier else ', barrier mode')) if args.bytesched else 'off'}")
    log("Running warmup...")
    for _ in range(args.num_warmup):
        train_step(model, optimizer, data, target)
    log("Running benchmark...")
    rates = []
    for i in range(args.num_iters):
        seconds = timeit.timeit(timed_batches, number=1)
        rate = args.batch_size * args.num_batches_per_iter / seconds
        log(f"Iter #{i}: {rate:.1f} img/sec per CPU rank")
        rates.append(rate)
    return rates


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    hvd.init()
    torch.manual_seed(1234 + hvd.rank())  # different data per rank; weights come from rank 0
    torch.set_num_threads(1)
    rates = run_benchmark(args)
    mean, conf = float(np.mean(rates)), 1.96 * float(np.std(rates))
    log(f"Img/sec per CPU rank: {mean:.1f} +-{conf:.1f}")
    log(f"Total img/sec on {hvd.size()} CPU rank(s): "
        f"{hvd.size() * mean:.1f} +-{hvd.size() * conf:.1f}")


if __name__ == "__main__":
    main()
