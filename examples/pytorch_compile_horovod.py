"""A compiled training step with Horovod: the usual script, and bytesched's two lines.

    horovodrun -np 2 -H localhost:2 --gloo python examples/pytorch_compile_horovod.py
    horovodrun -np 2 -H localhost:2 --gloo python examples/pytorch_compile_horovod.py --no-bytesched

Written as Horovod scripts usually are: ``hvd.init()``, the learning rate scaled by the number of
ranks, ``hvd.DistributedOptimizer`` accumulating ``--accumulate`` backward passes per step
(``backward_passes_per_step``), rank 0's weights and optimizer state broadcast at the start, and
an evaluation after every epoch averaged over the ranks with ``hvd.allreduce``. The forward pass
and loss run in one function compiled with ``torch.compile``; backward and the step run outside
it. With bytesched (the two lines after ``hvd.DistributedOptimizer``), the forward pass is compiled
where bytesched cannot hold it for updates, so the optimizer runs in barrier mode, splitting the
compiled graph so that backward hands out gradients early. The printed losses and accuracies are
the same both ways.

The data are synthetic 32x32 images of 10 classes (each class a fixed pattern plus noise), so the
script needs no download; ``--steps-per-epoch`` bounds the work.
"""

from __future__ import annotations

import argparse

import horovod.torch as hvd
import torch
import torch.nn.functional as F

from pytorch_train_cnn import SmallCNN, cifar_like  # the model and synthetic images of the example beside this one


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--steps-per-epoch", type=int, default=50, help="optimizer steps per epoch")
    parser.add_argument("--batch-size", type=int, default=32, help="per rank and backward pass")
    parser.add_argument("--accumulate", type=int, default=2, help="backward passes per optimizer step")
    parser.add_argument("--lr", type=float, default=0.01, help="per rank; scaled by the number of ranks")
    parser.add_argument("--bytesched", action=argparse.BooleanOptionalAction, default=True)
    args = parser.parse_args()
    hvd.init()
    torch.set_num_threads(1)
    torch.manual_seed(42)

    model = SmallCNN()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * hvd.size(), momentum=0.9)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         backward_passes_per_step=args.accumulate)
    if args.bytesched:
        from bytesched.plugins.torch import ScheduledOptimizer
        optimizer = ScheduledOptimizer(model, optimizer)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    @torch.compile
    def forward_loss(images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(model(images), labels)

    per_step = args.batch_size * args.accumulate
    images, labels = cifar_like(args.steps_per_epoch * per_step, seed=1 + hvd.rank())
    test_images, test_labels = cifar_like(500, seed=10_000 + hvd.rank())
    for epoch in range(args.epochs):
        total = 0.0
        for step in range(args.steps_per_epoch):
            optimizer.zero_grad()
            for micro in range(args.accumulate):
                at = step * per_step + micro * args.batch_size
                loss = forward_loss(images[at:at + args.batch_size], labels[at:at + args.batch_size])
                (loss / args.accumulate).backward()
                total += loss.item() / args.accumulate
            optimizer.step()
        model.eval()
        with torch.no_grad():
            correct = (model(test_images).argmax(1) == test_labels).float().mean()
        model.train()
        accuracy = hvd.allreduce(correct, name="test_accuracy")
        mean_loss = hvd.allreduce(torch.tensor(total / args.steps_per_epoch), name="train_loss")
        if hvd.rank() == 0:
            print(f"epoch {epoch + 1}: loss {mean_loss.item():.6f}, test accuracy {accuracy.item():.2%}",
                  flush=True)


if __name__ == "__main__":
    main()
