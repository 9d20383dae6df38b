"""One rank of the exit-abort reproduction (docs/experiments/exit-abort.md), run under torchrun:

    torchrun --nproc-per-node 2 reproduce.py MODE

MODE joins words with "-": "early" imports TorchDynamo before the process group exists (else it
is imported after, by DDP's or bytesched's construction); "ddp" or "bytesched" trains three steps
of a small model with it, then runs a forward pass (which waits for bytesched's last updates)
unless "noforward"; "destroy" calls destroy_process_group() at the end. Between the two, the
script all-reduces twenty Python tensors over the default group.
"""

import sys

import torch

MODE = sys.argv[1].split("-")
if "early" in MODE:
    import torch._dynamo  # the import is the point
import torch.distributed as dist  # noqa: E402  (after the optional import above)

dist.init_process_group("gloo")
model: torch.nn.Module = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 2))
optimizer: torch.optim.Optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
if "ddp" in MODE:
    model = torch.nn.parallel.DistributedDataParallel(model)
if "bytesched" in MODE:
    from bytesched.plugins.torch import ScheduledOptimizer
    optimizer = ScheduledOptimizer(model, optimizer)
if "ddp" in MODE or "bytesched" in MODE:
    for _ in range(3):
        model(torch.ones(3, 4)).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
    if "noforward" not in MODE:
        model(torch.ones(3, 4))
for _ in range(20):
    dist.all_reduce(torch.ones(1000))
del model, optimizer
if "destroy" in MODE:
    dist.destroy_process_group()
