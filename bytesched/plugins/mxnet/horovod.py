"""ScheduledOptimizer: MXNet/Gluon over Horovod, with the all-reduces scheduled (paper §5).

    import horovod.mxnet as hvd
    opt = hvd.DistributedOptimizer(mx.optimizer.create("sgd", learning_rate=0.1))
    opt = ScheduledOptimizer(opt)
    trainer = gluon.Trainer(list(net.collect_params().values()), opt, kvstore=None)

Launched with ``horovodrun``. Horovod's DistributedOptimizer all-reduces each gradient inside
``update`` and then updates; this wrapper replaces the all-reduce with a :class:`ProxiedTask`
(partitioned, released by the Core under the credit window, each partition an in-place
``horovod.mxnet.allreduce_`` on an avatar) and then runs the same inner update, which the engine
orders after the all-reduce. Ranks run the Core in ``immediate`` order: Horovod starts a
collective only once every rank submitted it, so rank 0's release order becomes the global one.
Everything else (attributes, learning rate, states) is Horovod's optimizer's, as with Horovod.
"""

from __future__ import annotations

from typing import Any

import horovod.mxnet as hvd
import mxnet as mx
import numpy as np

from bytesched import core as bcore
from bytesched.core import Config, SchedulingParams, split_elements
from bytesched.core.config import configure_logging, from_env
from bytesched.core.policies import make_policy
from bytesched.core.timeline import open_timeline

from .proxies import events
from .task import Avatars, ProxiedTask


class ScheduledOptimizer(mx.optimizer.Optimizer):
    """Wraps ``horovod.mxnet.DistributedOptimizer`` so its all-reduces are scheduled.

    Args:
        optimizer: the Horovod DistributedOptimizer to wrap.
        config: bytesched settings (default: from the ``BYTESCHED_*`` environment).
    """

    def __init__(self, optimizer: hvd.DistributedOptimizer, config: Config | None = None) -> None:
        # Optimizer.__init__ is not called: as with Horovod's wrapper, every attribute this class
        # does not define is the wrapped optimizer's (see __getattr__).
        if not isinstance(optimizer, hvd.DistributedOptimizer):
            raise TypeError("ScheduledOptimizer wraps horovod.mxnet.DistributedOptimizer(optimizer), "
                            f"got {type(optimizer).__name__}")
        self._hvd = optimizer
        self._config = config if config is not None else from_env()
        configure_logging(self._config)
        order = "immediate" if self._config.order == "auto" else self._config.order
        if order == "rank0":
            raise bcore.ConfigError("BYTESCHED_ORDER=rank0 is not needed with Horovod (it orders "
                                    "collectives itself): use auto or immediate")
        self._core = bcore.init(self._config, rank=hvd.rank(), order=order,
                                timeline=open_timeline(self._config, rank=hvd.rank(), world_size=hvd.size()))
        self._events = events()
        self._partition_bytes = make_policy(self._config.policy, self._config.params).partition_bytes()
        self._avatars: dict[int, Avatars] = {}

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or "_hvd" not in self.__dict__:
            raise AttributeError(name)
        return getattr(self._hvd, name)

    def set_params(self, params: SchedulingParams) -> None:
        """New partition and credit sizes, from the next all-reduce on (call it at the same step
        on every rank: the partitions' names and shapes must match across ranks)."""
        self._core.set_params(params)
        size = params.partition_bytes
        self._partition_bytes = size if size is not None else make_policy(self._config.policy, params).partition_bytes()

    # -- what Gluon's Trainer and MXNet's Updater call ---------------------------------------
    def create_state(self, index: int, weight: mx.nd.NDArray) -> Any:
        return self._hvd.create_state(index, weight)

    def create_state_multi_precision(self, index: int, weight: mx.nd.NDArray) -> Any:
        return self._hvd.create_state_multi_precision(index, weight)

    def update(self, index: Any, weight: Any, grad: Any, state: Any) -> None:
        self._allreduce(index, grad)
        self._hvd._optimizer.update(index, weight, grad, state)

    def update_multi_precision(self, index: Any, weight: Any, grad: Any, state: Any) -> None:
        self._allreduce(index, grad)
        self._hvd._optimizer.update_multi_precision(index, weight, grad, state)

    def set_learning_rate(self, lr: float) -> None:
        self._hvd.set_learning_rate(lr)

    def set_lr_mult(self, args_lr_mult: dict) -> None:
        self._hvd.set_lr_mult(args_lr_mult)

    def set_wd_mult(self, args_wd_mult: dict) -> None:
        self._hvd.set_wd_mult(args_wd_mult)

    # -- the scheduled all-reduce -------------------------------------------------------------
    def _allreduce(self, index: Any, grad: Any) -> None:
        process_set = self._hvd._process_set
        if process_set.size() == 1 or not process_set.included():
            return
        pairs = zip(index, grad) if isinstance(index, (list, tuple)) else [(index, grad)]
        for i, g in pairs:
            self._submit(int(i), g)

    def _submit(self, index: int, grad: mx.nd.NDArray) -> None:
        itemsize = np.dtype(grad.dtype).itemsize
        ranges = split_elements(grad.size, itemsize, self._partition_bytes)
        avatars = self._avatars.get(index)
        if avatars is None or not avatars.matches([grad], ranges):
            avatars = self._avatars[index] = Avatars(self._events.library, [grad], ranges)
        task = ProxiedTask(f"allreduce:{index}", index, ranges, itemsize, self._events)
        self._core.enqueue(task)
        opt = self._hvd

        def communicate() -> None:
            for part, (tensor,) in enumerate(avatars.parts):
                hvd.allreduce_(tensor, average=not opt._average_in_framework,
                               name=f"bytesched.{index}.{part}", priority=-index,
                               prescale_factor=1.0 / opt._gradient_predivide_factor,
                               postscale_factor=opt._postscale_factor, process_set=opt._process_set)

        task.post([grad], avatars, -index, communicate)
