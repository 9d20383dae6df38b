"""Applying the user's own optimizer to one parameter at a time.

Crossing the barrier means each parameter is updated as soon as its gradient is reduced, not in
one ``step()`` over all of them. Rather than re-implementing SGD, Adam and friends (the original
ByteScheduler did, for two of them), the update runs the wrapped optimizer's own ``step()`` on a
one-parameter view of it, so every per-parameter ``torch.optim`` optimizer works unchanged and
produces the same numbers as an ordinary ``step()``:

- the view is a shallow copy of the optimizer whose only parameter group holds the *hyperparameters
  as they were when the user called* ``step()`` (an LR scheduler may change them right after) and a
  stand-in for the parameter: ``param.detach()``, which shares the parameter's memory, carrying the
  reduced gradient. The user may meanwhile set ``param.grad`` (``model.zero_grad()``) without
  disturbing the update;
- the parameter's optimizer state is moved to the stand-in for the duration of the call and back.
"""

from __future__ import annotations

from typing import Any, Callable

import torch


def hyperparameters(optimizer: torch.optim.Optimizer) -> list[dict[str, Any]]:
    """A snapshot of every parameter group's settings (all but ``params``), tensors copied."""
    return [{key: value.clone() if isinstance(value, torch.Tensor) else value
             for key, value in group.items() if key != "params"}
            for group in optimizer.param_groups]


class SingleParameterStep:
    """Calls ``step_fn`` (the optimizer class's own step) on a one-parameter view of ``optimizer``.

    Not thread-safe: one thread applies updates, and nobody else steps ``optimizer`` meanwhile.
    """

    def __init__(self, optimizer: torch.optim.Optimizer,
                 step_fn: Callable[[torch.optim.Optimizer], Any]) -> None:
        self._optimizer = optimizer
        self._step_fn = step_fn

    def __call__(self, param: torch.Tensor, grad: torch.Tensor, hparams: dict[str, Any]) -> None:
        """Update ``param`` in place from ``grad`` with the group settings ``hparams``."""
        optimizer = self._optimizer
        stand_in = param.detach()
        stand_in.grad = grad
        view = object.__new__(type(optimizer))
        view.__dict__.update(optimizer.__dict__)
        view.param_groups = [dict(hparams, params=[stand_in])]
        state = optimizer.state
        if param in state:
            state[stand_in] = state.pop(param)
        try:
            self._step_fn(view)
        finally:
            if stand_in in state:
                state[param] = state.pop(stand_in)
