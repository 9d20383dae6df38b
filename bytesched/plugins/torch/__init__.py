"""The PyTorch plugin: ``ScheduledOptimizer`` over Horovod or torch.distributed.

    import horovod.torch as hvd
    from bytesched.plugins.torch import ScheduledOptimizer

    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    optimizer = ScheduledOptimizer(model, optimizer)

See docs/plugins/torch.md for the mechanism (ready and forward proxies, crossing the barrier), the
barrier mode and the torch.distributed backend.
"""

from .optimizer import ScheduledOptimizer
from .slots import BarrierCrossingError

__all__ = ["ScheduledOptimizer", "BarrierCrossingError"]
