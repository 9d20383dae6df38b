"""``BYTESCHED_CHECK=N``: every N steps, check that every rank holds the same parameters.

Data-parallel ranks must stay bit-identical; a scheduling bug (an update applied twice, a partition
reduced out of order, a gradient read before its all-reduce finished) shows up as ranks drifting
apart, silently, long before the loss says so. This check catches it where it happens: each rank
reduces every parameter to an exact integer digest (a position-weighted sum of its bytes, so it is
independent of summation order and of floating-point rounding), the digests of all ranks are
all-gathered with the job's own backend, and the first parameter whose digests differ is named
with the ranks that disagree with rank 0.
"""

from __future__ import annotations

from typing import Callable

import torch

from .backend import Backend
from .pipeline import ParamSlot

_WEIGHT_PERIOD = 251  # byte i weighs (i mod 251) + 1: a swap of two bytes changes the digest


class ParameterDivergence(RuntimeError):
    """Ranks hold different values of a parameter that data parallelism keeps identical."""


def digest(tensor: torch.Tensor) -> int:
    """An exact, order-independent fingerprint of ``tensor``'s bytes (any dtype)."""
    raw = tensor.detach().contiguous().reshape(-1).view(torch.uint8).to(torch.int64)
    weights = torch.arange(raw.numel(), dtype=torch.int64) % _WEIGHT_PERIOD + 1
    return int((raw * weights).sum())


class ConsistencyCheck:
    """Compares parameter digests across ranks every ``every`` steps (one small all-gather)."""

    def __init__(self, every: int, backend: Backend, slots: list[ParamSlot],
                 wait_applied: Callable[[], object]) -> None:
        self.every = every
        self._backend = backend
        self._slots = slots
        self._wait_applied = wait_applied
        self._steps = 0

    def after_step(self) -> None:
        """Count a step; on every ``every``-th, wait for its updates and compare (collective: every
        rank calls it at the same step)."""
        self._steps += 1
        if self._steps % self.every:
            return
        self._wait_applied()
        local = torch.tensor([digest(slot.param) for slot in self._slots], dtype=torch.int64)
        every_rank = self._backend.all_gather(local)
        differs = (every_rank != every_rank[0]).any(dim=0).nonzero()
        if len(differs):
            index = int(differs[0])
            ranks = [r for r in range(every_rank.shape[0]) if every_rank[r, index] != every_rank[0, index]]
            raise ParameterDivergence(
                f"BYTESCHED_CHECK: after step {self._steps}, parameter {self._slots[index].name!r} differs between "
                f"rank 0 and rank(s) {', '.join(map(str, ranks))} ({len(differs)} of {len(self._slots)} parameters "
                f"differ). Data-parallel ranks must hold identical parameters: something changed one rank's "
                f"weights (code run on one rank only, a non-deterministic update) or a scheduling bug; rerun with "
                f"BYTESCHED_POLICY=fifo and the same seed to tell which, and report it with this message")


def make_check(every: int, backend: Backend, slots: list[ParamSlot],
               wait_applied: Callable[[], object]) -> ConsistencyCheck | None:
    """The check for ``BYTESCHED_CHECK=every`` (None when 0 or a single rank: nothing to compare)."""
    if every <= 0 or backend.size < 2:
        return None
    return ConsistencyCheck(every, backend, slots, wait_applied)
