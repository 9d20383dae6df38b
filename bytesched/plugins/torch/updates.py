"""Applying the user's own optimizer to some of its parameters at a time.

Crossing the barrier means each parameter is updated as soon as its gradient is reduced, not in
one ``step()`` over all of them. Rather than re-implementing SGD, Adam and friends (the original
ByteScheduler did, for two of them), the update runs the wrapped optimizer's own ``step()`` on a
view of it that holds only the parameters whose gradients are ready, so every per-parameter
``torch.optim`` optimizer works unchanged and produces the same numbers as an ordinary ``step()``:

- the view is a shallow copy of the optimizer whose only parameter group holds the *hyperparameters
  as they were when the user called* ``step()`` (an LR scheduler may change them right after) and a
  stand-in for each parameter: ``param.detach()``, which shares the parameter's memory, carrying the
  reduced gradient. The user may meanwhile set ``param.grad`` (``model.zero_grad()``) without
  disturbing the update;
- the parameters' optimizer state is moved to the stand-ins for the duration of the call and back.

Several parameters go through one call when their gradients are ready together, since each call
pays its own Python overhead. That overhead is mostly torch's wrapper around every ``step`` (a
profiler record and the step hooks): when no step hook is registered and the profiler is off the
wrapper has nothing to do, and the call goes to the step it wraps (figures:
docs/experiments/per-tensor-cost.md, "Figures behind the PyTorch plugin's rules").
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch
from torch.optim import optimizer as torch_optimizer


def hyperparameters(optimizer: torch.optim.Optimizer) -> list[dict[str, Any]]:
    """A snapshot of every parameter group's settings (all but ``params``), tensors copied."""
    return [{key: value.clone() if isinstance(value, torch.Tensor) else value
             for key, value in group.items() if key != "params"}
            for group in optimizer.param_groups]


class PartialStep:
    """Calls ``step_fn`` (the optimizer class's own step) on a view of ``optimizer`` that holds
    only the parameters given.

    Not thread-safe: one thread applies updates, and nobody else steps ``optimizer`` meanwhile.
    """

    def __init__(self, optimizer: torch.optim.Optimizer,
                 step_fn: Callable[[torch.optim.Optimizer], Any]) -> None:
        self._optimizer = optimizer
        self._step_fn = step_fn
        self._bare_step_fn: Callable[[torch.optim.Optimizer], Any] | None = getattr(step_fn, "__wrapped__", None)
        """The step inside torch's profiling and hook wrapper (``Optimizer.profile_hook_step``)."""

    def __call__(self, params: Sequence[torch.Tensor], grads: Sequence[torch.Tensor],
                 hparams: dict[str, Any]) -> None:
        """Update each of ``params`` in place from its ``grads`` entry, with the group settings
        ``hparams`` (the parameters must share them: one group)."""
        optimizer = self._optimizer
        stand_ins = []
        for param, grad in zip(params, grads, strict=True):
            stand_in = param.detach()
            stand_in.grad = grad
            stand_ins.append(stand_in)
        view = object.__new__(type(optimizer))
        view.__dict__.update(optimizer.__dict__)
        view.param_groups = [dict(hparams, params=stand_ins)]
        state = optimizer.state
        for param, stand_in in zip(params, stand_ins):
            if param in state:
                state[stand_in] = state.pop(param)
        try:
            self._step_function()(view)
        finally:
            for param, stand_in in zip(params, stand_ins):
                if stand_in in state:
                    state[param] = state.pop(stand_in)

    def _step_function(self) -> Callable[[torch.optim.Optimizer], Any]:
        """The step to call: the bare one unless the wrapper has work (a step hook, global or of
        this optimizer, or a running profiler) or torch no longer names what it checks."""
        bare = self._bare_step_fn
        if bare is None or torch.autograd._profiler_enabled():
            return self._step_fn
        optimizer = self._optimizer
        hooks = (getattr(optimizer, "_optimizer_step_pre_hooks", None),
                 getattr(optimizer, "_optimizer_step_post_hooks", None),
                 getattr(torch_optimizer, "_global_optimizer_pre_hooks", None),
                 getattr(torch_optimizer, "_global_optimizer_post_hooks", None))
        if any(registered is None or registered for registered in hooks):
            return self._step_fn
        return bare
